"""Handlers of the ONNX operators legionpy imports: ``HANDLERS[op_type](imp,
node, inputs) -> [output values]`` (see :mod:`legionpy.frontends.onnx_import`
for the values). A handler raises :class:`Unsupported` with the reason when
a node uses a form legionpy cannot express (asymmetric padding, a Reshape
that moves the batch dim, ...); the import then reports it with the others.

Weight layouts: ONNX Conv weights are legionpy's (Cout, Cin/g, kh, kw);
Gemm/MatMul weights become dense ``weight`` (in, units); ONNX LSTM gates
``i, o, f, c`` are reordered to legionpy's ``i, f, g, o`` and the two bias
vectors summed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops import Parameter
from . import onnx_layout as L
from .onnx_import import Stack, Unsupported

__all__ = ["HANDLERS", "set_param"]

HANDLERS: dict[str, Any] = {}


def handles(*types: str):
    def deco(fn):
        for t in types:
            HANDLERS[t] = fn
        return fn
    return deco


def attrs(node: Any) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def set_param(ref_or_ops: Any, pname: str, value: np.ndarray) -> None:
    """Give parameter ``pname`` of the op(s) the imported ``value``."""
    ops = ref_or_ops if isinstance(ref_or_ops, list) else [ref_or_ops.op]
    old = ops[0].params[pname]
    value = np.ascontiguousarray(value, dtype=np.float32)
    if value.shape != old.shape:
        raise Unsupported(f"{pname} of shape {value.shape}, expected {old.shape}")
    p = Parameter(old.name, old.shape, {"kind": "array", "value": value}, old.dtype)
    for op in ops:
        op.params[pname] = p


def norm_axis(a: int, ndim: int) -> int:
    return a + ndim if a < 0 else a


def _sym_pads(pads: list, what: str) -> tuple[int, int]:
    if not pads:
        return 0, 0
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        raise Unsupported(f"{what}: asymmetric pads {pads}")
    return pads[0], pads[1]


def _pads_first(imp, node, x, pads, value=0.0):
    """``(x, symmetric pads)``: asymmetric ONNX pads become a ``pad`` op
    before the layer (which then pads by the smaller side)."""
    if not pads or (len(pads) == 4 and pads[0] == pads[2] and pads[1] == pads[3]):
        return x, _sym_pads(pads, node.op_type)
    if len(pads) != 4:
        raise Unsupported(f"pads {pads}")
    ph, pw = min(pads[0], pads[2]), min(pads[1], pads[3])
    extra = [(0, 0), (0, 0), (pads[0] - ph, pads[2] - ph), (pads[1] - pw, pads[3] - pw)]
    return imp.model.pad(x, extra, value, name=imp.name(node, ".pad")), (ph, pw)


# -- convolution, pooling, normalisation ----------------------------------------------
@handles("Conv")
def _conv(imp, node, ins):
    a, x = attrs(node), imp.act(node.input[0])
    w = imp.const(node.input[1], "Conv weight")
    if w.ndim != 4 or x.ndim != 4:
        raise Unsupported("only 2-D convolutions")
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise Unsupported("auto_pad")
    b = imp.const(node.input[2], "Conv bias") if len(node.input) > 2 and node.input[2] else None
    if b is not None and node.input[2] not in imp.weights and not b.any():
        b = None  # zeros the exporter made up (unoptimised dynamo: a bias-free conv)
    x, pads = _pads_first(imp, node, x, a.get("pads"))
    t = imp.model.conv2d(x, w.shape[0], tuple(w.shape[2:]), stride=tuple(a.get("strides",
                                                                               [1, 1])),
                         padding=pads, groups=a.get("group", 1),
                         bias=b is not None, name=imp.name(node),
                         dilation=tuple(a.get("dilations", [1, 1])))
    set_param(t, "weight", w)
    if b is not None:
        set_param(t, "bias", b)
    return [t]


@handles("MaxPool", "AveragePool")
def _pool(imp, node, ins):
    a, x = attrs(node), imp.act(node.input[0])
    if any(d != 1 for d in a.get("dilations", [1, 1])):
        raise Unsupported(f"dilations {a['dilations']}")
    avg = node.op_type == "AveragePool"
    p = a.get("pads")
    if avg and p and any(p) and a.get("count_include_pad", 0):
        raise Unsupported("count_include_pad=1 with padding")
    if avg and p and any(p) and not (p[0] == p[2] and p[1] == p[3]):
        raise Unsupported(f"asymmetric pads {p} of an average pool")
    x, pads = _pads_first(imp, node, x, p, float(np.finfo(np.float32).min))
    if a.get("ceil_mode", 0):
        if avg:
            raise Unsupported("ceil_mode of an average pool")
        from .onnx_math import ceil_pad

        x = ceil_pad(imp.model, x, a["kernel_shape"], a.get("strides", [1, 1]), pads,
                     imp.name(node, ".ceil"))
    if len(node.output) > 1 and node.output[1]:
        raise Unsupported("MaxPool indices output")
    return [imp.model.pool2d(x, tuple(a["kernel_shape"]), tuple(a.get("strides", [1, 1])),
                             pads, "avg" if avg else "max", name=imp.name(node))]


@handles("GlobalAveragePool")
def _gap(imp, node, ins):
    x = imp.act(node.input[0])
    if x.ndim != 4:
        raise Unsupported("only NCHW input")
    return [imp.model.pool2d(x, x.shape[2:], 1, 0, "avg", name=imp.name(node))]


@handles("BatchNormalization")
def _bn(imp, node, ins):
    a, x = attrs(node), imp.act(node.input[0])
    gamma, beta, mean, var = (imp.const(n, "BatchNormalization " + w) for n, w in
                              zip(node.input[1:5], ("scale", "B", "mean", "var")))
    if len([o for o in node.output if o]) > 1:
        raise Unsupported("training-mode outputs")
    t = imp.model.batch_norm(x, momentum=1.0 - a.get("momentum", 0.9),
                             eps=a.get("epsilon", 1e-5), name=imp.name(node))
    set_param(t, "gamma", gamma)
    set_param(t, "beta", beta)
    t.op.initial_state = {"running_mean": mean.astype(np.float32),
                          "running_var": var.astype(np.float32)}
    return [t]


@handles("LayerNormalization")
def _ln(imp, node, ins):
    a, x = attrs(node), imp.lay(node.input[0])
    if norm_axis(a.get("axis", -1), x.ndim) != x.ndim - 1:
        raise Unsupported(f"axis {a.get('axis')} (only the last dim)")
    x = L.as_last_dim(imp, node, x)
    t = imp.model.layer_norm(x.base, eps=a.get("epsilon", 1e-5), name=imp.name(node))
    d = x.shape[-1]
    gamma = np.ones(d, np.float32) if node.input[1] in imp.ones else \
        imp.const(node.input[1], "LayerNormalization scale")
    set_param(t, "gamma", np.broadcast_to(gamma.reshape(-1), (d,)))
    beta = imp.const(node.input[2], "B") if len(node.input) > 2 and node.input[2] else \
        np.zeros(x.shape[-1], np.float32)
    set_param(t, "beta", np.broadcast_to(beta.reshape(-1), (d,)))
    return [L.value(L.relayout(x, t))]


# -- dense ----------------------------------------------------------------------------
def dense_last(imp, node, v, units, bias):
    """A dense layer over the last ONNX axis of value ``v`` (any layout)."""
    x = L.as_last_dim(imp, node, L.lay(v))
    t = imp.model.dense(x.base, units, bias=bias, name=imp.name(node))
    return t, L.relayout(x, t, units)


@handles("Gemm")
def _gemm(imp, node, ins):
    a, v = attrs(node), imp.lay(node.input[0])
    if a.get("transA", 0) or v.ndim != 2:
        raise Unsupported("transA or a non-2-D input")
    w = imp.const(node.input[1], "Gemm B") * a.get("alpha", 1.0)
    w = w.T if a.get("transB", 0) else w
    c = imp.const(node.input[2], "Gemm C") * a.get("beta", 1.0) \
        if len(node.input) > 2 and node.input[2] else None
    if c is not None and c.size not in (1, w.shape[1]):
        raise Unsupported(f"C of shape {c.shape}")
    t, out = dense_last(imp, node, v, w.shape[1], c is not None)
    set_param(t, "weight", w)
    if c is not None:
        set_param(t, "bias", np.broadcast_to(c.reshape(-1), (w.shape[1],)))
    return [L.value(out)]


@handles("MatMul")
def _matmul(imp, node, ins):
    a, b = ins
    if isinstance(b, np.ndarray):
        if b.ndim != 2:
            raise Unsupported("a constant right operand that is not 2-D")
        t, out = dense_last(imp, node, imp.lay(node.input[0]), b.shape[1], False)
        set_param(t, "weight", b)
        return [L.value(out)]
    a, b = imp.lay(node.input[0]), imp.lay(node.input[1])
    if a.ndim < 3 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
        raise Unsupported(f"activation operands of shapes {a.shape} and {b.shape}")
    a, b = L.materialize(imp, node, a), L.materialize(imp, node, b)
    lead = [[a.size[x] for x in g] + [a.batch in g] for g in a.groups[:-2]]
    if lead != [[b.size[x] for x in g] + [b.batch in g] for g in b.groups[:-2]] or \
            any(a.batch in g for g in a.groups[-2:]) or any(b.batch in g for g in b.groups[-2:]):
        raise Unsupported(f"operands {a.shape} and {b.shape} with the batch in different axes")
    t = imp.model.batch_matmul(a.base, b.base, name=imp.name(node))
    return [L.value(L.relayout(a, t, b.shape[-1]))]


# -- element-wise ---------------------------------------------------------------------
@handles("Relu", "Tanh", "Sigmoid")
def _unary(imp, node, ins):
    f = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}[node.op_type]
    return [elementwise(imp, node, lambda r: getattr(imp.model, f)(r, name=imp.name(node)))]


def elementwise(imp, node, fn):
    """``fn`` on the base of input 0 (any layout; the layout is kept)."""
    x = imp.lay(node.input[0])
    return L.value(L.relayout(x, fn(x.base)))


@handles("Gelu")
def _gelu(imp, node, ins):
    appr = attrs(node).get("approximate", b"none")
    appr = appr.decode() if isinstance(appr, bytes) else appr
    return [elementwise(imp, node, lambda r: imp.model.gelu(r, approximate=appr,
                                                             name=imp.name(node)))]


@handles("Identity")
def _identity(imp, node, ins):
    return [ins[0]]


@handles("Cast")
def _cast(imp, node, ins):
    to = attrs(node)["to"]
    x = ins[0]
    floats, ints = (1, 10, 11, 16), (6, 7)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16; INT32, INT64
    if to not in floats + ints + (9,):  # and BOOL (a mask)
        raise Unsupported(f"a cast to ONNX type {to}")
    if isinstance(x, np.ndarray):  # CastLike of a constant to an activation's type
        return [x.astype(bool if to == 9 else np.float32 if to in floats else np.int64)]
    is_float = str(getattr(x, "dtype", "float32")).startswith("float")
    if is_float == (to in floats) or (to == 9 and is_float):
        return [x]  # to BOOL: masks hold 0/1, kept as floats
    x = imp.act(node.input[0], "Cast input")
    return [imp.model.cast(x, "int32" if to in ints else "float32", name=imp.name(node))]


@handles("Dropout")
def _dropout(imp, node, ins):
    rate = attrs(node).get("ratio", 0.5)
    if len(node.input) > 1 and node.input[1]:
        rate = float(imp.const(node.input[1], "Dropout ratio"))
    if len(node.output) > 1 and node.output[1]:
        raise Unsupported("the mask output")
    if rate <= 0:
        return [ins[0]]
    return [elementwise(imp, node, lambda r: imp.model.dropout(r, rate, name=imp.name(node)))]


def _const_operand(imp, node, ins):
    """``(activation, constant, constant is first)`` of a binary node."""
    if isinstance(ins[1], np.ndarray):
        return imp.lay(node.input[0]), ins[1], False
    if isinstance(ins[0], np.ndarray):
        return imp.lay(node.input[1]), ins[0], True
    return None, None, False


def _bias(imp, node, x, c):
    """``x + c`` for a constant broadcast over x's leading axes (any layout)."""
    from .onnx_math import drop_batch

    c = drop_batch(np.asarray(c, np.float32), x.ndim)
    while c.ndim > 1 and c.shape[0] == 1:
        c = c[0]
    k = c.ndim
    if k >= x.ndim or tuple(x.shape[x.ndim - k:]) != c.shape:
        raise Unsupported(f"a constant of shape {c.shape} that does not cover the trailing "
                          f"axes of {x.shape}")
    if x.groups[-k:] != x.dims[-k:] or any(x.batch in g for g in x.groups[-k:]):
        x = L.materialize(imp, node, x)
        if x.groups[-k:] != x.dims[-k:]:
            raise Unsupported(f"a constant over the batch axis of {x.shape}")
    t = imp.model.add_bias(x.base, ndim=k, name=imp.name(node))
    set_param(t, "bias", c)
    return L.value(L.relayout(x, t))


@handles("Add", "Sub")
def _add(imp, node, ins):
    from .onnx_math import binary, fixed

    x, c, first = _const_operand(imp, node, ins)
    sub = node.op_type == "Sub"
    fn = "sub" if sub else "add"
    if x is None:
        try:
            a, b = _pair(imp, node)
        except Unsupported:  # shapes that broadcast
            return [binary(imp, node, ins, fn)]
        if sub:
            b = imp.model.scale(b, -1.0, name=imp.name(node, ".neg"))
        return [L.value(L.relayout(a, imp.model.add(a.base, b, name=imp.name(node))))]
    cname = node.input[0 if first else 1]
    if (sub and first) or c.size == 1 or fixed(imp, cname, c):
        return [binary(imp, node, ins, fn)]
    try:
        return [_bias(imp, node, x, -c if sub else c)]
    except Unsupported:
        return [binary(imp, node, ins, fn)]


@handles("Mul", "Div")
def _mul(imp, node, ins):
    from .onnx_math import binary

    x, c, first = _const_operand(imp, node, ins)
    fn = "div" if node.op_type == "Div" else "mul"
    if x is None:
        if fn == "mul":
            try:
                a, b = _pair(imp, node)
                return [L.value(L.relayout(a, imp.model.multiply(a.base, b,
                                                                 name=imp.name(node))))]
            except Unsupported:
                pass
        return [binary(imp, node, ins, fn)]
    if c.size != 1 or (first and fn == "div"):
        from .onnx_math import trained_factor

        cname = node.input[0 if first else 1]
        shape = trained_factor(imp, cname, c, x.shape) if fn == "mul" else None
        if shape is not None:
            xm = L.materialize(imp, node, x) if x.groups[-len(shape):] != x.dims[-len(shape):] \
                or any(x.batch in g for g in x.groups[-len(shape):]) else x
            if xm.groups[-len(shape):] == xm.dims[-len(shape):]:
                t = imp.model.layer_scale(xm.base, shape, name=imp.name(node))
                set_param(t, "gamma", np.asarray(c, np.float32).reshape(shape))
                return [L.value(L.relayout(xm, t))]
        return [binary(imp, node, ins, fn)]
    alpha = float(c.reshape(-1)[0])
    alpha = 1.0 / alpha if fn == "div" else alpha
    return [L.value(L.relayout(x, imp.model.scale(x.base, alpha, name=imp.name(node))))]


def _pair(imp, node):
    """Two activation operands of one shape, in one layout: ``(Lay, base ref)``."""
    a, b = imp.lay(node.input[0]), imp.lay(node.input[1])
    if a.shape != b.shape:
        raise Unsupported(f"broadcasting {a.shape} and {b.shape}")
    if a.groups != b.groups or a.dims != b.dims:
        a, b = L.materialize(imp, node, a), L.materialize(imp, node, b)
        if a.base.shape != b.base.shape:
            raise Unsupported(f"operands {a.shape} with the batch in different axes")
    return a, b.base


@handles("Softmax")
def _softmax(imp, node, ins):
    x = imp.lay(node.input[0])
    ax = norm_axis(attrs(node).get("axis", -1), x.ndim)
    if ax != x.ndim - 1:
        raise Unsupported(f"axis {ax} (only the last dim)")
    last = node.output[0] in imp.outputs
    x = L.as_last_dim(imp, node, x)
    return [L.value(L.relayout(x, imp.model.softmax(x.base, loss=last, name=imp.name(node))))]


# -- shapes ---------------------------------------------------------------------------
@handles("Flatten")
def _flatten(imp, node, ins):
    x = imp.act(node.input[0])
    if norm_axis(attrs(node).get("axis", 1), x.ndim) != 1:
        raise Unsupported("axis other than 1")
    return [x if x.ndim == 2 and x.view is None else imp.model.flat(x, name=imp.name(node))]


def _reshape_to(imp, node, x, shape):
    shape = tuple(int(s) for s in shape)
    if shape == tuple(x.shape) and x.view is None:
        return x
    return imp.model.reshape(x, shape[1:], name=imp.name(node))


@handles("Reshape")
def _reshape(imp, node, ins):
    x = imp.lay(node.input[0])
    target = L.resolve_target(x, imp.const(node.input[1], "Reshape shape"), imp.export_batch)
    return [L.value(L.reshape(x, target))]


def _axes(imp, node, ins, ndim):
    a = attrs(node).get("axes")
    if a is None and len(node.input) > 1 and node.input[1]:
        a = imp.const(node.input[1], "axes")
    return sorted(norm_axis(int(v), ndim) for v in (a if a is not None else []))


@handles("Squeeze")
def _squeeze(imp, node, ins):
    v = ins[0]
    if isinstance(v, Stack):
        axes = _axes(imp, node, ins, len(v.shape))
        if axes == [1] and v.unit:
            return [Stack(v.items)]
        if axes == [0] and len(v.items) == 1 and not v.unit:
            return [v.items[0]]
        raise Unsupported(f"squeezing axes {axes} of a time-major {v.shape}")
    x = imp.lay(node.input[0])
    axes = _axes(imp, node, ins, x.ndim) or [i for i, s in enumerate(x.shape) if s == 1]
    return [L.value(L.squeeze(x, axes))]


@handles("Unsqueeze")
def _unsqueeze(imp, node, ins):
    v = ins[0]
    if isinstance(v, Stack):
        raise Unsupported("unsqueezing a time-major tensor")
    x = imp.lay(node.input[0])
    n = len(attrs(node).get("axes", [])) or (len(imp.const(node.input[1], "axes"))
                                             if len(node.input) > 1 else 1)
    axes = _axes(imp, node, ins, x.ndim + n)
    if axes == [0] and not isinstance(v, L.Lay):
        return [Stack([v])]
    return [L.value(L.unsqueeze(x, axes))]


@handles("Transpose")
def _transpose(imp, node, ins):
    v = ins[0]
    ndim = len(v.shape)
    perm = tuple(attrs(node).get("perm", range(ndim - 1, -1, -1)))
    if isinstance(v, Stack):
        if v.unit or perm[:2] != (1, 0) or perm[2:] != tuple(range(2, ndim)):
            raise Unsupported(f"perm {perm} of a time-major {v.shape}")
        return [_seq_to_batch(imp, node, v.items)]
    return [L.value(L.transpose(imp.lay(node.input[0]), perm))]


def _seq_to_batch(imp, node, items):
    """(T, N, ...) steps -> one (N, T, ...) activation."""
    rest = tuple(items[0].shape[1:])
    cat = imp.model.concat(items, axis=1, name=imp.name(node, ".steps"))
    return imp.model.reshape(cat, (len(items),) + rest, name=imp.name(node))


@handles("Concat")
def _concat(imp, node, ins):
    ax = attrs(node)["axis"]
    if all(isinstance(v, Stack) for v in ins):
        if norm_axis(ax, len(ins[0].shape)) != 0 or len({v.unit for v in ins}) != 1:
            raise Unsupported("concatenating time-major tensors along a non-leading axis")
        return [Stack([r for v in ins for r in v.items], ins[0].unit)]
    if any(isinstance(v, np.ndarray) for v in ins):
        from .onnx_math import concat_params

        return [concat_params(imp, node, ins, ax)]
    xs = [imp.act(n) for n in node.input]
    ax = norm_axis(ax, xs[0].ndim)
    if ax == 0:
        raise Unsupported("concatenating along the batch dim")
    return [imp.model.concat(xs, axis=ax, name=imp.name(node))]


@handles("Split")
def split_node(imp, node, ins):
    a, x = attrs(node), imp.lay(node.input[0])
    ax = norm_axis(a.get("axis", 0), x.ndim)
    sizes = a.get("split")
    if sizes is None and len(node.input) > 1 and node.input[1]:
        sizes = imp.const(node.input[1], "split")
    if sizes is None:
        k = a.get("num_outputs", len(node.output))
        sizes = [-(-x.shape[ax] // k)] * (k - 1)
        sizes.append(x.shape[ax] - sum(sizes))
    outs, start = [], 0
    for i, s in enumerate(int(v) for v in sizes):
        sub = type(node)()
        sub.CopyFrom(node)
        sub.name = f"{node.name}.{i}"
        outs.append(L.value(L.take(imp, sub, x, ax, start, start + s, keep=True)))
        start += s
    return outs


@handles("Slice")
def _slice(imp, node, ins):
    v = ins[0]
    starts, ends = (imp.const(n, "Slice " + w) for n, w in zip(node.input[1:3],
                                                              ("starts", "ends")))
    ndim = len(v.shape)
    axes = imp.const(node.input[3], "axes") if len(node.input) > 3 and node.input[3] \
        else np.arange(len(starts))
    steps = imp.const(node.input[4], "steps") if len(node.input) > 4 and node.input[4] \
        else np.ones(len(starts), np.int64)
    if len(axes) != 1 or int(steps[0]) != 1:
        raise Unsupported("more than one axis, or a step other than 1")
    ax, n = norm_axis(int(axes[0]), ndim), v.shape[norm_axis(int(axes[0]), ndim)]
    lo, hi = (int(np.clip(s + n if s < 0 else s, 0, n)) for s in (int(starts[0]), int(ends[0])))
    if isinstance(v, Stack):
        if ax != 0:
            raise Unsupported(f"slicing axis {ax} of a time-major tensor")
        return [Stack(v.items[lo:hi], v.unit)]
    return [L.value(L.take(imp, node, imp.lay(node.input[0]), ax, lo, hi, keep=True))]


@handles("Gather")
def _gather(imp, node, ins):
    data, idx = ins
    ax = attrs(node).get("axis", 0)
    if isinstance(data, np.ndarray):  # an embedding table
        ids = imp.act(node.input[1], "Gather indices")
        if data.ndim != 2 or ax != 0:
            raise Unsupported("a constant table that is not (vocab, dim) gathered on axis 0")
        t = imp.model.embedding(ids, data.shape[0], data.shape[1], name=imp.name(node))
        set_param(t, "weight", data)
        return [t]
    i = imp.const(node.input[1], "Gather indices")
    if i.ndim != 0:
        from .onnx_math import index_map

        return [index_map(imp, node, ins)]
    if isinstance(data, Stack):
        if norm_axis(ax, len(data.shape)) != 0:
            raise Unsupported("gathering a non-leading axis of a time-major tensor")
        return [data.items[int(i)]]
    x = imp.lay(node.input[0])
    ax = norm_axis(ax, x.ndim)
    k = int(i) % x.shape[ax]
    return [L.value(L.take(imp, node, x, ax, k, k + 1, keep=False))]


from . import onnx_lstm, onnx_math  # noqa: E402,F401  (LSTM, erf GELU; math, masks)
