"""The ONNX ``LSTM`` operator and the erf-GELU pattern.

An ONNX LSTM node runs a whole layer over T steps; legionpy unrolls it
into T ``lstm`` cells sharing one set of Parameters (ops/recurrent.py: a
cell per step so the search can pipeline layers). Its input is time-major
(T, N, I): a :class:`~legionpy.frontends.onnx_import.Stack` from a
``Transpose(1, 0, 2)`` of a batch-first tensor or the previous layer's
output; its outputs ``Y`` (T, 1, N, H), ``Y_h`` and ``Y_c`` (1, N, H) are
Stacks of the cells' ``h`` / ``c`` views. Forward direction, default
activations, no peepholes, zero initial states (PyTorch's export of
``nn.LSTM`` layers).

PyTorch exports ``nn.GELU()`` below opset 20 as ``Div(x, sqrt 2) -> Erf ->
Add 1 -> Mul x -> Mul 0.5``; :func:`fuse_erf_gelu` rewrites that chain into
one ``Gelu`` node before the import.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import onnx_layout as L
from .onnx_import import Stack, Unsupported
from .onnx_ops import attrs, handles, set_param

__all__ = ["fuse_erf_gelu"]

_REORDER = [0, 2, 3, 1]  # ONNX gates i, o, f, c -> legionpy i, f, g(=c), o


@handles("LSTM")
def _lstm(imp, node, ins):
    a = attrs(node)
    if a.get("direction", b"forward") not in (b"forward", "forward"):
        raise Unsupported(f"direction {a.get('direction')!r} (forward only)")
    if a.get("clip") is not None or a.get("input_forget", 0) or "activations" in a:
        raise Unsupported("clip, input_forget or custom activations")
    x, layout = ins[0], a.get("layout", 0)
    if layout == 1:
        x = imp.act(node.input[0])
        x = Stack([x.select(1, t) for t in range(x.shape[1])])
    elif isinstance(x, L.Lay) and x.ndim == 3 and x.batch in x.groups[1]:
        x = L.materialize(imp, node, x)  # base (N, T, I)
        if x.dims[1] == x.groups[0] and x.base.view is None:
            x = Stack([x.base.select(1, t) for t in range(x.shape[0])])
    if not isinstance(x, Stack) or x.unit:
        raise Unsupported("X must be time-major (a Transpose(1, 0, 2) of a batch-first "
                          "tensor, or the previous LSTM layer's squeezed Y)")
    w, r = imp.const(node.input[1], "LSTM W"), imp.const(node.input[2], "LSTM R")
    h = int(a.get("hidden_size", r.shape[-1]))
    b = imp.const(node.input[3], "LSTM B") if len(node.input) > 3 and node.input[3] \
        else np.zeros((1, 8 * h), np.float32)
    opt = list(node.input[4:]) + [""] * 4
    if opt[0]:
        raise Unsupported("sequence_lens")
    for n in opt[1:3]:
        if n and np.any(imp.const(n, "LSTM initial state")):
            raise Unsupported("a nonzero initial state")
    if opt[3]:
        raise Unsupported("peepholes")
    states, first = [], None
    base = imp.name(node)
    for t, xt in enumerate(x.items):
        s = imp.model.lstm(xt, states[-1] if states else None, h, share=first,
                           name=f"{base}.t{t}")
        first = first or s
        states.append(s)
    cells = [s.op for s in states]
    nin = w.shape[-1]
    set_param(cells, "w_ih", w[0].reshape(4, h, nin)[_REORDER])
    set_param(cells, "w_hh", r[0].reshape(4, h, h)[_REORDER])
    set_param(cells, "bias", (b[0, :4 * h] + b[0, 4 * h:]).reshape(4, h)[_REORDER])
    return [Stack([s.h for s in states], unit=True), Stack([states[-1].h]),
            Stack([states[-1].c])]


def _scalar(consts: dict, name: str) -> float | None:
    v = consts.get(name)
    return float(v.reshape(-1)[0]) if isinstance(v, np.ndarray) and v.size == 1 else None


def fuse_erf_gelu(nodes: list, consts: dict) -> list:
    """``nodes`` with each ``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul
    0.5`` chain replaced by one ``Gelu`` node (``consts``: initializers and
    Constant node values by name)."""
    from onnx import helper

    users: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            users.setdefault(i, []).append(n)

    def only_user(out: str, op: str) -> Any:
        u = users.get(out, [])
        return u[0] if len(u) == 1 and u[0].op_type == op else None

    def other(n: Any, name: str) -> str:
        return n.input[1] if n.input[0] == name else n.input[0]

    producer = {o: n for n in nodes for o in n.output}
    drop, put = set(), {}
    for e in nodes:
        if e.op_type != "Erf":
            continue
        d = producer.get(e.input[0])
        if d is None or d.op_type not in ("Div", "Mul") or len(users.get(d.output[0], [])) != 1:
            continue
        x, c = d.input[0], _scalar(consts, d.input[1])
        if c is None or abs((c if d.op_type == "Div" else 1 / c) - 2 ** 0.5) > 1e-3:
            continue
        add = only_user(e.output[0], "Add")
        m1 = add and _scalar(consts, other(add, e.output[0])) == 1.0 and \
            only_user(add.output[0], "Mul")
        if not m1 or other(m1, add.output[0]) != x:
            continue
        m2 = only_user(m1.output[0], "Mul")
        if not m2 or _scalar(consts, other(m2, m1.output[0])) != 0.5:
            continue
        drop.update(id(n) for n in (d, e, add, m1))
        put[id(m2)] = helper.make_node("Gelu", [x], [m2.output[0]], name=e.name or m2.name)
    return [put.get(id(n), n) for n in nodes if id(n) not in drop]
