"""Several machines on Ray: Ray is the control plane, torch.distributed the data plane.

Ray gives membership (a worker machine is a Ray node labelled with its name, its devices are
resources), authentication (``RAY_AUTH_MODE=token``), health and the place each remote rank runs
(an actor pinned to its node and device). Ours is a per-session torch.distributed group whose
rendezvous keys live in a Ray actor of the host, reached over Ray's authenticated calls only.

- ``settings``: environment, the token-auth rule, member names as Ray labels and resources;
- ``driver``: connect as a Ray driver, list members ``NAME/DEVICE``, start a rank actor;
- ``rank_actor`` / ``rendezvous``: the rank actor and the sessions' rendezvous actor (both shipped
  by value: worker nodes need not import the pack);
- ``group``: a session: its process group, the ``Store`` reaching the rendezvous, ``RaySession``;
- ``host``: the host's members, their rank actors (kept across sessions), one session at a time;
- ``rank_server``: the pack's side of a rank actor; ``node``: the worker's ``ray start`` line.

Nothing here imports Ray at module import (``settings.import_ray()`` does, when a cluster role
starts), so local multi-GPU never needs Ray installed.
"""
