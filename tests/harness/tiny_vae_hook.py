"""Test-only hook: ComfyUI's stock VAE loaders build the harness's tiny VAEs at their tiny size.

``comfy.sd.VAE`` picks a VAE's class from its keys, but for some VAEs it fixes the widths itself
whatever the file holds: HunyuanVideo 1.5's VAE (``block_out_channels`` 128..1024, 1.26B
parameters) and HunyuanVideo 1.0's (``ch`` 128, 246M, the VAE Kandinsky 5's template loads). A
tiny VAE file (``harness.tiny_vaes``) carries the constructor arguments to change as a uint8 JSON
tensor under ``VAE_CONFIG_KEY``: ``{"comfy.sd.AutoencoderKL": {"ddconfig": {"ch": 32}}, ...}``
(dotted path of the callable ``comfy.sd.VAE`` reaches, then keyword overrides; dict values are
merged into the argument core passes). ``install_tiny_vae_hook`` wraps ``comfy.sd.VAE.__init__``
to pop that key and build with those overrides, so VAELoader, CheckpointLoaderSimple (key under
the checkpoint's ``vae.`` prefix) and any node calling ``comfy.sd.VAE`` build the tiny VAE. Core
still detects the VAE, sets its compression, memory estimates and ``process_output``. Files
without the key load exactly as before.

Self-contained (json + ComfyUI only): the test server loads this file by path from its
``sharddit_test_hooks`` custom node folder.
"""
import contextlib
import importlib
import json

VAE_CONFIG_KEY = "sharddit_tiny.vae_overrides"


@contextlib.contextmanager
def overridden(overrides: dict):
    """While inside, each dotted callable in ``overrides`` is built with its keyword overrides."""
    restore = []
    try:
        for dotted, override in overrides.items():
            module_name, name = dotted.rsplit(".", 1)
            module = importlib.import_module(module_name)
            original = getattr(module, name)

            def build(*args, _original=original, _override=override, **kwargs):
                for key, value in _override.items():
                    kwargs[key] = {**kwargs[key], **value} if isinstance(value, dict) and key in kwargs else value
                return _original(*args, **kwargs)

            setattr(module, name, build)
            restore.append((module, name, original))
        yield
    finally:
        for module, name, original in reversed(restore):
            setattr(module, name, original)


def install_tiny_vae_hook() -> None:
    """Wrap ``comfy.sd.VAE.__init__`` to honour ``VAE_CONFIG_KEY``; idempotent."""
    import comfy.sd

    original = comfy.sd.VAE.__init__
    if getattr(original, "_sharddit_tiny_hook", False):
        return

    def __init__(self, sd=None, *args, **kwargs):
        if sd is None or VAE_CONFIG_KEY not in sd:
            return original(self, sd, *args, **kwargs)
        sd = dict(sd)
        overrides = json.loads(bytes(sd.pop(VAE_CONFIG_KEY).tolist()).decode())
        with overridden(overrides):
            return original(self, sd, *args, **kwargs)

    __init__._sharddit_tiny_hook = True
    __init__.__wrapped__ = original
    comfy.sd.VAE.__init__ = __init__
