"""Small workflows written by the shard transform's tests (our own graphs, not copied): a UI
workflow with everything the transform must handle or leave alone, and an API prompt with a
flattened subgraph. Used by tests/test_shard_transform.py and tests/test_shard_transform_cli.py."""
from __future__ import annotations

SUB = "5b1c0e6e-0000-4000-8000-00000000a001"


def node(nid, typ, pos, size=(300, 80), inputs=(), outputs=(), mode=0, widgets=None, title=None):
    n = {"id": nid, "type": typ, "pos": list(pos), "size": list(size), "flags": {}, "order": nid, "mode": mode,
         "inputs": [{"name": a, "type": t, "link": k} for a, t, k in inputs],
         "outputs": [{"name": a, "type": t, "links": list(k)} for a, t, k in outputs],
         "properties": {}, "widgets_values": list(widgets or [])}
    if title:
        n["title"] = title
    return n


def ui_workflow() -> dict:
    """Top level: a titled UNETLoader in a group -> a legacy Reroute -> LoRA -> KSampler, a Note
    under the loader, a bypassed UNETLoader, an unused one, a ShardDiT loader, and an instance of
    a subgraph whose CheckpointLoaderSimple feeds two KSamplers, one of them through a native
    reroute (a link with ``parentId``)."""
    top = [
        node(1, "UNETLoader", (0, 0), outputs=[("MODEL", "MODEL", [1])], widgets=["wan_high.safetensors", "default"],
              title="Wan high noise"),
        node(2, "Reroute", (0, 170), (75, 26), inputs=[("", "*", 1)], outputs=[("", "MODEL", [2])]),
        node(3, "LoraLoaderModelOnly", (0, 250), inputs=[("model", "MODEL", 2)], outputs=[("MODEL", "MODEL", [3])],
              widgets=["lightning.safetensors", 1.0]),
        node(4, "KSampler", (400, 0), (300, 260), inputs=[("model", "MODEL", 3)], outputs=[("LATENT", "LATENT", [])],
              widgets=[1, "fixed", 20, 5.0, "euler", "simple", 1.0]),
        node(5, "Note", (0, 400), (300, 60), widgets=["a note under the loader"]),
        node(6, "UNETLoader", (800, 0), outputs=[("MODEL", "MODEL", [4])], mode=4, widgets=["wan_low.safetensors", "default"]),
        node(7, "KSampler", (800, 200), (300, 260), inputs=[("model", "MODEL", 4)], outputs=[("LATENT", "LATENT", [])],
              widgets=[1, "fixed", 20, 5.0, "euler", "simple", 1.0]),
        node(8, "UNETLoader", (1200, 0), outputs=[("MODEL", "MODEL", [])], widgets=["unused.safetensors", "default"]),
        node(9, "ShardDiTUNETLoader", (1600, 0), outputs=[("MODEL", "MODEL", [5])], widgets=["wan.safetensors"]),
        node(10, "KSampler", (1600, 200), (300, 260), inputs=[("model", "MODEL", 5)], outputs=[("LATENT", "LATENT", [])]),
        node(11, SUB, (2000, 0), (200, 100), outputs=[("LATENT", "LATENT", [])]),
    ]
    links = [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"], [3, 3, 0, 4, 0, "MODEL"], [4, 6, 0, 7, 0, "MODEL"],
             [5, 9, 0, 10, 0, "MODEL"]]
    inner = [
        node(20, "CheckpointLoaderSimple", (0, 0), (300, 100), outputs=[("MODEL", "MODEL", [21, 22]),
              ("CLIP", "CLIP", []), ("VAE", "VAE", [])], widgets=["ltx.safetensors"]),
        node(21, "KSampler", (0, 200), (300, 260), inputs=[("model", "MODEL", 21)], outputs=[("LATENT", "LATENT", [23])]),
        node(22, "KSampler", (400, 200), (300, 260), inputs=[("model", "MODEL", 22)], outputs=[("LATENT", "LATENT", [])]),
    ]
    sub_links = [{"id": 21, "origin_id": 20, "origin_slot": 0, "target_id": 21, "target_slot": 0, "type": "MODEL"},
                 {"id": 22, "origin_id": 20, "origin_slot": 0, "target_id": 22, "target_slot": 0, "type": "MODEL",
                  "parentId": 1},
                 {"id": 23, "origin_id": 21, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "LATENT"}]
    sub = {"id": SUB, "name": "Stage", "nodes": inner, "links": sub_links, "groups": [],
           "reroutes": [{"id": 1, "pos": [350, 150], "linkIds": [22]}], "inputs": [],
           "outputs": [{"name": "LATENT", "type": "LATENT", "linkIds": [23]}]}
    groups = [{"id": 1, "title": "Models", "bounding": [-10, -70, 330, 170]},
              {"id": 2, "title": "Below", "bounding": [-10, 360, 330, 120]}]
    return {"last_node_id": 22, "last_link_id": 23, "nodes": top, "links": links, "groups": groups,
            "definitions": {"subgraphs": [sub]}, "extra": {}, "version": 0.4}


def api_workflow() -> dict:
    """A flattened subgraph (ids ``"128:<n>"``) as Export (API) writes it, plus a top-level
    GGUF loader."""
    return {
        "128:74": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan.safetensors", "weight_dtype": "default"}},
        "128:80": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["128:74", 0], "lora_name": "l.safetensors",
                                                                   "strength_model": 1.0}},
        "128:81": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["128:74", 0], "shift": 8.0}},
        "128:90": {"class_type": "KSampler", "inputs": {"model": ["128:80", 0], "seed": 1}},
        "3": {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "wan-Q8_0.gguf"}},
        "4": {"class_type": "KSampler", "inputs": {"model": ["3", 0], "seed": 1}},
    }
