"""``sequence`` mode over ``torch.distributed``: the shared secret (``secret``), the lobby entries
(``entries``) and the host's lobby (``lobby``), a worker's join (``join``) and serving loop
(``worker``), the host's session (``host``) and its remote ranks (``ranks``), the signed control
channel (``wire``, messages in ``protocol``), block descriptions (``block_specs``), weight
broadcasts (``weights``), activation exchange (``exchange``), settings (``config``, ``connect``)."""
