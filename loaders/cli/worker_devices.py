"""The ``--devices`` of ``python <pack-dir> worker`` (``worker_ray``), checked before Ray starts."""
from __future__ import annotations

from ...parallel.placement.devices import parse_device
from ...parallel.errors import InputError

__all__ = ["check_cuda", "parse_worker_devices"]


def parse_worker_devices(text: str) -> list[str]:
    """``"cuda:0, cuda:1"`` -> ``["cuda:0", "cuda:1"]``; ValueError for an empty list or a repeat
    (each device is served once)."""
    if not text.strip():
        raise InputError(f"--devices {text!r} names no device: give 'cpu', 'cuda:N' or a list such as "
                         "'cuda:0,cuda:1', or leave --devices out (cuda:0 if present, else cpu)")
    devices = [parse_device(part) for part in text.split(",")]
    for device in dict.fromkeys(devices):
        if devices.count(device) > 1:
            raise InputError(f"--devices {text!r} lists {device!r} {devices.count(device)} times: a worker serves each "
                             f"device once (one process per device, member NAME/{device}); list each device once, "
                             f"e.g. --devices {','.join(dict.fromkeys(devices))}")
    return devices


def check_cuda(devices: list[str], torch) -> None:
    """ValueError naming a listed cuda device this torch does not see, and what it does see."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device in devices:
        if device.startswith("cuda") and int(device.split(":")[1]) >= count:
            if count:
                raise InputError(f"--devices: {device!r} does not exist; torch sees cuda:0 .. cuda:{count - 1} here "
                                 f"(use those or 'cpu')")
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise InputError(f"--devices: {device!r} does not exist: torch {torch.__version__} ({build}) sees no CUDA "
                             f"GPU on this machine; serve 'cpu' (--devices cpu), or give this machine a GPU and "
                             f"torch's CUDA build")
