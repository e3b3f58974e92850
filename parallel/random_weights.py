"""Deterministic random weights for tiny stand-in models (self-test, tests, benchmarks).

Each tensor comes from its own generator seeded by ``(seed, key name)``, so the same seed gives
bit-identical weights in any order on any machine. Scales keep activations finite: matrices
~ N(0, 1/fan_in), norm weights 1 + N(0, 0.02²), biases and the rest ~ N(0, 0.02²).
"""
from __future__ import annotations

import zlib

import torch

__all__ = ["random_generator", "random_tensor", "random_state_dict"]


def random_generator(seed: int, name: str) -> torch.Generator:
    """The generator behind ``random_tensor(name, ..., seed)``."""
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))


def random_tensor(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The fp32 tensor for state-dict key ``name``."""
    g = random_generator(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) >= 2 and shape.numel() > 0 and leaf not in ("modulation", "gamma", "beta"):
        fan_in = shape.numel() // shape[0]
        return torch.randn(shape, generator=g) / fan_in**0.5
    t = torch.randn(shape, generator=g) * 0.02
    is_norm = leaf in ("gamma", "scale") or (leaf == "weight" and len(shape) == 1)
    return t + 1.0 if is_norm else t


def random_state_dict(module: torch.nn.Module, seed: int, dtype: torch.dtype = torch.float32) -> dict:
    """A tensor for every state-dict entry of ``module`` (which may live on ``meta``)."""
    return {k: random_tensor(k, v.shape, seed).to(dtype).contiguous() for k, v in module.state_dict().items()}
