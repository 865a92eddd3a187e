"""dense and activation kernels against plain numpy (and torch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_refs import needs_torch, num_grad, torch

from legionpy.ops import kernels as K


@pytest.mark.parametrize("act", [None, "relu", "sigmoid", "tanh"])
def test_dense_against_numpy(act):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    z = np.einsum("ni,io->no", x, w) + b
    ref = {
        None: z,
        "relu": np.maximum(z, 0),
        "sigmoid": 1 / (1 + np.exp(-z)),
        "tanh": np.tanh(z),
    }[act]
    y = K.dense_forward(x, w, b, activation=act)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dz = {
        None: dy,
        "relu": dy * (z > 0),
        "sigmoid": dy * ref * (1 - ref),
        "tanh": dy * (1 - ref**2),
    }[act]
    dx, dw, db = K.dense_backward(dy, x, w, activation=act, y=y)
    np.testing.assert_allclose(dx, dz @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, x.T @ dz, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, dz.sum(0), rtol=1e-5, atol=1e-5)
    assert y.dtype == dx.dtype == dw.dtype == np.float32


def test_dense_split_along_out_features_sums_dx():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    dy = rng.standard_normal((4, 5))
    dx_full, _, _ = K.dense_backward(dy, x, w)
    parts = [K.dense_backward(dy[:, a:b], x, w[:, a:b])[0] for a, b in ((0, 2), (2, 5))]
    np.testing.assert_allclose(sum(parts), dx_full, rtol=1e-12)


def test_dense_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="features"):
        K.dense_forward(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32))


def gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "gelu"])
def test_activation_forward_backward_finite_differences(name):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5)) * 3
    x[np.abs(x) < 1e-3] = 0.5  # keep relu away from its kink
    ref = {
        "relu": np.maximum(x, 0),
        "sigmoid": 1 / (1 + np.exp(-x)),
        "tanh": np.tanh(x),
        "gelu": gelu_ref(x),
    }[name]
    y = K.activation_forward(name, x)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(x.shape)
    dx = K.activation_backward(name, dy, x, y)
    g = num_grad(lambda: float((K.activation_forward(name, x) * dy).sum()), x)
    np.testing.assert_allclose(dx, g, rtol=1e-6, atol=1e-7)


def test_sigmoid_no_overflow_float32():
    x = np.array([-1000, -50, 0, 50, 1000], np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = K.sigmoid_forward(x)
    np.testing.assert_allclose(y, [0, 0, 0.5, 1, 1], atol=1e-7)
    assert y.dtype == np.float32


@needs_torch
@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "gelu"])
def test_activation_against_torch(name):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 7)) * 3).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    if name == "gelu":
        yt = torch.nn.functional.gelu(xt, approximate="tanh")
    else:
        yt = getattr(torch, name)(xt)
    y = K.activation_forward(name, x)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(
        K.activation_backward(name, dy, x, y), xt.grad.numpy(), rtol=1e-5, atol=1e-6
    )


def test_unfusable_activation_raises():
    with pytest.raises(ValueError, match="cannot be fused"):
        K.dense_forward(np.ones((1, 2), np.float32), np.ones((2, 2), np.float32), activation="gelu")
    with pytest.raises(ValueError, match="unknown activation"):
        K.activation_forward("swish", np.ones(2))
