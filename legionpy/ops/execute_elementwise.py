"""Tile kernels of :mod:`legionpy.ops.elementwise` (unary, binary, reduce,
pad, cast), registered in :mod:`legionpy.ops.execute`'s registry; same
conventions: ``forward(op, t)`` returns the output tile, ``backward(op, t,
y, dy)`` the input gradients over their input rects (a broadcast input's
gradient summed over the dims it is broadcast along) and no parameter
gradients. Derivatives follow PyTorch's (``clip``: 1 inside ``[min, max]``
inclusive; ``max``/``min``: the first operand on ties; ``hardswish``'s
``x/3 + 1/2`` on ``(-3, 3)``)."""

from __future__ import annotations

import math

import numpy as np

from . import kernels as K
from .execute import tile_kernel


def _erf(x):
    return (1.0 - K.erfc(x)).astype(x.dtype, copy=False)


def _softplus(xp, x):
    return xp.logaddexp(x, x.dtype.type(0))


def _unary_fwd(op, x):
    a, xp, f = op.attrs, K.array_module(x), op.attrs["fn"]
    t = x.dtype.type
    if f == "exp":
        return xp.exp(x)
    if f == "log":
        return xp.log(x)
    if f == "sqrt":
        return xp.sqrt(x)
    if f == "rsqrt":
        return 1 / xp.sqrt(x)
    if f == "reciprocal":
        return 1 / x
    if f == "neg":
        return -x
    if f == "abs":
        return xp.abs(x)
    if f == "erf":
        return _erf(x)
    if f == "pow":
        e = a["exponent"]
        return x * x if e == 2 else xp.power(x, t(e))
    if f == "clip":
        lo = -np.inf if a["min"] is None else a["min"]
        hi = np.inf if a["max"] is None else a["max"]
        return xp.clip(x, t(lo), t(hi))
    if f == "hardsigmoid":
        return xp.clip(x * t(a["alpha"]) + t(a["beta"]), t(0), t(1))
    if f == "hardswish":
        return x * xp.clip(x / t(6) + t(0.5), t(0), t(1))
    if f == "silu":
        return x * K.sigmoid_forward(x)
    if f == "mish":
        return x * xp.tanh(_softplus(xp, x))
    if f == "softplus":
        return _softplus(xp, x)
    if f == "leaky_relu":
        return xp.where(x >= 0, x, x * t(a["alpha"]))
    if f == "elu":
        return xp.where(x > 0, x, t(a["alpha"]) * xp.expm1(xp.minimum(x, t(0))))
    if f == "sin":
        return xp.sin(x)
    if f == "cos":
        return xp.cos(x)
    raise ValueError(f"unknown unary fn {f!r}")


def _unary_grad(op, x, y):
    """d fn / dx at ``x`` (forward output ``y``)."""
    a, xp, f = op.attrs, K.array_module(x), op.attrs["fn"]
    t = x.dtype.type
    if f == "exp":
        return y
    if f == "log":
        return 1 / x
    if f == "sqrt":
        return t(0.5) / y
    if f == "rsqrt":
        return t(-0.5) * y * y * y
    if f == "reciprocal":
        return -y * y
    if f == "neg":
        return xp.full_like(x, -1)
    if f == "abs":
        return xp.sign(x)
    if f == "erf":
        return t(2 / math.sqrt(math.pi)) * xp.exp(-x * x)
    if f == "pow":
        e = a["exponent"]
        return t(2) * x if e == 2 else t(e) * xp.power(x, t(e - 1))
    if f == "clip":
        m = xp.ones_like(x)
        if a["min"] is not None:
            m = m * (x >= t(a["min"]))
        if a["max"] is not None:
            m = m * (x <= t(a["max"]))
        return m
    if f == "hardsigmoid":
        z = x * t(a["alpha"]) + t(a["beta"])
        return ((z > 0) & (z < 1)) * t(a["alpha"])
    if f == "hardswish":
        return xp.where(x < -3, t(0), xp.where(x > 3, t(1), x / t(3) + t(0.5)))
    if f == "silu":
        s = K.sigmoid_forward(x)
        return s * (1 + x * (1 - s))
    if f == "mish":
        sp = xp.tanh(_softplus(xp, x))
        return sp + x * (1 - sp * sp) * K.sigmoid_forward(x)
    if f == "softplus":
        return K.sigmoid_forward(x)
    if f == "leaky_relu":
        return xp.where(x >= 0, t(1), t(a["alpha"]))
    if f == "elu":
        return xp.where(x > 0, t(1), y + t(a["alpha"]))
    if f == "sin":
        return xp.cos(x)
    if f == "cos":
        return -xp.sin(x)
    raise ValueError(f"unknown unary fn {f!r}")


@tile_kernel("unary")
class _Unary:
    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        return _unary_fwd(op, x).astype(x.dtype, copy=False)

    @staticmethod
    def backward(op, t, y, dy):
        if not t.need(0):
            return [None], {}
        return [(dy * _unary_grad(op, t.xs[0], y)).astype(dy.dtype, copy=False)], {}


def _const_tile(c, out, dtype):
    """The part of a broadcastable constant over output tile ``out``."""
    sl = tuple(slice(0, 1) if c.shape[d] == 1 else slice(out.lo[d], out.hi[d])
               for d in range(c.ndim))
    return c[sl] if dtype is None else np.ascontiguousarray(c[sl], dtype=dtype)


def _operands(op, t):
    """``(a, b)`` of the tile (the constant, sliced, in its place)."""
    xs = list(t.xs)
    c = op.attrs.get("const")
    if c is not None:
        xp = K.array_module(xs[0])
        ct = xp.asarray(_const_tile(c, t.out, xs[0].dtype))
        xs.insert(0 if op.attrs.get("const_first") else 1, ct)
    return xs


def _cond(op, t, xp):
    return xp.asarray(_const_tile(op.attrs["cond"], t.out, None).astype(bool))


@tile_kernel("binary")
class _Binary:
    @staticmethod
    def forward(op, t):
        a, b = _operands(op, t)
        xp, f = K.array_module(a), op.attrs["fn"]
        if f == "add":
            y = a + b
        elif f == "sub":
            y = a - b
        elif f == "mul":
            y = a * b
        elif f == "div":
            y = a / b
        elif f == "pow":
            y = xp.power(a, b)
        elif f == "max":
            y = xp.maximum(a, b)
        elif f == "min":
            y = xp.minimum(a, b)
        else:
            y = xp.where(_cond(op, t, xp), a, b)
        return xp.ascontiguousarray(xp.broadcast_to(y, t.out.shape)).astype(t.xs[0].dtype,
                                                                             copy=False)

    @staticmethod
    def backward(op, t, y, dy):
        a, b = _operands(op, t)
        xp, f = K.array_module(dy), op.attrs["fn"]
        if f == "add":
            ga, gb = dy, dy
        elif f == "sub":
            ga, gb = dy, -dy
        elif f == "mul":
            ga, gb = dy * b, dy * a
        elif f == "div":
            ga, gb = dy / b, -dy * a / (b * b)
        elif f == "pow":
            ga = dy * b * xp.power(a, b - 1)
            gb = dy * y * xp.log(xp.where(a > 0, a, 1))
        elif f in ("max", "min"):
            m = (a >= b) if f == "max" else (a <= b)
            ga, gb = dy * m, dy * ~m
        else:
            m = _cond(op, t, xp)
            ga, gb = dy * m, dy * ~m
        gs = [ga, gb]
        if op.attrs.get("const") is not None:
            gs.pop(0 if op.attrs.get("const_first") else 1)
        return [K.unbroadcast(g, x.shape).astype(x.dtype, copy=False) if t.need(i) else None
                for i, (g, x) in enumerate(zip(gs, t.xs))], {}


@tile_kernel("reduce")
class _Reduce:
    @staticmethod
    def forward(op, t):
        x, a = t.xs[0], op.attrs
        f = {"mean": x.mean, "sum": x.sum, "max": x.max}[a["fn"]]
        return f(axis=a["axes"], keepdims=a["keepdims"]).astype(x.dtype, copy=False)

    @staticmethod
    def backward(op, t, y, dy):
        x, a = t.xs[0], op.attrs
        xp = K.array_module(x)
        kept = [1 if d in a["axes"] else s for d, s in enumerate(x.shape)]
        g = dy.reshape(kept)
        if a["fn"] == "mean":
            g = g * g.dtype.type(1.0 / math.prod(x.shape[d] for d in a["axes"]))
        elif a["fn"] == "max":
            hit = x == y.reshape(kept)
            g = g * hit / hit.sum(axis=a["axes"], keepdims=True)  # ties share the gradient
        return [xp.ascontiguousarray(xp.broadcast_to(g, x.shape)).astype(x.dtype,
                                                                          copy=False)], {}


@tile_kernel("pad")
class _Pad:
    @staticmethod
    def _where(op, t):
        r = op.input_rect(0, t.out)
        pads = op.attrs["pads"]
        return tuple(slice(r.lo[d] + pads[d][0] - t.out.lo[d], r.hi[d] + pads[d][0] - t.out.lo[d])
                     for d in range(t.out.ndim))

    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        y = K.array_module(x).full(t.out.shape, op.attrs["value"], x.dtype)
        y[_Pad._where(op, t)] = x
        return y

    @staticmethod
    def backward(op, t, y, dy):
        return [dy[_Pad._where(op, t)].copy()], {}


@tile_kernel("cast")
class _Cast:
    @staticmethod
    def forward(op, t):
        return t.xs[0].astype(op.dtype)

    @staticmethod
    def backward(op, t, y, dy):
        x = t.xs[0]
        if not t.need(0) or not np.issubdtype(x.dtype, np.floating):
            return [None], {}
        return [dy.astype(x.dtype)], {}


@tile_kernel("gather")
class _Gather:
    @staticmethod
    def _index(op, t):
        o = t.out
        return op.attrs["index"][tuple(slice(a, b) for a, b in zip(o.lo[1:], o.hi[1:]))]

    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        xp = K.array_module(x)
        idx = xp.asarray(_Gather._index(op, t))
        return xp.ascontiguousarray(x.reshape(x.shape[0], -1)[:, idx])

    @staticmethod
    def backward(op, t, y, dy):
        x = t.xs[0]
        if not t.need(0) or not np.issubdtype(x.dtype, np.floating):
            return [None], {}
        xp = K.array_module(dy)
        dx = xp.zeros((x.shape[0], int(np.prod(x.shape[1:]))), dy.dtype)
        idx = _Gather._index(op, t).reshape(-1)
        K.scatter_add(xp, dx.T, xp.asarray(idx), dy.reshape(dy.shape[0], -1).T)
        return [dx.reshape(x.shape)], {}
