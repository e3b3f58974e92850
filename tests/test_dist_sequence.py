"""Distributed `sequence` mode on a toy DiT (pure torch, gloo on 127.0.0.1): the host (this test
process) and one worker process. Rank 1 of ``cpu,cpu`` runs in the worker: the split forward is
bit-identical to the all-local ``cpu,cpu`` run (the same split: every GEMM sees the same shapes) and
equal to the unsharded one or within the split bound of tests/harness/numerics.py (a split gives
GEMMs fewer rows, which CPU BLAS may sum in another order); weights cross once and
again only for the block that changed; a worker killed mid-forward fails the forward with its
name within the timeout; a local run still works; the worker re-joins and runs again."""
import os
import re
import signal
import time

import pytest
import torch
from harness import dist_procs
from harness.numerics import assert_same_shapes_equal, assert_split_close
from harness.seq_models import engine_for, run_sequence, toy_copies, toy_inputs
from harness.toy_seq import SeqToyDiT
from sharddit.parallel.distributed.weights import WeightLayout
from sharddit.parallel.distributed.lobby import describe_workers
from sharddit.parallel.distributed.ranks import attach_remote_ranks
from sharddit.parallel.distributed.worker import Worker, connect
from sharddit.parallel.sequence.threads import RankThreadError

TIMEOUT_S = 8.0


@pytest.fixture
def lobby():
    with dist_procs.lobby_with_workers(TIMEOUT_S) as lob:
        yield lob


def _worker(lob, name="w1"):
    proc = dist_procs.start_worker(lob.port, name, TIMEOUT_S)
    lob.procs.append(proc)
    dist_procs.wait_joined(lob, f"{name}/cpu", proc)
    return proc


def test_worker_rank_matches_and_owns_only_its_share(lobby):
    """cpu,w1/cpu: the worker's rank owns blocks 2 and 3 and keeps only those (sent once, again only
    when one changes); blocks 0 and 1 reach it from the host every forward (broadcast)."""
    model, local_model, ref_model = toy_copies(3)
    _worker(lobby)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    ranks = attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
    assert ranks.owners == {0: 0, 1: 0, 2: 1, 3: 1}
    lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
    block = WeightLayout(ref_model.blocks[0]).nbytes
    try:
        for batch in (1, 2):  # cfg = 1: tokens split, Ulysses across processes; cfg > 1: batch split
            x = toy_inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            out = run_sequence(handle, model, *x)
            local = run_sequence(lhandle, local_model, *x)
            assert_same_shapes_equal(out, local, what=f"worker rank vs thread rank, batch {batch}")
            assert_split_close(out, ref, what=f"cpu,w1/cpu batch {batch}")
            assert engine.stats.blocks_run == [4, 4]
            if batch == 1:
                assert engine.stats.exchanges[0] == 8
                assert engine.stats.bytes_exchanged[0] == lengine.stats.bytes_exchanged[0]
                assert ranks.weight_bytes["w1/cpu"] == 4 * block  # its two blocks, and the host's two streamed
            else:
                assert ranks.weight_bytes["w1/cpu"] == 2 * block  # only the host's two: its own stay
        assert ranks.bytes_sent["w1/cpu"] - ranks.weight_bytes["w1/cpu"] < block  # commands and arguments are small
        held = ranks.held_bytes(1)
        assert held["blocks"] == [2, 3] and held["owned"] == 2 * block, held  # its share, nothing more
        assert held["ring"] == 2 * block, held  # the block computing and the one arriving
        for changed, resent in ((2, 3), (0, 2)):  # a LoRA-like change of a worker block, then a host block
            with torch.no_grad():
                for b in (handle.proxies["blocks"][changed].real_block, ref_model.blocks[changed]):
                    b.o.weight.add_(0.01)
                ref = ref_model(*toy_inputs(2))
            assert_split_close(run_sequence(handle, model, *toy_inputs(2)), ref, what=f"block {changed} changed")
            assert ranks.weight_bytes["w1/cpu"] == resent * block, changed  # only the changed block again
    finally:
        engine.close()
        lengine.close()


def test_workers_that_keep_every_block_receive_no_weights_per_step(lobby):
    """keep_all (SHARDDIT_DIST_WEIGHTS=all, or auto with room): every block sent once, then only
    the changed one; nothing streams per step."""
    model, ref_model = toy_copies(2)
    _worker(lobby, "w1")
    _worker(lobby, "w2")
    handle, engine = engine_for(model, ["cpu", "cpu", "cpu"])
    ranks = attach_remote_ranks(engine, lobby, {1: "w1/cpu", 2: "w2/cpu"}, {"w1/cpu": "cpu", "w2/cpu": "cpu"}, keep_all=True)
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
        with torch.no_grad():
            for b in (handle.proxies["blocks"][0].real_block, ref_model.blocks[0]):
                b.o.weight.add_(0.01)
            ref = ref_model(*toy_inputs(1))
        assert_split_close(run_sequence(handle, model, *toy_inputs(1)), ref, what="keep_all block 0 changed")
        assert ranks.weight_bytes == {"w1/cpu": block, "w2/cpu": block}
    finally:
        engine.close()


def test_two_workers_stream_their_blocks_to_each_other(lobby):
    """cpu,w1/cpu,w2/cpu: a block w2 owns reaches w1 from w2 (not from the host), a host block
    reaches both; every forward matches the unsharded one (equal or within the split bound)."""
    model, ref_model = toy_copies(2)
    _worker(lobby, "w1")
    _worker(lobby, "w2")
    handle, engine = engine_for(model, ["cpu", "cpu", "cpu"])
    ranks = attach_remote_ranks(engine, lobby, {1: "w1/cpu", 2: "w2/cpu"}, {"w1/cpu": "cpu", "w2/cpu": "cpu"},
                                owners={0: 0, 1: 1, 2: 2, 3: 0})
    block = WeightLayout(ref_model.blocks[0]).nbytes
    try:
        for batch in (1, 2, 1):
            x = toy_inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            assert_split_close(run_sequence(handle, model, *x), ref, what=f"two workers batch {batch}")
            assert engine.stats.blocks_run == [4, 4, 4]
        # last forward: each worker received the three blocks it does not own, its own stayed put
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


def test_two_host_ranks_and_two_workers_in_one_batch_group(lobby):
    """cpu,cpu,w1/cpu,w2/cpu at cfg 1: one batch group of four positions, two of them threads of
    this process sharing one exchange; bit-identical to the all-local run (same split, same shapes),
equal to unsharded or within the split bound."""
    model, local_model, ref_model = toy_copies(3)
    _worker(lobby, "w1")
    _worker(lobby, "w2")
    handle, engine = engine_for(model, ["cpu"] * 4)
    attach_remote_ranks(engine, lobby, {2: "w1/cpu", 3: "w2/cpu"}, {"w1/cpu": "cpu", "w2/cpu": "cpu"})
    lhandle, lengine = engine_for(local_model, ["cpu"] * 4)
    try:
        for batch in (1, 2, 3):
            x = toy_inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            out = run_sequence(handle, model, *x)
            assert_same_shapes_equal(out, run_sequence(lhandle, local_model, *x), what=f"4 ranks vs all-local, batch {batch}")
            assert_split_close(out, ref, what=f"cpu,cpu,w1/cpu,w2/cpu batch {batch}")
            assert engine.stats.blocks_run == [4, 4, 4, 4]
            if batch == 1:
                assert engine.stats.groups == [((0, 1), (0, 1, 2, 3))]
                assert engine.stats.bytes_exchanged[:2] == lengine.stats.bytes_exchanged[:2]  # the host ranks
    finally:
        engine.close()
        lengine.close()


def test_worker_killed_mid_forward_names_it_then_local_runs_and_rejoin_works(lobby):
    model, local_model, ref_model = toy_copies(3)
    proc = _worker(lobby)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
    x = toy_inputs(1)
    with torch.no_grad():
        ref = ref_model(*x)
    try:
        assert_split_close(run_sequence(handle, model, *x), ref, what="before the kill")
        # the host's own rank kills the worker when it reaches block 2 (mid-forward)
        hook = handle.proxies["blocks"][2].real_block.register_forward_pre_hook(
            lambda *_: os.kill(proc.pid, signal.SIGKILL))
        t0 = time.monotonic()
        with pytest.raises(RankThreadError) as info:
            run_sequence(handle, model, *x)
        took = time.monotonic() - t0
        hook.remove()
        assert "'w1'" in str(info.value) and "block" in str(info.value), str(info.value)
        assert took < 2 * TIMEOUT_S + 5, took
        assert lobby.session is None  # the broken session was closed
        lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])  # a local run works at once
        assert_split_close(run_sequence(lhandle, local_model, *x), ref, what="local run after the kill")
        lengine.close()
        _worker(lobby)  # the same name re-joins; the host opens a new session
        assert_split_close(run_sequence(handle, model, *x), ref, what="after the re-join")
        assert lobby.session.sid == 2
    finally:
        engine.close()


def test_unknown_worker_name_lists_the_joined_ones(lobby):
    model, = toy_copies(1)
    assert lobby.describe().endswith("none joined yet")
    _worker(lobby)
    assert re.search(r"\n  w1 on \S+: w1/cpu \d+\.\d GiB free$", lobby.describe()), lobby.describe()
    client = connect("127.0.0.1", lobby.port, 5.0, wait_s=0)  # what `plan --workers` reads
    assert describe_workers(client, "127.0.0.1", lobby.port) == lobby.describe()
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, lobby, {1: "w9/cpu"}, {"w9/cpu": "cpu"})
    with pytest.raises(ValueError, match=r"'w9'.*joined: w1/cpu.*--name w9 --devices cpu"):
        run_sequence(handle, model, *toy_inputs(1))
    engine.close()


def test_hung_worker_fails_the_forward_within_the_timeout(lobby):
    model, = toy_copies(1)
    proc = _worker(lobby)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
    x = toy_inputs(1)
    try:
        run_sequence(handle, model, *x)
        hook = handle.proxies["blocks"][1].real_block.register_forward_pre_hook(
            lambda *_: os.kill(proc.pid, signal.SIGSTOP))  # the worker freezes mid-forward
        t0 = time.monotonic()
        with pytest.raises(RankThreadError, match=r"worker 'w1' \(rank 1, cpu\).*(within|silent for) 8 s"):
            run_sequence(handle, model, *x)
        took = time.monotonic() - t0
        hook.remove()
        assert TIMEOUT_S - 1 < took < 2 * TIMEOUT_S + 5, took
        assert lobby.session is None
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        engine.close()


def test_two_models_share_one_worker_session(lobby):
    """Wan 2.2's two experts: two engines, one session; blocks and per-forward constants of one
    model never stand in for the other's."""
    a, ref_a = toy_copies(2)
    torch.manual_seed(1)
    b = SeqToyDiT(dim=32, heads=4).eval()
    ref_b = SeqToyDiT(dim=32, heads=4).eval()
    ref_b.load_state_dict(b.state_dict())
    _worker(lobby)
    engines = []
    for model in (a, b):
        handle, engine = engine_for(model, ["cpu", "cpu"])
        attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
        engines.append((handle, engine, model))
    try:
        for x in (toy_inputs(1), toy_inputs(2), toy_inputs(1)):
            with torch.no_grad():
                want = [ref_a(*x), ref_b(*x)]
            for (handle, _, model), ref in zip(engines, want, strict=True):
                assert_split_close(run_sequence(handle, model, *x), ref, what=f"two models, batch {x[0].shape[0]}")
        assert lobby.session.sid == 1
    finally:
        for _, engine, _ in engines:
            engine.close()


def test_a_session_that_failed_to_open_does_not_block_the_next(lobby):
    """A registered worker that is gone (killed while joining): the session fails, naming it; a
    worker that joins afterwards gets a session (a failed init_process_group must not leave
    torch's group count behind, or host and fresh worker wait for each other's keys)."""
    Worker(connect("127.0.0.1", lobby.port, 5.0, wait_s=0), "w1", "cpu", {"free": 0},  # a registration whose
           say=lambda m: None)                                                          # process is gone
    model, ref_model = toy_copies(2)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
    x = toy_inputs(1)
    try:
        with pytest.raises(Exception, match=r"worker member\(s\) w1/cpu did not join session 1 within 8 s"):
            run_sequence(handle, model, *x)
        _worker(lobby)
        with torch.no_grad():
            assert_split_close(run_sequence(handle, model, *x), ref_model(*x), what="session after a failed one")
    finally:
        engine.close()


def test_speed_weighted_shares_reach_the_worker(lobby):
    """cpu:3,w1/cpu:1: the host rank takes 3/4 of the tokens and heads, the worker 1/4; the worker
    builds its Ulysses ranges from the shares in the command, so the run equals the all-local one
    with the same shares (same ranges, same shapes) and the unsharded one within the split bound."""
    model, local_model, ref_model = toy_copies(3)
    _worker(lobby)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
    lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
    for e in (engine, lengine):
        e.set_speeds((3, 1))
    try:
        x = toy_inputs(1)
        with torch.no_grad():
            ref = ref_model(*x)
        out = run_sequence(handle, model, *x)
        assert_same_shapes_equal(out, run_sequence(lhandle, local_model, *x), what="weighted: worker rank vs thread rank")
        assert_split_close(out, ref, what="cpu:3,w1/cpu:1")
        assert engine.stats.tokens == [(0, 18), (18, 24)] and engine.stats.exchanges[0] == 8
    finally:
        engine.close()
        lengine.close()
