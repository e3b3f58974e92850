"""Test-only hook: ComfyUI's stock text encoder loaders read the harness's tiny text encoders.

ComfyUI builds a "wan" text encoder from its fixed umt5_config_xxl.json (5.7B parameters)
whatever the file holds; its own per-encoder override is ``model_options["<name>_model_config"]``
(``comfy.sd1_clip.SDClipModel``), which CLIPLoader never passes. A tiny text encoder file
(``harness.tiny_models.umt5_state_dict``) carries that override as a uint8 JSON tensor under
``TE_CONFIG_KEY``; ``install_tiny_te_hook`` wraps ``comfy.sd.load_text_encoder_state_dicts`` to
pass it on, so stock CLIPLoader and any node calling ``comfy.sd.load_clip`` (e.g.
ShardDiTLoadTextEncoder) build the tiny model. Files without the key load exactly as before.

Self-contained (json + ComfyUI only): the test server loads this file by path from its
``sharddit_test_hooks`` custom node folder. Never load a tiny text encoder in a ComfyUI without
the hook: it would allocate the full-size model.
"""
import json

TE_CONFIG_KEY = "sharddit_tiny.te_model_options"


def install_tiny_te_hook() -> None:
    """Wrap ``comfy.sd.load_text_encoder_state_dicts`` to honour ``TE_CONFIG_KEY``; idempotent.

    Installed in-process by ``harness.comfy_env.load_comfy()`` and in the test server by its
    ``sharddit_test_hooks`` custom node folder.
    """
    import comfy.sd

    original = comfy.sd.load_text_encoder_state_dicts
    if getattr(original, "_sharddit_tiny_hook", False):
        return

    def load_text_encoder_state_dicts(state_dicts=[], embedding_directory=None, clip_type=None,
                                      model_options={}, **kwargs):
        extra = {}
        cleaned = []
        for sd in state_dicts:
            if TE_CONFIG_KEY in sd:
                sd = dict(sd)
                extra.update(json.loads(bytes(sd.pop(TE_CONFIG_KEY).tolist()).decode()))
            cleaned.append(sd)
        if clip_type is None:
            clip_type = comfy.sd.CLIPType.STABLE_DIFFUSION
        return original(cleaned, embedding_directory=embedding_directory, clip_type=clip_type,
                        model_options={**extra, **model_options}, **kwargs)

    load_text_encoder_state_dicts._sharddit_tiny_hook = True
    load_text_encoder_state_dicts.__wrapped__ = original
    comfy.sd.load_text_encoder_state_dicts = load_text_encoder_state_dicts
