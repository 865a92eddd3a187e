"""conv2d kernels against loops written here (and torch where importable),
and tiles of the output computed from clipped input tiles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from kernel_refs import F, needs_torch, torch

from legionpy.geometry import Rect
from legionpy.ops import kernels as K


def ref_conv(x, w, b, stride, pad, groups):
    """Plain loops over output pixels; returns y and a function giving grads."""
    (pt, pb), (pl, pr) = pad
    sh, sw = stride
    xp_ = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c, hp, wp = xp_.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    y = np.zeros((n, o, ho, wo), x.dtype)
    for g in range(groups):
        wg = w[g * og : (g + 1) * og]
        for r in range(ho):
            for q in range(wo):
                win = xp_[:, g * cg : (g + 1) * cg, r * sh : r * sh + kh, q * sw : q * sw + kw]
                y[:, g * og : (g + 1) * og, r, q] = np.einsum("ncij,ocij->no", win, wg)
    if b is not None:
        y += b[None, :, None, None]

    def grads(dy):
        dxp = np.zeros_like(xp_)
        dw = np.zeros_like(w)
        for g in range(groups):
            sl_o = slice(g * og, (g + 1) * og)
            sl_c = slice(g * cg, (g + 1) * cg)
            for r in range(ho):
                for q in range(wo):
                    hs = slice(r * sh, r * sh + kh)
                    ws = slice(q * sw, q * sw + kw)
                    win = xp_[:, sl_c, hs, ws]
                    dw[sl_o] += np.einsum("no,ncij->ocij", dy[:, sl_o, r, q], win)
                    dxp[:, sl_c, hs, ws] += np.einsum("no,ocij->ncij", dy[:, sl_o, r, q], w[sl_o])
        dx = dxp[:, :, pt : pt + x.shape[2], pl : pl + x.shape[3]]
        return dx, dw, dy.sum(axis=(0, 2, 3))

    return y, grads


CASES = [
    # (N, C, H, W, O, kh, kw, stride, padding, groups)
    (2, 3, 7, 6, 5, 3, 3, (1, 1), ((1, 1), (1, 1)), 1),
    (3, 4, 9, 8, 6, 3, 2, (2, 1), ((0, 2), (1, 0)), 2),
    (1, 2, 5, 5, 3, 1, 1, (1, 1), ((0, 0), (0, 0)), 1),
    (2, 3, 11, 10, 4, 5, 5, (3, 2), ((2, 2), (2, 2)), 1),
    (2, 4, 6, 7, 4, 3, 3, (1, 1), ((1, 1), (1, 1)), 4),  # depthwise
]


@pytest.mark.parametrize("case", CASES)
def test_conv_forward_backward_against_loops(case):
    n, c, h, w_, o, kh, kw, stride, pad, groups = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    y = K.conv2d_forward(x, w, b, stride, pad, groups)
    y_ref, grads = ref_conv(x, w, b, stride, pad, groups)
    assert y.dtype == np.float32 and y.shape == y_ref.shape
    assert y.shape == K.conv2d_output_shape(x.shape, o, (kh, kw), stride, pad)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw, db = K.conv2d_backward(dy, x, w, stride, pad, groups)
    dx_r, dw_r, db_r = grads(dy)
    np.testing.assert_allclose(dx, dx_r, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, dw_r, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, db_r, rtol=1e-4, atol=1e-4)
    assert dx.dtype == dw.dtype == db.dtype == np.float32
    none_dx, dw2, _ = K.conv2d_backward(dy, x, w, stride, pad, groups, need_input_grad=False)
    assert none_dx is None
    np.testing.assert_array_equal(dw2, dw)


@needs_torch
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("act", [None, "relu", "tanh", "sigmoid"])
def test_conv_against_torch(case, act):
    n, c, h, w_, o, kh, kw, stride, pad, groups = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    y = K.conv2d_forward(x, w, b, stride, pad, groups, activation=act)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    (pt, pb), (pl, pr) = pad
    yt = F.conv2d(F.pad(xt, (pl, pr, pt, pb)), wt, bt, stride=stride, groups=groups)
    if act is not None:
        yt = getattr(torch, act)(yt)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    dx, dw, db = K.conv2d_backward(dy, x, w, stride, pad, groups, activation=act, y=y)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, wt.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, bt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_finite_differences_float64():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 2, 5, 4))
    w = rng.standard_normal((3, 2, 3, 2))
    pad, stride = ((1, 0), (0, 1)), (2, 1)
    dy = rng.standard_normal(K.conv2d_output_shape(x.shape, 3, (3, 2), stride, pad))
    dx, dw, _ = K.conv2d_backward(dy, x, w, stride, pad)

    def loss(xx, ww):
        return float((K.conv2d_forward(xx, ww, None, stride, pad) * dy).sum())

    eps = 1e-6
    for arr, grad in ((x, dx), (w, dw)):
        for idx in list(np.ndindex(arr.shape))[::5]:
            old = arr[idx]
            arr[idx] = old + eps
            up = loss(x, w)
            arr[idx] = old - eps
            down = loss(x, w)
            arr[idx] = old
            assert abs((up - down) / (2 * eps) - grad[idx]) < 1e-6


def test_window_input_range_formula():
    for size, k, s, p in itertools.product((5, 8, 13), (1, 2, 3, 5), (1, 2, 3), (0, 1, 2)):
        if size + 2 * p < k:
            continue
        n_out = K.window_output_size(size, k, s, p, p)
        for a in range(n_out):
            for b in range(a + 1, n_out + 1):
                lo, hi, plo, phi = K.window_input_range(a, b, size, k, s, p)
                want_lo, want_hi = a * s - p, (b - 1) * s - p + k
                assert lo == min(max(want_lo, 0), size)
                assert hi == max(min(want_hi, size), lo)
                assert plo >= 0 and phi >= 0 and plo + (hi - lo) + phi == want_hi - want_lo
                if hi > lo:  # the usual case: padding is what was clipped
                    assert plo == lo - want_lo and phi == want_hi - hi
                assert K.window_output_size(hi - lo, k, s, plo, phi) == b - a


def _tiles(shape, degrees):
    return Rect.from_shape(shape).split(degrees)


SPLITS = [(1, 1, 1, 1), (2, 1, 1, 1), (1, 3, 1, 1), (1, 1, 3, 1), (1, 1, 1, 2), (2, 2, 2, 3)]


@pytest.mark.parametrize("degrees", SPLITS)
@pytest.mark.parametrize(
    "params",
    [
        # (C, H, W, O, k, stride, padding, groups)
        (3, 11, 10, 6, 3, 1, 1, 1),
        (4, 13, 9, 6, 5, 2, 2, 2),
        (2, 9, 9, 3, 2, 3, 1, 1),
        (3, 8, 7, 3, 3, 1, 0, 3),
    ],
)
def test_conv_tiles_equal_full(degrees, params):
    c, h, w_, o, k, s, p, groups = params
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    full = K.conv2d_forward(x, w, b, s, p, groups)
    dy = rng.standard_normal(full.shape).astype(np.float32)
    dx_full, dw_full, db_full = K.conv2d_backward(dy, x, w, s, p, groups)
    og = o // groups
    if groups > 1 and o // degrees[1] % og:
        pytest.skip("channel split does not align with groups")
    dx_sum = np.zeros_like(x)
    dw_sum = np.zeros_like(w)
    for t in _tiles(full.shape, degrees):
        if t.empty:
            continue
        in_rect, pad = K.conv2d_input_rect(x.shape, t, k, s, p, groups, out_channels=o)
        g0, g1 = K.conv2d_tile_groups(t, o, groups) if groups > 1 else (0, 1)
        xt = x[in_rect.to_slices()]
        wt = w[t.lo[1] : t.hi[1]]
        yt = K.conv2d_forward(xt, wt, b[t.lo[1] : t.hi[1]], s, pad, g1 - g0)
        np.testing.assert_allclose(yt, full[t.to_slices()], rtol=1e-5, atol=1e-5)
        dxt, dwt, _ = K.conv2d_backward(dy[t.to_slices()], xt, wt, s, pad, g1 - g0)
        dx_sum[in_rect.to_slices()] += dxt
        dw_sum[t.lo[1] : t.hi[1]] += dwt
    # Reduce(+) of the tiles' input and weight gradients gives the full ones
    np.testing.assert_allclose(dx_sum, dx_full, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw_sum, dw_full, rtol=1e-4, atol=1e-3)
    assert db_full.shape == (o,)


def test_conv_input_rect_rejects_group_cut():
    with pytest.raises(ValueError, match="cuts a group"):
        K.conv2d_input_rect((1, 4, 5, 5), Rect((0, 0, 0, 0), (1, 3, 5, 5)), 3, 1, 1, 2, 4)


def test_conv_rejects_channel_mismatch():
    with pytest.raises(ValueError, match="channels"):
        K.conv2d_forward(np.zeros((1, 3, 4, 4), np.float32), np.zeros((2, 2, 3, 3), np.float32))


def test_padding_forms():
    assert K.normalize_padding(2) == ((2, 2), (2, 2))
    assert K.normalize_padding((1, 0)) == ((1, 1), (0, 0))
    assert K.normalize_padding(((1, 0), (0, 2))) == ((1, 0), (0, 2))
    with pytest.raises(ValueError):
        K.normalize_padding((1, 2, 3))


def test_window_range_matches_operator_rules():
    """The operator rules (legionpy.ops) compute input rects independently;
    both must name the same input rows for every output tile."""
    base = pytest.importorskip("legionpy.ops.base")
    window = getattr(base, "window", None)
    if window is None:
        pytest.skip("legionpy.ops.base.window not available")
    for size, k, s, p in itertools.product((6, 9, 14), (1, 2, 3, 5), (1, 2, 3), (0, 1, 2)):
        if size + 2 * p < k or 2 * p >= k + s:  # windows wholly in padding: not produced
            continue
        n_out = K.window_output_size(size, k, s, p, p)
        for a in range(n_out):
            for b in range(a + 1, n_out + 1):
                lo, hi, _, _ = K.window_input_range(a, b, size, k, s, p)
                assert window(a, b, k, s, p, size) == (lo, hi), (size, k, s, p, a, b)
