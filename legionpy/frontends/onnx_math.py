"""ONNX handlers of element-wise math, broadcasting, reductions, padding,
masks and ``Einsum`` (the operators of torchvision's MobileNets and
EfficientNets and of GPT-2/BERT exports, issue 27), on the ops of
:mod:`legionpy.ops.elementwise`.

- Unary math (``Exp``, ``Sqrt``, ``Erf``, ``HardSwish``, ``Clip`` = ReLU6,
  ``Pow`` by a constant, ...) -> ``unary`` (keeps a value's layout).
- ``Add``/``Sub``/``Mul``/``Div`` that the layer handlers cannot express
  (broadcasting two activations: a squeeze-and-excitation scale
  ``(N, C, H, W) * (N, C, 1, 1)``, a padding mask ``(N, 1, 1, S)``; a
  fixed constant operand: a causal mask, ``+ 1``) -> ``binary``. A
  constant is *fixed* (no parameter) unless it comes from a float
  initializer (see ``Importer.weights``), which becomes ``add_bias``.
- ``Where(cond, a, b)`` with a constant ``cond`` (the masked fill of an
  attention mask), ``Trilu`` of an activation -> ``binary`` ``where``.
- ``Expand`` of an activation -> ``binary`` add of zeros of the target.
- ``ReduceMean``/``Sum``/``Max`` (axes as attribute or, opset 18, input),
  ``GlobalMaxPool`` -> ``reduce``.
- ``Pad`` (constant mode) -> ``pad``; ``Conv`` and pools with asymmetric
  pads are a ``pad`` then the layer (onnx_ops.py).
- ``Einsum`` of the attention contractions ``...ik,...kj`` /
  ``...ik,...jk`` -> ``batch_matmul``; with a constant 2-D right operand ->
  ``dense``.
- ``Cast`` between integers and floats of an activation -> ``cast``.

Comparison and logic (``Equal``, ``Less``, ``Not``, ``Range``,
``ConstantOfShape``) only appear on constants in these exports and are
folded by the importer.
"""

from __future__ import annotations

import numpy as np

from . import onnx_layout as L
from .onnx_import import Unsupported
from .onnx_ops import attrs, elementwise, handles, norm_axis

__all__ = ["binary", "fixed", "ceil_pad", "index_map", "trained_factor", "concat_params"]

_UNARY = {"Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
          "Neg": "neg", "Abs": "abs", "Erf": "erf", "Sin": "sin", "Cos": "cos",
          "Softplus": "softplus", "HardSwish": "hardswish", "Mish": "mish"}


@handles(*_UNARY)
def _unary(imp, node, ins):
    fn = _UNARY[node.op_type]
    return [elementwise(imp, node, lambda r: imp.model.unary(r, fn, name=imp.name(node)))]


@handles("HardSigmoid", "LeakyRelu", "Elu")
def _unary_params(imp, node, ins):
    a = attrs(node)
    fn, params = {"HardSigmoid": ("hardsigmoid", {"alpha": a.get("alpha", 0.2),
                                                  "beta": a.get("beta", 0.5)}),
                  "LeakyRelu": ("leaky_relu", {"alpha": a.get("alpha", 0.01)}),
                  "Elu": ("elu", {"alpha": a.get("alpha", 1.0)})}[node.op_type]
    return [elementwise(imp, node, lambda r: imp.model.unary(r, fn, name=imp.name(node),
                                                              **params))]


def _opt_scalar(imp, node, i, what):
    if len(node.input) > i and node.input[i]:
        return float(imp.const(node.input[i], what).reshape(-1)[0])
    return None


@handles("Clip")
def _clip(imp, node, ins):
    a = attrs(node)
    lo = _opt_scalar(imp, node, 1, "Clip min")
    hi = _opt_scalar(imp, node, 2, "Clip max")
    lo = a.get("min", lo) if lo is None else lo
    hi = a.get("max", hi) if hi is None else hi
    lo = None if lo is None or lo <= -3e38 else float(lo)
    hi = None if hi is None or hi >= 3e38 else float(hi)
    if lo == 0.0 and hi is None:
        return [elementwise(imp, node, lambda r: imp.model.relu(r, name=imp.name(node)))]
    return [elementwise(imp, node, lambda r: imp.model.unary(r, "clip", min=lo, max=hi,
                                                              name=imp.name(node)))]


@handles("Pow")
def _pow(imp, node, ins):
    if isinstance(ins[1], np.ndarray) and ins[1].size == 1:
        e = float(ins[1].reshape(-1)[0])
        if e == 1.0:
            return [ins[0]]
        fn, kw = ("sqrt", {}) if e == 0.5 else ("pow", {"exponent": e})
        return [elementwise(imp, node, lambda r: imp.model.unary(r, fn, name=imp.name(node),
                                                                  **kw))]
    return [binary(imp, node, ins, "pow")]


def drop_batch(c: np.ndarray, nd: int) -> np.ndarray:
    """A constant of rank ``nd`` folded at the export batch size holds the
    same values for every sample (positions, token types): one of them."""
    if c.ndim == nd and c.shape[0] > 1 and np.all(c == c[:1]):
        return c[:1]
    return c


def fixed(imp, name: str, value: np.ndarray) -> bool:
    """Whether the constant ``name`` is fixed data (a mask, a literal), not
    a trained weight (a float initializer or something folded from one):
    an additive mask (-inf or <= -1e4 entries) folded into an initializer
    by an exporter's optimiser is fixed too."""
    v = np.asarray(value)
    return name not in imp.weights or bool(v.size and (np.isneginf(v).any() or v.min() <= -1e4))


def trained_factor(imp, name: str, value: np.ndarray, xshape) -> tuple[int, ...] | None:
    """The shape of a ``layer_scale`` parameter for ``x * value``, or None
    when ``value`` is fixed data. The rule (issue 27): a factor is trained
    when it is a float initializer as stored (or a pure view of one:
    ``Importer.params``; not a value legionpy's constant folding computed),
    holds no mask entries (:func:`fixed`; nor only 0s and 1s with some 0),
    is the same for every sample, and is a *channel vector*: exactly one
    axis longer than 1 (ConvNeXt's (C, 1, 1) layer scale, a per-feature
    (D,) scale). Masks (2-D causal or
    padding tables, 0/1 patterns over several axes) and scalars stay fixed
    ``binary``/``scale`` operands."""
    if name not in imp.params or fixed(imp, name, value):
        return None
    v = np.asarray(value)
    if np.isin(v, (0.0, 1.0)).all() and not v.all():
        return None  # 0s and 1s, some 0: a mask (a buffer), not a scale
    c = drop_batch(v, len(xshape))
    if c.ndim == len(xshape):
        if c.shape[0] != 1:
            return None
        c = c[0]
    while c.ndim > 1 and c.shape[0] == 1:
        c = c[0]
    k = c.ndim
    if sum(s > 1 for s in c.shape) != 1 or k >= len(xshape) or \
            any(a not in (1, b) for a, b in zip(c.shape, xshape[len(xshape) - k:])):
        return None
    return tuple(int(s) for s in c.shape)


def concat_params(imp, node, ins, ax):
    """``Concat`` of one activation with trained constants (ViT's class
    token: the parameter ``Expand``-ed over the batch, then concatenated
    along the sequence): a ``concat_param`` per side of the activation.
    A constant that is not a weight (see :func:`fixed`) is not supported."""
    acts = [k for k, v in enumerate(ins) if not isinstance(v, np.ndarray)]
    if len(acts) != 1:
        raise Unsupported("concatenating constants with several activations")
    x = imp.act(node.input[acts[0]], "Concat input")
    ax = norm_axis(ax, x.ndim)
    if ax == 0:
        raise Unsupported("concatenating along the batch dim")
    before, after = [], []
    for k, (nm, v) in enumerate(zip(node.input, ins)):
        if k == acts[0]:
            continue
        c = drop_batch(np.asarray(v, np.float32), x.ndim)
        if nm not in imp.weights or fixed(imp, nm, v) or c.ndim != x.ndim or c.shape[0] != 1:
            raise Unsupported(f"concatenating a fixed constant of shape {np.shape(v)} (only "
                              "trained parameters, the same for every sample)")
        (before if k < acts[0] else after).append(c[0])
    for first, part in ((True, before), (False, after)):
        if part:
            c = np.concatenate(part, axis=ax - 1)
            sub = imp.name(node, ".param" if first else ".param_after")
            x = imp.model.concat_param(x, c.shape[ax - 1], axis=ax, first=first, name=sub)
            from .onnx_ops import set_param

            set_param(x, "value", c)
    return x


def binary(imp, node, ins, fn, cond=None):
    """``fn`` of the node's two operands with numpy broadcasting (a
    ``binary`` op on batch-first activations; a constant operand fixed)."""
    refs, consts, nd = [], [], None
    for k, (nm, v) in enumerate(zip(node.input[:2], ins[:2])):
        if isinstance(v, np.ndarray):
            consts.append((k, v))
        else:
            r = imp.act(nm, f"{node.op_type} operand")
            refs.append(r)
            nd = r.ndim
    if not refs:
        raise Unsupported("no activation operand")
    a = b = None
    for k, c in consts:
        c = drop_batch(np.asarray(c, np.float32), nd)
        c = np.where(np.isneginf(c), np.finfo(np.float32).min, c)
        if c.ndim > nd or (c.ndim == nd and c.shape[0] not in (1,)):
            raise Unsupported(f"a constant of shape {c.shape} over the batch dim of {nd}-D "
                              "operands")
        if k == 0:
            a = c
        else:
            b = c
    if len(refs) == 2:
        a, b = refs
        if a.shape[0] != b.shape[0] or a.ndim != b.ndim:
            raise Unsupported(f"broadcasting {a.shape} and {b.shape} across the batch dim")
    elif a is None:
        a = refs[0]
    else:
        b = refs[0]
    return imp.model.binary(a, b, fn, cond=cond, name=imp.name(node))


@handles("Where")
def _where(imp, node, ins):
    cond, x, y = ins
    if not isinstance(cond, np.ndarray):
        return [_where_mask(imp, node, ins)]
    for pick, v in ((cond.all(), x), (not cond.any(), y)):
        if pick and not isinstance(v, np.ndarray):
            full = np.broadcast_shapes(cond.shape, np.shape(x), np.shape(y))
            if tuple(full) == tuple(v.shape):
                return [v]  # a no-op select (IsNaN of an activation is all False)
    sub = type(node)()
    sub.CopyFrom(node)
    del sub.input[:]
    sub.input.extend(node.input[1:3])
    return [binary(imp, sub, [x, y], "where", cond=cond.astype(bool))]


def _where_mask(imp, node, ins):
    """``Where(m, a, b)`` with a 0/1 activation ``m``: ``m * (a - b) + b``
    (constants ``a``, ``b``: a padding mask to additive form) or
    ``m * a + (1 - m) * b``."""
    m = imp.act(node.input[0], "Where condition")
    a, b = ins[1], ins[2]
    fin = np.finfo(np.float32)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        a, b = (np.clip(np.asarray(v, np.float64), fin.min, fin.max) for v in (a, b))
        t = imp.model.binary(m, drop_batch((a - b).astype(np.float32), m.ndim), "mul",
                             name=imp.name(node, ".scale"))
        return imp.model.binary(t, drop_batch(b.astype(np.float32), m.ndim), "add",
                                name=imp.name(node))
    a, b = (imp.act(n) if not isinstance(v, np.ndarray) else drop_batch(
        np.asarray(v, np.float32), m.ndim) for n, v in zip(node.input[1:], (a, b)))
    ta = imp.model.binary(m, a, "mul", name=imp.name(node, ".a"))
    notm = imp.model.binary(np.float32(1), m, "sub", name=imp.name(node, ".not"))
    tb = imp.model.binary(notm, b, "mul", name=imp.name(node, ".b"))
    return imp.model.binary(ta, tb, "add", name=imp.name(node))


@handles("IsNaN", "IsInf")
def _isnan(imp, node, ins):
    """Activations are finite here (a NaN is an error legionpy reports):
    the guard of a fully masked softmax row folds to False."""
    return [np.zeros(ins[0].shape, bool)]


@handles("CastLike")
def _castlike(imp, node, ins):
    from .onnx_ops import HANDLERS

    like = ins[1]
    to = 1 if str(getattr(like, "dtype", "float32")).startswith("float") else 7
    sub = type(node)()
    sub.CopyFrom(node)
    del sub.input[1:]
    sub.op_type = "Cast"
    from onnx import helper

    sub.attribute.append(helper.make_attribute("to", to))
    return HANDLERS["Cast"](imp, sub, ins[:1])


@handles("Trilu")
def _trilu(imp, node, ins):
    x = imp.act(node.input[0], "Trilu input")
    k = int(_opt_scalar(imp, node, 1, "Trilu k") or 0)
    rows, cols = x.shape[-2:]
    upper = attrs(node).get("upper", 1)
    keep = np.triu(np.ones((rows, cols), bool), k) if upper else \
        np.tril(np.ones((rows, cols), bool), k)
    return [imp.model.binary(x, np.float32(0), "where", cond=keep, name=imp.name(node))]


@handles("Expand")
def _expand(imp, node, ins):
    x = imp.act(node.input[0], "Expand input")
    shape = [int(s) for s in imp.const(node.input[1], "Expand shape")]
    full = tuple(int(s) for s in np.broadcast_shapes(tuple(x.shape), tuple(shape)))
    if len(full) != x.ndim or full[0] != x.shape[0]:
        raise Unsupported(f"expanding {x.shape} to {shape} across the batch dim")
    if full == tuple(x.shape):
        return [x]
    return [imp.model.binary(x, np.zeros((1,) + full[1:], np.float32), "add",
                             name=imp.name(node))]


_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max"}


@handles(*_REDUCE, "GlobalMaxPool")
def _reduce(imp, node, ins):
    x = imp.act(node.input[0], f"{node.op_type} input")
    a = attrs(node)
    if node.op_type == "GlobalMaxPool":
        axes, keep, fn = list(range(2, x.ndim)), 1, "max"
    else:
        fn, keep = _REDUCE[node.op_type], a.get("keepdims", 1)
        axes = a.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = imp.const(node.input[1], "axes").tolist()
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            raise Unsupported("reducing every axis, the batch included")
    axes = sorted({norm_axis(int(v), x.ndim) for v in axes})
    if 0 in axes:
        raise Unsupported(f"reducing the batch axis (axes {axes})")
    return [imp.model.reduce(x, axes, fn, keepdims=bool(keep), name=imp.name(node))]


def pad_pairs(pads, ndim: int) -> list[tuple[int, int]]:
    """ONNX pads ``[b0, b1, ..., e0, e1, ...]`` as ``[(b0, e0), ...]``."""
    pads = [int(p) for p in pads]
    return [(pads[d], pads[d + ndim]) for d in range(ndim)]


@handles("Pad")
def _pad(imp, node, ins):
    a = attrs(node)
    mode = a.get("mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        raise Unsupported(f"mode {mode!r} (constant only)")
    x = imp.act(node.input[0], "Pad input")
    pads = a.get("pads")
    if pads is None:
        pads = imp.const(node.input[1], "Pad pads")
    value = _opt_scalar(imp, node, 2, "Pad constant_value") or a.get("value", 0.0)
    pairs = pad_pairs(pads, len(pads) // 2)
    if len(node.input) > 3 and node.input[3]:
        axes = [norm_axis(int(v), x.ndim) for v in imp.const(node.input[3], "Pad axes")]
        full = [(0, 0)] * x.ndim
        for ax, p in zip(axes, pairs):
            full[ax] = p
        pairs = full
    if len(pairs) != x.ndim or pairs[0] != (0, 0) or any(min(p) < 0 for p in pairs):
        raise Unsupported(f"pads {list(pads)} of {x.shape} (negative, or on the batch)")
    if not any(b or e for b, e in pairs):
        return [x]
    return [imp.model.pad(x, pairs, value, name=imp.name(node))]


@handles("Einsum")
def _einsum(imp, node, ins):
    eq = attrs(node)["equation"]
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not out:
        raise Unsupported(f"equation {eq!r} (two operands and an explicit output)")
    (p, q), r = terms, out
    if isinstance(ins[1], np.ndarray):
        w = ins[1]
        if w.ndim == 2 and p[:-1] == r[:-1] and q[0] == p[-1] and q[1] == r[-1]:
            from .onnx_ops import dense_last, set_param

            t, o = dense_last(imp, node, imp.lay(node.input[0]), w.shape[1], False)
            set_param(t, "weight", w)
            return [L.value(o)]
        raise Unsupported(f"equation {eq!r} with a constant operand")
    lead = p[:-2]
    if len(p) < 3 or q[:-2] != lead or r[:-2] != lead or len(set(p)) != len(p):
        raise Unsupported(f"equation {eq!r} (only batched matrix products)")
    i, k = p[-2:]
    if q[-2:] == k + r[-1] and r[-2:] == i + q[-1]:
        tb = False
    elif q[-2:] == r[-1] + k and r[-2:] == i + q[-2]:
        tb = True
    else:
        raise Unsupported(f"equation {eq!r} (only ...ik,...kj->...ij and ...ik,...jk->...ij)")
    x, y = imp.act(node.input[0]), imp.act(node.input[1])
    return [imp.model.batch_matmul(x, y, transpose_b=tb, name=imp.name(node))]


@handles("SplitToSequence")
def _split_to_sequence(imp, node, ins):
    """A Python list of the pieces (unoptimised dynamo exports split so)."""
    from .onnx_ops import split_node

    a, x = attrs(node), imp.lay(node.input[0])
    ax = norm_axis(a.get("axis", 0), x.ndim)
    n = x.shape[ax]
    split = imp.const(node.input[1], "split") if len(node.input) > 1 and node.input[1] \
        else None
    if split is None:
        sizes = [1] * n
    elif split.ndim == 0:
        k = int(split)
        sizes = [k] * (n // k) + ([n % k] if n % k else [])
    else:
        sizes = [int(v) for v in split]
    sub = type(node)()
    sub.CopyFrom(node)
    sub.op_type = "Split"
    del sub.input[1:]
    del sub.output[:]
    sub.output.extend(f"{node.output[0]}.{i}" for i in range(len(sizes)))
    del sub.attribute[:]
    from onnx import helper

    sub.attribute.extend([helper.make_attribute("axis", ax),
                          helper.make_attribute("split", sizes)])
    outs = split_node(imp, sub, [ins[0]])
    if split is None and not a.get("keepdims", 1):
        outs = [L.value(L.squeeze(L.lay(o), [ax])) for o in outs]
    return [list(outs)]


@handles("SequenceAt")
def _sequence_at(imp, node, ins):
    seq = ins[0]
    if not isinstance(seq, list):
        raise Unsupported("a sequence that is not a SplitToSequence output")
    return [seq[int(imp.const(node.input[1], "SequenceAt position"))]]


@handles("GatherND", "GatherElements")
def _gather_nd(imp, node, ins):
    return [index_map(imp, node, ins)]


def index_map(imp, node, ins):
    """A gather of an activation by constant indices that keeps every sample
    in its place (``GatherND`` broadcasting a padding mask, ``Gather`` of
    several positions): the node run on the element numbers of the tensor
    tells which element each output reads -> one ``gather`` op."""
    from .onnx_import import fold

    x = imp.act(node.input[0], f"{node.op_type} data")
    if any(not isinstance(v, np.ndarray) for v in ins[1:]):
        raise Unsupported("indices computed from activations")
    per = int(np.prod(x.shape[1:]))
    iota = np.arange(x.shape[0] * per, dtype=np.int64).reshape(x.shape)
    try:
        res = fold(node, [iota, *ins[1:]], imp.opset)[0]
    except Exception as e:  # noqa: BLE001 - e.g. indices built for another batch size
        raise Unsupported(f"indices for another shape ({type(e).__name__})") from None
    n = x.shape[0]
    own = np.arange(n).reshape((n,) + (1,) * (res.ndim - 1)) * per
    if res.ndim < 1 or res.shape[0] != n or np.any(res - own != res[:1]):
        raise Unsupported("indices that move values between samples")
    return imp.model.gather(x, res[0], name=imp.name(node))


@handles("And", "Or", "Not", "Xor")
def _logic(imp, node, ins):
    """Boolean masks are float 0/1 activations: And = mul, Or = max,
    Xor = |a - b|, Not = 1 - x."""
    if node.op_type == "Not":
        return [imp.model.binary(np.float32(1), imp.act(node.input[0]), "sub",
                                 name=imp.name(node))]
    ins = [v.astype(np.float32) if isinstance(v, np.ndarray) else v for v in ins]
    if node.op_type == "Xor":
        d = binary(imp, node, ins, "sub")
        return [imp.model.unary(d, "abs", name=imp.name(node, ".abs"))]
    return [binary(imp, node, ins, "mul" if node.op_type == "And" else "max")]


def ceil_pad(model, x, k, s, p, name):
    """A max pool's ``ceil_mode``: pad the bottom/right with the lowest
    float so the floor of the padded size is the ceil of the original's
    (each extra window still holds a real element, as PyTorch requires)."""
    extra = []
    for d in (2, 3):
        n = x.shape[d] + 2 * p[d - 2]
        out = -(-(n - k[d - 2]) // s[d - 2]) + 1
        if (out - 1) * s[d - 2] >= x.shape[d] + p[d - 2]:
            out -= 1
        extra.append(max(0, (out - 1) * s[d - 2] + k[d - 2] - n))
    if not any(extra):
        return x
    return model.pad(x, [(0, 0), (0, 0), (0, extra[0]), (0, extra[1])],
                     float(np.finfo(np.float32).min), name=name)
