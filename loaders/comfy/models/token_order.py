"""Where an MMDiT puts its text tokens, read off the model's own code (not a version string).

`sequence` mode splits the image tokens over the ranks and gives every rank all text tokens; the
rows of a joint tensor (single blocks' ``x``, the rotary table ``pe``, the joint attention) must be
cut where the model puts them. ComfyUI's HunyuanVideo moved its text tokens from after the image
tokens to before them in 0.14 (rotary ids, double-block attention, single blocks), with no flag to
read. So the order is read from the code that builds those tensors, with ``ast``:

- the model's ``forward_orig``: ``torch.cat((txt_ids, img_ids), ...)`` (rotary ids) and
  ``torch.cat((txt, img), ...)`` (single blocks' input), either order;
- each double-block class's ``forward``: ``torch.cat((txt_q, img_q), ...)`` (and k, v). A branch
  on an attribute of the block (``if self.flipped_img_txt:`` in ComfyUI 0.3.64) is followed as the
  block's attribute says.

Every one of these must be found, each in exactly one order, and all must agree; anything else
(renamed variables, another model's code, no source) gives None, and the caller runs the model in
``blocks`` mode: a refused speed-up, never a wrong result.
"""
from __future__ import annotations

import ast
import functools
import inspect
import logging
import textwrap

import torch

__all__ = ["IMAGE_FIRST", "TEXT_FIRST", "read_text_order"]

log = logging.getLogger("sharddit")

TEXT_FIRST, IMAGE_FIRST = "text_first", "image_first"
_MODEL_PAIRS = (("txt_ids", "img_ids"), ("txt", "img"))
_BLOCK_PAIRS = (("txt_q", "img_q"), ("txt_k", "img_k"), ("txt_v", "img_v"))


def read_text_order(dit: torch.nn.Module, double_blocks: str = "double_blocks") -> str | None:
    """``TEXT_FIRST`` or ``IMAGE_FIRST`` for ``dit`` (a HunyuanVideo-like MMDiT), None when unsure."""
    found = [_cat_orders(getattr(type(dit), "forward_orig", None), dit, _MODEL_PAIRS)]
    blocks = [getattr(b, "real_block", b) for b in getattr(dit, double_blocks, ())]  # ShardDiT's proxies: their block
    if not blocks:
        return None
    found += [_cat_orders(type(b).forward, b, _BLOCK_PAIRS) for b in blocks]
    orders = set()
    for per_pair in found:
        if per_pair is None or any(len(o) != 1 for o in per_pair.values()):
            log.debug("[ShardDiT] token order of %s: not read (%s)", type(dit).__name__, per_pair)
            return None
        orders |= set().union(*per_pair.values())
    return orders.pop() if len(orders) == 1 else None


def _cat_orders(fn, obj, pairs) -> dict[tuple[str, str], set[str]] | None:
    """Per (text, image) name pair: the orders of the ``torch.cat`` calls of that pair in ``fn``."""
    if fn is None:
        return None
    tree = _parse(fn)
    if tree is None:
        return None
    found = {p: set() for p in pairs}
    _visit(tree, obj, pairs, found)
    return found


@functools.lru_cache(maxsize=64)
def _parse(fn) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _visit(node, obj, pairs, found) -> None:
    if isinstance(node, ast.If):
        branch = _attribute_branch(node, obj)
        if branch is not None:
            for child in branch:
                _visit(child, obj, pairs, found)
            return
    if isinstance(node, ast.Call) and _is_cat(node.func) and node.args:
        names = _two_names(node.args[0])
        for text, image in pairs:
            if names == (text, image):
                found[(text, image)].add(TEXT_FIRST)
            elif names == (image, text):
                found[(text, image)].add(IMAGE_FIRST)
    for child in ast.iter_child_nodes(node):
        _visit(child, obj, pairs, found)


def _attribute_branch(node: ast.If, obj):
    """The statements ``obj`` runs for ``if self.X:`` / ``if not self.X:``; None for other tests."""
    test, negate = node.test, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, True
    if not (isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id == "self"):
        return None
    if not hasattr(obj, test.attr):
        return None
    return node.body if bool(getattr(obj, test.attr)) != negate else node.orelse


def _is_cat(func) -> bool:
    return isinstance(func, ast.Attribute) and func.attr in ("cat", "concat") and \
        isinstance(func.value, ast.Name) and func.value.id == "torch"


def _two_names(arg) -> tuple[str, str] | None:
    if isinstance(arg, (ast.Tuple, ast.List)) and len(arg.elts) == 2 and \
            all(isinstance(e, ast.Name) for e in arg.elts):
        return arg.elts[0].id, arg.elts[1].id
    return None
