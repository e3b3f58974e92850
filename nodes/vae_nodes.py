"""VAE nodes: core's tiled decode with batched tiles spread over devices."""
from comfy_api.latest import io

from ..loaders.comfy.vae import tiled_decode
from .common_inputs import devices_input, validate_one

CATEGORY = "sharddit/vae"

DEVICES_TOOLTIP = (
    "Where tile batches decode, one VAE copy per entry. 'auto' = the VAE's own device, plus every other "
    "GPU when the VAE is on a GPU. Or a list such as 'cuda:0,cuda:1'; 'cpu' may repeat ('cpu,cpu' = two "
    "CPU workers, for testing). Extra copies are loaded through ComfyUI, which accounts for their memory. "
    "Ignored for image (non-video) VAEs."
)
BATCH_TOOLTIP = (
    "Tiles decoded per VAE call (equal-shaped tiles are stacked; edge tiles form their own batches). "
    "'auto' sizes it from free memory and ComfyUI's decode-memory estimate for one tile, at most the tiles "
    "per device. A number such as '1' or '4' forces it. Ignored for image (non-video) VAEs."
)


class ShardDiTVAEDecodeTiled(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ShardDiTVAEDecodeTiled",
            display_name="VAE Decode Tiled (ShardDiT)",
            category=CATEGORY,
            description="Core VAE Decode (Tiled) with the same tiles and result, but equal-shaped tiles are "
                        "decoded in batches, spread over several devices, with progress and interrupt "
                        "between batches. For video VAEs (Wan 2.1/2.2, LTX-Video, LTX-2, HunyuanVideo 1.0/1.5, "
                        "Kandinsky 5). Given LTX-2's audio+video latent it decodes the video; decode the audio "
                        "with core's LTXV Audio VAE Decode.",
            inputs=[
                io.Latent.Input("samples", tooltip="The latent to decode (5-D video latent for a video VAE; "
                                                  "of LTX-2's audio+video latent, the video part)."),
                io.Vae.Input("vae", tooltip="The VAE used for decoding."),
                io.Int.Input("tile_size", default=512, min=64, max=4096, step=32,
                             tooltip="Tile width and height in pixels (divided by the VAE's spatial compression)."),
                io.Int.Input("overlap", default=64, min=0, max=4096, step=32,
                             tooltip="Pixels tiles overlap and blend over. Above tile_size/4 it is cut to "
                                     "tile_size/4, as core does."),
                io.Int.Input("temporal_size", default=64, min=8, max=4096, step=4,
                             tooltip="Only used for video VAEs: amount of frames to decode at a time "
                                     "(divided by the VAE's temporal compression, at least 2 latent frames)."),
                io.Int.Input("temporal_overlap", default=8, min=4, max=4096, step=4,
                             tooltip="Only used for video VAEs: amount of frames to overlap. Above "
                                     "temporal_size/2 it is halved, as core does; at least 1 latent frame."),
                io.String.Input("tile_batch_size", default="auto", multiline=False, tooltip=BATCH_TOOLTIP),
                devices_input(tooltip=DEVICES_TOOLTIP),
            ],
            outputs=[io.Image.Output(tooltip="Decoded frames (frames x height x width x channels), as core's "
                                             "VAE Decode (Tiled) returns them.")],
        )

    @classmethod
    def validate_inputs(cls, devices="auto") -> bool | str:
        # ComfyUI shows a validate_inputs message under EVERY input the method takes, so it takes
        # only `devices`; tile_batch_size is parsed first thing in execute, before any VAE copy.
        return validate_one(tiled_decode.check_decode_devices, devices)

    @classmethod
    def execute(cls, samples, vae, tile_size=512, overlap=64, temporal_size=64, temporal_overlap=8,
                tile_batch_size="auto", devices="auto") -> io.NodeOutput:
        images = tiled_decode.decode_tiled(vae, samples, tile_size, overlap, temporal_size, temporal_overlap,
                                         tile_batch_size=tile_batch_size, devices=devices)
        return io.NodeOutput(images)


NODES = [ShardDiTVAEDecodeTiled]
