"""Element-wise activations: relu, sigmoid, tanh, gelu (forward and backward).

``gelu`` is the tanh approximation (PyTorch ``gelu(approximate="tanh")``):
``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``; ``gelu_erf`` the exact
``x Phi(x)`` (PyTorch's default, ONNX ``Gelu``) with ``erfc``
from numba's ``math.erfc`` (numpy has none). relu, sigmoid and tanh differentiate from their output
``y``, so they can be fused into conv/dense (which then keep only ``y``);
gelu differentiates from its input ``x``.

All functions take and return arrays of any shape (float32 or float64).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from .common import array_module

__all__ = [
    "ACTIVATIONS",
    "FUSABLE",
    "relu_forward",
    "relu_backward",
    "sigmoid_forward",
    "sigmoid_backward",
    "tanh_forward",
    "tanh_backward",
    "gelu_forward",
    "gelu_backward",
    "gelu_erf_forward",
    "gelu_erf_backward",
    "erfc",
    "activation_forward",
    "activation_backward",
    "apply_activation_",
    "activation_grad_from_output",
]

ACTIVATIONS = ("relu", "sigmoid", "tanh", "gelu", "gelu_erf")
# activations whose derivative is a function of the output: fusable in place
FUSABLE = ("relu", "sigmoid", "tanh")
_GELU_C = math.sqrt(2.0 / math.pi)


def relu_forward(x: Any) -> Any:
    """``max(x, 0)``."""
    xp = array_module(x)
    return xp.maximum(x, 0)


def relu_backward(dy: Any, y: Any) -> Any:
    """``dy * (y > 0)``; ``y`` is the forward output (or input: same sign test)."""
    xp = array_module(dy, y)
    return xp.multiply(dy, y > 0, dtype=dy.dtype)  # 6x faster than where() on CPU


def sigmoid_forward(x: Any, out: Any | None = None) -> Any:
    """``1 / (1 + exp(-x)) = (1 + tanh(x / 2)) / 2``: no overflow for any ``x``.

    ``out`` may be ``x`` itself (in place)."""
    xp = array_module(x)
    out = xp.multiply(x, x.dtype.type(0.5), out=out)
    xp.tanh(out, out=out)
    out *= x.dtype.type(0.5)
    out += x.dtype.type(0.5)
    return out


def sigmoid_backward(dy: Any, y: Any) -> Any:
    """``dy * y * (1 - y)`` with ``y`` the forward output."""
    return dy * y * (1 - y)


def tanh_forward(x: Any) -> Any:
    xp = array_module(x)
    return xp.tanh(x)


def tanh_backward(dy: Any, y: Any) -> Any:
    """``dy * (1 - y^2)`` with ``y`` the forward output."""
    return dy * (1 - y * y)


def gelu_forward(x: Any) -> Any:
    """GELU, tanh approximation (matches ``torch.nn.functional.gelu(x, approximate="tanh")``)."""
    xp = array_module(x)
    t = xp.tanh(_GELU_C * (x + 0.044715 * x * x * x))
    return (0.5 * x * (1 + t)).astype(x.dtype, copy=False)


def gelu_backward(dy: Any, x: Any) -> Any:
    """Gradient of :func:`gelu_forward`; ``x`` is the forward INPUT."""
    xp = array_module(dy, x)
    x2 = x * x
    t = xp.tanh(_GELU_C * (x + 0.044715 * x2 * x))
    d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * x2)
    return (dy * d).astype(dy.dtype, copy=False)


@numba.vectorize(["float32(float32)", "float64(float64)"], cache=False)
def _erfc_cpu(x):  # pragma: no cover - compiled
    return math.erfc(x)


def erfc(x: Any) -> Any:
    """Complementary error function (numpy via numba's ``math.erfc``, cupy via
    ``cupyx.scipy.special``); numpy has none."""
    xp = array_module(x)
    if xp is not np:
        if hasattr(xp, "erfc"):  # the emulated GPU module names its own
            return xp.erfc(x)
        from cupyx.scipy.special import erfc as cerfc
        return cerfc(x)
    return _erfc_cpu(x)


def gelu_erf_forward(x: Any) -> Any:
    """Exact GELU ``x * Phi(x) = 0.5 x erfc(-x / sqrt 2)`` (PyTorch's default
    ``nn.GELU()``, ONNX ``Gelu``)."""
    return (0.5 * x * erfc(-x * _SQRT1_2)).astype(x.dtype, copy=False)


def gelu_erf_backward(dy: Any, x: Any) -> Any:
    """Gradient of :func:`gelu_erf_forward`: ``Phi(x) + x phi(x)``."""
    xp = array_module(dy, x)
    d = 0.5 * erfc(-x * _SQRT1_2) + x * xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return (dy * d).astype(dy.dtype, copy=False)


_SQRT1_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327

_FORWARD = {
    "relu": relu_forward,
    "sigmoid": sigmoid_forward,
    "tanh": tanh_forward,
    "gelu": gelu_forward,
    "gelu_erf": gelu_erf_forward,
}


def _check(name: str) -> None:
    if name not in _FORWARD:
        raise ValueError(f"unknown activation {name!r}; choose one of {ACTIVATIONS}")


def activation_forward(name: str, x: Any) -> Any:
    """Apply activation ``name`` (one of :data:`ACTIVATIONS`)."""
    _check(name)
    return _FORWARD[name](x)


def activation_backward(name: str, dy: Any, x: Any, y: Any) -> Any:
    """Gradient w.r.t. the input given forward input ``x`` and output ``y``."""
    _check(name)
    if name == "gelu":
        return gelu_backward(dy, x)
    if name == "gelu_erf":
        return gelu_erf_backward(dy, x)
    return activation_grad_from_output(name, dy, y)


def apply_activation_(name: str | None, z: Any) -> Any:
    """Apply a fusable activation to ``z`` IN PLACE and return it (``None``: identity)."""
    if name is None:
        return z
    if name not in FUSABLE:
        raise ValueError(
            f"activation {name!r} cannot be fused (its gradient needs the input); "
            f"fusable: {FUSABLE}; use a separate activation kernel"
        )
    xp = array_module(z)
    if name == "relu":
        xp.maximum(z, 0, out=z)
    elif name == "tanh":
        xp.tanh(z, out=z)
    else:
        sigmoid_forward(z, out=z)
    return z


def activation_grad_from_output(name: str | None, dy: Any, y: Any) -> Any:
    """Gradient through a fused activation from its output ``y`` (``None``: ``dy``)."""
    if name is None:
        return dy
    if name == "relu":
        return relu_backward(dy, y)
    if name == "sigmoid":
        return sigmoid_backward(dy, y)
    if name == "tanh":
        return tanh_backward(dy, y)
    raise ValueError(f"activation {name!r} is not fusable; fusable: {FUSABLE}")
