"""The inputs several ShardDiT nodes share, defined once: same name, default and tooltip in every
node. Defaults come from ``parallel/plan_types.py`` (``DEFAULT_DEVICES``,
``DEFAULT_RESERVE_VRAM_GB``), which the KSampler path, the CLI and the simulator use too.

A new shared input (e.g. the ``parallel`` mode) gets its helper here and its default there.
"""
from comfy_api.latest import io

from ..parallel.parallel_mode import DEFAULT_PARALLEL, PARALLEL_MODES
from ..parallel.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB

__all__ = ["DEFAULT_DEVICES", "DEFAULT_PARALLEL", "DEFAULT_RESERVE_VRAM_GB", "DEVICES_TOOLTIP", "devices_input",
           "parallel_input", "reserve_vram_input"]

DEVICES_TOOLTIP = (
    "Where the DiT blocks run. 'auto' plans from the free VRAM of every GPU (fewest GPUs that fit). "
    "Or a list such as 'cuda:0,cuda:1', optionally weighted 'cuda:0:3,cuda:1:1' (3/4 of the blocks on "
    "cuda:0); 'cpu' is allowed and may repeat ('cpu,cpu' = two shards on the CPU, for testing). "
    "A device of a ShardDiT worker on another machine is 'NAME/cuda:0' (parallel=sequence; README: "
    "Several machines)."
)


def devices_input(id: str = "devices", default: str = DEFAULT_DEVICES, tooltip: str = DEVICES_TOOLTIP) -> io.String.Input:
    return io.String.Input(id, default=default, multiline=False, tooltip=tooltip)


def reserve_vram_input() -> io.Float.Input:
    return io.Float.Input(
        "reserve_vram_gb", default=DEFAULT_RESERVE_VRAM_GB, min=0.0, max=1024.0, step=0.1,
        tooltip="GiB left free on every GPU for the CUDA context, other apps and allocator slack; "
                "the planner never fills it with weights or activations.",
    )


PARALLEL_TOOLTIP = (
    "How the sharded DiT runs. 'blocks' (capacity): each block computes on the GPU that holds it, one GPU "
    "busy at a time, nothing extra in memory. 'sequence' (speed): every GPU computes every step on its share "
    "of the tokens (and of cond/uncond), streaming the blocks it does not hold: about N times faster on N "
    "GPUs for two prefetched blocks per GPU. 'auto': sequence when two or more GPUs have room for it, else blocks."
)


def parallel_input() -> io.Combo.Input:
    # optional: workflows saved before the input existed keep validating (execute defaults to auto)
    return io.Combo.Input("parallel", options=list(PARALLEL_MODES), default=DEFAULT_PARALLEL, optional=True,
                          tooltip=PARALLEL_TOOLTIP)
