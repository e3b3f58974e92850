"""The test toys' blocks as worker families (``parallel.distributed.block_specs``): the host
describes a toy block by its constructor arguments, the worker builds it with the same class.
Imported by ``dist_procs`` (host side, and the worker processes it starts)."""
from __future__ import annotations

from harness import toy_dit, toy_seq
from harness.pack import import_pack

import_pack()

from sharddit.parallel.distributed.block_specs import register

_CLASSES = {
    "SeqBlock": (toy_seq.SeqBlock, lambda b: {"dim": b.qkv.in_features, "heads": b.heads,
                                              "ffn": b.ffn[0].out_features}),
    "MMDouble": (toy_seq.MMDouble, lambda b: {"dim": b.img_qkv.in_features, "heads": b.heads,
                                              "text_first": b.text_first}),
    "MMSingle": (toy_seq.MMSingle, lambda b: {"dim": b.qkv.in_features, "heads": b.heads}),
    "ToyBlock": (toy_dit.ToyBlock, lambda b: {"dim": b.q.in_features, "ffn": b.ffn[0].out_features}),
    "ToyDoubleBlock": (toy_dit.ToyDoubleBlock, lambda b: {"dim": b.txt.in_features}),
    "ToySingleBlock": (toy_dit.ToySingleBlock, lambda b: {"dim": b.lin.in_features}),
}


def _build(config: dict):
    cls = _CLASSES[config["class"]][0]
    return cls(**config["args"])


def _describer(name: str, args):
    return lambda block: {"class": name, "args": args(block)}


for _name, (_cls, _args) in _CLASSES.items():
    register("toy", _build, (_cls,), _describer(_name, _args))
