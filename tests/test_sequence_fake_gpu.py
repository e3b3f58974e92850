"""`sequence` mode on ComfyUI's real-size video DiTs over fake GPUs (FakeTensorMode).

Wan 2.1 14B, LTX-Video 13B and HunyuanVideo 13B (ComfyUI 0.3.64 classes on ``meta``), blocks
planned over fake ``cuda:0..N-1`` (N = 2, 4; 8 for Wan), one forward at 480p x 81 frames with cond+uncond
(batch 2) inside ``FakeTensorMode``: every rank's worker thread runs every block on its own fake
device. A tensor on the wrong device raises exactly where a real multi-GPU run would. Checked:
output home, bytes streamed per rank = the blocks it does not own, exchanges per block as designed
(two all-to-alls per block for a rank that shares a batch group, none for a rank alone), and a
deliberately broken exchange is caught.
"""
import pytest
from test_specs_fake_gpu import CASES, HOME, _forward, _model, _plan, comfy, models  # noqa: F401

from sharddit.parallel.sequence import threads as seq_workers
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.threads import RankThreadError
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.simulate import fake_device_mode, materialize_planned
from sharddit.parallel.placement.sizing import get_blocks

pytestmark = pytest.mark.comfy


def _token_specs(dit):
    from sharddit.loaders.comfy.models.specs import find_arch_spec

    return find_arch_spec(type(dit).__name__).sequence_specs(dit)[0]


def _run_sequence(dit, layout, devices, family, mode):
    materialize_planned(dit, get_blocks(dit, layout), devices, HOME)
    handle = attach_block_sharding(dit, layout, devices, HOME)
    ranks = [d for i, d in enumerate(devices) if i == 0 or devices[i - 1] != d]
    proxies = [p for pl in handle.proxies.values() for p in pl]
    engine = attach_sequence_engine(handle.router, proxies, _token_specs(dit), ranks, timeout_s=120,
                                    worker_context=lambda: mode, serialize=True)
    try:
        with handle.router.forward_scope(sequence=True):
            out = _forward(dit, family)
        return out, engine, ranks
    finally:
        engine.close()
        handle.detach()


# Eight ranks (two batch groups of four: Ulysses over four) on Wan only: each rank runs every block,
# so a case costs its rank count; LTX-Video's and HunyuanVideo's token layouts are proven on 2 and 4
# (groups of one and two), and the group-of-four exchange is family-independent code.
CASES_RUN = [(f, n) for f in ("wan", "ltxv", "hunyuan") for n in (2, 4)] + [("wan", 8)]


@pytest.mark.parametrize("family,n_dev", CASES_RUN)
def test_real_config_sequence_forward(comfy, models, family, n_dev):  # noqa: F811
    dit, layout = _model(models, comfy, family)
    devices, block_bytes = _plan(dit, layout, n_dev)
    with fake_device_mode() as mode:
        out, engine, ranks = _run_sequence(dit, layout, devices, family, mode)
        assert out.device == HOME and out.shape == CASES[family][0]
    st = engine.stats
    n_blocks = len(devices)
    assert st.fallbacks == 0 and st.blocks_run == [n_blocks] * len(ranks)
    for r, dev in enumerate(ranks):
        assert st.bytes_streamed[r] == sum(b for b, d in zip(block_bytes, devices, strict=True) if d != dev)
    for _, group in st.groups:
        for r in group:
            assert st.exchanges[r] == (2 * n_blocks if len(group) > 1 else 0)
            assert (st.bytes_exchanged[r] > 0) == (len(group) > 1)
    assert len(st.groups) == min(2, len(ranks))  # cond / uncond split first


def test_broken_exchange_is_caught(comfy, models, monkeypatch):  # noqa: F811
    """An exchange that forgets to move the other ranks' heads to its own device."""
    dit, layout = _model(models, comfy, "wan")
    devices, _ = _plan(dit, layout, 4)
    monkeypatch.setattr(seq_workers, "_to", lambda obj, dev: obj)
    with fake_device_mode() as mode:
        with pytest.raises(RankThreadError) as err:
            _run_sequence(dit, layout, devices, "wan", mode)
    assert "cuda:" in str(err.value) and "device" in str(err.value.__cause__)
