"""The test toys' blocks as worker families (``parallel.distributed.block_specs``): the host
describes a toy block by its constructor arguments, the member builds it with the same class.
Imported by the tests (host side) and by every rank actor of the tests' Ray nodes
(``SHARDDIT_WORKER_IMPORTS``); there, with ``SHARDDIT_TEST_RECORD_DIR`` set, the rank also records
every collective it posts to ``<dir>/<pid>.jsonl`` (``dist_order``)."""
from __future__ import annotations

import os
from pathlib import Path

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

if os.environ.get("SHARDDIT_TEST_RECORD_DIR"):
    from harness import dist_order

    dist_order.record_collectives(Path(os.environ["SHARDDIT_TEST_RECORD_DIR"]) / f"{os.getpid()}.jsonl")
