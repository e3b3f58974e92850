"""Several machines on Ray: Ray is the control plane, torch.distributed the data plane.

Ray gives membership (each worker machine is a Ray node labelled with its name, its devices are
resources), authentication (Ray's token: ``RAY_AUTH_MODE=token``), health (a dead node or actor is
reported by Ray) and the place each remote rank runs (an actor pinned to its node and device).
Only the data plane is ours: a per-session torch.distributed group whose rendezvous keys live in a
Ray actor of the host (``rendezvous``), reached over Ray's authenticated calls only.

- ``settings``: the environment (``SHARDDIT_RAY_ADDRESS``, ``SHARDDIT_CLUSTER_INSECURE``), the
  token-auth rule, member names as Ray labels and resources; pure, imports no Ray;
- ``driver``: connect as a Ray driver, list members ``NAME/DEVICE``, start a rank actor;
- ``rank_actor``: the actor a remote rank runs (shipped by value: worker nodes need not import the pack);
- ``rendezvous``: the sessions' rendezvous actor (shipped by value); ``store``: the torch.distributed
  Store each process of a session reaches it through;
- ``group``: form the per-session process group (rendezvous over Ray, every wait bounded);
- ``host``: the host's members, their rank actors (kept across sessions) and one session at a time;
- ``session``: a sampling session (commands as Ray calls, weights and exchanges on its groups);
- ``rank_server``: the pack's side of a rank actor (joins a session, serves its commands);
- ``node``: the ``ray start`` command line of ``python <pack-dir> worker --ray --join ...``.

Nothing here imports Ray at module import: ``settings.import_ray()`` does, only when a cluster
role starts, so local multi-GPU never needs Ray installed.
"""
