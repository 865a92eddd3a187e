"""Operators that imported graphs need beyond the zoo's layers: element-wise
math (``unary``), broadcasting binary ops with an optional fixed constant
(``binary``: attention masks, squeeze-and-excitation scales, decomposed
normalisations), reductions over any non-batch axes (``reduce``: adaptive
average pooling, mean pooling over a sequence), constant padding (``pad``)
dtype casts (``cast``) and per-sample gathers with fixed indices
(``gather``: a padding mask broadcast to the scores' shape).

Parallelizable dims (paper section 4, Table 1): every op here is
sample-parallel; element-wise ops split every other dim as ``attribute``
(no parameters); a broadcast input (extent 1 where the output is larger)
is read whole along that dim, so each tile of such a dim reads the same
rect and the runtime sums their gradient shares with ``Reduce(+)`` (the
invariant of ops/base.py). ``reduce`` splits the dims it keeps and not the
ones it reduces (those are read whole by every tile); ``pad`` splits every
non-batch dim, a tile reading the shifted, clipped rect of its input.

A ``binary`` constant (``attrs["const"]``, a numpy array broadcastable to
the output, extent 1 along the batch) is fixed: it is no parameter and gets
no gradient (an additive causal or padding mask, a ``+ 1`` in a GELU).
Constants that are trained (biases) are ``add_bias`` parameters instead.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from ..geometry import Rect
from .base import Operator, register

__all__ = ["Unary", "Binary", "Reduce", "Pad", "Cast", "Gather", "UNARY_FNS", "BINARY_FNS",
           "REDUCE_FNS"]

#: fn -> attrs it takes (defaults), for ``unary``
UNARY_FNS = {
    "exp": {}, "log": {}, "sqrt": {}, "rsqrt": {}, "reciprocal": {}, "neg": {}, "abs": {},
    "erf": {}, "pow": {"exponent": 2.0}, "clip": {"min": None, "max": None},
    "hardsigmoid": {"alpha": 0.2, "beta": 0.5}, "hardswish": {}, "silu": {}, "mish": {},
    "softplus": {}, "leaky_relu": {"alpha": 0.01}, "elu": {"alpha": 1.0}, "sin": {}, "cos": {},
}
BINARY_FNS = ("add", "sub", "mul", "div", "pow", "max", "min", "where")
REDUCE_FNS = ("mean", "sum", "max")


def _elementwise_dims(n: int) -> tuple[str, ...]:
    return ("sample",) + ("attribute",) * (n - 1)


@register
class Unary(Operator):
    """``fn(x)`` element-wise; attrs ``fn`` (one of :data:`UNARY_FNS`) and its
    parameters (``exponent``; ``min``/``max``; ``alpha``/``beta``)."""

    kind = "unary"

    def infer_shape(self):
        fn = self.attrs.get("fn")
        if fn not in UNARY_FNS:
            raise GraphError(f"unary {self.name!r}: unknown fn {fn!r}; choose one of "
                             f"{sorted(UNARY_FNS)}")
        for k, v in UNARY_FNS[fn].items():
            self.attrs.setdefault(k, v)
        return self.inputs[0].shape

    def flops(self, out):
        v = float(out.volume)
        return 4.0 * v, 6.0 * v


def broadcast_shape(shapes) -> tuple[int, ...]:
    """numpy's broadcast of ``shapes`` (all of one rank), or GraphError."""
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise GraphError(f"shapes {[tuple(s) for s in shapes]} do not broadcast") from None


@register
class Binary(Operator):
    """``fn(a, b)`` with numpy broadcasting. Inputs: one or two activations of
    equal rank (batch first); with one, ``attrs["const"]`` is the other
    operand (first when ``const_first``). ``fn="where"`` selects
    ``a if cond else b`` with a constant ``attrs["cond"]``."""

    kind = "binary"
    arity = None

    def infer_shape(self):
        a = self.attrs
        fn = a.get("fn")
        if fn not in BINARY_FNS:
            raise GraphError(f"binary {self.name!r}: unknown fn {fn!r}; choose one of "
                             f"{BINARY_FNS}")
        nact = len(self.inputs)
        if nact not in (1, 2) or (nact == 1) != (a.get("const") is not None):
            raise GraphError(f"binary {self.name!r} takes two activations, or one and a "
                             f"constant (got {nact} input(s), const "
                             f"{'set' if a.get('const') is not None else 'unset'})")
        nd = self.inputs[0].ndim
        shapes = [r.shape for r in self.inputs]
        for k in ("const", "cond"):
            c = a.get(k)
            if c is not None:
                c = np.asarray(c)
                if c.ndim > nd:
                    raise GraphError(f"binary {self.name!r}: {k} of shape {c.shape} has more "
                                     f"dims than the inputs {shapes}")
                c = c.reshape((1,) * (nd - c.ndim) + c.shape)
                if c.shape[0] != 1:
                    raise GraphError(f"binary {self.name!r}: {k} of shape {c.shape} varies "
                                     "along the batch dim")
                a[k] = c
                shapes.append(c.shape)
        if fn == "where" and a.get("cond") is None:
            raise GraphError(f"binary {self.name!r}: where needs a constant cond")
        if any(len(s) != nd for s in shapes[:nact]):
            raise GraphError(f"binary {self.name!r}: activations of shapes {shapes[:nact]} "
                             "differ in rank")
        a.setdefault("const_first", False)
        out = broadcast_shape(shapes)
        if out[0] != self.inputs[0].shape[0]:
            raise GraphError(f"binary {self.name!r}: output {out} changes the batch dim")
        return out

    def input_rect(self, i, out):
        s, o = self.inputs[i].shape, self.output_shape
        lo = tuple(0 if s[d] == 1 and o[d] != 1 else out.lo[d] for d in range(len(s)))
        hi = tuple(1 if s[d] == 1 and o[d] != 1 else out.hi[d] for d in range(len(s)))
        return Rect(lo, hi)

    def flops(self, out):
        return float(out.volume), 2.0 * float(out.volume)

    def signature(self) -> str:  # constants by shape and a hash, not their text
        attrs = {k: (v if not isinstance(v, np.ndarray) else
                     f"array{v.shape}#{hash(v.tobytes()) & 0xffffffff:x}")
                 for k, v in self.attrs.items()}
        ins = ";".join(str(r.shape) for r in self.inputs)
        return f"{self.kind}({','.join(f'{k}={attrs[k]!r}' for k in sorted(attrs))})[{ins}]"


@register
class Reduce(Operator):
    """``fn`` (mean, sum, max) over ``axes`` (never the batch dim 0), keeping
    them as extent 1 when ``keepdims``. Reduced axes are read whole."""

    kind = "reduce"

    def infer_shape(self):
        x, a = self.inputs[0].shape, self.attrs
        if a.get("fn") not in REDUCE_FNS:
            raise GraphError(f"reduce {self.name!r}: fn {a.get('fn')!r} is not one of "
                             f"{REDUCE_FNS}")
        axes = tuple(sorted({int(v) % len(x) for v in a["axes"]}))
        if not axes or 0 in axes:
            raise GraphError(f"reduce {self.name!r}: axes {a['axes']} of {x} must be "
                             "non-empty and leave the batch dim 0")
        a["axes"], a["keepdims"] = axes, bool(a.get("keepdims", True))
        if a["keepdims"]:
            return tuple(1 if d in axes else s for d, s in enumerate(x))
        return tuple(s for d, s in enumerate(x) if d not in axes)

    def infer_dims(self):
        a = self.attrs
        if a["keepdims"]:
            return tuple("sample" if d == 0 else (None if d in a["axes"] else "attribute")
                         for d in range(len(self.output_shape)))
        return _elementwise_dims(len(self.output_shape))

    def _kept(self) -> list[int]:
        """Input dim of each output dim."""
        n = self.inputs[0].ndim
        if self.attrs["keepdims"]:
            return list(range(n))
        return [d for d in range(n) if d not in self.attrs["axes"]]

    def input_rect(self, i, out):
        x, axes = self.inputs[0].shape, self.attrs["axes"]
        lo, hi = [0] * len(x), list(x)
        for o, d in enumerate(self._kept()):
            if d not in axes:
                lo[d], hi[d] = out.lo[o], out.hi[o]
        return Rect(tuple(lo), tuple(hi))

    def flops(self, out):
        per = math.prod(self.inputs[0].shape[d] for d in self.attrs["axes"])
        return float(out.volume * per), float(out.volume * per)


@register
class Pad(Operator):
    """Constant padding: ``attrs["pads"]`` is ``((before, after), ...)`` per
    dim (zero for the batch dim), ``value`` the fill."""

    kind = "pad"

    def infer_shape(self):
        x, a = self.inputs[0].shape, self.attrs
        pads = tuple((int(b), int(e)) for b, e in a["pads"])
        if len(pads) != len(x) or pads[0] != (0, 0) or any(b < 0 or e < 0 for b, e in pads):
            raise GraphError(f"pad {self.name!r}: pads {pads} for {x} must be one "
                             "non-negative (before, after) pair per dim, none on the batch")
        a["pads"], a["value"] = pads, float(a.get("value", 0.0))
        return tuple(s + b + e for s, (b, e) in zip(x, pads))

    def input_rect(self, i, out):
        x, pads = self.inputs[0].shape, self.attrs["pads"]
        lo = tuple(min(max(out.lo[d] - pads[d][0], 0), x[d]) for d in range(len(x)))
        hi = tuple(max(min(out.hi[d] - pads[d][0], x[d]), lo[d]) for d in range(len(x)))
        return Rect(lo, hi)

    def flops(self, out):
        return 0.0, 0.0


@register
class Cast(Operator):
    """``x.astype(to)`` (token ids or a 0/1 mask to float32, float to int32).
    A cast from integers passes no gradient back."""

    kind = "cast"

    def __init__(self, name, inputs, **kw):
        kw["dtype"] = kw.get("to", "float32")
        super().__init__(name, inputs, **kw)

    def flops(self, out):
        return 0.0, 0.0


@register
class Gather(Operator):
    """Per-sample gather with fixed indices: ``y[n, p...] = x[n].flat[index[p...]]``
    (``attrs["index"]``: an int array, the output's shape without the
    batch; a mask broadcast from (N, S) to (N, 1, S, S) by ONNX
    ``GatherND``). A tile reads its samples whole."""

    kind = "gather"

    def infer_shape(self):
        x, idx = self.inputs[0].shape, np.asarray(self.attrs["index"], np.int64)
        per = math.prod(x[1:])
        if idx.size == 0 or idx.min() < 0 or idx.max() >= per:
            raise GraphError(f"gather {self.name!r}: indices outside the {per} elements per "
                             f"sample of {x}")
        self.attrs["index"] = idx
        return (x[0],) + idx.shape

    def input_rect(self, i, out):
        x = self.inputs[0].shape
        return Rect((out.lo[0],) + (0,) * (len(x) - 1), (out.hi[0],) + tuple(x[1:]))

    def flops(self, out):
        return 0.0, float(out.volume)

    signature = Binary.signature
