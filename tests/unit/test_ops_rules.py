"""Operator shape, dims, rect and FLOP rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legionpy.errors import GraphError
from legionpy.geometry import Rect
from legionpy.ops import REGISTRY
from legionpy.optimizer import Graph


def test_registry_has_every_operator():
    assert set(REGISTRY) >= {"input", "conv2d", "pool2d", "dense", "relu", "sigmoid", "tanh",
                             "gelu", "batch_norm", "dropout", "flat", "reshape", "concat",
                             "add", "multiply", "softmax", "embedding", "batch_matmul",
                             "lstm", "attention"}


def test_conv_dims_shape_params_and_halo():
    g = Graph(8)
    x = g.input((3, 32, 32))
    y = g.conv2d(x, 16, 3, stride=1, padding=1)
    op = y.op
    assert y.shape == (8, 16, 32, 32)
    assert op.dims == ("sample", "parameter", "attribute", "attribute")
    assert op.params["weight"].shape == (16, 3, 3, 3) and op.params["bias"].shape == (16,)
    tile = Rect((0, 0, 8, 0), (4, 8, 16, 32))
    assert op.input_rect(0, tile) == Rect((0, 0, 7, 0), (4, 3, 17, 32))
    assert op.weight_rect("weight", tile) == Rect((0, 0, 0, 0), (8, 3, 3, 3))
    f, b = op.flops(op.output_rect)
    assert f == 2 * 8 * 16 * 32 * 32 * 3 * 9 and b == 2 * f


def test_grouped_conv_reads_only_its_groups():
    g = Graph(2)
    y = g.conv2d(g.input((8, 5, 5)), 4, 1, groups=4)
    assert y.op.input_rect(0, Rect((0, 2, 0, 0), (2, 3, 5, 5))).lo[1:2] == (4,)
    assert y.op.input_rect(0, Rect((0, 2, 0, 0), (2, 3, 5, 5))).hi[1] == 6


@settings(max_examples=60, deadline=None)
@given(st.integers(5, 20), st.integers(1, 5), st.integers(1, 3), st.integers(0, 2),
       st.integers(1, 4))
def test_conv_and_pool_halo_covers_window(n, k, s, p, parts):
    """Every output row's receptive field lies inside the input rect of its tile."""
    if k > n + 2 * p or p >= k:
        return
    g = Graph(1)
    x = g.input((1, n, n))
    y = g.conv2d(x, 1, k, stride=s, padding=p)
    h = y.shape[2]
    if parts > h:
        return
    for tile in y.op.output_rect.split((1, 1, parts, 1)):
        r = y.op.input_rect(0, tile)
        for oh in range(tile.lo[2], tile.hi[2]):
            lo, hi = max(0, oh * s - p), min(n, oh * s - p + k)
            assert r.lo[2] <= lo and hi <= r.hi[2]


def test_dense_batchnorm_softmax_dims():
    g = Graph(4)
    x = g.input((10,))
    d = g.dense(x, 6, activation="relu")
    assert d.op.dims == ("sample", "parameter")
    assert d.op.input_rect(0, Rect((0, 2), (2, 4))) == Rect((0, 0), (2, 10))
    assert d.op.weight_rect("weight", Rect((0, 2), (2, 4))) == Rect((0, 2), (10, 4))
    bn = g.batch_norm(g.conv2d(g.input((3, 8, 8)), 4, 3))
    assert bn.op.dims == ("sample", "parameter", None, None)  # local statistics per sample tile
    assert bn.op.input_rect(0, Rect((0, 1, 0, 0), (2, 3, 6, 6))) == Rect((0, 1, 0, 0), (2, 3, 6, 6))
    assert g.softmax(d).op.dims == ("sample", None)
    assert g.softmax(d, loss=False).op.dims == ("sample", None)


def test_concat_reads_only_overlapping_inputs():
    g = Graph(2)
    a, b = g.input((3, 4, 4)), g.input((5, 4, 4))
    c = g.concat([a, b], axis=1)
    assert c.shape == (2, 8, 4, 4)
    t = Rect((0, 0, 0, 0), (2, 3, 4, 4))
    assert c.op.input_rect(1, t).empty
    t = Rect((0, 2, 0, 0), (2, 6, 4, 4))
    assert c.op.input_rect(0, t) == Rect((0, 2, 0, 0), (2, 3, 4, 4))
    assert c.op.input_rect(1, t) == Rect((0, 0, 0, 0), (2, 3, 4, 4))


def test_lstm_state_views_and_shared_weights():
    g = Graph(4)
    x = g.input((6,))
    s1 = g.lstm(x, None, 8)
    s2 = g.lstm(x, s1, 8, share=s1)
    assert s1.shape == (4, 2, 8) and s1.h.shape == (4, 8)
    assert s2.op.params["w_ih"] is s1.op.params["w_ih"]
    assert s1.op.dims == ("sample", None, "parameter")
    assert s1.h.to_base(Rect((0, 2), (4, 4))) == Rect((0, 0, 2), (4, 1, 4))
    assert s2.op.weight_rect("w_hh", Rect((0, 0, 2), (4, 2, 4))) == Rect((0, 2, 0), (4, 4, 8))
    a = g.attention(s2.h, [s1.h, s2.h])
    assert a.shape == (4, 8) and a.op.params["w_c"].shape == (8, 16)


def test_embedding_batch_matmul_flat_reshape():
    g = Graph(2)
    t = g.input((5,), dtype="int32")
    e = g.embedding(t, 100, 16)
    assert e.shape == (2, 5, 16) and e.op.weight_rect("weight", Rect((0, 0, 4), (2, 5, 8))) \
        == Rect((0, 4), (100, 8))
    s = g.batch_matmul(e, e, transpose_b=True)
    assert s.shape == (2, 5, 5)
    assert s.op.input_rect(1, Rect((0, 0, 1), (2, 5, 3))) == Rect((0, 1, 0), (2, 3, 16))
    f = g.flat(e)
    assert f.shape == (2, 80) and f.op.dims == ("sample", None)
    assert g.reshape(f, (10, 8)).shape == (2, 10, 8)


def test_shape_errors_name_the_values():
    g = Graph(2)
    x = g.input((3, 8, 8))
    with pytest.raises(GraphError, match="groups=2"):
        g.conv2d(x, 4, 3, groups=2)
    with pytest.raises(GraphError, match=r"\(2, 3, 8, 8\) and \(2, 4, 8, 8\)"):
        g.add(x, g.conv2d(x, 4, 1))
    with pytest.raises(GraphError, match="activation"):
        g.dense(g.flat(x), 3, activation="swish")
    with pytest.raises(GraphError, match="reshape"):
        g.reshape(g.flat(x), (7,))
