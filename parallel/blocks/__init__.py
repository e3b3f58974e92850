"""``blocks`` mode: the router that runs each transformer block on the device holding its weights
(``routing``) and the sharding that attaches it to a model's block lists (``sharding``)."""
