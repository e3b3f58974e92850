"""``blocks`` mode: the router that runs each transformer block on the device holding its weights
(``routing``), the sharding that attaches it to a model's block lists (``sharding``), and one forward
of it on fake devices for the dry run (``dry_forward``)."""
