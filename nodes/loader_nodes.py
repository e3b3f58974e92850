"""Loader nodes: core's loaders plus device placement."""
import folder_paths
from comfy_api.latest import io

from ..loaders import model_loading
from .common_inputs import devices_input, reserve_vram_input

CATEGORY = "sharddit/loaders"


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
                               tooltip="A diffusion model file in ComfyUI/models/diffusion_models."),
                io.Combo.Input("weight_dtype", options=model_loading.WEIGHT_DTYPES,
                               tooltip="Weight dtype, as in core's loader: fp8 halves the VRAM the blocks need."),
                devices_input(),
                reserve_vram_input(),
            ],
            outputs=[io.Model.Output(tooltip="A MODEL whose blocks are sharded; use with any sampler.")],
        )

    @classmethod
    def validate_inputs(cls, unet_name, weight_dtype, devices, reserve_vram_gb):
        try:
            model_loading.check_file_name("diffusion_models", unet_name)
        except ValueError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, unet_name, weight_dtype, devices, reserve_vram_gb) -> io.NodeOutput:
        return io.NodeOutput(model_loading.load_sharded_diffusion_model(unet_name, weight_dtype, devices, reserve_vram_gb))


NODES = [ShardDiTLoadDiffusionModel]
