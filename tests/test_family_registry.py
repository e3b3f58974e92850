"""What a new model family must fill in (issue 35): family knowledge lives in the registries
(``parallel/families.py``: blocks, token split, geometry, cost shape, text encoders; its measured
activation factors in ``parallel/cost/memory.ACTIVATION_FACTORS`` keyed by the entry's name), never
in an if-chain on family names elsewhere. Pure: no ComfyUI."""
import re
from pathlib import Path

import pytest

from sharddit.loaders.plan.text_encoders import ENCODERS, LAYERS
from sharddit.parallel.cost.memory import ACTIVATION_FACTORS
from sharddit.parallel.families import FAMILIES

REPO = Path(__file__).resolve().parents[1]
PLANNED = [f for f in FAMILIES.values() if f.token_specs or f.geometry or f.cost_shape]
"""The video families `plan` builds from a config (Flux, an image model, is only sharded in `blocks`
from a loaded model)."""


@pytest.mark.parametrize("family", PLANNED, ids=lambda f: f.name)
def test_a_planned_family_fills_every_field_plan_needs(family):
    """Blocks and their stream, the geometry and cost shape of its config, and its text encoders."""
    missing = [field for field in ("block_lists", "stream_args", "geometry", "cost_shape", "text_encoders")
               if not getattr(family, field)]
    assert not missing, f"family {family.name}: fill {missing} in its parallel/families.py entry"
    assert len(family.stream_args) == len(family.block_lists), family.name


@pytest.mark.parametrize("family", PLANNED, ids=lambda f: f.name)
def test_its_text_encoders_are_in_the_encoder_table(family):
    """Every key an entry names has a size (and, when ShardDiT's loader splits it, its layers)."""
    for unet in ({}, {"byt5": True}, {"caption_proj_before_connector": True}):
        for key in family.text_encoders(unet):
            assert key in ENCODERS, f"family {family.name}: encoder {key!r} is not in text_encoders.ENCODERS"
    heavy = [k for k in family.text_encoders({}) if ENCODERS[k][1] > 2e9]
    assert all(k in LAYERS for k in heavy), f"family {family.name}: layers of {heavy} not in text_encoders.LAYERS"


@pytest.mark.parametrize("family", [f for f in FAMILIES.values() if f.token_specs], ids=lambda f: f.name)
def test_a_sequence_family_has_its_measured_activation_factors(family):
    """`sequence`'s memory plan needs the measured row of every family that splits tokens, and of
    each code variant its entry can select."""
    assert family.name in ACTIVATION_FACTORS, f"family {family.name}: add its measured row to ACTIVATION_FACTORS"
    if family.lean_block_attr:
        assert f"{family.name}/lean" in ACTIVATION_FACTORS, family.name
    if family.code_variant:
        assert f"{family.name}/{family.code_variant[2]}" in ACTIVATION_FACTORS, family.name


def test_no_family_name_dispatch_outside_the_registries():
    """No `family == "wan"`-style branch on a family's name in product code outside the two registries
    (``parallel/families.py``, ``loaders/comfy/models/comfy_families.py``): a new family is one entry per side."""
    names = "|".join(re.escape(n) for n in FAMILIES)
    branch = re.compile(rf"""(family|\.name)\s*(==|!=|\bin\b)\s*[(\[{{]?\s*["']({names})["']""")
    registries = {REPO / "parallel" / "families.py", REPO / "loaders" / "comfy" / "families.py"}
    hits = []
    for top in ("parallel", "loaders", "nodes"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path in registries:
                continue
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if branch.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{no}: {line.strip()}")
    assert not hits, "family-name dispatch outside the registries (move it into the family's entry):\n" + \
        "\n".join(hits)
