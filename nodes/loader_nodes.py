"""Loader nodes: core's loaders plus device placement."""
import folder_paths
from comfy_api.latest import io

from ..loaders.comfy.loading import component_loading, model_loading, text_encoder_split
from .common_inputs import CheckedCombo, devices_input, parallel_input, reserve_vram_input, validate_one
from ..parallel.placement.plan_types import DEFAULT_DEVICES
from ..parallel.cost.mode import DEFAULT_PARALLEL

CATEGORY = "sharddit/loaders"


def _first_file(folder: str):
    """Default of a file combo: its first file (without one the frontend's node-search preview
    card shows ``undefined``; core's V1 loaders get this from their list)."""
    return next(iter(folder_paths.get_filename_list(folder)), None)


class ShardDiTLoadDiffusionModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTLoadDiffusionModel",
            display_name="Load Diffusion Model (ShardDiT)",
            category=CATEGORY,
            description="Core 'Load Diffusion Model' whose transformer blocks are sharded over GPUs per a "
                        "plan made from free VRAM; no GPU ever holds the whole model.",
            inputs=[
                io.Combo.Input("unet_name", options=folder_paths.get_filename_list("diffusion_models"),
                               default=_first_file("diffusion_models"),
                               tooltip="A diffusion model file in ComfyUI/models/diffusion_models."),
                CheckedCombo("weight_dtype", options=model_loading.WEIGHT_DTYPES, default="default",
                             tooltip="Weight dtype, as in core's loader: fp8 halves the VRAM the blocks need."),
                devices_input(),
                reserve_vram_input(),
                parallel_input(),
            ],
            outputs=[io.Model.Output(tooltip="A MODEL whose blocks are sharded; use with any sampler.")],
        )

    @classmethod
    def validate_inputs(cls, devices=DEFAULT_DEVICES):
        # ComfyUI shows a validate_inputs message under EVERY input the method takes: it takes only
        # devices. reserve_vram_gb: core's min/max (NaN and a linked devices: checked first thing in
        # execute); combos: CheckedCombo; file names and contents: at the start of execute.
        return validate_one(model_loading.check_devices, devices)

    @classmethod
    def execute(cls, unet_name, weight_dtype, devices, reserve_vram_gb, parallel=DEFAULT_PARALLEL) -> io.NodeOutput:
        return io.NodeOutput(model_loading.load_sharded_diffusion_model(unet_name, weight_dtype, devices,
                                                                        reserve_vram_gb, parallel))



DEVICE_TOOLTIP = ("Where this model runs: 'auto' (a GPU the DiT does not use when one has room, else beside the "
                  "DiT, else the CPU; decided from free VRAM and logged), 'cpu', or 'cuda:N'.")
TE_DEVICE_TOOLTIP = ("Where the text encoder runs: 'auto' (a GPU the DiT does not use when one has room, else beside "
                     "the DiT; when no single device holds it, its layers split over the GPUs by free VRAM, the CPU "
                     "taking what they cannot), 'cpu', 'cuda:N', or a list to split its layers over "
                     "('cuda:0,cuda:1', 'cuda:0,cpu', weighted 'cuda:0:3,cuda:1:1').")


class ShardDiTLoadTextEncoder(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTLoadTextEncoder",
            display_name="Load Text Encoder (ShardDiT)",
            category=CATEGORY,
            description="Core 'Load CLIP' with the device chosen from free VRAM (or given).",
            inputs=[
                io.Combo.Input("clip_name", options=folder_paths.get_filename_list("text_encoders"),
                               default=_first_file("text_encoders"),
                               tooltip="A text encoder file in ComfyUI/models/text_encoders (e.g. umt5_xxl for Wan)."),
                CheckedCombo("type", options=component_loading.clip_types(), default="wan",
                             tooltip="The model family the text encoder is for (core CLIPLoader's list)."),
                devices_input("device", tooltip=TE_DEVICE_TOOLTIP),
            ],
            outputs=[io.Clip.Output(tooltip="A CLIP for the text encode nodes; it runs on the chosen device.")],
        )

    @classmethod
    def validate_inputs(cls, device="auto"):  # only `device`: see ShardDiTLoadDiffusionModel
        return validate_one(text_encoder_split.check_text_encoder_device, device)

    @classmethod
    def execute(cls, clip_name, type, device) -> io.NodeOutput:
        return io.NodeOutput(component_loading.load_text_encoder(clip_name, type, device))


class ShardDiTLoadDualTextEncoder(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTLoadDualTextEncoder",
            display_name="Load Dual Text Encoder (ShardDiT)",
            category=CATEGORY,
            description="Core 'DualCLIPLoader' (e.g. Qwen2.5-VL 7B + byT5 for HunyuanVideo 1.5, Qwen2.5-VL 7B + "
                        "CLIP-L for Kandinsky 5) with the device chosen from free VRAM for the pair (or given).",
            inputs=[
                io.Combo.Input("clip_name1", options=folder_paths.get_filename_list("text_encoders"),
                               default=_first_file("text_encoders"),
                               tooltip="The first text encoder file in ComfyUI/models/text_encoders "
                                       "(e.g. qwen_2.5_vl_7b_fp8_scaled.safetensors)."),
                io.Combo.Input("clip_name2", options=folder_paths.get_filename_list("text_encoders"),
                               default=_first_file("text_encoders"),
                               tooltip="The second text encoder file (e.g. byt5_small_glyphxl_fp16.safetensors "
                                       "for HunyuanVideo 1.5, clip_l.safetensors for Kandinsky 5)."),
                CheckedCombo("type", options=component_loading.dual_clip_types(),
                             default=component_loading.default_dual_clip_type(),
                             tooltip="The model family the pair is for (core DualCLIPLoader's list)."),
                devices_input("device", tooltip=TE_DEVICE_TOOLTIP),
            ],
            outputs=[io.Clip.Output(tooltip="A CLIP for the text encode nodes; both encoders run on the chosen device.")],
        )

    @classmethod
    def validate_inputs(cls, device="auto"):  # only `device`: see ShardDiTLoadDiffusionModel
        return validate_one(text_encoder_split.check_text_encoder_device, device)

    @classmethod
    def execute(cls, clip_name1, clip_name2, type, device) -> io.NodeOutput:
        return io.NodeOutput(component_loading.load_dual_text_encoder(clip_name1, clip_name2, type, device))


class ShardDiTLoadLTXAVTextEncoder(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTLoadLTXAVTextEncoder",
            display_name="Load LTXV Audio Text Encoder (ShardDiT)",
            category=CATEGORY,
            description="Core 'Load LTXV Audio Text Encoder' (LTX-2 / LTX-2.3: Gemma 3 12B + the checkpoint's text "
                        "projection) with the device chosen from free VRAM (or given).",
            inputs=[
                io.Combo.Input("text_encoder", options=folder_paths.get_filename_list("text_encoders"),
                               default=_first_file("text_encoders"),
                               tooltip="The Gemma 3 12B file in ComfyUI/models/text_encoders "
                                       "(e.g. gemma_3_12B_it_fp4_mixed.safetensors)."),
                io.Combo.Input("ckpt_name", options=folder_paths.get_filename_list("checkpoints"),
                               default=_first_file("checkpoints"),
                               tooltip="The LTX-2 checkpoint in ComfyUI/models/checkpoints; only its text "
                                       "projection is loaded here (and counted for the device)."),
                devices_input("device", tooltip=TE_DEVICE_TOOLTIP),
            ],
            outputs=[io.Clip.Output(tooltip="A CLIP for the text encode nodes; it runs on the chosen device.")],
        )

    @classmethod
    def validate_inputs(cls, device="auto"):  # only `device`: see ShardDiTLoadDiffusionModel
        return validate_one(text_encoder_split.check_text_encoder_device, device)

    @classmethod
    def execute(cls, text_encoder, ckpt_name, device) -> io.NodeOutput:
        return io.NodeOutput(component_loading.load_ltxav_text_encoder(text_encoder, ckpt_name, device))


class ShardDiTLoadVAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTLoadVAE",
            display_name="Load VAE (ShardDiT)",
            category=CATEGORY,
            description="Core 'Load VAE' with the device chosen from free VRAM (or given).",
            inputs=[
                io.Combo.Input("vae_name", options=folder_paths.get_filename_list("vae"), default=_first_file("vae"),
                               tooltip="A VAE file in ComfyUI/models/vae (e.g. wan_2.1_vae.safetensors)."),
                devices_input("device", tooltip=DEVICE_TOOLTIP),
            ],
            outputs=[io.Vae.Output(tooltip="A VAE that encodes/decodes on the chosen device.")],
        )

    @classmethod
    def validate_inputs(cls, device="auto"):  # only `device`: see ShardDiTLoadDiffusionModel
        return validate_one(model_loading.check_component_device, device)

    @classmethod
    def execute(cls, vae_name, device) -> io.NodeOutput:
        return io.NodeOutput(component_loading.load_vae(vae_name, device))


NODES = [ShardDiTLoadDiffusionModel, ShardDiTLoadTextEncoder, ShardDiTLoadDualTextEncoder, ShardDiTLoadLTXAVTextEncoder,
         ShardDiTLoadVAE]
