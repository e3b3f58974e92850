"""Sampling nodes: shard a MODEL's blocks over devices, and a KSampler that does it for you."""
import comfy.samplers
from comfy_api.latest import io

from ..loaders.comfy.loading import model_loading
from ..loaders.comfy.shard import sampling, pipeline
from .common_inputs import CheckedCombo, devices_input, parallel_input, reserve_vram_input, validate_one
from ..parallel.placement.plan_types import DEFAULT_DEVICES
from ..parallel.cost.mode import DEFAULT_PARALLEL

CATEGORY = "sharddit/sampling"


class ShardDiTShardModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTShardModel",
            display_name="Shard DiT Blocks (ShardDiT)",
            category=CATEGORY,
            description="Spread a video DiT's transformer blocks over several devices; each block computes "
                        "where its weights live and only activations travel. Works on a MODEL from any loader.",
            inputs=[
                io.Model.Input("model", tooltip="A Wan 2.1/2.2, LTX-Video, HunyuanVideo or Flux MODEL (core loader, GGUF, after LoRAs)."),
                devices_input(),
                reserve_vram_input(),
                parallel_input(),
            ],
            outputs=[io.Model.Output(tooltip="The same model with its blocks sharded; use it with any sampler.")],
        )

    @classmethod
    def validate_inputs(cls, devices=DEFAULT_DEVICES):
        # one input: ComfyUI shows the message under every input this method takes; reserve_vram_gb
        # gets core's min/max check, parallel is a CheckedCombo (see common_inputs)
        return validate_one(model_loading.check_devices, devices)

    @classmethod
    def execute(cls, model, devices, reserve_vram_gb, parallel=DEFAULT_PARALLEL) -> io.NodeOutput:
        model_loading.check_placement(devices, reserve_vram_gb)  # a linked devices, a NaN reserve: unseen until now
        return io.NodeOutput(pipeline.shard_model(model, devices=devices, reserve_vram_gb=reserve_vram_gb,
                                                        parallel=parallel))


class ShardDiTKSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTKSampler",
            display_name="KSampler (ShardDiT)",
            category=CATEGORY,
            description="Core KSampler (same maths, same results) that first shards the MODEL's blocks "
                        "over `devices` unless it is sharded already.",
            inputs=[
                io.Model.Input("model", tooltip="The model used for denoising the input latent."),
                io.Int.Input("seed", default=0, min=0, max=0xffffffffffffffff, control_after_generate=True,
                             tooltip="The random seed used for creating the noise."),
                io.Int.Input("steps", default=20, min=1, max=10000, tooltip="The number of steps used in the denoising process."),
                io.Float.Input("cfg", default=8.0, min=0.0, max=100.0, step=0.1, round=0.01,
                               tooltip="Classifier-free guidance scale; > 1 runs cond and uncond."),
                CheckedCombo("sampler_name", options=comfy.samplers.KSampler.SAMPLERS, default="euler",
                             tooltip="The sampling algorithm (core's list)."),
                CheckedCombo("scheduler", options=comfy.samplers.KSampler.SCHEDULERS, default="simple",
                             tooltip="How noise is removed over the steps (core's list)."),
                io.Conditioning.Input("positive", tooltip="What to include in the video."),
                io.Conditioning.Input("negative", tooltip="What to exclude from the video."),
                io.Latent.Input("latent_image", tooltip="The latent to denoise."),
                io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01,
                               tooltip="Amount of denoising applied; lower keeps more of the input latent."),
                devices_input(tooltip="Used only when the MODEL is not sharded yet. " + devices_input().tooltip),
                parallel_input(),
            ],
            outputs=[io.Latent.Output(tooltip="The denoised latent.")],
        )

    @classmethod
    def validate_inputs(cls, devices=DEFAULT_DEVICES):  # one input: see ShardDiTShardModel
        return validate_one(model_loading.check_devices, devices)

    @classmethod
    def execute(cls, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                denoise=1.0, devices=DEFAULT_DEVICES, parallel=DEFAULT_PARALLEL) -> io.NodeOutput:
        out = sampling.ksample(model, devices, seed, steps, cfg, sampler_name, scheduler, positive, negative,
                               latent_image, denoise, parallel)
        return io.NodeOutput(out)


NODES = [ShardDiTShardModel, ShardDiTKSampler]
