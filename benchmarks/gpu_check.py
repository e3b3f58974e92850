"""One prepared GPU check of the `sequence` engine's CUDA paths (issue 21), for the lent one-GPU
machine: under 9 minutes on one H200, one line per check, then a summary; exit 1 on any FAIL.

    python benchmarks/gpu_check.py            # CUDA if torch sees it, else the dry mode
    python benchmarks/gpu_check.py --dry      # CPU: checks its own wiring at tiny sizes
    python benchmarks/gpu_check.py --only ring,syncs

Sections (``[gpu_check] NAME: PASS|FAIL|SKIP figures``):
- ``ring``: the prefetch ring with a remote owner forced on one GPU (pageable, pinned and GPU
  owners) under ``TORCH_CUDA_SANITIZER=1`` in a child process, its blocks queued from a rank thread
  with the sanitizer entered there too, ``begin_forward`` / ``end_forward`` on the main thread: no
  race, streamed == resident (``gpu_check_ring.py``);
- ``ring_wait_removed``: each of ``sequence/stream.ORDER_WAITS`` removed in turn (``without_wait``), a
  child each: the sanitizer must flag every wait that orders two GPU streams;
- ``sequence``: ``cuda:0,cuda:0`` (owners, and every block streamed from pinned RAM) and ``cuda:0,cpu``
  against the unsharded forward, fp32 and bf16 (tolerances in ``gpu_check_sections.py``);
- ``syncs``: synchronizing calls per block in the steady state (``set_sync_debug_mode``): target 0;
- ``memory``: peak memory of a Wan-width model (dim 5120, 40 heads, 4 blocks) at 32k tokens on
  ``cuda:0,cuda:0`` streaming every block, against the plan;
- ``overlap``: step time streamed from pinned RAM over all resident: target <= 1.10 plus the first
  block's copy over the resident step (nothing precedes block 0 to overlap its copy with).

Without CUDA every section builds and runs its setup on CPU at tiny sizes and says SKIP and why
(``tests/test_gpu_check_dry.py`` runs that in CI). How to run it on the device machine:
tests/README.md, "The GPU check".
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PREFIX = "[gpu_check]"
SECTIONS = ("ring", "ring_wait_removed", "sequence", "syncs", "memory", "overlap")


@dataclass(frozen=True)
class Sizes:
    ring_dim: int
    ring_blocks: int
    ring_tokens: int
    dim: int
    heads: int
    blocks: int
    ffn: int
    tokens: int
    text: int
    mem_dim: int
    mem_heads: int
    mem_blocks: int
    mem_ffn: int
    mem_tokens: int
    mem_text: int
    reps: int


GPU = Sizes(ring_dim=1024, ring_blocks=6, ring_tokens=2048, dim=256, heads=4, blocks=4, ffn=1024, tokens=2048,
            text=64, mem_dim=5120, mem_heads=40, mem_blocks=4, mem_ffn=13824, mem_tokens=32760, mem_text=512, reps=3)
"""Wan 2.1 14B: dim 5120, 40 heads, FFN 13824, 480p x 81 frames = 32760 tokens, 512 text tokens."""
DRY = Sizes(ring_dim=32, ring_blocks=4, ring_tokens=8, dim=32, heads=4, blocks=4, ffn=64, tokens=12, text=5,
            mem_dim=64, mem_heads=4, mem_blocks=2, mem_ffn=128, mem_tokens=32, mem_text=8, reps=1)


def _setup_imports() -> None:
    """The pack as ``sharddit`` by path (never the repo root on sys.path), tests/ for the harness."""
    for p in (str(HERE), str(REPO / "tests")):
        if p not in sys.path:
            sys.path.insert(0, p)
    from harness.pack import import_pack

    import_pack()


def say(name: str, status: str, text: str) -> None:
    print(f"{PREFIX} {name}: {status} {text}", flush=True)


def _ring_child(sz: Sizes, cuda: bool, owners, scenarios, timeout_s: float):
    import gpu_check_ring as ring

    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_SANITIZER"}
    if cuda:
        env["TORCH_CUDA_SANITIZER"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--ring-child", "cuda:0" if cuda else "cpu",
           str(sz.ring_dim), str(sz.ring_blocks), str(sz.ring_tokens), ",".join(owners), ",".join(scenarios)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    rows = ring.parse_child(proc.stdout)
    if proc.returncode != 0 or len(rows) != len(owners) * len(scenarios):
        raise RuntimeError(f"ring child exit {proc.returncode}, {len(rows)} results; stderr: {proc.stderr[-1500:]}")
    return rows


_DRY_ROWS: list = []


def _ring_rows(sz: Sizes, cuda: bool, scenarios) -> list[dict]:
    """Results for ``scenarios``: on CUDA one child per scenario (each sanitizer session starts
    clean); dry, one child for the baseline and every wait (no sanitizer to reset; one import)."""
    import gpu_check_ring as ring

    owners = ring.owners_for(cuda)
    if cuda:
        return [r for s in scenarios for r in _ring_child(sz, cuda, owners, [s], 180)]
    if not _DRY_ROWS:
        api = ring.order_api()
        _DRY_ROWS.extend(_ring_child(sz, cuda, owners, ["none", *(api[0] if api else ())], 180))
    return [r for r in _DRY_ROWS if (r["without"] or "none") in scenarios]


def section_ring(sz: Sizes, cuda: bool):
    import gpu_check_ring as ring

    rows = _ring_rows(sz, cuda, ["none"])
    bad = [r for r in rows if r["races"] or r["error"] or r["max_diff"] is None or r["max_diff"] > ring.DIFF_TOL]
    figs = ", ".join(f"{r['owner']} races {r['races']} diff {r['max_diff']:.2g} copies {r['copies']}"
                     if r["max_diff"] is not None else f"{r['owner']} {r['error']}" for r in rows)
    if bad:
        return "FAIL", figs + "; first error: " + next((r["error"] for r in bad if r["error"]), "streamed != resident")
    if cuda and not all(r.get("rank_thread_sanitized") for r in rows):
        return "FAIL", figs + "; the rank thread ran without the sanitizer (only the main thread was checked)"
    if not cuda:
        return "SKIP", f"no CUDA: no sanitizer, pinned or GPU owner; pageable ring ran on cpu: {figs}"
    return "PASS", f"TORCH_CUDA_SANITIZER=1 on the main and the rank thread, remote owner forced on cuda:0: {figs}"


def section_ring_wait_removed(sz: Sizes, cuda: bool):
    import gpu_check_ring as ring

    api = ring.order_api()
    if api is None:
        return "SKIP", "skipped: seq_stream has no without_wait"
    waits = api[0]
    rows = _ring_rows(sz, cuda, list(waits))
    flagged = {w: sum(r["races"] for r in rows if r["without"] == w) for w in waits}
    figs = ", ".join(f"{w} {'flagged ' + str(n) if n else 'not flagged'}" for w, n in flagged.items())
    crashed = [f"{r['without']}/{r['owner']}: {r['error']}" for r in rows if r["error"] and not r["races"]]
    if not cuda:
        extra = f"; errors {crashed}" if crashed else ""
        return ("FAIL" if crashed else "SKIP"), f"no CUDA: no sanitizer; {len(rows)} runs without a wait ran{extra}"
    must = [w for w in ring.RACE_VISIBLE if w in flagged] or [waits[0]]
    missed = [w for w in must if not flagged[w]]
    status = "FAIL" if missed or crashed else "PASS"
    return status, (f"must flag {','.join(must)}: {figs}" + (f"; missed {missed}" if missed else "")
                    + (f"; errors {crashed}" if crashed else ""))


def _sections():
    import gpu_check_sections as s

    return {"ring": section_ring, "ring_wait_removed": section_ring_wait_removed, "sequence": s.section_sequence,
            "syncs": s.section_syncs, "memory": s.section_memory, "overlap": s.section_overlap}


def run(names, cuda: bool) -> int:
    import torch

    sz = GPU if cuda else DRY
    if not cuda:  # tiny ops on shared cores: OpenMP workers spinning made them 10-40x slower (tests/README.md)
        torch.set_num_threads(1)
    start = time.perf_counter()
    where = f"CUDA {torch.cuda.get_device_name(0)}" if cuda else "dry (no CUDA: wiring on CPU at tiny sizes)"
    print(f"{PREFIX} torch {torch.__version__}, {where}", flush=True)
    results = {}
    table = _sections()
    for name in names:
        t0 = time.perf_counter()
        try:
            status, text = table[name](sz, cuda)
        except Exception as e:  # noqa: BLE001 - one section's crash is its FAIL; the others still run
            traceback.print_exc()
            status, text = "FAIL", f"{type(e).__name__}: {e}"
        results[name] = status
        say(name, status, f"{text} [{time.perf_counter() - t0:.1f} s]")
    return summarize(results, time.perf_counter() - start, cuda)


def summarize(results: dict, seconds: float, cuda: bool) -> int:
    """The summary line; the exit status (1 on any FAIL)."""
    counts = {s: [n for n, v in results.items() if v == s] for s in ("PASS", "FAIL", "SKIP")}
    skipped = f" (skipped: {', '.join(counts['SKIP'])})" if counts["SKIP"] else ""
    failed = f" (failed: {', '.join(counts['FAIL'])})" if counts["FAIL"] else ""
    print(f"{PREFIX} summary: {len(counts['PASS'])} PASS, {len(counts['FAIL'])} FAIL{failed}, "
          f"{len(counts['SKIP'])} SKIP{skipped}; {'gpu' if cuda else 'dry'} mode, {seconds:.1f} s", flush=True)
    return 1 if counts["FAIL"] else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _setup_imports()
    if argv[:1] == ["--ring-child"]:
        import gpu_check_ring as ring

        return ring.child_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="CPU wiring check even where CUDA is available")
    ap.add_argument("--only", default="", help=f"comma list of sections ({', '.join(SECTIONS)})")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}: choose from {', '.join(SECTIONS)}")
    import torch

    cuda = torch.cuda.is_available() and not args.dry
    return run(names, cuda)


if __name__ == "__main__":
    sys.exit(main())
