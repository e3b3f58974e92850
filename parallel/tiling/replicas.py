"""Which listed devices get a VAE decoder replica (pure: no torch, no ComfyUI).

A ``devices`` list asks for one decoder per entry. Replicas are bounded by the work (no more
decoders than decoder calls) and by memory (each new replica needs its bytes free on its device,
after the replicas already chosen there); the entries left out are reported with the reason.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..units import MiB
from ..errors import InputError

__all__ = ["MAX_DECODE_DEVICES", "check_decode_device_count", "select_decoder_devices"]

MAX_DECODE_DEVICES = 64
"""More entries than this are refused outright: one decoder per GPU is the useful maximum."""



def check_decode_device_count(n_entries: int) -> None:
    """ValueError when a VAE ``devices`` list is longer than any machine can use."""
    if n_entries > MAX_DECODE_DEVICES:
        raise InputError(
            f"devices lists {n_entries} entries; the VAE decode loads one VAE copy per entry and uses at most "
            f"{MAX_DECODE_DEVICES}: list each GPU once (e.g. 'cuda:0,cuda:1'), or use 'auto'"
        )


def select_decoder_devices(entries: Sequence[str], costs: Sequence[int], work: int,
                           free: Mapping[str, int]) -> tuple[list[int], list[tuple[str, str]]]:
    """Indices of the entries that get a decoder, and ``(device, reason)`` for those left out.

    ``costs[i]`` is the bytes entry ``i`` still needs on its device (0 for the VAE itself or a
    replica already loaded there); ``work`` is the number of decoder calls (>= 1); ``free`` the
    free bytes per device. The first entry is always kept (the decode needs one decoder).
    """
    assert len(entries) == len(costs) and entries, (entries, costs)
    left = dict(free)
    kept: list[int] = []
    out: list[tuple[str, str]] = []
    for i, (device, cost) in enumerate(zip(entries, costs)):
        if len(kept) >= max(1, work):
            out.append((device, f"only {work} decoder call{'s' if work != 1 else ''} to make"))
            continue
        room = left.get(device, 0)
        if kept and cost > room:
            out.append((device, f"a VAE copy needs {cost / MiB:.0f} MiB, {max(room, 0) / MiB:.0f} MiB free"))
            continue
        left[device] = room - cost
        kept.append(i)
    return kept, out
