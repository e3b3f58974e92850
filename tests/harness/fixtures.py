"""pytest fixtures for `comfy` tests (loaded by tests/conftest.py via ``pytest_plugins``).

- ``comfy_env``: in-process ComfyUI on CPU with this pack loaded (``harness.comfy_env.load_comfy``).
- ``tiny_models``: tiny random-weight models written once per session into a ComfyUI-style models
  dir and registered with ``folder_paths`` (see ``harness.tiny_models``); ComfyUI template file
  names (``TEMPLATE_NAMES``) are symlinked to them. Add names with ``tiny_models.add_aliases``.
- ``comfy_server``: one headless ComfyUI subprocess per session with this pack and the tiny
  models (``harness.server``).
- ``workflow_models``: every model file the shipped workflows name exists on ``comfy_server``
  (tiny models under the real names: ``WORKFLOW_NAMES``, ``CHECKPOINT_NAMES``).

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
# Real file names the shipped workflows use → tiny model kind (beyond TEMPLATE_NAMES). Kinds for
# names that are only validated or loaded in the UI (never executed) need not match the architecture.
WORKFLOW_NAMES = {
    "wan2.1_t2v_14B_fp8_scaled.safetensors": "wan21_t2v",
    "hunyuan_video_t2v_720p_bf16.safetensors": "hunyuan_video",
    "t5xxl_fp16.safetensors": "umt5",
    "clip_l.safetensors": "umt5",
    "llava_llama3_fp8_scaled.safetensors": "umt5",
    "hunyuan_video_vae_bf16.safetensors": "wan21_vae",
}
# models/checkpoints is not one of the tiny models' folders: the LTX-Video checkpoint name is
# linked into the server's own models dir (--base-directory) instead.
CHECKPOINT_NAMES = {"ltxv-13b-0.9.7-dev.safetensors": "ltxv"}


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
def env(comfy_env):
    """Short name of ``comfy_env`` for the in-process sampling tests."""
    return comfy_env


@pytest.fixture(scope="session")
def tiny():
    """``harness.tiny_models``: builders of the tiny state dicts (no files)."""
    from harness import tiny_models as builders

    return builders


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


@pytest.fixture(scope="session")
def workflow_models(tiny_models, comfy_server):
    """``tiny_models`` with every model file any shipped workflow names present on ``comfy_server``:
    the names in ``WORKFLOW_NAMES`` / ``CHECKPOINT_NAMES`` as tiny models of their kind (the ones a
    test runs), any other name as a tiny file of its folder's kind (``FOLDER_KINDS``: only
    validated or shown in the UI, never loaded)."""
    import workflow_tools as wt

    tiny_models.add_aliases(WORKFLOW_NAMES)
    base = comfy_server.workdir / "base" / "models"
    for folder, name in sorted({f for _, ui, _ in wt.workflow_pairs() for f in wt.model_files(wt.load(ui))}):
        if name in tiny_models.aliases:
            continue
        if folder in FOLDER_KINDS:
            tiny_models.add_aliases({name: FOLDER_KINDS[folder]})
        elif not (base / folder / name).exists():  # checkpoints, ...: the server's own models dir
            (base / folder).mkdir(parents=True, exist_ok=True)
            os.symlink(tiny_models.path(CHECKPOINT_NAMES.get(name, "ltxv")), base / folder / name)
    return tiny_models


# A tiny model per folder for file names a workflow only has validated (never run).
# Folders the tiny models lack (checkpoints) get a link to the tiny LTX-Video checkpoint.
FOLDER_KINDS = {"diffusion_models": "wan21_t2v", "text_encoders": "umt5", "vae": "wan21_vae",
                "loras": "wan21_lora"}
