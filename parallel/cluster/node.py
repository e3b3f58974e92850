"""A worker machine's Ray node: the ``ray start`` command that ``python <pack-dir> worker --ray``
runs (pure: builds the command and its environment, imports no Ray).

The node carries the worker's name as the label ``sharddit/name`` and one unit of the resource
``sharddit/NAME/DEVICE`` per device it serves, so the host lists it as members ``NAME/DEVICE``
(``driver.members_from_nodes``). The node offers Ray no GPUs (``--num-gpus 0``): a rank actor
holds its member's resource instead, so Ray leaves ``CUDA_VISIBLE_DEVICES`` as the worker command
had it and the actor of ``box2/cuda:1`` uses exactly the GPU that ``--devices cuda:1`` named
there (had Ray handed out GPUs, which one an actor got would be Ray's choice).
"""
from __future__ import annotations

import json
import re
import sys

from .settings import NAME_LABEL, member_resource
from ..errors import InputError

__all__ = ["check_label_name", "ray_start_command"]

_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def check_label_name(name: str) -> str:
    """A worker name Ray accepts as a label value (it must also end with a letter or digit)."""
    if not _LABEL_VALUE.fullmatch(name):
        raise InputError(f"--name {name!r}: on a Ray cluster a worker's name must end with a letter or digit "
                         f"(Ray's label values do), e.g. {name.rstrip('._-') or 'box2'!r}")
    return name


def ray_start_command(address: str, name: str, devices: list[str], python: str = sys.executable) -> list[str]:
    """``ray start --address ADDRESS --block`` from ``python`` (ComfyUI's), labelled and with one
    resource per device, offering Ray no GPU of its own to hand out (see the module's docstring)."""
    resources = {member_resource(check_label_name(name), device): 1 for device in devices}
    return [python, "-m", "ray.scripts.scripts", "start", "--address", address, "--labels", f"{NAME_LABEL}={name}",
            "--resources", json.dumps(resources), "--num-gpus", "0", "--disable-usage-stats", "--block"]

