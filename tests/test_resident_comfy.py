"""Resident blocks for a sampling run (issue 34, part 1), the ComfyUI side (``loaders/comfy/shard/resident_budgets``):
each GPU rank's budget from the free memory left once the models are loaded, set before the first
step and dropped when the run ends. The ring's own behaviour (nothing streamed once resident, a
changed block recopied) is test_stream_order.py's, on recorded GPU streams."""
import pytest
import torch

pytestmark = pytest.mark.comfy
GIB = 1 << 30


def test_budgets_are_the_free_memory_left_after_the_plan(env):
    from harness.comfy_env import pack_module

    resident = pack_module(env, "loaders.comfy.shard.resident_budgets")
    inv = pack_module(env, "parallel.placement.inventory")
    memory = pack_module(env, "parallel.cost.memory")
    inventory = inv.Inventory((inv.DeviceInfo("cuda:0", "RTX 4090", 24 * GIB, 10 * GIB, releasable_bytes=2 * GIB),
                               inv.DeviceInfo("cuda:1", "RTX 4090", 24 * GIB, 3 * GIB),
                               inv.DeviceInfo("cpu", "CPU", 64 * GIB, 60 * GIB)), "nvml")
    rows = [memory.RankMemory("cuda:0", 8 * GIB, 2 * GIB, 4 * GIB), memory.RankMemory("cuda:1", 8 * GIB, 2 * GIB, 2 * GIB),
            memory.RankMemory("cpu", 8 * GIB, 0, 1 * GIB)]
    # cuda:0: 10 free + 2 releasable - 4 activations - 2 ring to come - 1 reserve = 5; cuda:1: 3 - 2 - 1 (its
    # ring already holds 1 of its 2) - 1 < 0 -> 0; cpu: never
    assert resident.resident_budgets(rows, inventory, GIB, {"cuda:1": GIB}) == [5 * GIB, 0, 0]


def test_the_run_sets_budgets_after_loading_and_drops_them_at_the_end(env, tiny, monkeypatch):
    from harness.sampling import family, load, ours

    build, shape, extras = family(tiny, "wan21")
    model = load(env, build())
    calls = []
    ours(env, model, torch.zeros(shape), extras, "cpu,cpu", cfg=1.0, parallel="sequence")  # shards made
    (state,) = model.model.__dict__["_sharddit_states"].values()
    engine = state.router.engine
    real_keep, real_drop = engine.keep_resident, engine.drop_resident
    monkeypatch.setattr(engine, "keep_resident", lambda b: (calls.append(("keep", list(b))), real_keep(b)))
    monkeypatch.setattr(engine, "drop_resident", lambda: (calls.append(("drop",)), real_drop()))
    ours(env, model, torch.zeros(shape), extras, "cpu,cpu", cfg=1.0, parallel="sequence")
    assert calls == [("keep", [0, 0]), ("drop",)]  # CPU ranks keep nothing; the run's copies go at its end
    calls.clear()
    monkeypatch.setenv("SHARDDIT_RESIDENT", "0")
    ours(env, model, torch.zeros(shape), extras, "cpu,cpu", cfg=1.0, parallel="sequence")
    assert calls == [("drop",)]


@pytest.mark.parametrize("gib,kept", [(80, (20, 20)), (24, (9, 10))])
def test_plan_shows_the_blocks_each_gpu_keeps(env, capsys, gib, kept):
    """`plan` says per GPU how many of the blocks it streams it keeps resident with the room left
    beside the plan: on two 80 GiB cards all 20 (nothing streamed); on two 24
    GiB cards, Wan 2.1 14B bf16 at 480p, about half."""
    import re

    from sharddit.loaders.cli.main import main

    args = ["plan", "--model", "wan2.1-t2v-14b", "--devices", f"cuda:0={gib}GiB,cuda:1={gib}GiB", "--size", "832x480",
            "--frames", "81", "--cfg", "1", "--parallel", "sequence"]
    assert main(args) == 0
    out = capsys.readouterr().out
    line = re.search(r"^resident blocks \(room beside the plan; dropped after each run\): (.+)$", out, re.MULTILINE)
    assert line, out
    said = dict(re.findall(r"(cuda:\d): (\d+) of 20 resident", line.group(1)))
    assert (int(said["cuda:0"]), int(said["cuda:1"])) == kept, line.group(0)
    assert ("nothing streamed" in line.group(1)) == (kept == (20, 20))
