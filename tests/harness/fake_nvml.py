"""A stand-in ``pynvml`` (nvidia-ml-py's module) serving three GPUs, for tests of what NVML sees
against what torch sees (``CUDA_VISIBLE_DEVICES``, ComfyUI's Windows one-GPU default).

``write_fake_pynvml(folder)`` writes it as ``folder/pynvml.py`` (put ``folder`` on ``PYTHONPATH``
for a subprocess) and returns the imported module (for ``sys.modules["pynvml"]`` in-process).
"""
import importlib.util
from pathlib import Path

GPUS = [("RTX 4090", "GPU-aa11-0000", "00000000:01:00.0"), ("RTX 3090", "GPU-bb22-0000", "00000000:21:00.0"),
        ("RTX 3060", "GPU-cc33-0000", "00000000:41:00.0")]
FAKE_PYNVML = f'''"""Stand-in for nvidia-ml-py's pynvml (test only): three GPUs."""
from types import SimpleNamespace
GPUS = {GPUS!r}
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(GPUS)
def nvmlDeviceGetHandleByIndex(i): return GPUS[i]
def nvmlDeviceGetMemoryInfo(g): return SimpleNamespace(total=24 << 30, free=20 << 30, used=0)
def nvmlDeviceGetName(g): return g[0]
def nvmlDeviceGetUUID(g): return g[1]
def nvmlDeviceGetPciInfo(g): return SimpleNamespace(busId=g[2])
'''


def write_fake_pynvml(folder: Path):
    (folder / "pynvml.py").write_text(FAKE_PYNVML)
    spec = importlib.util.spec_from_file_location("pynvml", folder / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
