"""Settings of the Ray control plane, read from one place each (pure: imports no Ray).

- ``SHARDDIT_RAY_ADDRESS`` (host): the Ray cluster the host joins as a driver, ``auto`` or
  ``HOST:PORT`` (6379 by default). Unset: no cluster, Ray is never imported.
- ``RAY_AUTH_MODE`` (Ray's own): must be ``token`` on every member, with the cluster's token in
  ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``. Whoever holds the token
  controls the cluster: it is Ray's model, and ours.
- ``SHARDDIT_CLUSTER_INSECURE=1``: start a cluster role without token authentication anyway
  (anyone who reaches the Ray ports can then run code on every member); said loudly each time.

A member ``NAME/DEVICE`` is a Ray node labelled ``sharddit/name=NAME`` holding one unit of the
resource ``sharddit/NAME/DEVICE`` per device it serves (``member_resource``).
"""
from __future__ import annotations

import logging
import os

from ..placement.devices import check_member_name, parse_device
from ..errors import InputError, RunError

__all__ = ["AUTH_MODE_ENV", "INSECURE_ENV", "INSTALL_HINT", "NAME_LABEL", "RAY_ADDRESS_ENV", "RESOURCE_PREFIX",
           "ClusterError", "ClusterInsecure", "check_auth", "import_ray", "member_resource", "parse_member_resource",
           "raise_fd_limit", "ray_address"]

log = logging.getLogger(__name__)

RAY_ADDRESS_ENV = "SHARDDIT_RAY_ADDRESS"
INSECURE_ENV = "SHARDDIT_CLUSTER_INSECURE"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
NAME_LABEL = "sharddit/name"
RESOURCE_PREFIX = "sharddit/"
INSTALL_HINT = ("pip install -r requirements-cluster.txt (in the pack folder), or pip install 'sharddit[cluster]', "
                "in the Python that runs ComfyUI and on every worker machine")


class ClusterError(RunError):
    """A cluster role cannot start or a member failed; the message names the member and the fix."""


class ClusterInsecure(InputError):
    """A cluster role was asked for without Ray's token authentication."""


def ray_address(env=os.environ) -> str | None:
    """``SHARDDIT_RAY_ADDRESS`` stripped, None when unset or blank (no cluster: Ray is not imported)."""
    text = env.get(RAY_ADDRESS_ENV, "").strip()
    return text or None


def check_auth(role: str, env=os.environ) -> bool:
    """True when ``RAY_AUTH_MODE=token``. Otherwise ClusterInsecure naming ``role`` and both fixes,
    unless ``SHARDDIT_CLUSTER_INSECURE=1``: then a loud warning and False."""
    mode = env.get(AUTH_MODE_ENV, "").strip()
    if mode.lower() == "token":
        return True
    shown = repr(mode) if mode else "unset"
    if env.get(INSECURE_ENV, "").strip() == "1":
        log.warning("[ShardDiT] WARNING: %s starts WITHOUT Ray token authentication (%s is %s, %s=1): anyone "
                    "who can reach this cluster's ports can join it, run code on every member and read the "
                    "weights. Use this on a machine or network only you can reach.", role, AUTH_MODE_ENV, shown,
                    INSECURE_ENV)
        return False
    raise ClusterInsecure(
        f"{role} refused: {AUTH_MODE_ENV} is {shown}, not 'token', so anyone who reaches the Ray ports "
        f"could join the cluster and run code on it. Make a token once (ray get-auth-token --generate), give it to "
        f"every machine (~/.ray/auth_token or RAY_AUTH_TOKEN) and set {AUTH_MODE_ENV}=token on each; or set "
        f"{INSECURE_ENV}=1 to run without authentication on a network only you can reach")


FD_LIMIT_WANTED = 65536
"""The open-files soft limit a cluster role raises itself to (up to the hard limit): gloo's listeners
accept every connection, a stranger's too, and keep it open until it says who it is, so 1100 held
connections must not exhaust a process left at the common soft limit of 1024 (the process would fail
to accept ComfyUI's own HTTP requests, or abort)."""


def raise_fd_limit(wanted: int = FD_LIMIT_WANTED) -> tuple[int, int]:
    """Raise this process's soft limit on open files towards ``wanted`` (never above the hard limit,
    never lowered); returns (soft, hard) afterwards. A no-op where ``resource`` is missing."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("[ShardDiT] could not raise the open-files limit from %d to %d (%s): a stranger holding "
                        "many connections to gloo's ports could exhaust this process; raise `ulimit -n`", soft,
                        target, err)
    if soft != resource.RLIM_INFINITY and soft < 4096:
        log.warning("[ShardDiT] this process may open only %d files (hard limit %d): a stranger holding many "
                    "connections to gloo's ports could exhaust it; raise the hard limit (`ulimit -Hn`)", soft, hard)
    return soft, hard


def import_ray():
    """The ``ray`` module; ClusterError with the install line when this Python has none."""
    try:
        import ray
    except ImportError as err:
        raise ClusterError(f"several machines need Ray, and this Python has none ({err}): "
                           f"{INSTALL_HINT}") from None
    return ray


def member_resource(name: str, device: str) -> str:
    """The custom Ray resource of member ``NAME/DEVICE``: ``sharddit/box2/cuda:0``."""
    return f"{RESOURCE_PREFIX}{check_member_name(name)}/{parse_device(device)}"


def parse_member_resource(resource: str) -> tuple[str, str] | None:
    """``sharddit/box2/cuda:0`` -> ``("box2", "cuda:0")``; None for any other resource (Ray's own,
    another program's, or a malformed one: a node's resources are not ours to trust blindly)."""
    if not resource.startswith(RESOURCE_PREFIX):
        return None
    name, sep, device = resource[len(RESOURCE_PREFIX):].partition("/")
    if not sep:
        return None
    try:
        return check_member_name(name), parse_device(device)
    except ValueError:
        return None
