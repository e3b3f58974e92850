"""Fake-device helpers for dry runs: weights and peak activation memory per device, no GPU needed.

Pure PyTorch (no ComfyUI). Used by the dry run (``blocks/dry_forward.simulated_forward``,
``loaders/plan``): fake multi-GPU runs under ``FakeTensorMode`` (the measured reference figure:
tests/README.md):

- ``materialize_module``: gives a ``meta`` module real-looking parameters on a fake device
  (``cuda:1`` on a CPU-only machine) under ``FakeTensorMode``. Random initialisers fail on fake
  CUDA, so parameters are replaced by ``torch.empty`` of the same shape and dtype.
- ``MemoryTracker``: a ``TorchDispatchMode`` that counts every new output storage once, on the
  device of the tensor that created it, and releases it when the storage is finalised (PyTorch
  keeps one Python object per storage, so a weakref finaliser fires exactly when the storage
  dies). Storages owned by parameters/buffers are skipped, so ``weight.t()`` and other views of
  weights are not counted as activations (counted, the weights would count twice).
- ``flash_attention_standin``: ComfyUI's attention signature, allocating what flash /
  memory-efficient attention allocates on a GPU (the output, plus a small fp32 log-sum-exp),
  never the L x L matrix that SDPA's CPU math path builds on fake CUDA tensors (171 GB per
  block for Wan 14B at 480p, where a GPU's flash kernel allocates only the output).

Not modelled: the CUDA context (~0.5 GiB per GPU), allocator fragmentation and rounding, cuBLAS
workspaces. Callers plan headroom for them.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .tensor_map import taken
from .errors import RunError

__all__ = [
    "DeviceMemory",
    "MemoryTracker",
    "fake_device_mode",
    "flash_attention_standin",
    "materialize_module",
    "fake_weights",
    "modules_move_in_place",
]


class ThreadSafeFakeTensorMode(FakeTensorMode):
    """``FakeTensorMode`` that `sequence` worker threads can share: one dispatch at a time.

    The mode keeps per-call state on itself (``in_kernel_invocation``, its enter stack), so two
    threads dispatching through one instance at once corrupt it. A re-entrant lock serialises
    dispatch (nested dispatch in one thread re-enters); threads waiting in an exchange hold no lock.
    Each worker enters the mode itself (the dispatch-mode stack is per thread).
    """

    def __init__(self, *args, scalars: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._thread_lock = threading.RLock()
        self.scalars = scalars
        """A Python number read off a fake tensor (``float(t)``, ``t.item()``) gives a stand-in
        (``SCALAR_STANDIN``) instead of failing: for forwards that only branch on such values (MiniMax
        H3's timesteps) when the simulation measures shapes and bytes, not values."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.scalars and func is torch.ops.aten._local_scalar_dense.default:
            return SCALAR_STANDIN[0] if args[0].is_floating_point() else SCALAR_STANDIN[1]
        with self._thread_lock:
            return super().__torch_dispatch__(func, types, args, kwargs if kwargs is not None else {})

    def __enter__(self):
        with self._thread_lock:
            return super().__enter__()

    def __exit__(self, a, b, c):
        with self._thread_lock:
            return super().__exit__(a, b, c)


SCALAR_STANDIN = (0.5, 1)
"""(float, integer) a fake tensor reads as under ``fake_device_mode(scalars=True)``."""


@contextlib.contextmanager
def fake_device_mode(scalars: bool = False):
    """``no_grad`` + ``FakeTensorMode``: tensors may claim any ``cuda:N`` on a CPU-only build.

    ``no_grad`` is required: autograd metadata on a fake CUDA tensor aborts the process.
    Module conversion must not swap parameter objects (``module.to`` inside the mode).
    """
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(False)
    try:
        with torch.no_grad(), ThreadSafeFakeTensorMode(allow_non_fake_inputs=False, scalars=scalars) as mode:
            yield mode
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)


@contextlib.contextmanager
def modules_move_in_place(module: torch.nn.Module):
    """``m.to(device)`` on ``module`` and its sub-modules moves the tensors in place while the
    simulation runs (HunyuanVideo 1.5's forward calls ``self.cond_type_embedding.to(txt.device)``).

    ``nn.Module.to`` swaps parameter objects when the new tensor is a tensor subclass such as
    ``FakeTensor`` (``torch.utils.swap_tensors``), which fails while the simulation holds other
    references to them; a weight already on that device is left as it is (what ``to`` does on a
    GPU), another is replaced by a moved copy (``.data =`` keeps a fake tensor's device). Restored
    on exit.
    """
    patched = [m for m in module.modules() if "to" not in m.__dict__]

    def mover(mod):
        def to(*args, **kwargs):
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
            for sub in mod.modules():
                for tensors in (sub._parameters, sub._buffers):
                    for name, t in tensors.items():
                        if t is not None and ((device is not None and t.device != device)
                                              or (dtype is not None and t.is_floating_point() and t.dtype != dtype)):
                            moved = t.detach().to(device=device or t.device, dtype=dtype if t.is_floating_point() else None)
                            is_param = isinstance(t, torch.nn.Parameter)
                            tensors[name] = torch.nn.Parameter(moved, requires_grad=False) if is_param else moved
            return mod
        return to

    for m in patched:
        m.to = mover(m)
    try:
        yield
    finally:
        for m in patched:
            m.__dict__.pop("to", None)


def materialize_module(module: torch.nn.Module, device, exclude=(), memo=None) -> None:
    """Replace every parameter and buffer of ``module`` by an empty tensor on ``device``.

    Call inside ``fake_device_mode()``. Shapes and dtypes are kept; ``requires_grad`` is False.
    Sub-modules in ``exclude`` (module objects) are skipped with their subtrees. ``memo`` maps
    ``id(old tensor)`` to its replacement so tied parameters stay tied across calls.
    """
    device = torch.device(device)
    memo = {} if memo is None else memo
    skip = {id(m) for m in exclude}
    stack = [module]
    while stack:
        mod = stack.pop()
        if id(mod) in skip:
            continue
        for name, p in list(mod._parameters.items()):
            if p is not None:
                if id(p) not in memo:
                    t = torch.empty(p.shape, dtype=p.dtype, device=device)
                    memo[id(p)] = torch.nn.Parameter(t, requires_grad=False)
                mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None:
                if id(b) not in memo:
                    memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device=device)
                mod._buffers[name] = memo[id(b)]
        stack.extend(mod._modules.values())


def materialize_planned(module: torch.nn.Module, blocks, block_devices, home) -> None:
    """Weights where a loader would put them before the engine attaches: ``blocks[i]`` on
    ``block_devices[i]``, everything else on ``home`` (tied tensors stay tied)."""
    memo: dict = {}
    materialize_module(module, home, exclude=blocks, memo=memo)
    for block, device in zip(blocks, block_devices, strict=True):
        materialize_module(block, device, memo=memo)


@contextlib.contextmanager
def fake_weights(module: torch.nn.Module, blocks, block_devices, home):
    """``materialize_planned`` for the length of a ``with``; afterwards every parameter and buffer
    is back on ``meta`` (tied tensors stay tied): the next run starts clean, no fake tensor leaks."""
    materialize_planned(module, blocks, block_devices, home)
    try:
        yield
    finally:
        memo = {}
        for mod in module.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    if id(p) not in memo:
                        meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
                        memo[id(p)] = torch.nn.Parameter(meta, requires_grad=False)
                    mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="meta")


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata





@dataclass
class DeviceMemory:
    """What one device holds during the simulated forward (bytes)."""

    weights: int = 0
    """Parameters and buffers resident on the device."""
    peak_activations: int = 0
    """Largest sum of live non-weight storages on the device at any moment."""
    live_activations: int = 0
    """Non-weight storages still alive when the report was taken (inputs, outputs)."""
    coinciding_activations: int = 0
    """The sum of each thread's own peak on the device (a storage counts to the thread that made
    it): the peak if every thread's peaks met, which another interleaving of the same threads can
    reach; ``peak_activations`` is only the interleaving this run happened to take."""

    @property
    def peak_total(self) -> int:
        return self.weights + self.peak_activations


class MemoryTracker(TorchDispatchMode):
    """Per-device live and peak bytes of every storage created while the mode is active.

    Enter it inside ``fake_device_mode()`` (so it runs first and fake tensors run below it)::

        with fake_device_mode(), MemoryTracker(model) as tracker:
            model(x)
        tracker.report()  # {"cuda:0": DeviceMemory(...), ...}

    Storages of ``modules``' parameters and buffers (and any passed to ``ignore``) are weights:
    never counted as activations, even when an op returns a view of them.
    """

    def __init__(self, *modules: torch.nn.Module):
        super().__init__()
        self._owned: set[int] = set()
        self._weights: dict[str, int] = {}
        self._live: dict[int, tuple[str, int]] = {}
        self._current: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._thread_current: dict[tuple[str, int], int] = {}
        self._thread_peak: dict[tuple[str, int], int] = {}
        self._thread = threading.local()  # a number per thread (an ident can be reused once one ends)
        self._threads = itertools.count()
        self._lock = threading.RLock()
        for m in modules:
            self.add_weights(m)

    def add_weights(self, module: torch.nn.Module) -> None:
        """Treat ``module``'s parameters and buffers as weights (count once, per device)."""
        for t in list(module.parameters()) + list(module.buffers()):
            self.ignore(t, weight=True)

    def ignore(self, t: torch.Tensor, weight: bool = False) -> None:
        key = _storage_key(t)
        if key in self._owned:
            return
        self._owned.add(key)
        if weight:
            dev = str(t.device)
            self._weights[dev] = self._weights.get(dev, 0) + t.untyped_storage().nbytes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._track_outputs(func(*args, **(kwargs or {})))

    def _track_outputs(self, out):
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def thread_view(self) -> TorchDispatchMode:
        """A mode for another thread (``sequence`` workers) that counts into this tracker.

        The dispatch-mode stack is per thread: enter the view inside the fake mode in each worker.
        """
        return _TrackerView(self)

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        with self._lock:
            if key in self._live or key in self._owned:
                return
            dev, nbytes = str(t.device), storage.nbytes()
            if not hasattr(self._thread, "number"):
                self._thread.number = next(self._threads)
            who = (dev, self._thread.number)
            self._live[key] = (dev, nbytes, who)
            cur = self._current.get(dev, 0) + nbytes
            self._current[dev] = cur
            if cur > self._peak.get(dev, 0):
                self._peak[dev] = cur
            mine = self._thread_current.get(who, 0) + nbytes
            self._thread_current[who] = mine
            if mine > self._thread_peak.get(who, 0):
                self._thread_peak[who] = mine
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                dev, nbytes, who = entry
                self._current[dev] -= nbytes
                self._thread_current[who] -= nbytes

    def report(self) -> dict[str, DeviceMemory]:
        """Per device: weights, peak activations, activations still alive now."""
        devs = sorted(set(self._weights) | set(self._peak))
        return {
            d: DeviceMemory(self._weights.get(d, 0), self._peak.get(d, 0), self._current.get(d, 0),
                            sum(p for (dev, _), p in self._thread_peak.items() if dev == d))
            for d in devs
        }


class _TrackerView(TorchDispatchMode):
    """``MemoryTracker.thread_view``: same accounting, entered on another thread."""

    def __init__(self, tracker: MemoryTracker):
        super().__init__()
        self._tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._tracker._track_outputs(func(*args, **(kwargs or {})))


def flash_attention_standin(q, k, v, heads, mask=None, attn_precision=None,
                            skip_reshape=False, skip_output_reshape=False, **kwargs):
    """Output-only attention with ComfyUI's ``optimized_attention`` signature.

    Allocates what flash / memory-efficient SDPA allocates on a GPU: the output (laid out
    ``b, L, heads, d`` so the usual ``transpose(1, 2).reshape`` is a view) and a transient fp32
    log-sum-exp of ``b x heads x L``. Inputs on different devices raise, like a real kernel.
    q, k, v may come in ComfyUI's single-owner containers (0.33+: an object whose ``take()`` hands
    the tensor over), as a backend takes them when called directly.
    """
    q, k, v = (taken(t) for t in (q, k, v))
    for name, t in (("k", k), ("v", v), ("mask", mask)):
        if t is not None and t.device != q.device:
            raise RunError(
                f"attention got q on {q.device} but {name} on {t.device}: "
                "Expected all tensors to be on the same device"
            )
    if skip_reshape:
        b, h, length, _ = q.shape
        dv = v.shape[-1]
    else:
        b, length, inner = q.shape
        h = heads
        dv = v.shape[-1] // heads
    lse = torch.empty((b, h, length), dtype=torch.float32, device=q.device)
    out = torch.empty((b, length, h, dv), dtype=q.dtype, device=q.device)
    del lse
    if skip_output_reshape:
        return out.transpose(1, 2)
    return out.view(b, length, h * dv)

