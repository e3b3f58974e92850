"""Fake-device memory tracker on toy modules (pure torch, CI).

Byte sizes are written next to each tensor: bf16 = 2 bytes per element.
"""
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
