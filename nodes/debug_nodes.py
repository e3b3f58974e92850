"""Debug nodes: ``ShardDiTPlan`` shows the devices and a simulated placement (logic in loaders/plan/node_logic.py).

In the UI the node shows a picture of the plan (ComfyUI's image preview) and the text table (the
``text`` entry, drawn by ``web/plan_text.js``)."""
from comfy_api.latest import io, ui

from ..loaders.comfy.models.checks import check_device_entries
from ..loaders.plan import node_logic, presets, setup
from ..parallel.placement.inventory import read_hidden_note
from .common_inputs import (
    DEFAULT_PLAN_CFG, CheckedCombo, cfg_input, devices_input, gpu_input, link_gbps_input, parallel_input,
    reserve_vram_input, validate_one)
from ..parallel.cost.mode import DEFAULT_PARALLEL

CATEGORY = "sharddit/debug"
PLAN_DEVICES_TOOLTIP = (
    "'auto': this machine's GPUs, read now. A list 'cuda:0,cuda:1' to use those. Or imagined "
    "GPUs with their free memory, 'cuda:0=24GiB,cuda:1=12GiB', to ask 'would it fit there?'.")


class ShardDiTPlan(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTPlan",
            display_name="Placement Plan (ShardDiT)",
            category=CATEGORY,
            description="Shows every device (total, free, what ComfyUI and ShardDiT hold) and simulates "
                        "one forward of the chosen model on the planned devices (no weights needed): "
                        "weights, peak activations and whether it fits; then each parallel strategy's per-device "
                        "peak and predicted speed, and the one 'auto' picks.",
            is_output_node=True,
            inputs=[
                devices_input(tooltip=PLAN_DEVICES_TOOLTIP),
                CheckedCombo("model", options=presets.preset_names(), default="wan2.1-t2v-14b",
                             tooltip="Model architecture to simulate (ComfyUI's own class, built without weights)."),
                io.Int.Input("width", default=832, min=16, max=8192, step=16, tooltip="Video width in pixels."),
                io.Int.Input("height", default=480, min=16, max=8192, step=16, tooltip="Video height in pixels."),
                io.Int.Input("frames", default=81, min=1, max=1025, step=4,
                             tooltip="Frames (Wan/Hunyuan: 4k+1, LTX-Video: 8k+1)."),
                CheckedCombo("batch", options=list(node_logic.BATCH_CHOICES), default="auto", tooltip=(
                    "'2': cond+uncond in one batch; '1': one at a time; 'auto': 2 if it fits, else 1 "
                    "(what ComfyUI's sampler does).")),
                CheckedCombo("dtype", options=list(setup.DTYPES), default="bf16",
                             tooltip="Weight dtype; fp8 = 1-byte weights computed in bf16."),
                reserve_vram_input(),
                parallel_input(),
                cfg_input(),
                gpu_input(),
                link_gbps_input(),
            ],
            outputs=[io.String.Output(display_name="plan", tooltip="The inventory and plan as text.")],
        )

    @classmethod
    def validate_inputs(cls, gpu=""):
        # one input: ComfyUI shows the message under every input this method takes. Combos are
        # CheckedCombo, cfg and link_gbps get core's min/max; execute checks them all again (NaN).
        return validate_one(node_logic.check_gpu, gpu)

    @classmethod
    def execute(cls, devices, model, width, height, frames, batch, dtype, reserve_vram_gb,
                parallel=DEFAULT_PARALLEL, cfg=DEFAULT_PLAN_CFG, gpu="", link_gbps=0.0) -> io.NodeOutput:
        check_device_entries(devices, allow_empty=False)  # '' is not 'auto'; before any simulation
        text, report = node_logic.run_plan(model, devices, width, height, frames, batch, dtype, reserve_vram_gb,
                                          parallel=parallel, cfg=cfg, gpu=gpu, link_gbps=link_gbps)
        note = read_hidden_note(devices)  # GPUs the driver has but ComfyUI cannot use, and the fix
        text = f"{note}\n\n{text}" if note else text
        picture = ui.PreviewImage(node_logic.picture_tensor(report), cls=cls)
        return io.NodeOutput(text, ui={**picture.as_dict(), **ui.PreviewText(text).as_dict()})


NODES = [ShardDiTPlan]
