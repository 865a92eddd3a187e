"""Tile execution of ops/elementwise.py (unary, binary with broadcasting
and fixed constants, reduce, pad, cast): for several tilings of the output,
the tiles' forwards assemble the numpy reference and the tiles' input
gradients, summed over the rects each tile read, equal central differences
of the reference (no torch needed)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from legionpy.errors import GraphError
from legionpy.geometry import Rect
from legionpy.ops.execute import Tile, tile_backward, tile_forward
from legionpy.optimizer import Graph

RNG = np.random.default_rng(0)
erf = np.vectorize(math.erf)


def _sl(r: Rect):
    return tuple(slice(a, b) for a, b in zip(r.lo, r.hi))


def tiled(op, xs, degs, dy):
    """Forward and input gradients assembled from the tiles of ``degs``."""
    y = np.zeros(op.output_shape, np.float32)
    dxs = [np.zeros(x.shape, np.float64) for x in xs]
    ranges = [[(k * s // d, (k + 1) * s // d) for k in range(d)]
              for s, d in zip(op.output_shape, degs)]
    for combo in itertools.product(*ranges):
        out = Rect(tuple(c[0] for c in combo), tuple(c[1] for c in combo))
        rs = [op.input_rect(i, out) for i in range(len(xs))]
        t = Tile(out, [x[_sl(r)] for x, r in zip(xs, rs)], {})
        yt = tile_forward(op, t)
        y[_sl(out)] = yt
        g, dws = tile_backward(op, t, yt, dy[_sl(out)])
        assert dws == {}
        for i, r in enumerate(rs):
            if g[i] is not None:
                dxs[i][_sl(r)] += g[i]
    return y, dxs


def numeric(ref, xs, dy, eps=1e-3):
    out = []
    for x in xs:
        g = np.zeros(x.shape)
        for idx in np.ndindex(x.shape):
            o = x[idx]
            x[idx] = o + eps
            p = (ref(xs) * dy).sum()
            x[idx] = o - eps
            m = (ref(xs) * dy).sum()
            x[idx] = o
            g[idx] = (p - m) / (2 * eps)
        out.append(g)
    return out


def check(op, xs, ref, degs_list):
    xs = [x.astype(np.float32) for x in xs]
    ref64 = lambda a: ref([v.astype(np.float64) for v in a])  # noqa: E731
    dy = RNG.standard_normal(op.output_shape).astype(np.float32)
    want = ref64(xs)
    ngrad = numeric(ref64, [x.copy() for x in xs], dy)
    for degs in degs_list:
        y, dxs = tiled(op, xs, degs, dy)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        for a, b in zip(dxs, ngrad):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)


UNARY = [("exp", np.exp, False, {}), ("sqrt", np.sqrt, True, {}),
         ("rsqrt", lambda v: 1 / np.sqrt(v), True, {}), ("reciprocal", lambda v: 1 / v, True, {}),
         ("neg", lambda v: -v, False, {}), ("log", np.log, True, {}), ("erf", erf, False, {}),
         ("silu", lambda v: v / (1 + np.exp(-v)), False, {}),
         ("mish", lambda v: v * np.tanh(np.log1p(np.exp(v))), False, {}),
         ("softplus", lambda v: np.log1p(np.exp(v)), False, {}),
         ("hardswish", lambda v: v * np.clip(v / 6 + 0.5, 0, 1), False, {}),
         ("hardsigmoid", lambda v: np.clip(v * 0.2 + 0.5, 0, 1), False, {}),
         ("pow", lambda v: v ** 3, False, {"exponent": 3.0}),
         ("clip", lambda v: np.clip(v, 0, 0.5), False, {"min": 0.0, "max": 0.5}),
         ("leaky_relu", lambda v: np.where(v >= 0, v, 0.1 * v), False, {"alpha": 0.1}),
         ("elu", lambda v: np.where(v > 0, v, np.expm1(v)), False, {})]


@pytest.mark.parametrize("fn,ref,positive,params", UNARY, ids=[u[0] for u in UNARY])
def test_unary(fn, ref, positive, params):
    g = Graph(2)
    op = g.unary(g.input((3, 4)), fn, **params).op
    assert op.dims == ("sample", "attribute", "attribute")
    x = RNG.random((2, 3, 4)) + 0.5 if positive else RNG.standard_normal((2, 3, 4)) * 2
    x[np.abs(x) < 0.05] = 0.3  # keep central differences off the kinks
    x[np.abs(np.abs(x) - 3) < 0.05] = 2.5
    check(op, [x], lambda a: ref(a[0]), [(1, 1, 1), (2, 3, 2)])


@pytest.mark.parametrize("fn,ref", [("add", np.add), ("sub", np.subtract),
                                    ("mul", np.multiply), ("div", np.divide),
                                    ("max", np.maximum), ("min", np.minimum),
                                    ("pow", np.power)])
def test_binary_broadcasts_two_activations(fn, ref):
    g = Graph(2)
    op = g.binary(g.input((3, 4)), g.input((1, 4)), fn).op
    assert op.output_shape == (2, 3, 4) and op.parallel_dims == (0, 1, 2)
    xs = [RNG.random((2, 3, 4)) + 0.5, RNG.random((2, 1, 4)) + 1]
    check(op, xs, lambda a: ref(a[0], a[1]), [(1, 1, 1), (2, 3, 2)])


def test_binary_with_a_fixed_constant_and_where():
    g = Graph(2)
    x = g.input((3, 4))
    c = RNG.standard_normal((3, 1)).astype(np.float32)
    op = g.binary(c, x, "sub").op
    assert not op.params and op.attrs["const_first"]
    check(op, [RNG.standard_normal((2, 3, 4))], lambda a: c - a[0], [(2, 3, 2)])
    cond = np.tril(np.ones((3, 4), bool))
    op = g.binary(x, np.float32(-1e9), "where", cond=cond).op
    check(op, [RNG.standard_normal((2, 3, 4))], lambda a: np.where(cond, a[0], -1e9),
          [(2, 3, 2)])
    with pytest.raises(GraphError, match="varies along the batch"):
        g.binary(x, np.ones((2, 3, 4), np.float32), "add")
    with pytest.raises(GraphError, match="do not broadcast"):
        g.binary(x, g.input((5, 4)), "add")


def test_reduce_keeps_or_drops_axes_and_never_splits_them():
    g = Graph(2)
    z = g.input((3, 4, 5))
    op = g.reduce(z, [2, 3], "mean").op
    assert op.output_shape == (2, 3, 1, 1) and op.dims == ("sample", "attribute", None, None)
    check(op, [RNG.standard_normal((2, 3, 4, 5))],
          lambda a: a[0].mean(axis=(2, 3), keepdims=True), [(2, 3, 1, 1)])
    op = g.reduce(z, [1], "sum", keepdims=False).op
    assert op.output_shape == (2, 4, 5)
    check(op, [RNG.standard_normal((2, 3, 4, 5))], lambda a: a[0].sum(axis=1), [(2, 2, 5)])
    op = g.reduce(z, [-1], "max").op
    check(op, [RNG.standard_normal((2, 3, 4, 5))],
          lambda a: a[0].max(axis=-1, keepdims=True), [(2, 3, 2, 1)])
    with pytest.raises(GraphError, match="batch dim"):
        g.reduce(z, [0, 1])


def test_pad_tiles_read_their_shifted_clipped_rect():
    g = Graph(2)
    pads = [(0, 0), (1, 0), (0, 2), (2, 1)]
    op = g.pad(g.input((3, 4, 5)), pads, value=0.5).op
    assert op.output_shape == (2, 4, 6, 8)
    check(op, [RNG.standard_normal((2, 3, 4, 5))],
          lambda a: np.pad(a[0], pads, constant_values=0.5), [(1, 1, 1, 1), (2, 2, 3, 4)])


def test_cast_ints_to_floats_passes_no_gradient():
    g = Graph(2)
    op = g.cast(g.input((3,), dtype="int32"), "float32").op
    assert op.dtype == "float32"
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = Tile(op.output_rect, [x], {})
    y = tile_forward(op, t)
    assert y.dtype == np.float32 and (y == x).all()
    assert tile_backward(op, t, y, np.ones_like(y))[0] == [None]


def test_gather_broadcasts_a_mask_per_sample():
    g = Graph(2)
    idx = np.broadcast_to(np.arange(5), (1, 5, 5))  # (N, S) -> (N, 1, S, S) as GatherND
    op = g.gather(g.input((5,)), idx).op
    assert op.output_shape == (2, 1, 5, 5) and op.dims[0] == "sample"
    check(op, [RNG.standard_normal((2, 5))], lambda a: np.broadcast_to(
        a[0][:, None, None, :], (2, 1, 5, 5)), [(1, 1, 1, 1), (2, 1, 2, 3)])
    with pytest.raises(GraphError, match="outside"):
        g.gather(g.input((5,)), np.array([5]))
