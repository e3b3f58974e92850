"""Loading models the way core's loader nodes do, then placing them per ShardDiT's plan."""
import logging
import math

import torch

import comfy.sd
import folder_paths

from ....parallel.placement.devices import check_devices_exist, parse_component_device, parse_device_plan
from ....parallel.placement.inventory import read_inventory
from ....parallel.cost.mode import check_parallel
from ..models.checks import check_device_entries, check_diffusion_model_file
from ..remote.host_workers import check_workers
from ..shard.pipeline import shard_model
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")

WEIGHT_DTYPES = ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]


def check_file_name(folder: str, name: str) -> str:
    """Full path of ``name`` in ComfyUI's ``folder`` list, or a ValueError naming what exists.

    V3 combo values are not validated server-side in ComfyUI 0.3.64, so loaders check here.
    """
    names = folder_paths.get_filename_list(folder)
    if name not in names:
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") if names else "(none)"
        raise InputError(
            f"{folder} file {name!r} not found. Available in models/{folder}: {shown}. "
            f"Put the file into ComfyUI/models/{folder}/ (or an extra_model_paths.yaml folder) and refresh."
        )
    return folder_paths.get_full_path_or_raise(folder, name)


def check_devices(devices: str) -> None:
    """Cheap checks of a ``devices`` input (length, syntax, existence) before anything is loaded."""
    check_device_entries(devices)
    parsed = parse_device_plan(devices)
    if not parsed.auto:
        inventory = read_inventory()
        check_devices_exist(parsed.unique_devices, inventory.names, inventory.hidden_note)
    check_workers(devices, parsed.members, contact=False)  # validate_inputs: the web-server thread


RESERVE_MAX_GB = 1024.0


def check_reserve(reserve_vram_gb) -> None:
    """``reserve_vram_gb`` is a finite number of GiB in [0, 1024] (core's min/max checks do not
    run on an input ``validate_inputs`` takes, and NaN passes them anyway)."""
    try:
        value = float(reserve_vram_gb)
    except (TypeError, ValueError):
        value = math.nan
    if not (0.0 <= value <= RESERVE_MAX_GB):
        raise InputError(f"reserve_vram_gb {reserve_vram_gb!r} is not valid: give the GiB to keep free "
                         f"on every GPU, a number from 0 to {RESERVE_MAX_GB:g} (1 is a good start)")


def check_placement(devices: str, reserve_vram_gb=0.0) -> None:
    """``validate_inputs`` checks shared by the nodes that shard: devices, then the reserve."""
    check_devices(devices)
    check_reserve(reserve_vram_gb)


def check_component_device(device: str) -> None:
    """Cheap checks of a single ``device`` input (``auto``, ``cpu``, ``cuda:N``)."""
    chosen = parse_component_device(device)
    if chosen != "auto":
        inventory = read_inventory()
        check_devices_exist([chosen], inventory.names, inventory.hidden_note)


def unet_model_options(weight_dtype: str) -> dict:
    """Same mapping as core UNETLoader."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise InputError(f"weight_dtype {weight_dtype!r} is not one of {WEIGHT_DTYPES}.")
    options = {}
    if weight_dtype in ("fp8_e4m3fn", "fp8_e4m3fn_fast"):
        options["dtype"] = torch.float8_e4m3fn
    if weight_dtype == "fp8_e4m3fn_fast":
        options["fp8_optimizations"] = True
    if weight_dtype == "fp8_e5m2":
        options["dtype"] = torch.float8_e5m2
    return options


def load_sharded_diffusion_model(unet_name: str, weight_dtype: str, devices: str, reserve_vram_gb: float,
                                 parallel: str = "auto"):
    """Core UNETLoader (weights land in CPU RAM, nothing on a GPU), then shard per plan."""
    check_placement(devices, reserve_vram_gb)
    path = check_file_name("diffusion_models", unet_name)
    check_parallel(parallel)
    check_diffusion_model_file(path, unet_name)
    model = comfy.sd.load_diffusion_model(path, model_options=unet_model_options(weight_dtype))
    return shard_model(model, devices=devices, reserve_vram_gb=reserve_vram_gb, parallel=parallel)
