"""A worker machine's Ray node: the ``ray start`` command that ``python <pack-dir> worker --ray``
runs (pure: builds the command and its environment, imports no Ray).

The node carries the worker's name as the label ``sharddit/name`` and one unit of the resource
``sharddit/NAME/DEVICE`` per device it serves, so the host lists it as members ``NAME/DEVICE``
(``driver.members_from_nodes``). Its GPUs for Ray are exactly the cuda devices listed: Ray then
gives each cuda rank actor one of them.
"""
from __future__ import annotations

import json
import re
import sys

from .settings import NAME_LABEL, member_resource

__all__ = ["check_label_name", "node_env", "ray_start_command"]

_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def check_label_name(name: str) -> str:
    """A worker name Ray accepts as a label value (it must also end with a letter or digit)."""
    if not _LABEL_VALUE.fullmatch(name):
        raise ValueError(f"--name {name!r}: on a Ray cluster a worker's name must end with a letter or digit "
                         f"(Ray's label values do), e.g. {name.rstrip('._-') or 'box2'!r}")
    return name


def ray_start_command(address: str, name: str, devices: list[str], python: str = sys.executable) -> list[str]:
    """``ray start --address ADDRESS --block`` from ``python`` (ComfyUI's), labelled and with one
    resource per device; ``--num-gpus`` is the number of cuda devices listed (0: Ray hands out none)."""
    resources = {member_resource(check_label_name(name), device): 1 for device in devices}
    n_gpus = sum(device.startswith("cuda") for device in devices)
    return [python, "-m", "ray.scripts.scripts", "start", "--address", address, "--labels", f"{NAME_LABEL}={name}",
            "--resources", json.dumps(resources), "--num-gpus", str(n_gpus), "--disable-usage-stats", "--block"]


def node_env(devices: list[str], env: dict) -> dict:
    """The node's environment: ``CUDA_VISIBLE_DEVICES`` narrowed to the cuda devices listed (read
    through an existing ``CUDA_VISIBLE_DEVICES``, as torch numbers them), so Ray hands out only those."""
    cuda = [int(device.split(":")[1]) for device in devices if device.startswith("cuda")]
    out = dict(env)
    if cuda:
        visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        out["CUDA_VISIBLE_DEVICES"] = ",".join(visible[i] if visible else str(i) for i in cuda)
    return out
