"""Trained-parameter operators of imported graphs (issue 27): ``concat_param``
(ViT's class token) and ``layer_scale`` (ConvNeXt's per-channel scale), and
dilated ``conv2d``, against plain numpy references for every tiling (each
parallelizable dim split 1, 2 and 3 ways, and all split 2 ways at once),
summing tile gradients over their rects as the runtime's ``Reduce(+)`` does.
No torch needed."""

from __future__ import annotations

import numpy as np
import pytest
from simhelpers import tilings

from legionpy.errors import GraphError
from legionpy.ops.execute import Tile, tile_backward, tile_forward
from legionpy.optimizer import Graph

RNG = np.random.default_rng(27)



def run_tiled(op, xs, ws, dy, degrees):
    y = np.zeros(op.output_shape)
    dxs = [np.zeros_like(x) for x in xs]
    dws = {k: np.zeros_like(w) for k, w in ws.items()}
    for out in op.output_rect.split(degrees):
        rin = [op.input_rect(i, out) for i in range(len(xs))]
        t = Tile(out, [x[r.to_slices()] for x, r in zip(xs, rin)],
                 {k: w[op.weight_rect(k, out).to_slices()] for k, w in ws.items()})
        yt = tile_forward(op, t)
        assert yt.shape == out.shape
        y[out.to_slices()] = yt
        gx, gw = tile_backward(op, t, yt, dy[out.to_slices()].copy())
        for i, (g, r) in enumerate(zip(gx, rin)):
            assert g.shape == r.shape
            dxs[i][r.to_slices()] += g
        for k, g in gw.items():
            r = op.weight_rect(k, out)
            assert g.shape == r.shape, (k, g.shape, r)
            dws[k][r.to_slices()] += g
    return y, dxs, dws


def check(op, xs, ws, want_y, want_dxs, want_dws, dy):
    for deg in tilings(op):
        y, dxs, dws = run_tiled(op, xs, ws, dy, deg)
        np.testing.assert_allclose(y, want_y, rtol=1e-12, err_msg=str(deg))
        for a, b in zip(dxs, want_dxs):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=str(deg))
        for k in want_dws:
            np.testing.assert_allclose(dws[k], want_dws[k], rtol=1e-12, atol=1e-12,
                                       err_msg=f"{k} {deg}")


@pytest.mark.parametrize("first,size", [(True, 1), (False, 2)])
def test_concat_param_class_token(first, size):
    g = Graph(3)
    op = g.concat_param(g.input((5, 4)), size, axis=1, first=first).op
    assert op.output_shape == (3, 5 + size, 4)
    assert op.dims == ("sample", "attribute", "attribute") and op.params["value"].shape == (
        size, 4)
    x, p = RNG.standard_normal((3, 5, 4)), RNG.standard_normal((size, 4))
    dy = RNG.standard_normal(op.output_shape)
    pb = np.broadcast_to(p, (3, size, 4))
    y = np.concatenate([pb, x] if first else [x, pb], axis=1)
    dx = dy[:, size:] if first else dy[:, :5]
    dp = (dy[:, :size] if first else dy[:, 5:]).sum(0)
    check(op, [x], {"value": p}, y, [dx], {"value": dp}, dy)


def test_concat_param_on_another_axis_and_bad_axis():
    g = Graph(2)
    op = g.concat_param(g.input((3, 4)), 2, axis=-1).op
    assert op.output_shape == (2, 3, 6) and op.params["value"].shape == (3, 2)
    x, p = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((3, 2))
    dy = RNG.standard_normal(op.output_shape)
    check(op, [x], {"value": p}, np.concatenate([np.broadcast_to(p, (2, 3, 2)), x], 2),
          [dy[..., 2:]], {"value": dy[..., :2].sum(0)}, dy)
    with pytest.raises(GraphError, match="must not be the batch"):
        g.concat_param(g.input((3, 4)), 1, axis=0)


@pytest.mark.parametrize("shape", [(4, 1, 1), (4, 3, 1), (5,), (3, 5)])
def test_layer_scale_broadcasts_over_trailing_dims(shape):
    g = Graph(2)
    op = g.layer_scale(g.input((4, 3, 5)), shape).op
    assert op.params["gamma"].shape == shape and op.dims == ("sample",) + ("attribute",) * 3
    x, gam = RNG.standard_normal((2, 4, 3, 5)), RNG.standard_normal(shape)
    dy = RNG.standard_normal(op.output_shape)
    full = dy * x
    lead = 4 - len(shape)
    axes = tuple(range(lead)) + tuple(lead + d for d, s in enumerate(shape) if s == 1)
    dg = full.sum(axis=axes, keepdims=True).reshape(shape)
    check(op, [x], {"gamma": gam}, x * gam, [dy * gam], {"gamma": dg}, dy)


def test_layer_scale_rejects_a_shape_that_does_not_broadcast_and_inits():
    g = Graph(2)
    with pytest.raises(GraphError, match="does not broadcast"):
        g.layer_scale(g.input((4, 3)), (4,))
    from legionpy.nn.init import initial_value

    p = g.layer_scale(g.input((4, 3)), (1, 3), init=1e-6).op.params["gamma"]
    np.testing.assert_array_equal(initial_value(p, 0), np.full((1, 3), 1e-6, np.float32))


def conv_ref(x, w, stride, pad, dil):
    """Direct dilated convolution (float64 loops over the kernel)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, ho, wo))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dil[0]: i * dil[0] + stride[0] * (ho - 1) + 1: stride[0],
                       j * dil[1]: j * dil[1] + stride[1] * (wo - 1) + 1: stride[1]]
            y += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return y


def conv_ref_grads(x, w, dy, stride, pad, dil, eps=1e-6):
    """(dx, dw) of sum(conv_ref * dy): the adjoint, through the linearity in
    x and w (exact: conv_ref is bilinear)."""
    dx = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = 1.0
        dx[idx] = (conv_ref(e, w, stride, pad, dil) * dy).sum()
    dw = np.zeros_like(w)
    for idx in np.ndindex(*w.shape):
        e = np.zeros_like(w)
        e[idx] = 1.0
        dw[idx] = (conv_ref(x, e, stride, pad, dil) * dy).sum()
    return dx, dw


@pytest.mark.parametrize("stride,pad,dil", [((1, 1), (2, 2), (2, 2)), ((2, 1), (1, 3), (2, 3))])
def test_dilated_conv2d_every_tiling(stride, pad, dil):
    g = Graph(2)
    op = g.conv2d(g.input((3, 9, 10)), 4, 3, stride=stride, padding=pad, dilation=dil,
                  bias=False).op
    x, w = RNG.standard_normal((2, 3, 9, 10)), RNG.standard_normal((4, 3, 3, 3))
    y = conv_ref(x, w, stride, pad, dil)
    assert op.output_shape == y.shape
    dy = RNG.standard_normal(y.shape)
    dx, dw = conv_ref_grads(x, w, dy, stride, pad, dil)
    check(op, [x], {"weight": w}, y, [dx], {"weight": dw}, dy)


def test_dilated_conv2d_needs_a_wider_halo():
    g = Graph(1)
    x = g.input((1, 16, 16))
    plain = g.conv2d(x, 1, 3, padding=1).op
    dil = g.conv2d(x, 1, 3, padding=2, dilation=2).op
    tile = plain.output_rect.split((1, 1, 4, 1))[1]  # rows 4..8
    assert plain.input_rect(0, tile).lo[2] == 3 and plain.input_rect(0, tile).hi[2] == 9
    assert dil.input_rect(0, tile).lo[2] == 2 and dil.input_rect(0, tile).hi[2] == 10
    assert dil.flops(tile) == plain.flops(tile)  # the same multiply-adds per output
