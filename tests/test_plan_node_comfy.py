"""``ShardDiTPlan`` inside real ComfyUI (CPU): registered, schema, text in the UI and as STRING."""
import re

import pytest

from harness.comfy_env import load_comfy

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def env():
    return load_comfy()


def test_schema(env):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    schema = node.define_schema()
    assert schema.display_name == "Placement Plan (ShardDiT)" and schema.category == "sharddit/debug"
    assert schema.is_output_node
    ids = [i.id for i in schema.inputs]
    assert ids == ["devices", "model", "width", "height", "frames", "batch", "dtype", "reserve_vram_gb"]
    assert all(i.tooltip for i in schema.inputs) and all(o.tooltip for o in schema.outputs)
    model = next(i for i in schema.inputs if i.id == "model")
    assert "wan2.1-t2v-14b" in model.options and "hunyuanvideo-13b" in model.options


def test_execute_shows_plan_text(env):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    out = node.execute(devices="cuda:0=8GiB,cuda:1=8GiB", model="wan2.1-t2v-1.3b", width=256, height=256,
                       frames=5, batch="auto", dtype="bf16", reserve_vram_gb=1.0)
    text = out.result[0]
    assert isinstance(text, str) and "FITS: cond+uncond together (batch 2)." in text
    assert "cuda:0 | home + blocks 0-29" in text
    assert out.ui.as_dict() == {"text": (text,)}


def test_execute_on_this_machine_lists_holdings(env):
    """devices 'auto' reads this machine (CPU only here): the inventory table has the holdings
    columns and the DiT is simulated on cpu."""
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    out = node.execute(devices="auto", model="wan2.1-t2v-1.3b", width=128, height=128, frames=1,
                       batch="1", dtype="fp8", reserve_vram_gb=0.0)
    text = out.result[0]
    assert "ComfyUI holds" in text and "ShardDiT holds" in text
    assert re.search(r"^cpu +\| home \+ blocks 0-29 ", text, re.M), text


def test_holdings_and_current_placements_from_loaded_models(env, monkeypatch):
    """ComfyUI's loaded models are split into 'ComfyUI holds' / 'ShardDiT holds' per device, and a
    sharded model's plan is listed."""
    from types import SimpleNamespace

    from harness.comfy_env import pack_module

    plan_node = pack_module(env, "loaders.plan_node")
    planner = pack_module(env, "parallel.planner")
    inventory = pack_module(env, "parallel.inventory").inventory_from_spec("cuda:0=24GiB,cuda:1=24GiB")
    plan = planner.plan_placement(inventory, planner.Footprint(block_bytes=(10 << 30,) * 4),
                                  planner.PlacementRequest())

    class Patcher:
        def __init__(self, size, state=None, shard=False):
            self.size, self.state, self.model = size, state, SimpleNamespace(diffusion_model=torch_module())
            if shard:
                self.sharddit_keys = frozenset()

        def loaded_size(self):
            return self.size

        def get_attachment(self, key):
            return self.state if key == "sharddit" else None

    def torch_module():
        import torch

        return torch.nn.Identity()

    loaded = [SimpleNamespace(device="cuda:0", model=Patcher(3, SimpleNamespace(plan=plan))),
              SimpleNamespace(device="cuda:1", model=Patcher(5, shard=True)),
              SimpleNamespace(device="cuda:1", model=Patcher(7))]
    monkeypatch.setattr(env.mm, "current_loaded_models", loaded)
    assert plan_node.read_holdings() == {"cuda:0": (0, 3), "cuda:1": (7, 5)}
    text = plan_node.describe_current_placements(inventory)
    assert text.startswith("Loaded now, sharded by ShardDiT: Identity") and "blocks" in text
