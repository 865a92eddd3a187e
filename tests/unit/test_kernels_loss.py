"""softmax, losses and accuracy: plain numpy references, torch, sample splits."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_refs import F, needs_torch, torch

from legionpy.ops import kernels as K


def softmax_ref(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_softmax_forward_backward():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7))
    y = K.softmax_forward(x)
    np.testing.assert_allclose(y, softmax_ref(x), rtol=1e-12)
    dy = rng.standard_normal(x.shape)
    jac = np.stack([np.diag(r) - np.outer(r, r) for r in y])  # (N, K, K)
    np.testing.assert_allclose(
        K.softmax_backward(dy, y), np.einsum("nij,nj->ni", jac, dy), rtol=1e-10
    )


def test_sparse_cross_entropy_reference_and_split():
    rng = np.random.default_rng(1)
    z = rng.standard_normal((9, 5)).astype(np.float32) * 4
    labels = rng.integers(0, 5, 9)
    loss, g = K.sparse_cross_entropy(z, labels)
    p = softmax_ref(z.astype(np.float64))
    ref = -np.log(p[np.arange(9), labels]).mean()
    assert abs(loss - ref) < 1e-5
    onehot = np.eye(5)[labels]
    np.testing.assert_allclose(g, (p - onehot) / 9, rtol=1e-4, atol=1e-6)
    assert g.dtype == np.float32
    # tiles along the samples: shares of the global mean
    parts = [slice(0, 4), slice(4, 9)]
    outs = [K.sparse_cross_entropy(z[s], labels[s], global_batch=9) for s in parts]
    assert abs(sum(o[0] for o in outs) - loss) < 1e-5
    np.testing.assert_allclose(np.concatenate([o[1] for o in outs]), g, rtol=1e-6)
    loss2, g2 = K.sparse_cross_entropy_from_probs(K.softmax_forward(z), labels)
    assert abs(loss2 - loss) < 1e-5
    np.testing.assert_allclose(g2, g, rtol=1e-5, atol=1e-7)


def test_dense_cross_entropy_and_mse():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((6, 4))
    t = softmax_ref(rng.standard_normal((6, 4)))
    loss, g = K.cross_entropy(z, t)
    assert abs(loss - (-(t * np.log(softmax_ref(z))).sum(axis=1).mean())) < 1e-12
    np.testing.assert_allclose(g, (softmax_ref(z) - t) / 6, rtol=1e-10)
    pred, target = rng.standard_normal((6, 3, 2)), rng.standard_normal((6, 3, 2))
    loss, g = K.mse_loss(pred, target)
    assert abs(loss - ((pred - target) ** 2).mean()) < 1e-12
    np.testing.assert_allclose(g, 2 * (pred - target) / pred.size)
    # a feature-split tile uses the full per-sample size
    l1, g1 = K.mse_loss(pred[:, :1], target[:, :1], global_batch=6, features=6)
    l2, _ = K.mse_loss(pred[:, 1:], target[:, 1:], global_batch=6, features=6)
    assert abs(l1 + l2 - loss) < 1e-12
    np.testing.assert_allclose(g1, g[:, :1])


@needs_torch
def test_losses_against_torch():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((7, 6)).astype(np.float32)
    labels = rng.integers(0, 6, 7)
    zt = torch.tensor(z, requires_grad=True)
    lt = F.cross_entropy(zt, torch.tensor(labels))
    lt.backward()
    loss, g = K.sparse_cross_entropy(z, labels)
    assert abs(loss - lt.item()) < 1e-5
    np.testing.assert_allclose(g, zt.grad.numpy(), rtol=1e-5, atol=1e-7)
    t = K.softmax_forward(rng.standard_normal((7, 6)).astype(np.float32))
    zt = torch.tensor(z, requires_grad=True)
    lt = F.cross_entropy(zt, torch.tensor(t))
    lt.backward()
    loss, g = K.cross_entropy(z, t)
    assert abs(loss - lt.item()) < 1e-5
    np.testing.assert_allclose(g, zt.grad.numpy(), rtol=1e-5, atol=1e-7)
    pt = torch.tensor(z, requires_grad=True)
    lt = F.mse_loss(pt, torch.tensor(t))
    lt.backward()
    loss, g = K.mse_loss(z, t)
    assert abs(loss - lt.item()) < 1e-6
    np.testing.assert_allclose(g, pt.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_accuracy_count():
    scores = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert K.accuracy_count(scores, np.array([1, 1, 1])) == 2
    assert K.accuracy_count(scores, np.eye(2)[[1, 0, 0]]) == 2


def test_bad_global_batch():
    with pytest.raises(ValueError, match="global_batch"):
        K.sparse_cross_entropy(np.zeros((2, 3)), np.zeros(2, int), global_batch=0)
