"""Test-only hook: ComfyUI's stock text encoder loaders read the harness's tiny text encoders.

ComfyUI builds a "wan" text encoder from its fixed umt5_config_xxl.json (5.7B parameters)
whatever the file holds; its own per-encoder override is ``model_options["<name>_model_config"]``
(``comfy.sd1_clip.SDClipModel``), which CLIPLoader never passes. A tiny text encoder file
(``harness.tiny_models.umt5_state_dict``) carries that override as a uint8 JSON tensor under
``TE_CONFIG_KEY``; ``install_tiny_te_hook`` wraps ``comfy.sd.load_text_encoder_state_dicts`` to
pass it on, so stock CLIPLoader and any node calling ``comfy.sd.load_clip`` (e.g.
ShardDiTLoadTextEncoder) build the tiny model. Files without the key load exactly as before.

Two more keys in that JSON cover encoders whose sizes core hard-codes outside any config
(``harness.tiny_encoders``): ``TINY_VOCAB_ROWS`` (Qwen2.5-VL's 152,064-row and CLIP-L's 49,408-row
token tables: the file stores that many rows and a token id looks up row ``id % rows``, since
core's own tokenizers give the full-range ids) and ``TINY_LTXAV`` (LTX-2's Gemma projection, built
by ``comfy.text_encoders.lt.LTXAVTEModel`` at 3840 x 49 inputs: it takes the shapes the checkpoint's
``text_embedding_projection`` weights have). Both become ``model_options["custom_operations"]``:
core's ``comfy.ops.manual_cast`` with only those layers' shapes changed, so every other layer runs
core's own code and kernels. ``TINY_MIN_LENGTH`` ({tokenizer name: n}) lowers a tokenizer's
padding minimum (Gemma 3 12B's pads every prompt to 1024 tokens: ~4 s per encode through 48
tiny layers on one CPU thread; core's ``gemma3_12b_min_length`` tokenizer option does not reach
``Gemma3_Tokenizer``, which drops its keyword arguments).

Self-contained (json + ComfyUI only): the test server loads this file by path from its
``sharddit_test_hooks`` custom node folder. Never load a tiny text encoder in a ComfyUI without
the hook: it would allocate the full-size model.
"""
import json

TE_CONFIG_KEY = "sharddit_tiny.te_model_options"
TINY_VOCAB_ROWS = "sharddit_tiny_vocab_rows"
TINY_LTXAV = "sharddit_tiny_ltxav"
TINY_MIN_LENGTH = "sharddit_tiny_min_length"
# comfy/text_encoders/lt.py LTXAVTEModel: Gemma 3 12B's 3840 features x 49 hidden states in, 3840
# out (LTX-2, "single_linear") or 4096 video + 2048 audio out (LTX-2.3, "dual_linear").
LTXAV_IN = 3840 * 49
LTXAV_PROJECTIONS = (("text_embedding_projection.video_aggregate_embed.weight", 4096),
                     ("text_embedding_projection.audio_aggregate_embed.weight", 2048),
                     ("text_embedding_projection.aggregate_embed.weight", 3840),
                     ("text_embedding_projection.weight", 3840))


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
        ops = _tiny_ops(extra.pop(TINY_VOCAB_ROWS, None), _ltxav_shapes(cleaned) if extra.pop(TINY_LTXAV, None) else {})
        if ops is not None and "custom_operations" not in model_options:
            extra["custom_operations"] = ops
        min_lengths = extra.pop(TINY_MIN_LENGTH, {})
        clip = original(cleaned, embedding_directory=embedding_directory, clip_type=clip_type,
                        model_options={**extra, **model_options}, **kwargs)
        for name, length in min_lengths.items():
            if hasattr(clip.tokenizer, name):
                getattr(clip.tokenizer, name).min_length = length
        return clip

    load_text_encoder_state_dicts._sharddit_tiny_hook = True
    load_text_encoder_state_dicts.__wrapped__ = original
    comfy.sd.load_text_encoder_state_dicts = load_text_encoder_state_dicts


def _ltxav_shapes(state_dicts) -> dict:
    """Core's hard-coded LTX-2 projection shape (in, out) -> the checkpoint's (in, out)."""
    shapes = {}
    for sd in state_dicts:
        for key, core_out in LTXAV_PROJECTIONS:
            if key in sd:
                out_features, in_features = sd[key].shape
                shapes[(LTXAV_IN, core_out)] = (in_features, out_features)
    return shapes


def _tiny_ops(vocab_rows, linear_shapes: dict):
    """``comfy.ops.manual_cast`` (what core uses for an unquantized text encoder) with token tables
    of more than ``vocab_rows`` rows folded to ``vocab_rows`` and the Linear shapes in
    ``linear_shapes`` replaced; None when neither applies."""
    if not vocab_rows and not linear_shapes:
        return None
    import comfy.ops

    base = comfy.ops.manual_cast

    class Linear(base.Linear):
        def __init__(self, in_features, out_features, *args, **kwargs):
            in_features, out_features = linear_shapes.get((in_features, out_features), (in_features, out_features))
            super().__init__(in_features, out_features, *args, **kwargs)

    class Embedding(base.Embedding):
        def __init__(self, num_embeddings, *args, **kwargs):
            folded = bool(vocab_rows) and num_embeddings > vocab_rows
            super().__init__(vocab_rows if folded else num_embeddings, *args, **kwargs)
            self.folded = folded

        def forward(self, input, *args, **kwargs):
            return super().forward(input % self.num_embeddings if self.folded else input, *args, **kwargs)

    return type("sharddit_tiny_ops", (base,), {"Linear": Linear, "Embedding": Embedding})
