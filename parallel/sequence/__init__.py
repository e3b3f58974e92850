"""``sequence`` mode on one machine: splitting tokens and cond/uncond over ranks (``split``), the
engine's block loop (``engine``), streaming the blocks a rank does not own (``stream``, with its
CUDA ``ops`` and a recording stand-in, ``record``, that checks the order rules on CPU), Ulysses
attention (``ulysses``, pipelined by head chunks on GPU ranks) and the per-device threads and their exchange (``threads``)."""
