"""ComfyUI settings and patchers ShardDiT must follow (issue 31): ``--disable-pinned-memory`` reaches
the block ring through the Shard node, and a pack's patcher subclass whose ``__init__`` lacks
``fast_disk`` (which newer cores' ``clone()`` passes) still shards and clones."""
import pytest
import torch
from harness.comfy_env import pack_module
from harness.sampling import CFG, SEED, cond, load

pytestmark = pytest.mark.comfy


def _shard(env, model, devices="cpu,cpu"):
    return env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"].execute(model, devices, 0.0).result[0]


def test_the_ring_follows_disable_pinned_memory(env, tiny, monkeypatch):
    from comfy.cli_args import args

    ops = pack_module(env, "parallel.sequence.ops")
    monkeypatch.setattr(ops, "_PINNED", [True])
    model = load(env, tiny.wan21_t2v_state_dict())
    if not hasattr(args, "disable_pinned_memory"):  # no such flag in this core: pinning stays allowed
        _shard(env, model)
        assert ops.TorchOps().pin is True
        return
    monkeypatch.setattr(args, "disable_pinned_memory", True)
    _shard(env, model)
    assert ops.TorchOps().pin is False, "started with --disable-pinned-memory: the ring must not pin"
    monkeypatch.setattr(args, "disable_pinned_memory", False)
    _shard(env, model)
    assert ops.TorchOps().pin is True


def _patcher_classes():
    import comfy.model_patcher

    class CorePatcherWithFastDisk(comfy.model_patcher.ModelPatcher):
        """Stand-in for a core whose ModelPatcher takes ``fast_disk`` and whose ``clone()`` builds the copy
        with it (read in ComfyUI 0.38.1; no such core runs here): it first builds its class as that
        clone does, so a subclass that refuses the keyword fails exactly where it would there."""

        def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False,
                     fast_disk=False):
            super().__init__(model, load_device, offload_device, size, weight_inplace_update)
            self.fast_disk = fast_disk

        def clone(self, *args, **kwargs):
            self.__class__(self.model, self.load_device, self.offload_device, self.model_size(),
                           weight_inplace_update=self.weight_inplace_update, fast_disk=self.fast_disk)
            return super().clone(*args, **kwargs)

    class PackPatcher(CorePatcherWithFastDisk):
        """A pack's subclass written for older cores: its own ``__init__`` without ``fast_disk``."""

        def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
            super().__init__(model, load_device, offload_device, size, weight_inplace_update)

    return CorePatcherWithFastDisk, PackPatcher


def _sample(env, model):
    latent = {"samples": torch.zeros(1, 16, 2, 8, 8)}
    return env.nodes.common_ksampler(model, SEED, 2, CFG, "euler", "simple", cond(), cond(seed=2), latent)[0]["samples"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the refused __init__'s __del__
def test_a_patcher_subclass_without_fast_disk_shards_and_clones(env, tiny):
    core_like, pack_patcher = _patcher_classes()
    base = load(env, tiny.wan21_t2v_state_dict())
    model = pack_patcher(base.model, base.load_device, base.offload_device, base.size)
    with pytest.raises(TypeError, match="fast_disk"):
        model.clone()  # the stand-in reproduces the failure
    ref = _sample(env, base)
    sharded = _shard(env, model)
    assert type(model) is pack_patcher, "the MODEL given to the node keeps its class"
    assert isinstance(sharded, pack_patcher) and type(sharded).__name__ == "PackPatcher"
    assert pack_module(env, "loaders.comfy.shard.hooks").get_shard_state(sharded) is not None
    again = sharded.clone()  # what a LoRA loader after the Shard node does
    assert isinstance(again, pack_patcher) and again.fast_disk is False
    assert torch.equal(_sample(env, again), ref)
    patcher_clone = pack_module(env, "loaders.comfy.core.patcher_clone")
    assert patcher_clone.missing_init_keywords(pack_patcher) == ("fast_disk",)
    assert patcher_clone.missing_init_keywords(core_like) == ()
    assert patcher_clone.clonable(base) is base, "core's own patchers are cloned by core"
