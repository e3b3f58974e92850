"""Architecture spec lookup (pure: specs.py imports ComfyUI nowhere; CI)."""
import pytest
import torch

from sharddit.loaders.comfy.models.specs import SPECS, find_arch_spec, get_arch_spec


def test_every_spec_is_a_valid_layout():
    names = [n for s in SPECS for n in s.class_names]
    assert len(names) == len(set(names))
    for spec in SPECS:
        if spec.name in ("Wan VACE", "Wan S2V", "Wan Animate", "WanDancer"):  # layout read off the instance
            continue
        layout = get_arch_spec(spec.class_names[0])
        assert len(layout.stream_args) == len(layout.block_lists)


def test_unknown_architecture_error_lists_supported():
    with pytest.raises(ValueError) as err:
        get_arch_spec(torch.nn.Linear(2, 2))
    msg = str(err.value)
    assert msg.startswith("[ShardDiT] cannot shard diffusion model class 'Linear'")
    for name in ("WanModel", "VaceWanModel", "WanModel_S2V", "LTXVModel", "HunyuanVideo", "Flux"):
        assert name in msg
    assert "Use ComfyUI's core nodes for this model, or open an issue" in msg
    assert find_arch_spec("HunyuanVideo").block_lists == ("double_blocks", "single_blocks")
    assert get_arch_spec("LTXVModel").stream_args == (("x",),)
    with pytest.raises(ValueError, match="pass the VaceWanModel instance"):
        get_arch_spec("VaceWanModel")


def test_every_comfy_family_names_a_pure_family_entry():
    """One name finds both sides: each ComfyUI-side entry and spec names an entry of
    parallel/families.py, and the block lists a spec reports are that entry's."""
    from sharddit.loaders.comfy.models.comfy_families import COMFY_FAMILIES
    from sharddit.parallel.families import FAMILIES, family_of, get_family

    for name, fam in COMFY_FAMILIES.items():
        assert name in FAMILIES and all(s.family == name for s in fam.specs)
        for spec in fam.specs:
            assert spec.block_lists == get_family(name).block_lists
    for name, fam in FAMILIES.items():
        if fam.geometry is not None:
            assert all(family_of({"image_model": m}, "x") == name for m in fam.image_models)
    with pytest.raises(ValueError, match="model family 'nope' is not known"):
        get_family("nope")
