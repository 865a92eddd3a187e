"""Tile kernels of the sequence operators (:mod:`legionpy.ops.sequence`),
registered in :mod:`legionpy.ops.execute`'s registry; same conventions:
``forward(op, t)`` returns the output tile, ``backward(op, t, y, dy)`` the
input gradients over their input rects and the parameter gradients over
their weight rects (partial sums where tiles share a rect)."""

from __future__ import annotations

import numpy as np

from . import kernels as K
from .execute import tile_kernel
from .kernels.common import array_module


@tile_kernel("layer_norm")
class _LayerNorm:
    @staticmethod
    def forward(op, t):
        y, t.cache["ln"] = K.layer_norm_forward(t.xs[0], t.ws["gamma"], t.ws["beta"],
                                                op.attrs.get("eps", 1e-5))
        return y

    @staticmethod
    def backward(op, t, y, dy):
        dx, dg, db = K.layer_norm_backward(dy, t.cache["ln"], t.ws["gamma"])
        return [dx], {"gamma": dg, "beta": db}


@tile_kernel("transpose")
class _Transpose:
    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        xp = array_module(x)  # the tile's device: CuPy refuses np.ascontiguousarray
        return xp.ascontiguousarray(xp.transpose(x, op.attrs["perm"]))

    @staticmethod
    def backward(op, t, y, dy):
        return [array_module(dy).transpose(dy, np.argsort(op.attrs["perm"]).tolist())], {}


@tile_kernel("slice")
class _Slice:
    @staticmethod
    def forward(op, t):
        return t.xs[0].copy()

    @staticmethod
    def backward(op, t, y, dy):
        return [dy], {}


@tile_kernel("scale")
class _Scale:
    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        return x * x.dtype.type(op.attrs["alpha"])

    @staticmethod
    def backward(op, t, y, dy):
        return [dy * dy.dtype.type(op.attrs["alpha"])], {}


@tile_kernel("add_bias")
class _AddBias:
    @staticmethod
    def forward(op, t):
        return t.xs[0] + t.ws["bias"]

    @staticmethod
    def backward(op, t, y, dy):
        k = int(op.attrs["ndim"])
        return [dy], {"bias": dy.sum(axis=tuple(range(dy.ndim - k)))}


@tile_kernel("layer_scale")
class _LayerScale:
    @staticmethod
    def forward(op, t):
        return t.xs[0] * t.ws["gamma"]

    @staticmethod
    def backward(op, t, y, dy):
        g = t.ws["gamma"]
        lead = dy.ndim - g.ndim  # the batch and dims before gamma's: summed
        axes = tuple(range(lead)) + tuple(lead + d for d, s in enumerate(g.shape) if s == 1)
        dg = (dy * t.xs[0]).sum(axis=axes, keepdims=True).reshape(g.shape)
        return [dy * g], {"gamma": dg}


@tile_kernel("concat_param")
class _ConcatParam:
    """The output tile holds a piece of the parameter (broadcast over the
    tile's samples) and a piece of the input along the axis, either maybe
    empty; the pieces sit where their rects say."""

    @staticmethod
    def _cuts(op, t):
        ax = op.attrs["axis"]
        (plo, _), (xlo, _) = op._ranges()
        w = op.weight_rect("value", t.out)
        x = op.input_rect(0, t.out)
        sl_w = [slice(None)] * t.out.ndim
        sl_x = [slice(None)] * t.out.ndim
        sl_w[ax] = slice(w.lo[ax - 1] + plo - t.out.lo[ax], w.hi[ax - 1] + plo - t.out.lo[ax])
        sl_x[ax] = slice(x.lo[ax] + xlo - t.out.lo[ax], x.hi[ax] + xlo - t.out.lo[ax])
        return tuple(sl_w), tuple(sl_x), w.volume > 0, x.volume > 0

    @staticmethod
    def forward(op, t):
        x, p = t.xs[0], t.ws["value"]
        y = array_module(x).empty(t.out.shape, x.dtype)
        sw, sx, hw, hx = _ConcatParam._cuts(op, t)
        if hw:
            y[sw] = p[None].astype(x.dtype, copy=False)
        if hx:
            y[sx] = x
        return y

    @staticmethod
    def backward(op, t, y, dy):
        sw, sx, hw, hx = _ConcatParam._cuts(op, t)
        xp = array_module(dy)
        dx = dy[sx] if hx else xp.zeros(t.xs[0].shape, dy.dtype)
        dp = dy[sw].sum(axis=0) if hw else xp.zeros(t.ws["value"].shape, dy.dtype)
        return [dx], {"value": dp}


def sinusoid(rows: range, cols: range, d_model: int, xp=np) -> np.ndarray:
    """The sinusoidal positional table ``PE[rows, cols]`` of width ``d_model``."""
    pos = xp.arange(rows.start, rows.stop, dtype=np.float64)[:, None]
    c = xp.arange(cols.start, cols.stop)
    ang = pos / xp.power(10000.0, (c - c % 2) / float(d_model))[None, :]
    return xp.where(c % 2 == 0, xp.sin(ang), xp.cos(ang))


@tile_kernel("positional_encoding")
class _Positional:
    @staticmethod
    def forward(op, t):
        x, o = t.xs[0], t.out
        pe = sinusoid(range(o.lo[1], o.hi[1]), range(o.lo[2], o.hi[2]), op.output_shape[2],
                      K.array_module(x))
        return x + pe.astype(x.dtype)[None]

    @staticmethod
    def backward(op, t, y, dy):
        return [dy], {}
