"""Tile execution (legionpy.ops.execute) against whole-tensor references.

For every operator: build it in a Graph at odd sizes, compute the whole
forward and the gradients of ``sum(y * dy)`` with PyTorch autograd (or plain
numpy for the structural ops), then run every tile of every tiling (each
parallelizable dim split 1, 2 and 3 ways, and all of them split 2 ways at
once), assemble the output tiles, and sum each tile's input gradient over its
``input_rect`` and weight gradients over its ``weight_rect``, as the runtime's
``Reduce("+")`` does. Everything in float64, so tolerances are tight.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from simhelpers import tilings as all_tilings

from legionpy.errors import StrategyError
from legionpy.ops import kernels as K
from legionpy.ops.execute import EXECUTABLE, Tile, check_tiling, tile_backward, tile_forward
from legionpy.optimizer import Graph

torch = pytest.importorskip("torch")
F = torch.nn.functional
RNG = np.random.default_rng(0)


def tilings(op):
    for deg in all_tilings(op):
        try:
            check_tiling(op, deg)
        except StrategyError:
            continue
        yield deg


def run_tiled(op, xs, ws, dy, degrees, need=None, cache_all=None):
    y = np.zeros(op.output_shape)
    dxs = [np.zeros_like(x, dtype=np.float64) for x in xs]
    dws = {k: np.zeros_like(w) for k, w in ws.items()}
    for out in op.output_rect.split(degrees):
        rin = [op.input_rect(i, out) for i in range(len(xs))]
        t = Tile(out, [x[r.to_slices()] for x, r in zip(xs, rin)],
                 {k: w[op.weight_rect(k, out).to_slices()] for k, w in ws.items()},
                 need_dx=need)
        yt = tile_forward(op, t)
        assert yt.shape == out.shape
        y[out.to_slices()] = yt
        gx, gw = tile_backward(op, t, yt, dy[out.to_slices()].copy())
        for i, (g, r) in enumerate(zip(gx, rin)):
            if g is not None and r.volume:
                assert g.shape == r.shape, (op.kind, i, g.shape, r)
                dxs[i][r.to_slices()] += g
        for k, g in gw.items():
            r = op.weight_rect(k, out)
            assert g.shape == r.shape
            dws[k][r.to_slices()] += g
    return y, dxs, dws


def check(op, xs, ws, ref_fn, need=None, rtol=1e-9, only=None):
    """ref_fn(torch xs, torch ws) -> torch y; compares every tiling (or those
    ``only(degrees)`` accepts)."""
    dy = RNG.standard_normal(op.output_shape)
    txs = [torch.tensor(x, requires_grad=x.dtype == np.float64) for x in xs]
    tws = {k: torch.tensor(w, requires_grad=True) for k, w in ws.items()}
    ty = ref_fn(txs, tws)
    (ty * torch.tensor(dy)).sum().backward()
    ry = ty.detach().numpy()
    for deg in tilings(op):
        if only is not None and not only(deg):
            continue
        y, dxs, dws = run_tiled(op, xs, ws, dy, deg, need)
        np.testing.assert_allclose(y, ry, rtol=rtol, atol=1e-12, err_msg=f"y {deg}")
        for i, tx in enumerate(txs):
            if tx.requires_grad and (need is None or need[i]):
                np.testing.assert_allclose(dxs[i], tx.grad.numpy(), rtol=rtol, atol=1e-10,
                                           err_msg=f"dx{i} {deg}")
        for k, tw in tws.items():
            np.testing.assert_allclose(dws[k], tw.grad.numpy(), rtol=rtol, atol=1e-10,
                                       err_msg=f"d{k} {deg}")


def rand(*shape):
    return RNG.standard_normal(shape)


def weights(op):
    return {k: rand(*p.shape) * 0.3 for k, p in op.params.items()}


ACT = {None: lambda z: z, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
       "gelu": lambda z: F.gelu(z, approximate="tanh")}


@pytest.mark.parametrize("k,s,p,groups,act", [(3, 1, 1, 1, "relu"), (3, 2, 1, 1, None),
                                              (5, 2, 2, 1, "gelu"), (3, 1, 0, 3, "tanh"),
                                              (2, 3, 1, 1, "sigmoid")])
def test_conv2d(k, s, p, groups, act):
    g = Graph(3)
    op = g.conv2d(g.input((6, 9, 7)), 9, k, stride=s, padding=p, groups=groups,
                  activation=act).op
    ws = weights(op)
    check(op, [rand(3, 6, 9, 7)], ws, lambda x, w: ACT[act](
        F.conv2d(x[0], w["weight"], w["bias"], stride=s, padding=p, groups=groups)))


def test_conv2d_without_bias_first_layer():
    g = Graph(2)
    op = g.conv2d(g.input((3, 7, 7)), 4, 3, padding=1, bias=False).op
    check(op, [rand(2, 3, 7, 7)], weights(op),
          lambda x, w: F.conv2d(x[0], w["weight"], padding=1), need=[False])


def test_grouped_conv_channel_tiles_hold_whole_groups():
    g = Graph(2)
    op = g.conv2d(g.input((6, 5, 5)), 6, 3, groups=3).op
    check_tiling(op, (1, 3, 1, 1))
    with pytest.raises(StrategyError, match="groups"):
        check_tiling(op, (1, 2, 1, 1))


@pytest.mark.parametrize("mode,k,s,p", [("max", 3, 2, 1), ("avg", 3, 2, 1), ("max", 2, 2, 0),
                                        ("avg", 3, 1, 0)])
def test_pool2d(mode, k, s, p):
    g = Graph(3)
    op = g.pool2d(g.input((5, 9, 7)), k, stride=s, padding=p, pool_type=mode).op
    fn = (lambda x, w: F.max_pool2d(x[0], k, s, p)) if mode == "max" else (
        lambda x, w: F.avg_pool2d(x[0], k, s, p, count_include_pad=False))
    check(op, [rand(3, 5, 9, 7)], {}, fn)


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_dense(act):
    g = Graph(5)
    op = g.dense(g.input((7,)), 9, activation=act).op
    check(op, [rand(5, 7)], weights(op), lambda x, w: ACT[act](x[0] @ w["weight"] + w["bias"]))


def test_dense_3d_input():
    g = Graph(3)
    op = g.dense(g.input((5, 7)), 6).op
    check(op, [rand(3, 5, 7)], weights(op), lambda x, w: x[0] @ w["weight"] + w["bias"])


@pytest.mark.parametrize("kind", ["relu", "sigmoid", "tanh", "gelu"])
def test_unary(kind):
    g = Graph(5)
    op = getattr(g, kind)(g.input((3, 7))).op
    check(op, [rand(5, 3, 7)], {}, lambda x, w: ACT[kind](x[0]))


def _bn_ref(k):
    """Batch norm + relu with the statistics of each of ``k`` sample blocks."""
    def ref(x, w):
        blocks = torch.tensor_split(x[0], k, dim=0)
        return torch.relu(torch.cat([F.batch_norm(b, None, None, w["gamma"], w["beta"],
                                                  training=True, eps=1e-5) for b in blocks]))
    return ref


@pytest.mark.parametrize("k", [1, 2, 3])
def test_batch_norm_tiles(k):
    """Channel tiles are exact; sample tiles normalise with their own samples."""
    g = Graph(6)
    op = g.batch_norm(g.input((6, 3, 5)), relu=True).op
    check(op, [rand(6, 6, 3, 5)], {"gamma": rand(6), "beta": rand(6)}, _bn_ref(k), rtol=1e-7,
          only=lambda deg: deg[0] == k)


def test_dropout_mask_is_global():
    g = Graph(5)
    op = g.dropout(g.input((6, 7)), rate=0.3, seed=4).op
    x = rand(5, 6, 7)
    keep = K.dropout_mask(0.3, 4, 0, op.output_shape, (0, 0, 0), op.output_shape)
    check(op, [x], {}, lambda xs, w: xs[0] * torch.tensor(keep) / 0.7)


@pytest.mark.parametrize("kind", ["flat", "reshape"])
def test_flat_reshape(kind):
    g = Graph(5)
    x = g.input((3, 4, 5))
    op = (g.flat(x) if kind == "flat" else g.reshape(x, (12, 5))).op
    check(op, [rand(5, 3, 4, 5)], {}, lambda xs, w: xs[0].reshape(op.output_shape))


def test_concat_add_multiply():
    g = Graph(3)
    a, b = g.input((2, 5)), g.input((5, 5))
    op = g.concat([a, b], axis=1).op
    check(op, [rand(3, 2, 5), rand(3, 5, 5)], {}, lambda xs, w: torch.cat(xs, 1))
    c = g.input((7, 5))
    op = g.add(b, c if False else b, activation="relu").op
    check(op, [rand(3, 5, 5), rand(3, 5, 5)], {}, lambda xs, w: torch.relu(xs[0] + xs[1]))
    op = g.multiply(b, b).op
    check(op, [rand(3, 5, 5), rand(3, 5, 5)], {}, lambda xs, w: xs[0] * xs[1])


def test_softmax_without_loss():
    g = Graph(5)
    op = g.softmax(g.input((3, 7)), loss=False).op
    check(op, [rand(5, 3, 7)], {}, lambda xs, w: torch.softmax(xs[0], -1))


@pytest.mark.parametrize("tb", [False, True])
def test_batch_matmul(tb):
    g = Graph(3)
    a, b = g.input((5, 4)), g.input((7, 4) if tb else (4, 7))
    op = g.batch_matmul(a, b, transpose_b=tb).op
    check(op, [rand(3, 5, 4), rand(3, 7, 4) if tb else rand(3, 4, 7)], {},
          lambda xs, w: torch.bmm(xs[0], xs[1].transpose(1, 2) if tb else xs[1]))


def test_embedding():
    g = Graph(5)
    op = g.embedding(g.input((3,), dtype="int64"), 11, 7).op
    ids = RNG.integers(0, 11, (5, 3))
    check(op, [ids], {"weight": rand(11, 7)}, lambda xs, w: F.embedding(xs[0], w["weight"]),
          need=[False])


def _lstm_ref(xs, w, units):
    x = xs[0]
    if len(xs) > 1:
        h, c = xs[1][:, 0], xs[1][:, 1]
    else:
        h = c = torch.zeros(x.shape[0], units, dtype=x.dtype)
    z = [x @ w["w_ih"][k].T + h @ w["w_hh"][k].T + w["bias"][k] for k in range(4)]
    i, f, gg, o = torch.sigmoid(z[0]), torch.sigmoid(z[1]), torch.tanh(z[2]), torch.sigmoid(z[3])
    c2 = f * c + i * gg
    return torch.stack([o * torch.tanh(c2), c2], 1)


@pytest.mark.parametrize("with_state", [False, True])
def test_lstm_cell(with_state):
    g = Graph(3)
    x = g.input((5,))
    s = g.input((2, 6)) if with_state else None
    op = g.lstm(x, s, 6).op
    xs = [rand(3, 5)] + ([rand(3, 2, 6)] if with_state else [])
    check(op, xs, weights(op), lambda t, w: _lstm_ref(t, w, 6))


def test_attention():
    g = Graph(3)
    q = g.input((6,))
    keys = [g.input((6,)) for _ in range(4)]
    op = g.attention(q, keys).op

    def ref(xs, w):
        k = torch.stack(xs[1:], 1)
        score = torch.einsum("nth,nh->nt", k, xs[0] @ w["w_a"])
        ctx = torch.einsum("nt,nth->nh", torch.softmax(score, 1), k)
        return torch.tanh(torch.cat([ctx, xs[0]], 1) @ w["w_c"].T)

    check(op, [rand(3, 6) for _ in range(5)], weights(op), ref)


def test_every_registered_kind_is_executable():
    from legionpy.ops import REGISTRY

    assert set(REGISTRY) - {"input"} <= set(EXECUTABLE)


def test_tilings_cover_all_parallel_dims():
    g = Graph(4)
    op = g.conv2d(g.input((3, 6, 6)), 4, 3).op
    degs = list(tilings(op))
    assert (2, 1, 1, 1) in degs and (1, 3, 1, 1) in degs and (1, 1, 1, 3) in degs
    assert len(set(itertools.chain(degs))) == len(degs)
