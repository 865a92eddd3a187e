"""Decomposed layer normalisation folded back into one node (issue 27).

Exports below opset 17 and hand-written modules (GPT-2-style ``LayerNorm``
classes, T5's) spell ``LayerNorm`` as

    mu = ReduceMean(x, [-1]); d = x - mu; v = ReduceMean(d ** 2, [-1])
    y = d / Sqrt(v + eps)  [* gamma]  [+ beta]

(``d ** 2`` as ``Pow(d, 2)`` or ``Mul(d, d)``). :func:`fuse_layer_norm`
rewrites each such chain into one ``LayerNormalization`` node, so the
importer builds a ``layer_norm`` op (its ``gamma`` and ``beta`` trained
parameters, its dims as the zoo's) instead of eight element-wise ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fuse_layer_norm"]


def _scalar(consts: dict, name: str) -> float | None:
    v = consts.get(name)
    return float(v.reshape(-1)[0]) if isinstance(v, np.ndarray) and v.size == 1 else None


def _last_axis_mean(n: Any, consts: dict) -> bool:
    from onnx import helper

    if n.op_type != "ReduceMean":
        return False
    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    axes = a.get("axes")
    if axes is None and len(n.input) > 1 and n.input[1]:
        v = consts.get(n.input[1])
        axes = None if v is None else v.reshape(-1).tolist()
    return a.get("keepdims", 1) == 1 and axes is not None and list(axes) == [-1]


def fuse_layer_norm(nodes: list, consts: dict) -> tuple[list, set]:
    """``(nodes, ones)``: every decomposed layer norm over the last axis
    replaced by a ``LayerNormalization`` node (``consts``: initializers and
    Constant node values by name); ``ones`` names the ``gamma`` inputs of
    chains without a scale (ones of the normalised extent, at import)."""
    from onnx import helper

    users: dict[str, list] = {}
    for n in nodes:
        for i in dict.fromkeys(n.input):  # Mul(d, d) uses d once
            users.setdefault(i, []).append(n)

    def only(out: str, *ops: str) -> Any:
        u = users.get(out, [])
        return u[0] if len(u) == 1 and u[0].op_type in ops else None

    drop, put, new = set(), {}, set()
    for mu in nodes:
        if not _last_axis_mean(mu, consts):
            continue
        x = mu.input[0]
        subs = [u for u in users.get(mu.output[0], []) if u.op_type == "Sub" and
                list(u.input) == [x, mu.output[0]]]
        if len(subs) != 1 or len(users.get(mu.output[0], [])) != 1:
            continue
        d = subs[0].output[0]
        du = users.get(d, [])
        sq = [u for u in du if (u.op_type == "Pow" and u.input[0] == d and
                                _scalar(consts, u.input[1]) == 2.0) or
              (u.op_type == "Mul" and list(u.input) == [d, d])]
        div = [u for u in du if u.op_type == "Div" and u.input[0] == d]
        if len(sq) != 1 or len(div) != 1 or len(du) != 2:
            continue
        var = only(sq[0].output[0], "ReduceMean")
        add = var and _last_axis_mean(var, consts) and only(var.output[0], "Add")
        eps = add and _scalar(consts, add.input[1] if add.input[0] == var.output[0]
                              else add.input[0])
        sqrt = eps is not None and add and only(add.output[0], "Sqrt")
        if not sqrt or div[0].input[1] != sqrt.output[0]:
            continue
        chain = [mu, subs[0], sq[0], var, add, sqrt, div[0]]
        out, gamma, beta = div[0].output[0], "", ""
        mul = only(out, "Mul")
        if mul is not None:
            g = mul.input[1] if mul.input[0] == out else mul.input[0]
            if isinstance(consts.get(g), np.ndarray) and consts[g].ndim <= 1:
                gamma, out = g, mul.output[0]
                chain.append(mul)
        plus = only(out, "Add")
        if plus is not None and gamma:
            b = plus.input[1] if plus.input[0] == out else plus.input[0]
            if isinstance(consts.get(b), np.ndarray) and consts[b].ndim <= 1:
                beta, out = b, plus.output[0]
                chain.append(plus)
        if not gamma:
            gamma = f"{mu.name or x}.ones"
            new.add(gamma)
        ins = [x, gamma] + ([beta] if beta else [])
        drop.update(id(n) for n in chain[:-1])
        put[id(chain[-1])] = helper.make_node("LayerNormalization", ins, [out],
                                              name=mu.name or out, axis=-1, epsilon=eps)
    return [put.get(id(n), n) for n in nodes if id(n) not in drop], new
