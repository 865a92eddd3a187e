"""batch_norm and dropout kernels: reference numpy, torch, tiling invariance."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_refs import needs_torch, torch

from legionpy.geometry import Rect
from legionpy.ops import kernels as K


def bn_ref(x, gamma, beta, eps):
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    shp = (1, -1, 1, 1) if x.ndim == 4 else (1, -1)
    mean = x.mean(axis=axes).reshape(shp)
    var = ((x - mean) ** 2).mean(axis=axes).reshape(shp)
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(shp) + beta.reshape(shp)


@pytest.mark.parametrize("shape", [(5, 3, 4, 3), (7, 4)])
def test_batch_norm_training_finite_differences(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    y, cache, (mean, var, count) = K.batch_norm_forward(x, gamma, beta, eps=1e-5)
    np.testing.assert_allclose(y, bn_ref(x, gamma, beta, 1e-5), rtol=1e-10, atol=1e-10)
    dy = rng.standard_normal(shape)
    dx, dg, db = K.batch_norm_backward(dy, cache, gamma)

    def loss():
        return float((bn_ref(x, gamma, beta, 1e-5) * dy).sum())

    eps = 1e-6
    for arr, grad in ((x, dx), (gamma, dg), (beta, db)):
        for idx in list(np.ndindex(arr.shape))[::3]:
            old = arr[idx]
            arr[idx] = old + eps
            up = loss()
            arr[idx] = old - eps
            down = loss()
            arr[idx] = old
            assert abs((up - down) / (2 * eps) - grad[idx]) < 1e-5


def test_batch_norm_sample_split_with_global_stats():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 3, 4, 5)).astype(np.float32)
    gamma, beta = rng.standard_normal(3).astype(np.float32), np.zeros(3, np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y_full, cache_full, _ = K.batch_norm_forward(x, gamma, beta)
    dx_full, dg_full, db_full = K.batch_norm_backward(dy, cache_full, gamma)
    parts = [slice(0, 2), slice(2, 6), slice(6, 9)]
    mean, var, count = K.batch_norm_combine_stats([K.batch_norm_stats(x[p]) for p in parts])
    caches = []
    for p in parts:
        yt, c, _ = K.batch_norm_forward(x[p], gamma, beta, mean, var, count=count)
        np.testing.assert_allclose(yt, y_full[p], rtol=1e-5, atol=1e-5)
        caches.append(c)
    sums = [K.batch_norm_backward_sums(dy[p], c) for p, c in zip(parts, caches)]
    total = (sum(s[0] for s in sums), sum(s[1] for s in sums))
    dg_sum = np.zeros(3, np.float32)
    for p, c in zip(parts, caches):
        dxt, dgt, _ = K.batch_norm_backward(dy[p], c, gamma, sums=total)
        np.testing.assert_allclose(dxt, dx_full[p], rtol=1e-4, atol=1e-4)
        dg_sum += dgt
    np.testing.assert_allclose(dg_sum, dg_full, rtol=1e-4, atol=1e-4)


@needs_torch
def test_batch_norm_against_torch_train_and_eval():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 4, 5, 3)).astype(np.float32)
    gamma = rng.standard_normal(4).astype(np.float32)
    beta = rng.standard_normal(4).astype(np.float32)
    bn = torch.nn.BatchNorm2d(4, eps=1e-5, momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(gamma))
        bn.bias.copy_(torch.tensor(beta))
    xt = torch.tensor(x, requires_grad=True)
    yt = bn(xt)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    y, cache, (mean, var, count) = K.batch_norm_forward(x, gamma, beta)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    dx, dg, db = K.batch_norm_backward(dy, cache, gamma)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dg, bn.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, bn.bias.grad.numpy(), rtol=1e-4, atol=1e-4)
    rm, rv = K.batch_norm_update_running(
        np.zeros(4, np.float32), np.ones(4, np.float32), mean, var, count
    )
    np.testing.assert_allclose(rm, bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, bn.running_var.numpy(), rtol=1e-5, atol=1e-6)
    bn.eval()
    xt2 = torch.tensor(x, requires_grad=True)
    yt2 = bn(xt2)
    yt2.backward(torch.tensor(dy))
    y2, c2, _ = K.batch_norm_forward(x, gamma, beta, rm, rv, training=False)
    np.testing.assert_allclose(y2, yt2.detach().numpy(), rtol=1e-4, atol=1e-5)
    dx2, _, _ = K.batch_norm_backward(dy, c2, gamma)
    np.testing.assert_allclose(dx2, xt2.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_batch_norm_eval_needs_running_stats():
    with pytest.raises(ValueError, match="running"):
        K.batch_norm_forward(np.ones((2, 3)), np.ones(3), np.zeros(3), training=False)


@pytest.mark.parametrize("degrees", [(2, 1, 1, 1), (1, 3, 1, 1), (1, 1, 2, 3), (3, 2, 3, 2)])
def test_dropout_tile_equals_slice_of_full(degrees):
    shape = (5, 4, 7, 6)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    full, keep_full = K.dropout_forward(x, 0.3, seed=11, step=4)
    for t in Rect.from_shape(shape).split(degrees):
        yt, keep = K.dropout_forward(
            x[t.to_slices()], 0.3, seed=11, step=4, offset=t.lo, full_shape=shape
        )
        np.testing.assert_array_equal(keep, keep_full[t.to_slices()])
        np.testing.assert_array_equal(yt, full[t.to_slices()])
        dy = np.ones_like(yt)
        np.testing.assert_array_equal(
            K.dropout_backward(dy, keep, 0.3), np.where(keep, np.float32(1 / 0.7), 0)
        )


def test_dropout_mask_statistics_and_keys():
    a = K.dropout_mask(0.25, 1, 0, (200, 300), (0, 0), (200, 300))
    assert abs(a.mean() - 0.75) < 0.01
    b = K.dropout_mask(0.25, 1, 1, (200, 300), (0, 0), (200, 300))
    c = K.dropout_mask(0.25, 2, 0, (200, 300), (0, 0), (200, 300))
    assert (a != b).mean() > 0.3 and (a != c).mean() > 0.3
    # neighbouring elements are uncorrelated
    u = K.uniform_tile(5, 0, (100000,), (0,), (100000,))
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02
    np.testing.assert_array_equal(a, K.dropout_mask(0.25, 1, 0, (200, 300), (0, 0), (200, 300)))


def test_dropout_eval_and_errors():
    x = np.ones((2, 3), np.float32)
    y, keep = K.dropout_forward(x, 0.5, 0, 0, training=False)
    assert y is x and keep is None
    y, keep = K.dropout_forward(x, 0.5, 0, 0)
    assert set(np.unique(y)) <= {0.0, 2.0} and y.dtype == np.float32
    with pytest.raises(ValueError, match="probability"):
        K.dropout_forward(x, 1.0, 0, 0)
    with pytest.raises(ValueError, match="leaves dim"):
        K.dropout_forward(x, 0.5, 0, 0, offset=(1, 0), full_shape=(2, 3))
