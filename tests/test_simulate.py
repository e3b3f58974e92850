"""Fake-device memory tracker on toy modules (pure torch, CI).

Byte sizes are written next to each tensor: bf16 = 2 bytes per element.
"""
import contextlib
import gc

import pytest
import torch

from sharddit.parallel.simulate import (
    MemoryTracker,
    fake_device_mode,
    flash_attention_standin,
    materialize_module,
    modules_move_in_place,
)

BF16 = torch.bfloat16


def _bytes_by_device(module) -> dict[str, int]:
    out = {}
    for t in module.parameters():
        out[str(t.device)] = out.get(str(t.device), 0) + t.numel() * t.element_size()
    return out


def _toy():
    with torch.device("meta"):
        return torch.nn.Sequential(
            torch.nn.Linear(64, 128, dtype=BF16),   # 64*128*2 + 128*2 = 16640 B
            torch.nn.Linear(128, 64, dtype=BF16),   # 128*64*2 + 64*2  = 16512 B
        )


def test_materialize_places_params_on_fake_devices():
    model = _toy()
    with fake_device_mode():
        materialize_module(model, "cuda:1", exclude=[model[1]])
        materialize_module(model[1], "cuda:0")
        assert model[0].weight.device == torch.device("cuda:1")
        assert model[1].weight.device == torch.device("cuda:0")
        assert not model[0].weight.requires_grad
        assert _bytes_by_device(model) == {"cuda:1": 16640, "cuda:0": 16512}


def test_weights_counted_once_and_views_not_counted():
    model = _toy()
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        with MemoryTracker(model) as tracker:
            w = model[0].weight.t()          # view of a weight: not an activation
            w2 = model[0].weight.view(-1)    # another view
            x = torch.empty(4, 64, dtype=BF16, device="cuda:0")   # 512 B
            y = model(x)                     # 4*128*2 = 1024 B, then 4*64*2 = 512 B
            del w, w2
        rep = tracker.report()["cuda:0"]
    assert rep.weights == 16640 + 16512
    assert rep.peak_activations == 512 + 1024 + 512
    assert rep.live_activations == 512 + 512  # x and y still alive
    del x, y


def test_peak_for_known_sequence_with_release():
    with fake_device_mode():
        with MemoryTracker() as tracker:
            a = torch.empty(1000, dtype=BF16, device="cuda:0")   # 2000 B
            b = torch.empty(500, dtype=BF16, device="cuda:1")    # 1000 B on another device
            c = a.narrow(0, 0, 10)                               # view: not counted
            d = a + 1                                            # 2000 B -> peak 4000
            del a, c, d
            gc.collect()
            e = torch.empty(1500, dtype=BF16, device="cuda:0")   # 3000 B, peak stays 4000
            f = e * 2                                            # 3000 B -> peak 6000
            del e, f
            gc.collect()
        rep = tracker.report()
    assert rep["cuda:0"].peak_activations == 6000
    assert rep["cuda:0"].live_activations == 0
    assert rep["cuda:1"].peak_activations == 1000
    del b


def test_coinciding_peak_sums_each_threads_own_peak():
    """Two threads that allocate one after the other peak at 2000 B together in this run; their own
    peaks (2000 B and 3000 B) would meet under another interleaving: ``coinciding_activations``."""
    import threading

    def allocate(n):
        with fake_device_mode(), tracker.thread_view():
            t = torch.empty(n, dtype=BF16, device="cuda:0")
            del t
            gc.collect()

    with MemoryTracker() as tracker:
        for n in (1000, 1500):  # 2000 B, then 3000 B
            worker = threading.Thread(target=allocate, args=(n,))
            worker.start()
            worker.join()
    rep = tracker.report()["cuda:0"]
    assert rep.peak_activations == 3000
    assert rep.coinciding_activations == 2000 + 3000


def test_flash_standin_allocates_output_only():
    with fake_device_mode():
        q = torch.empty(2, 4096, 8 * 64, dtype=BF16, device="cuda:0")
        with MemoryTracker() as tracker:
            out = flash_attention_standin(q, q, q, heads=8)
        rep = tracker.report()["cuda:0"]
        assert out.shape == (2, 4096, 512)
        # output 2*4096*512*2 = 8 MiB, plus the fp32 lse 2*8*4096*4 = 256 KiB; never 4096x4096
        assert rep.peak_activations == 2 * 4096 * 512 * 2 + 2 * 8 * 4096 * 4
        q4 = q.view(2, 4096, 8, 64).transpose(1, 2)
        assert flash_attention_standin(q4, q4, q4, 8, skip_reshape=True,
                                       skip_output_reshape=True).shape == (2, 8, 4096, 64)


def test_flash_standin_rejects_mixed_devices():
    with fake_device_mode():
        q = torch.empty(1, 16, 64, dtype=BF16, device="cuda:0")
        k = torch.empty(1, 16, 64, dtype=BF16, device="cuda:1")
        with pytest.raises(RuntimeError, match="same device"):
            flash_attention_standin(q, k, k, heads=1)


def test_module_to_inside_a_forward_moves_in_place():
    """HunyuanVideo 1.5's forward calls ``self.cond_type_embedding.to(txt.device)``: on fake devices
    ``nn.Module.to`` tries to swap the parameter objects, which fails while others hold them (in the
    simulation: "_apply(): Couldn't swap Embedding.weight"); ``modules_move_in_place`` keeps a weight
    that is already there and replaces one that moves."""
    model, memo = _toy(), {}
    with fake_device_mode():
        materialize_module(model, "cuda:0", memo=memo)
        weight = model[0].weight
        with modules_move_in_place(model):
            assert model[0].to("cuda:0") is model[0] and model[0].weight is weight  # already there: as it was
            model[1].to(torch.device("cuda:1"))
            assert _bytes_by_device(model) == {"cuda:0": 16640, "cuda:1": 16512}
        assert "to" not in model[0].__dict__  # restored


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64, dtype=BF16)  # 64*64*2 + 64*2 = 8320 B

    def forward(self, x):
        return self.lin(x)


class _ToyDiT(torch.nn.Module):
    """An embedding on the home device and two lists of blocks (one nested), as a DiT lays them out."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(64, 64, dtype=BF16)  # 8320 B
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(3)])
        self.tail = torch.nn.Module()
        self.tail.blocks = torch.nn.ModuleList([_Block() for _ in range(2)])

    def forward(self, x):
        x = self.embed(x)
        for b in [*self.blocks, *self.tail.blocks]:
            x = b(x)
        return x


def test_simulated_forward_measures_each_device_and_leaves_the_module_on_meta():
    """Weights where the plan puts them, the forward routed by the pack's block engine (a block's
    output on its device, the input moved there), every storage counted; afterwards the module is
    exactly as before: its own block lists (no proxies), every tensor on ``meta``."""
    from sharddit.parallel.blocks.routing import BlockLayout
    from sharddit.parallel.blocks.dry_forward import simulated_forward

    layout = BlockLayout(("blocks", "tail.blocks"), (("x",), ("x",)))
    with torch.device("meta"):
        dit = _ToyDiT()
    lists = (dit.blocks, dit.tail.blocks)
    seen = []

    def forward(home):
        seen.append(home)
        out = dit(torch.empty(4, 64, dtype=BF16, device=home))  # 512 B per hidden state
        assert out.device == torch.device(home)  # the last block's output comes home
        del out

    memory, extra = simulated_forward(dit, layout, ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:1"], "cuda:0",
                                      forward)
    assert extra is None and seen == [torch.device("cuda:0")]
    assert memory["cuda:0"].weights == 3 * 8320 and memory["cuda:1"].weights == 3 * 8320
    assert memory["cuda:1"].peak_activations >= 2 * 512  # the hidden state copied in, a block's output
    assert (dit.blocks, dit.tail.blocks) == lists
    assert all(t.device.type == "meta" for t in [*dit.parameters(), *dit.buffers()])

    # the probe: one block of each list, all on the home device; the lists come back whole
    memory, _ = simulated_forward(dit, layout, None, "cuda:1", forward, first_only=True)
    assert set(memory) == {"cuda:1"} and memory["cuda:1"].weights == 3 * 8320
    assert len(dit.blocks) == 3 and len(dit.tail.blocks) == 2
    assert all(t.device.type == "meta" for t in dit.parameters())


def test_simulated_forward_runs_a_second_engine_and_always_closes_it():
    """``engine`` attaches to the sharded module before the forward; its ``after`` value is returned
    and ``close`` runs even when the forward fails, which leaves the module on ``meta``."""
    from sharddit.parallel.blocks.routing import BlockLayout
    from sharddit.parallel.blocks.dry_forward import simulated_forward

    layout = BlockLayout(("blocks", "tail.blocks"), (("x",), ("x",)))
    with torch.device("meta"):
        dit = _ToyDiT()
    closed = []

    class Engine:  # what a second engine sees: the sharding handle, the fake mode, the tracker
        def __init__(self, handle, mode, tracker):
            self.proxies = sum(len(p) for p in handle.proxies.values())
            self.tracked = isinstance(tracker, MemoryTracker)
            self.scopes = 0
            handle.router.use_engine(self)  # the forward runs in a `sequence` scope of this engine

        @contextlib.contextmanager
        def forward_scope(self):
            self.scopes += 1
            yield self

    def engine(handle, mode, tracker):
        e = Engine(handle, mode, tracker)
        return (lambda: (e.proxies, e.tracked, e.scopes)), (lambda: closed.append(True))

    _, extra = simulated_forward(dit, layout, ["cuda:0"] * 5, "cuda:0", lambda home: None, engine=engine)
    assert extra == (5, True, 1) and closed == [True]

    def broken(home):
        raise RuntimeError("the forward failed")

    with pytest.raises(RuntimeError, match="the forward failed"):
        simulated_forward(dit, layout, ["cuda:0"] * 5, "cuda:0", broken, engine=engine)
    assert closed == [True, True]
    assert all(t.device.type == "meta" for t in dit.parameters()) and len(dit.blocks) == 3
