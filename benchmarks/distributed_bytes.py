"""Bytes each rank sends per sampling step in distributed `sequence` mode, beside the cost model.

The host (this process, a Ray driver) and one member's rank actor on a second local Ray node (token
auth on; ``tests/harness/ray_cluster.py``), over gloo on 127.0.0.1, run a Wan-shaped toy DiT (``tests/harness/toy_seq.py``: dim 1024, 16 heads, 4 blocks, fp32,
512 text tokens) as ``cpu,w1/cpu``. After one warm-up forward (which also carries every block's
weights of the blocks the worker owns -- half of them -- printed apart) each step's bytes are
counted where they cross the process boundary:

- host -> worker: the block commands (the worker's share of the hidden state at the first block,
  per-forward constants: modulation, rotary table, text context), the weights of the blocks the
  host owns (streamed every step: the worker keeps only its own), and the host's side of the
  Ulysses all-to-alls;
- worker -> host: its side of the all-to-alls, acknowledgements, and its rows at the gather.

The analytic figure is ``parallel/cost/model.py``'s ``estimate_sequence(...).bytes_per_device``
(Ulysses exchange + streamed weights of the blocks a rank does not own + scatter of the hidden
state) for the same shape, with fp32 activations and weights. The cost model leaves out the constants (text context,
rotary table), which this prints as the difference. Then the same model's figures for Wan 2.1
14B (bf16) at 480p and 720p, 81 frames, on two ranks — what a network link must carry per step.

    python benchmarks/distributed_bytes.py [--tokens 2048] [--batch 1] [--steps 3]   # a Python with Ray
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def import_pack():
    sys.path.insert(0, str(REPO / "tests"))
    from harness.pack import import_pack as _import_pack

    return _import_pack()


def _toy_shape(dim, heads, n_blocks, text_tokens, tokens):
    from sharddit.parallel.cost.inputs import BlockShape, ModelShape

    block = BlockShape(n_blocks, 6 * dim * dim + 2 * dim * 4 * dim, 2 * dim * dim, 8 * dim * dim + 2 * dim * 4 * dim)
    return ModelShape("toy", dim, heads, (block,), text_tokens, 1, 1, (1, 1, 1))


def _analytic(shape, width, height, frames, cfg, act_bytes, weight_bytes=2):
    from sharddit.parallel.cost.model import Hardware, Workload, estimate_sequence

    work = Workload(shape, width, height, frames, cfg=cfg, activation_bytes=act_bytes, weight_bytes=weight_bytes)
    return estimate_sequence(work, Hardware((1e12, 1e12), 1e9)).bytes_per_device


def wan14b_table() -> list[str]:
    from sharddit.parallel.families import shape_from_config

    cfg = {"dim": 5120, "num_heads": 40, "ffn_dim": 13824, "num_layers": 40}
    shape = shape_from_config("wan2.1-14b", "wan", cfg, spatial=8, temporal=4, text_tokens=512)
    lines = []
    for label, (w, h) in (("480p", (832, 480)), ("720p", (1280, 720))):
        for cfg_scale in (1.0, 5.0):
            b = _analytic(shape, w, h, 81, cfg_scale, 2, 2)
            lines.append(f"wan2.1-14b {label} 81 frames cfg={cfg_scale:g} 2 ranks: {b / 1e9:.2f} GB per rank per "
                         f"step (bf16) -> {b * 8 / 1e9:.1f} Gbit; at 10 Gbit/s {b * 8 / 10e9:.2f} s, "
                         f"at 100 Gbit/s {b * 8 / 100e9:.3f} s per step")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1, help="1 = cfg 1 (token split), 2 = cond + uncond")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    import_pack()
    import tempfile

    from harness import dist_toys  # noqa: F401  (the toy blocks' describers)
    from harness.ray_cluster import LocalRayCluster
    from harness.toy_seq import SeqToyDiT
    from sharddit.parallel.cluster.host import ClusterHost
    from sharddit.parallel.distributed.ranks import attach_remote_ranks
    from sharddit.parallel.sequence.engine import attach_sequence_engine
    from sharddit.parallel.sequence.split import TokenSpec
    from sharddit.parallel.blocks.sharding import attach_block_sharding
    from sharddit.parallel.blocks.routing import BlockLayout

    dim, heads, n_blocks, text = 1024, 16, 4, 512
    tmp = tempfile.TemporaryDirectory(prefix="sdb")  # short: Ray's socket paths fit 107 bytes
    cluster = LocalRayCluster(Path(tmp.name), REPO, 60.0).start(("w1",))
    host = ClusterHost(cluster.address, 60.0)
    torch.set_num_threads(cluster.ray.get(host.rank("w1/cpu").where.remote(), timeout=60)["threads"])
    torch.manual_seed(0)
    model = SeqToyDiT(dim=dim, heads=heads, n_blocks=n_blocks, ffn=4 * dim, in_dim=64).eval()
    x = torch.randn(args.batch, args.tokens, 64)
    t, ctx = torch.rand(args.batch), torch.randn(args.batch, text, dim)
    with torch.inference_mode():
        ref = model(x, t, ctx)
    handle = attach_block_sharding(model, BlockLayout(("blocks",), (("x",),)), ["cpu"] * n_blocks, "cpu")
    engine = attach_sequence_engine(handle.router, list(handle.proxies["blocks"]),
                                    (TokenSpec({"x": 1, "e": 1, "freqs": 1}),), ["cpu", "cpu"])
    try:
        ranks = attach_remote_ranks(engine, host, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
        rows = []
        for step in range(args.steps):
            before = host.session.bytes_received.get("w1/cpu", 0) if host.session else 0
            with torch.inference_mode(), handle.router.forward_scope(sequence=True):
                out = model(x, t, ctx)
            assert torch.equal(out, ref), "distributed forward differs from the unsharded one"
            session = host.session
            replies = session.bytes_received["w1/cpu"] - before
            ex = engine.stats
            to_worker = ranks.bytes_sent["w1/cpu"] + ex.bytes_sent[0]
            from_worker = replies + ex.bytes_exchanged[0]
            to_worker += ranks.streamed_bytes["w1/cpu"]
            rows.append((step, to_worker, from_worker, ranks.bytes_sent["w1/cpu"], ex.bytes_exchanged[0],
                         ranks.streamed_bytes["w1/cpu"]))
        shape = _toy_shape(dim, heads, n_blocks, text, args.tokens)
        analytic = _analytic(shape, args.tokens, 1, 1, 2.0 if args.batch == 2 else 1.0, 4, 4)
        weights_analytic = sum(b.weight_params for b in shape.blocks for _ in range(b.count)) * 4 / 2
        print(f"toy Wan-shaped DiT dim {dim}, {heads} heads, {n_blocks} blocks, {args.tokens} tokens, batch "
              f"{args.batch}, fp32, ranks cpu,w1/cpu (a Ray member, gloo on 127.0.0.1); outputs bit-identical to unsharded")
        for step, to_w, from_w, commands, exch, streamed in rows:
            what = " (also carries the worker's own blocks, once)" if step == 0 else ""
            print(f"step {step}{what}: host->worker {to_w / 1e6:.2f} MB (commands {commands / 1e6:.2f} MB, "
                  f"streamed weights {streamed / 1e6:.2f} MB), worker->host {from_w / 1e6:.2f} MB "
                  f"(exchange {exch / 1e6:.2f} MB)")
        _, to_w, from_w, _, _, streamed = rows[-1]
        print(f"streamed weights per step: {streamed / 1e6:.2f} MB measured, {weights_analytic / 1e6:.2f} MB analytic "
              f"(the host's half of the blocks; measured adds biases and modulation, which the model leaves out)")
        host_analytic = analytic - weights_analytic  # the host holds every block: it receives no weights
        print(f"analytic (cost model, per step): the worker receives {analytic / 1e6:.2f} MB (exchange + scatter + "
              f"streamed weights), the host {host_analytic / 1e6:.2f} MB (exchange + gather)")
        print(f"measured/analytic: host->worker {to_w / analytic:.2f}, worker->host {from_w / host_analytic:.2f} "
              "(above 1: the constants the model leaves out -- text context, rotary table -- and the commands)")
        for line in wan14b_table():
            print(line)
    finally:
        engine.close()
        host.close_session()
        cluster.stop()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
