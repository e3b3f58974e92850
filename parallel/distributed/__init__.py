"""``sequence`` mode over ``torch.distributed`` (the data plane; the cluster is ``parallel/cluster``):
the host's remote ranks (``ranks``), what a member does with its commands (``serving``), the
commands themselves (``protocol``), members, their offers and room (``members``), block
descriptions (``block_specs``), weights (``weights``), activation exchange (``exchange``, bytes in
``wire``), one order for every collective (``order``), settings and addresses (``config``)."""
