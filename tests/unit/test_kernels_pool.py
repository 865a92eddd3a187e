"""pool2d kernels against loops written here (and torch), and tiles vs full."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_refs import F, needs_torch, torch

from legionpy.geometry import Rect
from legionpy.ops import kernels as K


def ref_pool(x, k, s, pad, mode):
    """Loops over output pixels; max ignores padding, avg divides by real cells.
    Returns y and the gradient for a given dy (first max wins)."""
    (pt, pb), (pl, pr) = pad
    n, c, h, w = x.shape
    ho, wo = (h + pt + pb - k[0]) // s[0] + 1, (w + pl + pr - k[1]) // s[1] + 1
    y = np.zeros((n, c, ho, wo), x.dtype)
    wins = {}
    for r in range(ho):
        for q in range(wo):
            h0, w0 = r * s[0] - pt, q * s[1] - pl
            hs = slice(max(h0, 0), min(h0 + k[0], h))
            ws = slice(max(w0, 0), min(w0 + k[1], w))
            win = x[:, :, hs, ws]
            wins[r, q] = (hs, ws)
            y[:, :, r, q] = win.max(axis=(2, 3)) if mode == "max" else win.mean(axis=(2, 3))

    def grad(dy):
        dx = np.zeros_like(x)
        for (r, q), (hs, ws) in wins.items():
            win = x[:, :, hs, ws]
            if mode == "avg":
                dx[:, :, hs, ws] += dy[:, :, r, q, None, None] / (win.shape[2] * win.shape[3])
            else:
                flat = win.reshape(n, c, -1).argmax(axis=2)
                for i in range(n):
                    for j in range(c):
                        a, b = np.unravel_index(flat[i, j], win.shape[2:])
                        dx[i, j, hs.start + a, ws.start + b] += dy[i, j, r, q]
        return dx

    return y, grad


CASES = [
    ((3, 3), (2, 2), ((1, 1), (1, 1))),
    ((2, 2), (2, 2), ((0, 0), (0, 0))),
    ((3, 2), (1, 2), ((1, 0), (0, 1))),
    ((3, 3), (3, 2), ((0, 1), (1, 1))),
]


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("case", CASES)
def test_pool_against_loops(mode, case):
    k, s, pad = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    y = K.pool2d_forward(x, k, s, pad, mode)
    y_ref, grad = ref_pool(x, k, s, pad, mode)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
    assert y.shape == K.pool2d_output_shape(x.shape, k, s, pad) and y.dtype == np.float32
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = K.pool2d_backward(dy, x, y, k, s, pad, mode)
    np.testing.assert_allclose(dx, grad(dy), rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("case", [c for c in CASES if c[2][0][0] == c[2][0][1]])
def test_pool_against_torch(mode, case):
    k, s, pad = case
    (pt, _), (pl, _) = pad
    if pad[1][0] != pad[1][1]:
        pytest.skip("torch pools take symmetric padding only")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    if mode == "max":
        yt = F.max_pool2d(xt, k, s, (pt, pl))
    else:
        yt = F.avg_pool2d(xt, k, s, (pt, pl), count_include_pad=False)
    y = K.pool2d_forward(x, k, s, pad, mode)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-6, atol=1e-6)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(
        K.pool2d_backward(dy, x, y, k, s, pad, mode), xt.grad.numpy(), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("degrees", [(1, 1, 1, 1), (2, 3, 1, 1), (1, 1, 3, 2), (3, 2, 2, 3)])
@pytest.mark.parametrize("params", [(3, 2, 1), (2, 2, 0), (3, 1, 1), (5, 3, 2)])
def test_pool_tiles_equal_full(mode, degrees, params):
    k, s, p = params
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 5, 13, 11)).astype(np.float32)
    full = K.pool2d_forward(x, k, s, p, mode)
    dy = rng.standard_normal(full.shape).astype(np.float32)
    dx_full = K.pool2d_backward(dy, x, full, k, s, p, mode)
    dx_sum = np.zeros_like(x)
    for t in Rect.from_shape(full.shape).split(degrees):
        if t.empty:
            continue
        in_rect, pad = K.pool2d_input_rect(x.shape, t, k, s, p)
        xt = x[in_rect.to_slices()]
        yt = K.pool2d_forward(xt, k, s, pad, mode)
        np.testing.assert_array_equal(yt, full[t.to_slices()])
        dx_sum[in_rect.to_slices()] += K.pool2d_backward(dy[t.to_slices()], xt, yt, k, s, pad, mode)
    np.testing.assert_allclose(dx_sum, dx_full, rtol=1e-6, atol=1e-6)


def test_pool_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        K.pool2d_forward(np.zeros((1, 1, 4, 4), np.float32), 2, mode="median")
