"""Tile execution of the sequence operators (ops/sequence.py, 4-D
batch_matmul, causal softmax, exact GELU) against PyTorch, for every tiling:
the same law as tests/unit/test_ops_exec_layers.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_ops_exec_layers import check, rand, weights

from legionpy.errors import GraphError
from legionpy.ops.execute_sequence import sinusoid
from legionpy.optimizer import Graph

torch = pytest.importorskip("torch")
F = torch.nn.functional


def test_layer_norm():
    g = Graph(3)
    op = g.layer_norm(g.input((4, 6)), eps=1e-3).op
    assert op.dims == ("sample", "attribute", None)
    ws = {"gamma": 1 + rand(6) * 0.3, "beta": rand(6)}
    check(op, [rand(3, 4, 6)], ws,
          lambda x, w: F.layer_norm(x[0], (6,), w["gamma"], w["beta"], eps=1e-3))


def test_transpose_splits_every_dim():
    g = Graph(2)
    op = g.transpose(g.input((3, 4, 5)), (0, 2, 3, 1)).op
    assert op.output_shape == (2, 4, 5, 3) and op.parallel_dims == (0, 1, 2, 3)
    check(op, [rand(2, 3, 4, 5)], {}, lambda x, w: x[0].permute(0, 2, 3, 1))
    with pytest.raises(GraphError, match="keeping dim 0"):
        g.transpose(g.input((3, 4)), (1, 0, 2))


def test_slice_scale_add_bias():
    g = Graph(2)
    x = g.input((9, 4))
    op = g.slice(x, 1, 3, 7).op
    check(op, [rand(2, 9, 4)], {}, lambda x, w: x[0][:, 3:7])
    op = g.scale(x, 0.25).op
    check(op, [rand(2, 9, 4)], {}, lambda x, w: x[0] * 0.25)
    op = g.add_bias(x, ndim=2).op
    assert op.params["bias"].shape == (9, 4)
    check(op, [rand(2, 9, 4)], weights(op), lambda x, w: x[0] + w["bias"])


def test_positional_encoding_is_the_sinusoid_table():
    g = Graph(2)
    op = g.positional_encoding(g.input((5, 6))).op
    pe = np.zeros((5, 6))
    for p in range(5):
        for i in range(0, 6, 2):
            pe[p, i] = math.sin(p / 10000 ** (i / 6))
            pe[p, i + 1] = math.cos(p / 10000 ** (i / 6))
    np.testing.assert_allclose(sinusoid(range(5), range(6), 6), pe, rtol=1e-12)
    check(op, [rand(2, 5, 6)], {}, lambda x, w: x[0] + torch.tensor(pe))


@pytest.mark.parametrize("tb", [False, True])
def test_batch_matmul_over_heads(tb):
    g = Graph(2)
    a, b = g.input((3, 5, 4)), g.input((3, 7, 4) if tb else (3, 4, 7))
    op = g.batch_matmul(a, b, transpose_b=tb).op
    assert op.output_shape == (2, 3, 5, 7) and op.dims[1] == "attribute"
    check(op, [rand(2, 3, 5, 4), rand(2, 3, 7, 4) if tb else rand(2, 3, 4, 7)], {},
          lambda xs, w: xs[0] @ (xs[1].transpose(-1, -2) if tb else xs[1]))


def test_causal_softmax():
    g = Graph(2)
    op = g.softmax(g.input((2, 5, 5)), loss=False, causal=True).op
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    check(op, [rand(2, 2, 5, 5)], {},
          lambda x, w: torch.softmax(x[0].masked_fill(mask, -math.inf), -1))


def test_exact_gelu():
    g = Graph(3)
    op = g.gelu(g.input((11,)), approximate="none").op
    check(op, [rand(3, 11) * 3], {}, lambda x, w: F.gelu(x[0]), rtol=1e-6)
    op = g.dense(g.input((4,)), 5, activation="gelu_erf").op
    check(op, [rand(3, 4)], weights(op),
          lambda x, w: F.gelu(x[0] @ w["weight"] + w["bias"]), rtol=1e-6)
