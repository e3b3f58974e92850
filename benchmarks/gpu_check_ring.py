"""gpu_check section ``ring``: the prefetch ring (``parallel/sequence/stream.BlockStream``) with a remote
owner on ONE GPU, driven the way the engine drives a rank, under PyTorch's CUDA sanitizer
(``TORCH_CUDA_SANITIZER=1``, set by the parent in a child process). The sanitizer is a dispatch
mode entered at import that only sees the thread that entered it; so, as in the engine, the main
thread patches the owners' weights and calls ``begin_forward`` / ``end_forward``, and a rank thread
(``sequence/threads.RankThreads``, the main thread's stream carried in) queues the blocks with the
sanitizer entered there too (``_SanitizerInThread``: the same event handler, so a race between a
rank thread's kernels and the main thread's is seen).

Owners of the streamed blocks: ``pageable`` (plain host RAM: the engine's ``cpu`` share), ``pinned``
(page-locked host RAM: ComfyUI's dynamic-VRAM pins) and ``gpu`` (a block on ``cuda:0`` itself,
with the ring *forced* to treat it as remote, ``_ForcedRemote``: the one-GPU stand-in for an owner on
another GPU; the same side stream, events and buffers run, not PyTorch's cross-device barrier).
Before each pass the owner's weights are rewritten on the current stream (``mul_(1)``), as ComfyUI
patching weights just before a step does, so the ring's wait on the owner's stream is exercised.

Per scenario (no wait removed, or one of ``sequence/stream.ORDER_WAITS`` removed with
``sequence/stream.without_wait``): races the sanitizer reported, and the streamed result against the
same blocks all resident (same kernels, same shapes: identical expected).
"""
from __future__ import annotations

import contextlib
import json
import sys

import torch

OWNERS = ("pageable", "pinned", "gpu")
RACE_VISIBLE = ("side_waits_owner", "compute_waits_copy", "copy_waits_reader")
"""Waits whose removal lets two GPU streams touch one tensor unordered: the sanitizer must flag
each. The others (``bounce_waits_copy``, ``release_waits_copies``) order the *host* against a copy
(host memcpy into pinned memory, freeing memory): the sanitizer tracks GPU streams only."""
DIFF_TOL = 1e-6
"""Resident vs streamed, same kernels and shapes: identical expected; a race reads another block's
weights or garbage (differences of order 1). 1e-6 leaves room for nothing but a tie-break."""


class _Block(torch.nn.Module):
    """A residual MLP block: enough kernels per block for copies and compute to interleave."""

    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def seq_stream_module():
    from sharddit.parallel.sequence import stream as seq_stream
    return seq_stream


def order_api():
    """``(ORDER_WAITS, without_wait)`` of sequence/stream, or None where it has not landed."""
    mod = seq_stream_module()
    waits, ctx = getattr(mod, "ORDER_WAITS", None), getattr(mod, "without_wait", None)
    return (tuple(waits), ctx) if waits and ctx is not None else None


def _forced_remote_class():
    base = seq_stream_module().BlockStream

    class _ForcedRemote(base):
        """Every block is remote: on one GPU the ring copies a ``cuda:0`` block into its buffers."""

        def owns(self, block):
            return False

    return _ForcedRemote


def _place_blocks(blocks, owner: str, device: torch.device):
    with torch.no_grad():
        for b in blocks:
            for p in b.parameters():
                if owner == "gpu":
                    p.data = p.data.to(device)
                elif owner == "pinned":
                    p.data = p.data.cpu().pin_memory()
                else:
                    p.data = p.data.cpu()


def _blocks(stream, blocks, x):
    h = x
    for g, block in enumerate(blocks):
        module = stream.module_for(g, block)
        h = module(h)
        stream.done_with(module, g)
        if g + 1 < len(blocks):  # after block g's kernels are queued, as the engine does
            stream.prefetch(g + 1, blocks[g + 1])
    return h


def _pass(pool, stream, blocks, x):
    """One forward as the engine runs it for one rank: begin on the main thread, the blocks on
    the rank's thread, end on the main thread once the rank queued its last block."""
    mod = seq_stream_module()
    mod.begin_forward([stream])
    with torch.no_grad():
        h = pool.wait(pool.submit(0, lambda: _blocks(stream, blocks, x), "ring pass"), 0)
    mod.end_forward([stream])  # owner_waits_copies: the next patch of the owners waits for our copies
    return h


def _sanitizer_in_thread():
    """A context entering the CUDA sanitizer in a rank thread (None where it is off)."""
    from torch.cuda._sanitizer import cuda_sanitizer
    from torch.utils._python_dispatch import TorchDispatchMode

    if not cuda_sanitizer.enabled:
        return None

    class _SanitizerInThread(TorchDispatchMode):
        """The process's sanitizer (its one event handler), entered in another thread."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return cuda_sanitizer.dispatch.__torch_dispatch__(func, types, args, kwargs)

    return _SanitizerInThread


def run_scenario(owner: str, without: str | None, device: torch.device, dim: int, n_blocks: int,
                 tokens: int, passes: int = 2) -> dict:
    """One owner, one wait removed (or none): races flagged, max diff vs resident, copies made."""
    mod = seq_stream_module()
    torch.manual_seed(0)
    blocks = [_Block(dim).eval() for _ in range(n_blocks)]
    x = torch.randn(tokens, dim, device=device)
    with torch.no_grad():
        resident = [b.to(device) for b in blocks]
        ref = x
        for b in resident:
            ref = b(ref)
        _place_blocks(blocks, owner, device)
    same_place = owner == "gpu" or device.type == "cpu"  # dry runs: a cpu ring, cpu owners
    stream = _forced_remote_class()(device) if same_place else mod.BlockStream(device)
    api = order_api()
    ctx = api[1](without) if without else contextlib.nullcontext()
    out = {"owner": owner, "without": without or "", "races": 0, "max_diff": None, "copies": 0, "error": ""}
    try:
        from torch.cuda._sanitizer import CUDASanitizerErrors
    except ImportError:  # pragma: no cover - every torch we run has it
        CUDASanitizerErrors = ()
    from sharddit.parallel.sequence.threads import RankThreads

    diffs = []
    in_thread = _sanitizer_in_thread()
    pool = RankThreads([device], timeout_s=120, worker_context=in_thread)
    out["rank_thread_sanitized"] = in_thread is not None
    try:
        with ctx, torch.no_grad():
            for _ in range(passes):
                for b in blocks:  # the owner's weights rewritten on its current stream (a patch)
                    for p in b.parameters():
                        p.mul_(1.0)
                got = _pass(pool, stream, blocks, x)
                diffs.append((got - ref).abs().max())
            stream.release()
    except Exception as e:  # noqa: BLE001 - a race (main or rank thread) or the scenario's failure
        cause = e.__cause__ if e.__cause__ is not None else e  # a rank thread's error: RankThreadError
        if CUDASanitizerErrors and isinstance(cause, CUDASanitizerErrors):
            out["races"] = len(cause.errors)
            out["error"] = str(cause.errors[0]).splitlines()[0] if cause.errors else "sanitizer error"
        else:
            out["error"] = f"{type(e).__name__}: {e}"
    finally:
        pool.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if diffs:
        out["max_diff"] = max(float(d) for d in diffs)
    out["copies"] = stream.copies
    return out


def child_main(argv) -> int:
    """``gpu_check.py --ring-child DEVICE DIM BLOCKS TOKENS OWNERS SCENARIOS``: one JSON line per
    (scenario, owner). SCENARIOS: comma list of ``none`` or wait names."""
    device, dim, n_blocks, tokens, owners, scenarios = argv
    device = torch.device(device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    for scenario in scenarios.split(","):
        without = None if scenario == "none" else scenario
        for owner in owners.split(","):
            res = run_scenario(owner, without, device, int(dim), int(n_blocks), int(tokens))
            print("RING " + json.dumps(res), flush=True)
    return 0


def parse_child(stdout: str) -> list[dict]:
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("RING ")]


def owners_for(cuda: bool) -> tuple[str, ...]:
    return OWNERS if cuda else ("pageable",)


if __name__ == "__main__":  # pragma: no cover - run through gpu_check.py
    sys.exit("run benchmarks/gpu_check.py")
