"""In-process ComfyUI for fast `comfy` tests.

``load_comfy()`` imports ComfyUI from ``COMFYUI_PATH`` in CPU mode through the pack's own
``loaders/comfyui_import.py`` (ComfyUI's root on ``sys.path``, never ours), imports ComfyUI's ``nodes`` and its built-in extra nodes, then loads this pack exactly
the way ComfyUI loads a custom node folder (``nodes.load_custom_node``). Call it from tests marked
``comfy``; it is idempotent.
"""
import asyncio
import logging
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_STATE = {}


def comfy_path() -> Path:
    path = os.environ.get("COMFYUI_PATH")
    if not path:
        raise RuntimeError("COMFYUI_PATH is not set (see tests/README.md)")
    return Path(path).resolve()


def comfy_version() -> str:
    """``__version__`` of the tree at ``COMFYUI_PATH`` (``comfyui_version.py``), "unknown" if absent."""
    path = comfy_path() / "comfyui_version.py"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return text.rsplit("=", 1)[-1].strip().strip('"') if "__version__" in text else "unknown"


def load_comfy() -> types.SimpleNamespace:
    """Import real ComfyUI in this process (CPU) with this pack loaded as a custom node."""
    if "env" in _STATE:
        return _STATE["env"]
    comfy_path()  # a clear error when COMFYUI_PATH is unset
    from sharddit.loaders.comfyui_import import import_comfyui  # the pack's one way to import ComfyUI

    import_comfyui()  # COMFYUI_PATH first on sys.path, CPU mode, PyTorch attention
    from comfy.cli_args import args

    args.disable_auto_launch = True
    # Same thread policy as the test server (harness.server): on a few shared cores, OpenMP
    # workers spin-waiting on descheduled siblings make tiny models 10-40x slower.
    import torch

    torch.set_num_threads(int(os.environ.get("SHARDDIT_TEST_THREADS", "1")))
    # ComfyUI's own `utils` package must be imported before `nodes`: nodes.py puts ComfyUI/comfy
    # on sys.path[0], after which `import utils` would find comfy/utils.py instead (main.py imports
    # utils.extra_config first for the same reason). Without this comfy_extras/nodes_images fails.
    import utils.extra_config  # noqa: F401
    import utils.install_util  # noqa: F401
    import comfy.model_management as mm  # noqa: E402  (after args are set)
    import folder_paths
    import nodes
    import comfy.utils  # noqa: F401
    import comfy.sd  # noqa: F401
    import comfy.samplers  # noqa: F401

    asyncio.run(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
    before = set(nodes.NODE_CLASS_MAPPINGS)
    ok = asyncio.run(nodes.load_custom_node(str(REPO)))
    if not ok:
        raise RuntimeError(f"ComfyUI failed to import the pack from {REPO} (see log above)")
    pack_module = sys.modules[str(REPO).replace(".", "_x_")]
    env = types.SimpleNamespace(
        nodes=nodes,
        mm=mm,
        folder_paths=folder_paths,
        pack=pack_module,
        pack_node_ids=sorted(set(nodes.NODE_CLASS_MAPPINGS) - before),
    )
    logging.getLogger().setLevel(logging.INFO)
    from .tiny_te_hook import install_tiny_te_hook
    from .tiny_vae_hook import install_tiny_vae_hook

    install_tiny_te_hook()  # test-only: lets stock CLIPLoader load the harness's tiny text encoder
    install_tiny_vae_hook()  # test-only: stock VAE loaders build the harness's narrow VAEs (tiny_vaes)
    _STATE["env"] = env
    return env


def pack_module(env, dotted: str):
    """The pack's submodule as ComfyUI imported it, e.g. ``pack_module(env, 'loaders.comfy.shard.sharded_model')``."""
    import importlib

    return importlib.import_module(f"{env.pack.__name__}.{dotted}")
