"""``sequence`` mode over ``torch.distributed`` (the data plane; the cluster is ``parallel/cluster``):
the host's remote ranks (``ranks``) and what a member does with its commands (``serving``), the
commands themselves (``protocol``), members and their offers (``members``), the host's checks and
errors (``host``), block descriptions (``block_specs``), weight broadcasts (``weights``),
activation exchange (``exchange``, parts in ``wire``), one order for every collective (``order``),
settings (``config``, ``connect``)."""
