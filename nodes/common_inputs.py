"""The inputs several ShardDiT nodes share, defined once: same name, default and tooltip in every
node. Defaults come from ``parallel/placement/plan_types.py`` (``DEFAULT_DEVICES``,
``DEFAULT_RESERVE_VRAM_GB``), which the KSampler path, the CLI and the simulator use too.

A new shared input (e.g. the ``parallel`` mode) gets its helper here and its default there.
"""
from comfy_api.latest import io

from ..loaders.comfy.core.features import core_checks_v3_combos
from ..parallel.cost.mode import DEFAULT_PARALLEL, PARALLEL_MODES
from ..parallel.cost.inputs import DEFAULT_LINK_GBPS
from ..parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB

__all__ = ["CheckedCombo", "DEVICES_TOOLTIP",
           "cfg_input", "devices_input", "gpu_input", "link_gbps_input", "parallel_input", "reserve_vram_input",
           "validate_one"]

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
    "GPUs for two prefetched blocks per GPU. 'auto': sequence when two or more GPUs have room for it and the "
    "cost model predicts it faster for this latent on these GPUs (PCIe 4.0 link assumed), else blocks; the log "
    "says why."
)


class CheckedCombo(io.Combo.Input):
    """A combo whose value ComfyUI itself checks before anything runs: a value not in the list is
    one "Value not in list" error, under this input, naming the value and the list.

    ComfyUI checks a combo whose type is its options list (the V1 form, core's own nodes), in
    0.3.64 and later; a V3 combo's type is "COMBO", which 0.3.64 passes unchecked ('', 'ring' or
    null reached ``execute``). A check in ``validate_inputs`` instead is shown under every input
    that method takes (ComfyUI 0.3.64 and 0.29), so each node's ``validate_inputs`` takes one input
    and combos are checked here."""

    def get_io_type(self):
        # the V1 form only where core would not check the V3 one (0.3.64); see core_checks_v3_combos
        return super().get_io_type() if core_checks_v3_combos() else list(self.options)


def validate_one(check, value) -> bool | str:
    """``validate_inputs`` form of ``check(value)``: True, or the message ComfyUI shows under the
    one input the method takes. None is a linked input (its value is made later, ComfyUI passes
    None while validating): checked when the node runs."""
    if value is None:
        return True
    try:
        check(value)
    except ValueError as e:
        return str(e)
    return True


def parallel_input() -> io.Combo.Input:
    # optional: workflows saved before the input existed keep validating (execute defaults to auto)
    return CheckedCombo("parallel", options=list(PARALLEL_MODES), default=DEFAULT_PARALLEL, optional=True,
                        tooltip=PARALLEL_TOOLTIP)


DEFAULT_PLAN_CFG = 6.0
"""The Plan node's guidance scale (> 1: cond + uncond every step); same as the ``plan`` CLI."""


def cfg_input() -> io.Float.Input:
    return io.Float.Input("cfg", default=DEFAULT_PLAN_CFG, min=1.0, max=100.0, step=0.1, optional=True,
                          tooltip="Guidance scale to plan for: 1 = cond only (batch 1); > 1 = cond + uncond "
                                  "every step, which sequence mode splits over the GPUs first.")


def gpu_input() -> io.String.Input:
    return io.String.Input("gpu", default="", multiline=False, optional=True,
                           tooltip="GPU kind for the speed prediction, e.g. 'RTX 4090', 'H100'. Empty: the "
                                   "devices' NVML names (RTX 4090 when unknown).")


def link_gbps_input() -> io.Float.Input:
    return io.Float.Input("link_gbps", default=0.0, min=0.0, max=10000.0, step=0.5, optional=True,
                          tooltip=f"GB/s of one GPU-to-GPU copy. 0: {DEFAULT_LINK_GBPS:g} (PCIe 4.0 without "
                                  "P2P, through host memory); ~25 with P2P; NVLink hundreds.")
