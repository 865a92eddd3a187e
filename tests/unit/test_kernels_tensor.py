"""concat/split, add, multiply, reshape, batch matmul and embedding kernels."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_refs import needs_torch, torch

from legionpy.ops import kernels as K


def test_concat_split_roundtrip():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, c, 3)).astype(np.float32) for c in (1, 4, 2)]
    y = K.concat_forward(xs, axis=1)
    assert y.shape == (2, 7, 3)
    grads = K.concat_backward(y * 2, [1, 4, 2], axis=1)
    for g, x in zip(grads, xs):
        np.testing.assert_array_equal(g, 2 * x)
    pieces = K.split_forward(y, [3, 4], axis=1)
    np.testing.assert_array_equal(K.split_backward(pieces, axis=1), y)
    with pytest.raises(ValueError, match="sum"):
        K.split_forward(y, [3, 3], axis=1)


def test_add_multiply_broadcast_grads():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 3, 5)), rng.standard_normal((3, 1))
    dy = rng.standard_normal((4, 3, 5))
    np.testing.assert_allclose(K.add_forward(a, b), a + b)
    da, db = K.add_backward(dy, a.shape, b.shape)
    np.testing.assert_allclose(da, dy)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2))[:, None])
    da, db = K.multiply_backward(dy, a, b)
    np.testing.assert_allclose(da, dy * b)
    np.testing.assert_allclose(db, (dy * a).sum(axis=(0, 2))[:, None])


def test_reshape_flat():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
    y = K.flat_forward(x)
    assert y.shape == (2, 12) and np.shares_memory(x, y)
    assert K.flat_backward(y, x.shape).shape == x.shape
    assert K.reshape_backward(K.reshape_forward(x, (4, 6)), x.shape).shape == x.shape


def test_batch_matmul():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 2))
    y = K.batch_matmul_forward(a, b)
    np.testing.assert_allclose(y, np.einsum("bmk,bkn->bmn", a, b))
    dy = rng.standard_normal(y.shape)
    da, db = K.batch_matmul_backward(dy, a, b)
    np.testing.assert_allclose(da, np.einsum("bmn,bkn->bmk", dy, b))
    np.testing.assert_allclose(db, np.einsum("bmk,bmn->bkn", a, dy))


def test_embedding_sparse_gradient():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((10, 4)).astype(np.float32)
    ids = np.array([[1, 7, 1], [3, 7, 1]])
    y = K.embedding_forward(ids, w)
    assert y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y[1, 0], w[3])
    dy = rng.standard_normal(y.shape).astype(np.float32)
    uniq, rows = K.embedding_backward(dy, ids)
    dense_ref = np.zeros_like(w)
    for i, j in np.ndindex(ids.shape):
        dense_ref[ids[i, j]] += dy[i, j]
    np.testing.assert_array_equal(uniq, [1, 3, 7])
    np.testing.assert_allclose(rows, dense_ref[[1, 3, 7]], rtol=1e-6)
    dense = K.embedding_apply_sparse(np.zeros_like(w), uniq, rows)
    np.testing.assert_allclose(dense, dense_ref, rtol=1e-6)
    with pytest.raises(IndexError, match="embedding ids"):
        K.embedding_forward(np.array([10]), w)


@needs_torch
def test_embedding_against_torch():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((12, 3)).astype(np.float32)
    ids = rng.integers(0, 12, (5, 4))
    emb = torch.nn.Embedding(12, 3, sparse=False)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor(w))
    yt = emb(torch.tensor(ids))
    dy = rng.standard_normal(yt.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    np.testing.assert_array_equal(K.embedding_forward(ids, w), yt.detach().numpy())
    uniq, rows = K.embedding_backward(dy, ids)
    dense = K.embedding_apply_sparse(np.zeros_like(w), uniq, rows)
    np.testing.assert_allclose(dense, emb.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
