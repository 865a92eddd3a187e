"""Softmax, losses and accuracy.

Every loss takes ``global_batch``, the number of samples of the WHOLE batch:
a tile holding part of the samples returns its share of the global mean
(``sum over its samples / global_batch``) and the gradient of the global
mean w.r.t. its logits, so summing the tiles' losses gives the batch loss
and their gradients need no rescaling. ``global_batch`` defaults to the
tile's own batch size. Losses are returned as Python floats.
"""

from __future__ import annotations

from typing import Any

from .common import array_module

__all__ = [
    "causal_mask",
    "softmax_forward",
    "softmax_backward",
    "log_softmax",
    "sparse_cross_entropy",
    "sparse_cross_entropy_from_probs",
    "cross_entropy",
    "mse_loss",
    "accuracy_count",
]


def causal_mask(x: Any, row0: int) -> Any:
    """A copy of scores ``x`` (..., rows, keys) with ``-inf`` where key ``j``
    lies after query ``row0 + i`` (the rows are global rows ``row0..``)."""
    xp = array_module(x)
    rows = xp.arange(row0, row0 + x.shape[-2])[:, None]
    keys = xp.arange(x.shape[-1])[None, :]
    return xp.where(keys > rows, x.dtype.type(-xp.inf), x)


def softmax_forward(x: Any, axis: int = -1) -> Any:
    """Numerically stable softmax along ``axis``."""
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def softmax_backward(dy: Any, y: Any, axis: int = -1) -> Any:
    """``y * (dy - sum(dy * y))`` with ``y`` the softmax output."""
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


def log_softmax(x: Any, axis: int = -1) -> Any:
    xp = array_module(x)
    z = x - x.max(axis=axis, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=axis, keepdims=True))


def _batch(n: int, global_batch: int | None) -> int:
    g = n if global_batch is None else int(global_batch)
    if g <= 0:
        raise ValueError(f"global_batch must be positive, got {global_batch}")
    return g


def sparse_cross_entropy(
    logits: Any, labels: Any, global_batch: int | None = None
) -> tuple[float, Any]:
    """Softmax + cross-entropy with integer labels.

    logits (N, K) float; labels (N,) int in [0, K). Returns
    ``(sum_n -log softmax(logits)[n, labels[n]] / global_batch,
    dlogits (N, K) = (softmax - onehot) / global_batch)``.
    """
    return sparse_cross_entropy_from_probs(softmax_forward(logits), labels, global_batch)


def sparse_cross_entropy_from_probs(
    probs: Any, labels: Any, global_batch: int | None = None
) -> tuple[float, Any]:
    """As :func:`sparse_cross_entropy` from softmax output ``probs`` (N, K);
    the gradient is still w.r.t. the LOGITS (softmax fused into the loss)."""
    xp = array_module(probs, labels)
    n = probs.shape[0]
    g = _batch(n, global_batch)
    rows = xp.arange(n)
    labels = labels.reshape(-1).astype(xp.int64, copy=False)
    picked = probs[rows, labels]
    tiny = xp.finfo(probs.dtype).tiny
    loss = float(-xp.log(xp.maximum(picked, tiny)).sum()) / g
    grad = probs.copy()
    grad[rows, labels] -= 1
    grad *= probs.dtype.type(1.0 / g)
    return loss, grad


def cross_entropy(logits: Any, targets: Any, global_batch: int | None = None) -> tuple[float, Any]:
    """Softmax + cross-entropy with dense targets (N, K) (probabilities).

    Returns ``(sum -targets * log_softmax(logits) / global_batch,
    dlogits = (softmax * sum(targets) - targets) / global_batch)``.
    """
    g = _batch(logits.shape[0], global_batch)
    ls = log_softmax(logits)
    loss = float(-(targets * ls).sum()) / g
    p = softmax_forward(logits)
    grad = (p * targets.sum(axis=-1, keepdims=True) - targets) * logits.dtype.type(1.0 / g)
    return loss, grad.astype(logits.dtype, copy=False)


def mse_loss(
    pred: Any,
    target: Any,
    global_batch: int | None = None,
    features: int | None = None,
) -> tuple[float, Any]:
    """Mean squared error over samples and features (PyTorch ``MSELoss``).

    pred, target: (N, ...). ``features`` is the per-sample element count of
    the FULL tensor (default: this tile's); the loss is
    ``sum (pred - target)^2 / (global_batch * features)``. Returns
    ``(loss, dpred)``.
    """
    g = _batch(pred.shape[0], global_batch)
    f = int(pred[0].size) if features is None else int(features)
    d = pred - target
    scale = 1.0 / (g * f)
    return float((d * d).sum()) * scale, (d * pred.dtype.type(2 * scale)).astype(
        pred.dtype, copy=False
    )


def accuracy_count(scores: Any, labels: Any) -> int:
    """Number of samples whose argmax of ``scores`` (N, K) equals ``labels``
    ((N,) ints, or (N, K) one-hot / probabilities). Divide the sum over tiles
    by the global batch for the accuracy."""
    if labels.ndim == scores.ndim:
        labels = labels.argmax(axis=-1)
    return int((scores.argmax(axis=-1) == labels.reshape(-1)).sum())
