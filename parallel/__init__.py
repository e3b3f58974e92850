"""Pure-PyTorch engine, one folder per concern; nothing here imports ComfyUI (``comfy``,
``comfy_api``, ``folder_paths``, ``nodes``) or the pack's ``loaders``/``nodes`` (a test enforces it).

- ``placement/``: devices and their free memory, sizing, the planner that puts blocks on devices;
- ``blocks/``: block sharding (``blocks`` mode): hooks that run each block where its weights are;
- ``sequence/``: the sequence-parallel engine (``sequence`` mode): token/batch split, block
  streaming, Ulysses attention, one thread per local device;
- ``distributed/``: the same engine over ``torch.distributed`` (the data plane of several machines);
- ``cluster/``: several machines on Ray (preview): members, rank actors, per-session groups;
- ``cost/``: what each mode costs (memory, time, bytes) and the ``auto`` decision;
- ``tiling/``: the batched, multi-device tiled VAE decode.
Top level: ``families`` (one entry per model family), ``simulate`` (fake-device memory tracking),
``random_weights``, and two leaves every folder uses: ``tensor_map`` (the one walk over nested
block arguments) and ``units`` (GiB and its formatter).
"""
