"""pytest fixtures for `comfy` tests (loaded by tests/conftest.py via ``pytest_plugins``).

- ``comfy_env``: in-process ComfyUI on CPU with this pack loaded (``harness.comfy_env.load_comfy``).
- ``tiny_models``: tiny random-weight models written once per session into a ComfyUI-style models
  dir and registered with ``folder_paths`` (see ``harness.tiny_models``); ComfyUI template file
  names (``TEMPLATE_NAMES``) are symlinked to them. Add names with ``tiny_models.add_aliases``.
- ``comfy_server``: one headless ComfyUI subprocess per session with this pack and the tiny
  models (``harness.server``).

Each skips (never fails) when COMFYUI_PATH is unset, so a test that forgets the `comfy` marker
is skipped too.
"""
import os

import pytest

# ComfyUI template file names (comfyui-workflow-templates) → tiny model kind. Symlinks: free.
TEMPLATE_NAMES = {
    "wan2.1_t2v_14B_fp16.safetensors": "wan21_t2v",
    "wan2.1_t2v_14B_fp8_e4m3fn.safetensors": "wan21_t2v",
    "wan2.1_t2v_1.3B_fp16.safetensors": "wan21_t2v",
    "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": "wan22_high_noise",
    "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": "wan22_low_noise",
    "wan2.2_t2v_high_noise_14B_fp16.safetensors": "wan22_high_noise",
    "wan2.2_t2v_low_noise_14B_fp16.safetensors": "wan22_low_noise",
    "hunyuan_video_t2v_720p_bf16.safetensors": "hunyuan_video",
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors": "umt5",
    "umt5_xxl_fp16.safetensors": "umt5",
    "wan_2.1_vae.safetensors": "wan21_vae",
}


def _require_comfy():
    if not os.environ.get("COMFYUI_PATH"):
        pytest.skip("needs ComfyUI: set COMFYUI_PATH (see tests/README.md)")


@pytest.fixture(scope="session")
def comfy_env():
    """``types.SimpleNamespace(nodes, mm, folder_paths, pack, pack_node_ids)`` of in-process ComfyUI."""
    _require_comfy()
    from harness.comfy_env import load_comfy

    return load_comfy()


@pytest.fixture(scope="session")
def tiny_models(comfy_env, tmp_path_factory):
    """``harness.tiny_models.TinyModels`` written once per session, registered with folder_paths."""
    from harness.tiny_models import default_cache_dir, register_with_folder_paths, write_tiny_models

    models = write_tiny_models(tmp_path_factory.mktemp("tiny_models"), names=TEMPLATE_NAMES,
                               cache_dir=default_cache_dir())
    register_with_folder_paths(models)
    return models


@pytest.fixture(scope="session")
def comfy_server(tiny_models, tmp_path_factory):
    """``harness.server.ComfyServer``: ComfyUI on 127.0.0.1:<free port>, CPU, this pack + tiny models.

    Started once per session, stopped at its end; on a start failure the log tail is in the error.
    """
    from harness.comfy_env import comfy_path
    from harness.server import ComfyServer

    server = ComfyServer(comfy_path(), tmp_path_factory.mktemp("comfy_server"), tiny_models.root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
