"""Distributed `sequence` mode on a toy DiT through Ray members (pure torch; issue 32): the host
is this test process (the Ray driver), the members ``w1/cpu`` and ``w2/cpu`` are rank actors on two
local Ray nodes (``ray_members``, token auth on). Each forward is bit-identical to the all-local
run with the same split (the same GEMM shapes, the same CPU threads) and equal to the unsharded
one or within the split bound of tests/harness/numerics.py; weights cross once and again only for
the block that changed; a member killed or frozen mid-forward fails the forward naming it within
the timeout, a local run works at once, and the next forward starts the member's rank again."""
import os
import signal
import time

import pytest
import torch
from harness import dist_toys  # noqa: F401  (the toy blocks' describers, on this side too)
from harness.numerics import assert_same_shapes_equal, assert_split_close
from harness.seq_models import engine_for, run_sequence, toy_copies, toy_inputs
from harness.toy_seq import SeqToyDiT
from sharddit.parallel.distributed.ranks import attach_remote_ranks
from sharddit.parallel.distributed.weights import WeightLayout
from sharddit.parallel.sequence.threads import RankThreadError

pytestmark = [pytest.mark.cluster, pytest.mark.no_blas]
TIMEOUT_S = 8.0
CPU = {"w1/cpu": "cpu", "w2/cpu": "cpu"}


@pytest.fixture
def host(ray_members):
    """A ClusterHost of the shared cluster, with this process on the members' CPU threads (Ray runs
    its workers with OMP_NUM_THREADS=1); its rank actors are killed afterwards (each holds its
    member: the next test's host starts its own)."""
    from sharddit.parallel.cluster.host import ClusterHost

    h = ClusterHost(ray_members.address, TIMEOUT_S)
    threads = torch.get_num_threads()
    torch.set_num_threads(ray_members.ray.get(h.rank("w1/cpu").where.remote(), timeout=TIMEOUT_S)["threads"])
    try:
        yield h
    finally:
        h.close_session()
        for actor in h.ranks.values():
            ray_members.ray.kill(actor)
        torch.set_num_threads(threads)


def _against_local_and_unsharded(run, local, ref_model, batch, what):
    """One forward of ``run`` (handle, model) at ``batch``: bit-identical to ``local``'s (the same
    split) and within the split bound of the unsharded ``ref_model``."""
    x = toy_inputs(batch)
    with torch.no_grad():
        ref = ref_model(*x)
    out = run_sequence(*run, *x)
    assert_same_shapes_equal(out, run_sequence(*local, *x), what=f"{what}, batch {batch}: member vs thread ranks")
    assert_split_close(out, ref, what=f"{what} batch {batch}")
    return out


def _pid(host, member):
    return host.ray.get(host.rank(member).where.remote(), timeout=TIMEOUT_S)["pid"]


def test_a_member_rank_matches_and_owns_only_its_share(host):
    """cpu,w1/cpu: the member's rank owns blocks 2 and 3 and keeps only those (sent once, again only
    when one changes); blocks 0 and 1 reach it from the host every forward (broadcast)."""
    model, local_model, ref_model = toy_copies(3)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    ranks = attach_remote_ranks(engine, host, {1: "w1/cpu"}, CPU)
    assert ranks.owners == {0: 0, 1: 0, 2: 1, 3: 1}
    lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
    block = WeightLayout(ref_model.blocks[0]).nbytes
    try:
        for batch in (1, 2):  # cfg = 1: tokens split, Ulysses across processes; cfg > 1: batch split
            _against_local_and_unsharded((handle, model), (lhandle, local_model), ref_model, batch, "cpu,w1/cpu")
            assert engine.stats.blocks_run == [4, 4]
            if batch == 1:
                assert engine.stats.bytes_exchanged[0] == lengine.stats.bytes_exchanged[0]
                assert ranks.weight_bytes["w1/cpu"] == 4 * block  # its two blocks, and the host's two streamed
            else:
                assert ranks.weight_bytes["w1/cpu"] == 2 * block  # only the host's two: its own stay
        held = ranks.held_bytes(1)
        assert held["blocks"] == [2, 3] and held["owned"] == 2 * block and held["ring"] == 2 * block, held
        for changed, resent in ((2, 3), (0, 2)):  # a LoRA-like change of a member block, then a host block
            with torch.no_grad():
                for b in (handle.proxies["blocks"][changed].real_block, ref_model.blocks[changed]):
                    b.o.weight.add_(0.01)
                ref = ref_model(*toy_inputs(2))
            assert_split_close(run_sequence(handle, model, *toy_inputs(2)), ref, what=f"block {changed} changed")
            assert ranks.weight_bytes["w1/cpu"] == resent * block, changed  # only the changed block again
    finally:
        engine.close()
        lengine.close()


def test_members_that_keep_every_block_receive_no_weights_per_step(host):
    model, ref_model = toy_copies(2)
    handle, engine = engine_for(model, ["cpu", "cpu", "cpu"])
    ranks = attach_remote_ranks(engine, host, {1: "w1/cpu", 2: "w2/cpu"}, CPU, keep_all=True)
    block = WeightLayout(ref_model.blocks[0]).nbytes
    try:
        for batch, sent in ((1, 4), (2, 0), (1, 0)):
            x = toy_inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            assert_split_close(run_sequence(handle, model, *x), ref, what=f"keep_all batch {batch}")
            assert ranks.weight_bytes == {"w1/cpu": sent * block, "w2/cpu": sent * block}
            assert ranks.streamed_bytes == {"w1/cpu": 0, "w2/cpu": 0}
        assert ranks.held_bytes(1)["blocks"] == [0, 1, 2, 3] and ranks.held_bytes(2)["ring"] == 0
    finally:
        engine.close()


def test_two_members_stream_their_blocks_to_each_other(host):
    """cpu,w1/cpu,w2/cpu: a block w2 owns reaches w1 from w2 (the members' weight group), a host
    block reaches both."""
    model, ref_model = toy_copies(2)
    handle, engine = engine_for(model, ["cpu", "cpu", "cpu"])
    ranks = attach_remote_ranks(engine, host, {1: "w1/cpu", 2: "w2/cpu"}, CPU, owners={0: 0, 1: 1, 2: 2, 3: 0})
    block = WeightLayout(ref_model.blocks[0]).nbytes
    try:
        for batch in (1, 2, 3, 1):  # 3: three batch groups of one rank each, one per process
            x = toy_inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            assert_split_close(run_sequence(handle, model, *x), ref, what=f"two members batch {batch}")
        assert ranks.weight_bytes == {"w1/cpu": 3 * block, "w2/cpu": 3 * block}
        assert ranks.held_bytes(1)["blocks"] == [1] and ranks.held_bytes(2)["blocks"] == [2]
        with torch.no_grad():  # a change of w2's block: sent to w2 once, from w2 on to w1
            for b in (handle.proxies["blocks"][2].real_block, ref_model.blocks[2]):
                b.o.weight.add_(0.01)
            ref = ref_model(*toy_inputs(1))
        assert_split_close(run_sequence(handle, model, *toy_inputs(1)), ref, what="w2's block changed")
        assert ranks.weight_bytes == {"w1/cpu": 3 * block, "w2/cpu": 4 * block}
    finally:
        engine.close()


def test_two_host_ranks_and_two_members_in_one_batch_group(host):
    model, local_model, ref_model = toy_copies(3)
    handle, engine = engine_for(model, ["cpu"] * 4)
    attach_remote_ranks(engine, host, {2: "w1/cpu", 3: "w2/cpu"}, CPU)
    lhandle, lengine = engine_for(local_model, ["cpu"] * 4)
    try:
        for batch in (1, 2, 3):
            _against_local_and_unsharded((handle, model), (lhandle, local_model), ref_model, batch,
                                         "cpu,cpu,w1/cpu,w2/cpu")
            if batch == 1:
                assert engine.stats.groups == [((0, 1), (0, 1, 2, 3))]
    finally:
        engine.close()
        lengine.close()


@pytest.mark.parametrize("fate", ["killed", "frozen"])
def test_a_member_lost_mid_forward_is_named_then_local_runs_and_the_next_forward_works(host, fate):
    model, local_model, ref_model = toy_copies(3)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, host, {1: "w1/cpu"}, CPU)
    x = toy_inputs(1)
    with torch.no_grad():
        ref = ref_model(*x)
    pid = _pid(host, "w1/cpu")
    try:
        assert_split_close(run_sequence(handle, model, *x), ref, what="before")
        sig = signal.SIGKILL if fate == "killed" else signal.SIGSTOP  # the host's own rank does it at block 2
        hook = handle.proxies["blocks"][2].real_block.register_forward_pre_hook(lambda *_: os.kill(pid, sig))
        t0 = time.monotonic()
        with pytest.raises(RankThreadError, match=r"member w1/cpu \(rank 1, cpu, on Ray\)"):
            run_sequence(handle, model, *x)
        took = time.monotonic() - t0
        hook.remove()
        assert took < 2 * TIMEOUT_S + 10, took
        assert host.session is None  # the broken session was closed
        if fate == "frozen":
            os.kill(pid, signal.SIGKILL)  # a frozen rank is the user's to end; the next session starts another
        lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
        assert_split_close(run_sequence(lhandle, local_model, *x), ref, what="local run after")
        lengine.close()
        t0 = time.monotonic()
        while True:  # Ray reports the dead actor within its health period; until then a session may fail once
            try:
                out = run_sequence(handle, model, *x)
                break
            except (RankThreadError, RuntimeError):
                assert time.monotonic() - t0 < 3 * TIMEOUT_S
        assert_split_close(out, ref, what="the next forward, a new rank actor")
        assert _pid(host, "w1/cpu") != pid
    finally:
        engine.close()


def test_an_unknown_member_lists_the_members(host):
    model, = toy_copies(1)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, host, {1: "w9/cpu"}, {"w9/cpu": "cpu"})
    with pytest.raises(Exception, match=r"no member 'w9/cpu'.*members: w1/cpu, w2/cpu.*worker --ray"):
        run_sequence(handle, model, *toy_inputs(1))
    engine.close()


def test_two_models_share_one_session(host):
    a, ref_a = toy_copies(2)
    torch.manual_seed(1)
    b = SeqToyDiT(dim=32, heads=4).eval()
    ref_b = SeqToyDiT(dim=32, heads=4).eval()
    ref_b.load_state_dict(b.state_dict())
    engines = []
    for model in (a, b):
        handle, engine = engine_for(model, ["cpu", "cpu"])
        attach_remote_ranks(engine, host, {1: "w1/cpu"}, CPU)
        engines.append((handle, engine, model))
    try:
        for x in (toy_inputs(1), toy_inputs(2), toy_inputs(1)):
            with torch.no_grad():
                want = [ref_a(*x), ref_b(*x)]
            for (handle, _, model), ref in zip(engines, want, strict=True):
                assert_split_close(run_sequence(handle, model, *x), ref, what=f"two models, batch {x[0].shape[0]}")
        assert host.session.sid == 1
    finally:
        for _, engine, _ in engines:
            engine.close()


def test_speed_weighted_shares_reach_the_member(host):
    model, local_model, ref_model = toy_copies(3)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, host, {1: "w1/cpu"}, CPU)
    lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
    for e in (engine, lengine):
        e.set_speeds((3, 1))
    try:
        x = toy_inputs(1)
        with torch.no_grad():
            ref = ref_model(*x)
        out = run_sequence(handle, model, *x)
        assert_same_shapes_equal(out, run_sequence(lhandle, local_model, *x), what="weighted: member vs thread rank")
        assert_split_close(out, ref, what="cpu:3,w1/cpu:1")
        assert engine.stats.tokens == [(0, 18), (18, 24)]
    finally:
        engine.close()
        lengine.close()


@pytest.mark.parametrize("keep_all", [True, False])
def test_a_closed_engine_runs_again_and_resends_the_dropped_blocks(host, keep_all):
    """Issue 19 on Ray: an engine whose model was released (``close``: the member drops its blocks)
    runs again when ComfyUI reuses the same sharded model, sending them again."""
    model, local_model = toy_copies(2)
    block = WeightLayout(local_model.blocks[0]).nbytes
    handle, engine = engine_for(model, ["cpu", "cpu"])
    lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
    ranks = attach_remote_ranks(engine, host, {1: "w1/cpu"}, CPU, keep_all=keep_all)
    owned = 4 if keep_all else 2
    try:
        for batch in (1, 2, 1):
            x = toy_inputs(batch)
            assert torch.equal(run_sequence(handle, model, *x), run_sequence(lhandle, local_model, *x)), batch
            assert ranks.held_bytes(1)["owned"] == owned * block
            engine.close()  # the model is released between prompts; the member drops its blocks
            assert host.session is not None and ranks.held_bytes(1)["owned"] == 0
    finally:
        engine.close()
        lengine.close()
