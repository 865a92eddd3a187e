"""Dense (fully connected) layer: ``y = act(x @ W + b)`` with W of shape (in, out).

Splitting along the output features (a parameter split) gives each tile
``W[:, o0:o1]`` and ``b[o0:o1]`` and all of ``x``; its ``dx`` is a partial sum
the runtime reduces with ``+``. Splitting along samples gives each tile all of
W; its ``dW``/``db`` are partial sums.
"""

from __future__ import annotations

from typing import Any

from .activation import activation_grad_from_output, apply_activation_
from .common import array_module

__all__ = ["dense_forward", "dense_backward"]


def dense_forward(
    x: Any, weight: Any, bias: Any | None = None, activation: str | None = None
) -> Any:
    """x (N, in) @ weight (in, out) + bias (out,) -> (N, out); optional fused
    activation ``relu``/``sigmoid``/``tanh``."""
    xp = array_module(x, weight)
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"dense: x has {x.shape[-1]} features but weight {tuple(weight.shape)} expects "
            f"{weight.shape[0]}"
        )
    y = xp.matmul(x, weight)
    if bias is not None:
        y += bias
    return apply_activation_(activation, y)


def dense_backward(
    dy: Any,
    x: Any,
    weight: Any,
    has_bias: bool = True,
    need_input_grad: bool = True,
    activation: str | None = None,
    y: Any | None = None,
) -> tuple[Any | None, Any, Any | None]:
    """Gradients ``(dx (N, in) | None, dweight (in, out), dbias (out,) | None)``.

    ``y`` is the forward output, needed only with a fused activation.
    """
    xp = array_module(dy, x, weight)
    if activation is not None:
        if y is None:
            raise ValueError("dense_backward with a fused activation needs the forward output y")
        dy = activation_grad_from_output(activation, dy, y)
    dw = xp.matmul(x.T, dy)
    db = dy.sum(axis=0) if has_bias else None
    dx = xp.matmul(dy, weight.T) if need_input_grad else None
    return dx, dw, db
