"""Block sharding engine on toy DiTs (pure torch, CI).

Tier 1: every device ``cpu`` -> the sharded forward equals the unsharded one bit for bit.
Tier 2: fake ``cuda:0..N`` (FakeTensorMode) -> placement, hops, constant copies, and a deliberately
broken router is caught by the same device-mismatch error a real multi-GPU run would raise.
"""
import pytest
import torch
from harness.toy_dit import ToyDiT, ToyMMDiT

from sharddit.parallel.blocks.routing import BlockRouter
from sharddit.parallel.blocks.sharding import BlockProxy, attach_block_sharding, needs_home_every_block
from sharddit.parallel.blocks.routing import BlockLayout
from sharddit.parallel.simulate import fake_device_mode, materialize_module

WAN_LAYOUT = BlockLayout(("blocks",), (("x",),))
MM_LAYOUT = BlockLayout(("double_blocks", "single_blocks"), (("img", "txt"), ("x",)),
                        home_every_block_kwargs=("control",))
N_TOY_CONSTANTS = 5  # e, freqs cos, freqs sin, context, transformer_options["scale"]


def _toy_inputs(device="cpu", batch=2, tokens=12, text=5, fake=False):
    make = (lambda *s: torch.empty(*s, device=device)) if fake else (lambda *s: torch.randn(*s))
    return make(batch, tokens, 8), make(batch), make(batch, text, 32), {"scale": make(1) if fake else torch.tensor([0.9])}


def _split(n_blocks, devices):
    """Contiguous ranges, as even as possible, in the order given."""
    k = len(devices)
    return [devices[min(k - 1, g * k // n_blocks)] for g in range(n_blocks)]


def _snapshot(module):
    return ({k: v.clone() for k, v in module.state_dict().items()},
            {n: (type(m), sorted(m.__dict__), dict(m._modules)) for n, m in module.named_modules()})


@pytest.mark.parametrize("devices", [["cpu", "cpu"], ["cpu", "cpu", "cpu"]])
def test_cpu_sharding_is_bit_identical(devices):
    torch.manual_seed(0)
    model = ToyDiT(n_blocks=6, inter_block={2}).eval()
    x, t, ctx, opts = _toy_inputs()
    with torch.no_grad():
        ref = model(x, t, ctx, opts)
        layout = BlockLayout(("blocks",), (("x",),), return_home_after=frozenset({2}))
        handle = attach_block_sharding(model, layout, _split(6, devices), "cpu")
        out = model(x, t, ctx, opts)
        handle.detach()
        again = model(x, t, ctx, opts)
    assert torch.equal(out, ref) and torch.equal(again, ref)
    assert handle.stats.blocks_run == 6 and handle.stats.hops == 0 and handle.stats.constant_copies == 0


def test_mmdit_cpu_sharding_is_bit_identical():
    torch.manual_seed(0)
    model = ToyMMDiT().eval()
    x, t, _, opts = _toy_inputs()
    txt = torch.randn(2, 4, 32)
    control = [torch.randn(2, 12, 32) for _ in range(3)]
    with torch.no_grad():
        ref = model(x, t, txt.clone(), control, opts)
        handle = attach_block_sharding(model, MM_LAYOUT, ["cpu"] * 6, "cpu")
        out = model(x, t, txt.clone(), control, opts)
        handle.detach()
    assert torch.equal(out, ref)


def test_detach_restores_module_exactly():
    torch.manual_seed(0)
    model = ToyDiT(n_blocks=4)
    blocks_list, blocks = model.blocks, list(model.blocks)
    params = {n: p for n, p in model.named_parameters()}
    sd, structure = _snapshot(model)
    handle = attach_block_sharding(model, WAN_LAYOUT, ["cpu"] * 4, "cpu")
    assert all(isinstance(p, BlockProxy) for p in model.blocks)
    handle.detach()
    handle.detach()  # idempotent
    assert model.blocks is blocks_list and list(model.blocks) == blocks
    assert all(a is b for a, b in zip(model.blocks, blocks))
    assert {n: p for n, p in model.named_parameters()}.keys() == params.keys()
    assert all(p is params[n] for n, p in model.named_parameters())
    sd2, structure2 = _snapshot(model)
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert structure == structure2
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_proxies_hide_block_weights_but_expose_attributes():
    model = ToyDiT(n_blocks=3)
    real = list(model.blocks)
    handle = attach_block_sharding(model, WAN_LAYOUT, ["cpu"] * 3, "cpu")
    names = [n for n, _ in model.named_parameters()]
    assert names and not any(n.startswith("blocks.") for n in names)
    # state_dict keeps the full key space (ComfyUI's LoRA key mapping reads it), same tensors
    sd = model.state_dict(keep_vars=True)
    assert sd["blocks.1.q.weight"] is real[1].q.weight
    assert [k for k in sd if k.startswith("blocks.")] == [f"blocks.{i}.{k}" for i in range(3) for k in real[i].state_dict()]
    proxy = model.blocks[1]
    assert proxy.modulation is real[1].modulation and proxy.real_block is real[1]
    assert proxy.block_index == 1 and proxy.block_device == torch.device("cpu")
    model.eval()
    assert not real[1].training
    with pytest.raises(AttributeError):
        proxy.no_such_attribute
    handle.detach()


def test_errors_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match="2 block lists but 1 stream_args"):
        BlockLayout(("a", "b"), (("x",),))
    model = ToyDiT(n_blocks=4)
    with pytest.raises(ValueError, match="has 4 blocks in \\('blocks',\\) but 3 block devices"):
        attach_block_sharding(model, WAN_LAYOUT, ["cpu"] * 3, "cpu")
    with pytest.raises(ValueError, match="'cuda' has no index: pass e.g. 'cuda:0'"):
        attach_block_sharding(model, WAN_LAYOUT, ["cuda"] * 4, "cpu")
    with pytest.raises(ValueError, match="stream argument 'y' .* is not a parameter of ToyBlock.forward"):
        attach_block_sharding(model, BlockLayout(("blocks",), (("y",),)), ["cpu"] * 4, "cpu")
    handle = attach_block_sharding(model, WAN_LAYOUT, ["cpu"] * 4, "cpu")
    with pytest.raises(ValueError, match="already sharded"):
        attach_block_sharding(model, WAN_LAYOUT, ["cpu"] * 4, "cpu")
    handle.detach()


def test_needs_home_every_block_binds_positional_and_keyword_control():
    fwd = ToyMMDiT.forward
    assert needs_home_every_block(MM_LAYOUT, fwd, (None, 1, 2, 3, [1]), {})
    assert needs_home_every_block(MM_LAYOUT, fwd, (None, 1, 2), {"control": {"input": []}})
    assert not needs_home_every_block(MM_LAYOUT, fwd, (None, 1, 2, None), {})
    assert not needs_home_every_block(WAN_LAYOUT, fwd, (None, 1, 2, 3), {})


# ---- tier 2: fake multi-GPU ---------------------------------------------------------------------

def _fake_toy(cls=ToyDiT, **kw):
    with torch.device("meta"):
        return cls(**kw).eval()


def _boundaries(devs):
    return sum(a != b for a, b in zip(devs, devs[1:]))


@pytest.mark.parametrize("n_dev", [2, 3, 4])
def test_fake_multi_gpu_hops_and_constants(n_dev):
    model = _fake_toy(n_blocks=8)
    devices = [f"cuda:{i}" for i in range(n_dev)]
    block_devices = _split(8, devices)
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        handle = attach_block_sharding(model, WAN_LAYOUT, block_devices, "cuda:0")
        for proxy, dev in zip(model.blocks, block_devices):
            assert {p.device for p in proxy.real_block.parameters()} == {torch.device(dev)}
        assert {p.device for p in model.parameters()} == {torch.device("cuda:0")}
        for _ in range(2):  # stats are per forward
            out = model(*_toy_inputs("cuda:0", fake=True))
            stats = handle.stats
            assert out.device == torch.device("cuda:0")
            assert stats.hops == _boundaries(block_devices) + 1 == handle.router.planned_hops()
            assert stats.copies_by_device == {d: N_TOY_CONSTANTS for d in devices[1:]}
            assert not handle.router._cache  # released after the last block without a scope
        handle.detach()
        assert {p.device for p in model.parameters()} == {torch.device("cuda:0")}


def test_fake_forward_scope_keeps_cache_until_exit():
    model = _fake_toy(n_blocks=4)
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        handle = attach_block_sharding(model, WAN_LAYOUT, ["cuda:0", "cuda:1"] * 2, "cuda:0")
        with handle.router.forward_scope():
            model(*_toy_inputs("cuda:0", fake=True))
            assert handle.router._cache
        assert not handle.router._cache
        assert handle.stats.hops == 4 == handle.router.planned_hops()  # 0|1|0|1 -> home
        assert handle.stats.copies_by_device == {"cuda:1": N_TOY_CONSTANTS}


def test_fake_return_home_after_inter_block_code():
    model = _fake_toy(n_blocks=6, inter_block={1})
    devs = ["cuda:0", "cuda:1", "cuda:1", "cuda:2", "cuda:2", "cuda:2"]
    inputs = lambda: _toy_inputs("cuda:0", fake=True)  # noqa: E731
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        handle = attach_block_sharding(model, WAN_LAYOUT, devs, "cuda:0")  # layout lacks {1}
        with pytest.raises(Exception, match="on the same device"):
            model(*inputs())
        handle.detach()
        layout = BlockLayout(("blocks",), (("x",),), return_home_after=frozenset({1}))
        handle = attach_block_sharding(model, layout, devs, "cuda:0")
        out = model(*inputs())
        assert out.device == torch.device("cuda:0")
        # 0->1 at block 1, home after 1, home->1 at 2, 1->2 at 3, home after 5
        assert [h[0] for h in handle.stats.hop_log] == [1, 1, 2, 3, 5]
        assert handle.stats.hops == _boundaries(devs) + 1 + 2 == handle.router.planned_hops()


class _ForgetfulRouter(BlockRouter):
    """Broken on purpose: hands blocks the home device's constants."""

    def _copy_constant(self, t, dev):
        return t


def test_fake_broken_router_is_caught(monkeypatch):
    import sharddit.parallel.blocks.sharding as sharding

    model = _fake_toy(n_blocks=4)
    monkeypatch.setattr(sharding, "BlockRouter", _ForgetfulRouter)
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        attach_block_sharding(model, WAN_LAYOUT, ["cuda:0", "cuda:0", "cuda:1", "cuda:1"], "cuda:0")
        with pytest.raises(Exception, match="on the same device") as err:
            model(*_toy_inputs("cuda:0", fake=True))
    assert "cuda:1" in str(err.value) and "cuda:0" in str(err.value)


@pytest.mark.parametrize("with_control", [False, True])
def test_fake_mmdit_two_lists_tuple_outputs(with_control):
    model = _fake_toy(ToyMMDiT, n_double=4, n_single=4)
    devs = ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:1", "cuda:2", "cuda:2", "cuda:2"]
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        handle = attach_block_sharding(model, MM_LAYOUT, devs, "cuda:0")
        x, t, _, opts = _toy_inputs("cuda:0", fake=True)
        txt = torch.empty(2, 4, 32, device="cuda:0")
        control = [torch.empty(2, 12, 32, device="cuda:0") for _ in range(4)] if with_control else None
        args = (x, t, txt, control, opts)
        home_all = needs_home_every_block(MM_LAYOUT, ToyMMDiT.forward, (model,) + args, {})
        assert home_all == with_control
        with handle.router.forward_scope(return_home_all=home_all):
            out = model(*args)
        assert out.device == torch.device("cuda:0")
        assert handle.stats.hops == handle.router.planned_hops(return_home_all=home_all)
        # double: 0->1 at 2, home after 3; single: home->1 at 4, 1->2 at 5, home after 7
        assert with_control or handle.stats.hops == 5


def test_fake_return_home_if_due_for_skipping_patches():
    model = _fake_toy(n_blocks=4)
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        handle = attach_block_sharding(model, WAN_LAYOUT, ["cuda:0", "cuda:0", "cuda:1", "cuda:1"], "cuda:0")
        x = torch.empty(2, 3, device="cuda:1")
        router = handle.router
        assert router.return_home_if_due(2, {"img": x})["img"] is x  # not the last block
        out = router.return_home_if_due(3, {"img": x, "txt": x})  # a patch skipped the last block
        assert out["img"].device == out["txt"].device == torch.device("cuda:0")
        with router.forward_scope(return_home_all=True):
            assert router.return_home_if_due(2, (x,))[0].device == torch.device("cuda:0")
        handle.detach()


def test_current_cuda_device_is_set_around_blocks(monkeypatch):
    entered = []

    class _Recorder:
        def __init__(self, dev):
            self.dev = dev

        def __enter__(self):
            entered.append(str(self.dev))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", _Recorder)
    model = _fake_toy(n_blocks=4)
    with fake_device_mode():
        materialize_module(model, "cuda:0")
        handle = attach_block_sharding(model, WAN_LAYOUT, ["cuda:0", "cuda:0", "cuda:1", "cuda:1"], "cuda:0")
        handle.router.set_current_device = True  # what a CUDA build sets
        model(*_toy_inputs("cuda:0", fake=True))
        handle.detach()
    assert entered == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
