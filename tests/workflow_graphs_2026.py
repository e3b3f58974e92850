"""The 2026 families' workflows (tests/build_workflows.py writes them): Wan 2.2 T2V A14B with its two
experts, LTX-2.3 with sound, HunyuanVideo 1.5 720p, Kandinsky 5 Lite and MiniMax H3 with sound, each
with the pack's own layout, prompts and notes (model files and folders, VRAM per GPU and the mode
``parallel`` ``auto`` picks, both from ``plan`` on ComfyUI 0.29.0 with the workflow's settings; 0.33.0
for MiniMax H3, which older ComfyUI lacks).
"""
from __future__ import annotations

from build_workflows import (CREATE_VIDEO_H, PLAN_NOTE, SHORT_NEGATIVE, WAN_NEGATIVE, Graph, custom_sampler,
                             decode_nodes, files_note, files_note_node, plan_node)


def av_decode_nodes(g: Graph, first_id: int, sep_y: int, av_src, vae_src, audio: tuple, fps: float, prefix: str):
    """Separate a video+audio latent, decode the video with ShardDiT's tiled decode and the audio with
    core's ``audio = (node class, its VAE input, (node, slot) of the audio VAE)``, mux and save
    (ids ``first_id`` .. ``first_id + 4``; the separation node at ``(880, sep_y)``, the rest in the last column)."""
    sep, dec, aud, mux, save = range(first_id, first_id + 5)
    g.node(sep, "LTXVSeparateAVLatent", (880, sep_y), (320, None))
    g.link(av_src[0], av_src[1], sep, "av_latent")
    g.node(dec, "ShardDiTVAEDecodeTiled", (1240, 0), (360, None), tile_size=512, overlap=64, temporal_size=64,
           temporal_overlap=8, tile_batch_size="auto", devices="auto")
    g.link(sep, 0, dec, "samples")
    g.link(vae_src[0], vae_src[1], dec, "vae")
    cls, vae_input, audio_vae = audio
    g.node(aud, cls, (1240, 250), (360, None))
    g.link(sep, 1, aud, "samples")
    g.link(audio_vae[0], audio_vae[1], aud, vae_input)
    g.node(mux, "CreateVideo", (1240, 350), (360, CREATE_VIDEO_H), fps=fps)
    g.link(dec, 0, mux, "images")
    g.link(aud, 0, mux, "audio")
    g.node(save, "SaveVideo", (1240, 500), (360, None), grows_to=420, filename_prefix=prefix, format="auto",
           codec="auto")
    g.link(mux, 0, save, "video")


def wan22_t2v(t) -> Graph:
    """Wan 2.2 T2V A14B: two experts of the same shape, the high-noise one for the first half of
    the steps, the low-noise one for the rest (two KSamplerAdvanced over one 20-step schedule)."""
    g = Graph("wan2.2_t2v_A14B_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2202", t)
    files = [("diffusion_models", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"),
             ("diffusion_models", "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"),
             ("text_encoders", "umt5_xxl_fp8_e4m3fn_scaled.safetensors"), ("vae", "wan_2.1_vae.safetensors")]
    for nid, (title, f), y in ((1, ("High-noise expert", files[0]), 0), (2, ("Low-noise expert", files[1]), 180)):
        g.node(nid, "ShardDiTLoadDiffusionModel", (0, y), (400, None), title=title, models=[f],
               unet_name=f[1], weight_dtype="default", devices="auto", reserve_vram_gb=1.0, parallel="auto")
    g.node(3, "ShardDiTLoadTextEncoder", (0, 360), (400, None), models=[files[2]],
           clip_name=files[2][1], type="wan", device="auto")
    g.node(4, "ShardDiTLoadVAE", (0, 520), (400, None), models=[files[3]], vae_name=files[3][1], device="auto")
    g.node(5, "EmptyHunyuanLatentVideo", (0, 720), (400, None), width=832, height=480, length=81, batch_size=1)
    g.node(6, "CLIPTextEncode", (440, 0), (400, 200), title="Positive prompt",
           text="An old lighthouse keeper climbs a spiral iron staircase carrying an oil lamp, the flame swaying "
                "with each step, stormy sea visible through the narrow windows, the camera rising with him, "
                "warm lamplight against cold blue dusk")
    g.node(7, "CLIPTextEncode", (440, 250), (400, 180), title="Negative prompt", text=WAN_NEGATIVE)
    g.link(3, 0, 6, "clip")
    g.link(3, 0, 7, "clip")
    common = dict(steps=20, cfg=3.5, sampler_name="euler", scheduler="simple")
    for ms, ks, loader, y, first in ((8, 9, 1, 0, True), (10, 11, 2, 520, False)):
        g.node(ms, "ModelSamplingSD3", (880, y), (330, None), shift=8.0)
        g.link(loader, 0, ms, "model")
        g.node(ks, "KSamplerAdvanced", (880, y + 110), (330, None), title="High noise: steps 0-10" if first
               else "Low noise: steps 10-20", add_noise="enable" if first else "disable", noise_seed=42 if first else 0,
               start_at_step=0 if first else 10, end_at_step=10 if first else 10000,
               return_with_leftover_noise="enable" if first else "disable", **common)
        g.link(ms, 0, ks, "model")
        g.link(6, 0, ks, "positive")
        g.link(7, 0, ks, "negative")
    g.link(5, 0, 9, "latent_image")
    g.link(9, 0, 11, "latent_image")
    decode_nodes(g, 12, 1250, (11, 0), (4, 0), 16.0, "video/sharddit_wan2.2_t2v_A14B")
    files_note_node(g, 15, files_note("Wan 2.2 T2V A14B, 832×480, 81 frames", files, WAN22_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 16, "wan2.2-t2v-a14b", 832, 480, 81, "fp8", 3.5)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3, 4])
    g.group("2 - Video size", [5])
    g.group("3 - Prompt", [6, 7])
    g.group("4 - High-noise expert", [8, 9])
    g.group("5 - Low-noise expert", [10, 11])
    g.group("6 - Decode and save", [12, 13, 14])
    return g


WAN22_NOTE = (
    "Wan 2.2 A14B is two 14B DiTs of the same shape: the high-noise expert lays out the motion in steps 0-10, "
    "the low-noise expert refines the detail in steps 10-20. Each loader shards its own expert; the second "
    "KSampler (Advanced) continues from the first one's latent without adding noise.\n\n"
    "**VRAM per GPU** (`plan`, two 16 GiB cards, fp8, per expert): cuda:0 6.8 GiB weights + 2.7 activations "
    "+ 0.7 prefetch, cuda:1 6.5 + 2.7 + 0.7. One 16 GiB card cannot hold an expert (18.6 GiB). `parallel` "
    "`auto` picks **sequence** here (cond and uncond on their own GPU: 1.99× one GPU predicted); "
    "`blocks` fits too (12.1 GiB on cuda:0) but runs no faster than one GPU.")


def ltx23_t2v(t) -> Graph:
    """LTX-2.3 (22B, video with sound): one checkpoint holds the DiT and both VAEs; core's loader and
    the Shard node, Gemma 3 through ShardDiT's LTXAV text encoder loader, one stage at 768×512."""
    g = Graph("ltx2.3_t2v_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2505", t, min_comfyui="0.29.0")
    files = [("checkpoints", "ltx-2.3-22b-dev-fp8.safetensors"), ("text_encoders", "gemma_3_12B_it_fp4_mixed.safetensors")]
    g.node(1, "CheckpointLoaderSimple", (0, 0), (400, None), title="LTX-2.3 22B (DiT + VAEs)", models=[files[0]],
           ckpt_name=files[0][1])
    g.node(2, "ShardDiTShardModel", (0, 150), (400, None), devices="auto", reserve_vram_gb=1.0, parallel="auto")
    g.link(1, 0, 2, "model")
    g.node(3, "ShardDiTLoadLTXAVTextEncoder", (0, 310), (400, None), models=[files[1], files[0]],
           text_encoder=files[1][1], ckpt_name=files[0][1], device="auto")
    g.node(4, "LTXVAudioVAELoader", (0, 470), (400, None), title="Audio VAE (from the checkpoint)", ckpt_name=files[0][1])
    g.node(5, "EmptyLTXVLatentVideo", (0, 640), (400, None), width=768, height=512, length=97, batch_size=1)
    g.node(6, "LTXVEmptyLatentAudio", (0, 820), (400, None), frames_number=97, frame_rate=25.0, batch_size=1)
    g.link(4, 0, 6, "audio_vae")
    g.node(7, "LTXVConcatAVLatent", (0, 1000), (400, None))
    g.link(5, 0, 7, "video_latent")
    g.link(6, 0, 7, "audio_latent")
    g.node(8, "CLIPTextEncode", (440, 0), (400, 230), title="Positive prompt",
           text="A street drummer plays a steel pan under a railway bridge at night. Trains rumble overhead and "
                "the sound echoes off the wet brick walls; passers-by slow down, one of them starts to dance. "
                "Handheld camera at chest height, sodium lamps, light drizzle, the clang of the steel pan and the "
                "rhythm of the train blending together.")
    g.node(9, "CLIPTextEncode", (440, 280), (400, 150), title="Negative prompt", text=SHORT_NEGATIVE)
    g.link(3, 0, 8, "clip")
    g.link(3, 0, 9, "clip")
    g.node(10, "LTXVConditioning", (440, 480), (300, None), frame_rate=25.0)
    g.link(8, 0, 10, "positive")
    g.link(9, 0, 10, "negative")
    g.node(11, "LTXVScheduler", (880, 0), (320, None), steps=20, max_shift=2.05, base_shift=0.95, stretch=True,
           terminal=0.1)
    g.link(7, 0, 11, "latent")
    g.node(12, "KSamplerSelect", (880, 210), (320, None), sampler_name="euler_ancestral")
    g.node(13, "RandomNoise", (880, 320), (320, None), noise_seed=42)
    g.node(14, "CFGGuider", (880, 450), (320, None), cfg=4.0)
    g.link(2, 0, 14, "model")
    g.link(10, 0, 14, "positive")
    g.link(10, 1, 14, "negative")
    custom_sampler(g, 15, (880, 620), noise=(13, 0), guider=(14, 0), sampler=(12, 0), sigmas=(11, 0), latent=(7, 0))
    av_decode_nodes(g, 16, 780, (15, 0), (1, 2), ("LTXVAudioVAEDecode", "audio_vae", (4, 0)), 25.0,
                    "video/sharddit_ltx2.3_t2v")
    files_note_node(g, 21, files_note("LTX-2.3 T2V with sound, 768×512, 97 frames", files, LTX23_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 22, "ltx-2.3", 768, 512, 97, "fp8", 4.0)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3, 4])
    g.group("2 - Video and sound", [5, 6, 7])
    g.group("3 - Prompt", [8, 9, 10])
    g.group("4 - Sample", [11, 12, 13, 14, 15, 16])
    g.group("5 - Decode and save", [17, 18, 19, 20])
    return g


LTX23_NOTE = (
    "The checkpoint holds the DiT, the video VAE and the audio VAE: core's Load Checkpoint reads it from "
    "`models/checkpoints/`, **Shard DiT Blocks (ShardDiT)** spreads the DiT's 48 blocks over the GPUs, and the "
    "Gemma 3 text encoder loader takes the same checkpoint for its text projection. Video and sound are sampled "
    "together as one latent and split again for decoding.\n\n"
    "**VRAM per GPU** (`plan`, two 16 GiB cards, fp8, CFG 4): cuda:0 10.2 GiB weights + 0.7 activations + 0.7 "
    "prefetch, cuda:1 9.4 + 0.5 + 0.7; one 16 GiB card is short (20.6 GiB). `parallel` `auto` picks **sequence** "
    "(cond and uncond each on its own GPU: 1.96× one GPU predicted); on one 24 GiB card it keeps the DiT whole.")


def hunyuan15_t2v(t) -> Graph:
    g = Graph("hunyuan_video_1.5_720p_t2v_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2606", t, min_comfyui="0.29.0")
    files = [("diffusion_models", "hunyuanvideo1.5_720p_t2v_fp16.safetensors"),
             ("text_encoders", "qwen_2.5_vl_7b_fp8_scaled.safetensors"),
             ("text_encoders", "byt5_small_glyphxl_fp16.safetensors"), ("vae", "hunyuanvideo15_vae_fp16.safetensors")]
    g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, None), models=[files[0]],
           unet_name=files[0][1], weight_dtype="default", devices="auto", reserve_vram_gb=1.0, parallel="auto")
    g.node(2, "ShardDiTLoadDualTextEncoder", (0, 180), (400, None), models=[files[1], files[2]],
           clip_name1=files[1][1], clip_name2=files[2][1], type="hunyuan_video_15", device="auto")
    g.node(3, "ShardDiTLoadVAE", (0, 380), (400, None), models=[files[3]], vae_name=files[3][1], device="auto")
    g.node(4, "EmptyHunyuanVideo15Latent", (0, 580), (400, None), width=1280, height=720, length=121, batch_size=1)
    g.node(5, "CLIPTextEncode", (440, 0), (400, 200), title="Positive prompt",
           text="A glassblower shapes a glowing orange bulb on the end of a long pipe, turning it slowly over the "
                "furnace mouth; sparks drift up, the workshop is dim and warm, close-up that slowly pulls back "
                "to show the whole bench")
    g.node(6, "CLIPTextEncode", (440, 250), (400, 150), title="Negative prompt", text=SHORT_NEGATIVE)
    g.link(2, 0, 5, "clip")
    g.link(2, 0, 6, "clip")
    g.node(7, "ModelSamplingSD3", (880, 0), (330, None), shift=7.0)
    g.link(1, 0, 7, "model")
    g.node(8, "ShardDiTKSampler", (880, 110), (330, None), seed=42, steps=20, cfg=6.0, sampler_name="euler",
           scheduler="simple", denoise=1.0, devices="auto", parallel="auto")
    g.link(7, 0, 8, "model")
    g.link(5, 0, 8, "positive")
    g.link(6, 0, 8, "negative")
    g.link(4, 0, 8, "latent_image")
    decode_nodes(g, 9, 1250, (8, 0), (3, 0), 24.0, "video/sharddit_hunyuan_video_1.5_t2v")
    files_note_node(g, 12, files_note("HunyuanVideo 1.5 T2V 720p, 1280×720, 121 frames", files,
                                      HV15_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 13, "hunyuanvideo-1.5", 1280, 720, 121, "fp16", 6.0)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3])
    g.group("2 - Video size", [4])
    g.group("3 - Prompt", [5, 6])
    g.group("4 - Sample", [7, 8])
    g.group("5 - Decode and save", [9, 10, 11])
    return g


HV15_NOTE = (
    "HunyuanVideo 1.5's two text encoders (Qwen2.5-VL for the prompt, ByT5 for text drawn in the picture) load "
    "together through **Load Dual Text Encoder (ShardDiT)**, type `hunyuan_video_15`. Real CFG (6) with a "
    "negative prompt: each step runs the DiT twice.\n\n"
    "**VRAM per GPU** (`plan`, two 24 GiB cards, fp16): cuda:0 7.9 GiB weights + 5.3 activations + 0.6 "
    "prefetch, cuda:1 7.6 + 4.8 + 0.6; one 24 GiB card is short (25.1 GiB). `parallel` `auto` picks "
    "**sequence** (cond and uncond each on its own GPU: 2.0× one GPU predicted).")


def kandinsky5_t2v(t) -> Graph:
    g = Graph("kandinsky5_lite_t2v_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2707", t, min_comfyui="0.29.0")
    files = [("diffusion_models", "kandinsky5lite_t2v_sft_5s.safetensors"),
             ("text_encoders", "qwen_2.5_vl_7b_fp8_scaled.safetensors"), ("text_encoders", "clip_l.safetensors"),
             ("vae", "hunyuan_video_vae_bf16.safetensors")]
    g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, None), models=[files[0]],
           unet_name=files[0][1], weight_dtype="default", devices="auto", reserve_vram_gb=1.0, parallel="auto")
    g.node(2, "ShardDiTLoadDualTextEncoder", (0, 180), (400, None), models=[files[1], files[2]],
           clip_name1=files[1][1], clip_name2=files[2][1], type="kandinsky5", device="auto")
    g.node(3, "ShardDiTLoadVAE", (0, 380), (400, None), models=[files[3]], vae_name=files[3][1], device="auto")
    g.node(4, "CLIPTextEncode", (440, 0), (400, 200), title="Positive prompt",
           text="A paper boat drifts down a rain-filled gutter past fallen autumn leaves, a child's boots splash "
                "alongside, low camera at water level, overcast light, shallow depth of field")
    g.node(5, "CLIPTextEncode", (440, 250), (400, 150), title="Negative prompt", text=SHORT_NEGATIVE)
    g.link(2, 0, 4, "clip")
    g.link(2, 0, 5, "clip")
    g.node(6, "Kandinsky5ImageToVideo", (440, 500), (400, None), width=768, height=512, length=121, batch_size=1)
    g.link(4, 0, 6, "positive")
    g.link(5, 0, 6, "negative")
    g.link(3, 0, 6, "vae")
    g.node(7, "ModelSamplingSD3", (880, 0), (330, None), shift=5.0)
    g.link(1, 0, 7, "model")
    g.node(8, "ShardDiTKSampler", (880, 110), (330, None), seed=42, steps=50, cfg=5.0,
           sampler_name="euler_ancestral", scheduler="beta", denoise=1.0, devices="auto", parallel="auto")
    g.link(7, 0, 8, "model")
    g.link(6, 0, 8, "positive")
    g.link(6, 1, 8, "negative")
    g.link(6, 2, 8, "latent_image")
    decode_nodes(g, 9, 1250, (8, 0), (3, 0), 24.0, "video/sharddit_kandinsky5_lite_t2v", tile=(256, 64, 64, 8))
    files_note_node(g, 12, files_note("Kandinsky 5 Lite T2V, 768×512, 121 frames", files, K5_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 13, "kandinsky5-lite", 768, 512, 121, "bf16", 5.0)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3])
    g.group("2 - Prompt and video size", [4, 5, 6])
    g.group("3 - Sample", [7, 8])
    g.group("4 - Decode and save", [9, 10, 11])
    return g


K5_NOTE = (
    "Kandinsky 5 Lite reads the prompt twice: Qwen2.5-VL and CLIP-L, loaded together by **Load Dual Text "
    "Encoder (ShardDiT)**, type `kandinsky5`. Its latent comes from Kandinsky5ImageToVideo, here without a "
    "start image (text to video); it decodes with HunyuanVideo's VAE.\n\n"
    "**VRAM per GPU** (`plan`, two 8 GiB cards, bf16, cfg 5): the 2B DiT fits one card (3.7 GiB weights + 2.3 "
    "activations), and `parallel` `auto` picks **sequence**: cond on one GPU, uncond on the other, each holding "
    "half the blocks and streaming the rest (cuda:0 1.9 GiB weights + 1.3 activations + 0.2 ring), about 2x "
    "faster than one GPU (core's CFG split predicts the same with a full copy on each).")


def minimax_h3_t2v(t) -> Graph:
    """MiniMax H3 (ComfyUI 0.33): text to video with its sound track. One latent holds both; core's
    custom sampler runs it guided by the prompt alone, Separate AV Latent hands each part to its VAE."""
    g = Graph("minimax_h3_t2v_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2808", t, min_comfyui="0.33.0")
    files = [("diffusion_models", "minimax_h3_fl2va_pruned_int8_convrot.safetensors"),
             ("text_encoders", "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"),
             ("vae", "minimax_h3_video_vae_fp16.safetensors"), ("vae", "minimax_h3_audio_vae_fp32.safetensors")]
    g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, None), models=[files[0]],
           unet_name=files[0][1], weight_dtype="default", devices="auto", reserve_vram_gb=1.0, parallel="auto")
    g.node(2, "ShardDiTLoadTextEncoder", (0, 180), (400, None), models=[files[1]],
           clip_name=files[1][1], type="minimax", device="auto")
    g.node(3, "ShardDiTLoadVAE", (0, 340), (400, None), title="Video VAE", models=[files[2]], vae_name=files[2][1],
           device="auto")
    g.node(4, "VAELoader", (0, 480), (400, None), title="Audio VAE", models=[files[3]], vae_name=files[3][1])
    g.node(5, "EmptyMiniMaxH3LatentAV", (0, 680), (400, None), width=1344, height=768, length=124)
    g.node(6, "CLIPTextEncode", (440, 0), (400, 300), title="Prompt",
           text="A blacksmith works at an anvil in a stone forge at night. He draws a glowing bar from the coals, "
                "turns it with tongs and strikes it: each hammer blow rings out and throws a burst of sparks. "
                "The bellows wheeze, the fire roars, rain drums on the tin roof outside. The camera circles slowly "
                "at waist height, orange firelight on his face and leather apron, cold blue light at the door.")
    g.link(2, 0, 6, "clip")
    g.node(7, "RandomNoise", (880, 0), (320, None), noise_seed=42)
    g.node(8, "KSamplerSelect", (880, 130), (320, None), sampler_name="res_multistep")
    g.node(9, "BasicScheduler", (880, 240), (320, None), scheduler="simple", steps=20, denoise=1.0)
    g.link(1, 0, 9, "model")
    g.node(10, "BasicGuider", (880, 400), (320, None))
    g.link(1, 0, 10, "model")
    g.link(6, 0, 10, "conditioning")
    custom_sampler(g, 11, (880, 500), noise=(7, 0), guider=(10, 0), sampler=(8, 0), sigmas=(9, 0), latent=(5, 0))
    av_decode_nodes(g, 12, 680, (11, 0), (3, 0), ("VAEDecodeAudio", "vae", (4, 0)), 24.0,
                    "video/sharddit_minimax_h3_t2v")
    files_note_node(g, 17, files_note("MiniMax H3 with sound, 1344×768, 124 frames", files,
                                      H3_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 18, "minimax-h3-fp8", 1344, 768, 124, "fp8", 1.0)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3, 4])
    g.group("2 - Video and sound", [5])
    g.group("3 - Prompt", [6])
    g.group("4 - Sample", [7, 8, 9, 10, 11, 12])
    g.group("5 - Decode and save", [13, 14, 15, 16])
    return g


# `plan` on ComfyUI 0.33.0 (--model minimax-h3-fp8 --size 1344x768 --frames 124, cfg 1, --reserve-vram-gb 1;
# workflows/README.md has the command). The int8 DiT file takes as many bytes per weight as fp8.
H3_NOTE = (
    "One latent holds the video and its sound (124 frames = 5 s at 24 fps); the prompt alone guides the sampler "
    "(Basic Guider, CFG 1, as H3 is published) and Separate AV Latent hands each part to its VAE. Where no single "
    "device holds the Qwen3-VL 32B text encoder (type `minimax`), its loader splits its layers over them.\n\n"
    "**VRAM per GPU** (`plan`, two 24 GiB cards, fp8, CFG 1): cuda:0 15.9 GiB weights + 3.3 activations + 1.2 "
    "prefetch, cuda:1 15.0 + 2.9 + 1.2; one 24 GiB card is short (35.6 GiB). `parallel` `auto` picks "
    "**sequence** (the video's tokens split over the GPUs: 1.93× one GPU predicted, 3.77× on four); `plan` "
    "then puts the text encoder on the CPU (about a minute per prompt).")


GRAPHS_2026 = [wan22_t2v, ltx23_t2v, hunyuan15_t2v, kandinsky5_t2v, minimax_h3_t2v]
