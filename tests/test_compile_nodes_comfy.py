"""Per-block torch.compile nodes (KJNodes, vendored) and sharding: refused with the order that
works, never bypassed silently; a whole-model compile (core's wrapper) composes in either order.

torch.compile is lazy: the refusals happen before anything compiles. The composing cases use
core's ``set_torch_compile_wrapper`` (what core's TorchCompileModel calls) with the ``eager``
backend, so the test proves the wrapping composes without a C compiler on CPU.
"""
import pytest
import torch
from harness import sampling

pytestmark = pytest.mark.comfy

COMPILE_ARGS = dict(backend="inductor", fullgraph=False, mode="default", dynamic=False, dynamo_cache_size_limit=64,
                    compile_transformer_blocks_only=True)


@pytest.fixture(scope="module")
def kj(comfy_env, tmp_path_factory):
    from harness.vendor_packs import extract_pack, import_pack

    pytest.importorskip("accelerate", reason="KJNodes needs accelerate: pip install --no-deps -r tests/requirements-nodeps.txt")
    folder = extract_pack("ComfyUI-KJNodes", tmp_path_factory.mktemp("custom_nodes"))
    return import_pack(folder).NODE_CLASS_MAPPINGS


@pytest.fixture
def wan(comfy_env):
    import comfy.sd
    from harness import tiny_models

    return comfy.sd.load_diffusion_model_state_dict(dict(tiny_models.wan21_t2v_state_dict()))


def _stock(env, model):
    return sampling.stock(env, model, torch.zeros(1, 16, 1, 8, 8), {})


def _ours(env, model):
    return sampling.ours(env, model, torch.zeros(1, 16, 1, 8, 8), {}, "cpu,cpu")


def _shard(env, model):
    return env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"].execute(model, "cpu,cpu", 0.0).result[0]


@pytest.mark.parametrize("version", ["TorchCompileModelWanVideo", "TorchCompileModelWanVideoV2"])
@pytest.mark.parametrize("order", ["compile_then_shard", "shard_then_compile", "compile_then_ksampler"])
def test_per_block_compile_refused_with_the_order_that_works(comfy_env, kj, wan, version, order):
    compile_node = kj[version]()
    compile_ = lambda m: compile_node.patch(m, **COMPILE_ARGS)[0]  # noqa: E731
    with pytest.raises(ValueError) as err:
        if order == "compile_then_shard":
            _ours(comfy_env, _shard(comfy_env, compile_(wan)))
        elif order == "shard_then_compile":
            _ours(comfy_env, compile_(_shard(comfy_env, wan)))
        else:
            _ours(comfy_env, compile_(wan))
    text = str(err.value)
    assert "per-block torch.compile" in text and "core's TorchCompileModel" in text, text


def test_whole_model_compile_composes_in_either_order(comfy_env, wan):
    """The backend counts the graphs dynamo hands it and the times they run: a wrapper dropped on
    the way (by sharding, or by our sampler) would leave both at 0 and still match the reference."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    seen = {"graphs": 0, "runs": 0}

    def counting_eager(gm, example_inputs):  # like backend="eager": runs the traced graph as is
        seen["graphs"] += 1

        def run(*args):
            seen["runs"] += 1
            return gm.forward(*args)
        return run

    def compile_(model):
        m = model.clone()
        set_torch_compile_wrapper(model=m, backend=counting_eager)
        return m

    torch._dynamo.reset()
    ref = _stock(comfy_env, wan)
    assert seen == {"graphs": 0, "runs": 0}  # the plain model compiles nothing
    for order, model in (("compile then sample", lambda: compile_(wan)),
                         ("shard then compile", lambda: compile_(_shard(comfy_env, wan)))):
        torch._dynamo.reset()
        seen.update(graphs=0, runs=0)
        assert torch.equal(_ours(comfy_env, model()), ref), order  # blocks mode: the reference's shapes
        assert seen["graphs"] > 0 and seen["runs"] >= sampling.STEPS, (order, seen)  # the wrapper ran
