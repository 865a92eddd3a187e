"""Batch normalisation over (N, H, W) per channel (or over N for (N, C) input),
and layer normalisation over the last dim.

Training normalises with the batch statistics; eval with running ones. For
a tile split along samples the statistics must be those of the GLOBAL batch:
each tile computes :func:`batch_norm_stats`, the runtime combines them with
:func:`batch_norm_combine_stats` and passes ``mean``/``var`` in; backward
likewise needs the global sums of :func:`batch_norm_backward_sums` (pass
``sums=``). Unsplit, all of that happens inside the two calls.

The running variance is updated with the unbiased batch variance (PyTorch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .common import array_module

__all__ = [
    "BatchNormCache",
    "batch_norm_stats",
    "batch_norm_combine_stats",
    "batch_norm_forward",
    "batch_norm_backward_sums",
    "batch_norm_backward",
    "batch_norm_update_running",
    "layer_norm_forward",
    "layer_norm_backward",
]


class BatchNormCache(NamedTuple):
    """What :func:`batch_norm_backward` needs: normalised input, 1/std, count."""

    xhat: Any  # same shape as x
    invstd: Any  # (C,)
    count: int  # elements per channel the statistics were taken over (global)
    training: bool


def _axes(x: Any) -> tuple[int, ...]:
    if x.ndim == 2:
        return (0,)
    if x.ndim == 4:
        return (0, 2, 3)
    raise ValueError(f"batch_norm expects (N, C) or (N, C, H, W) input, got shape {x.shape}")


def _bc(v: Any, x: Any) -> Any:
    """Per-channel vector shaped to broadcast against x."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def batch_norm_stats(x: Any) -> tuple[Any, Any, int]:
    """Per-channel ``(mean (C,), biased var (C,), count)`` of x, two-pass."""
    axes = _axes(x)
    count = 1
    for a in axes:
        count *= x.shape[a]
    mean = x.mean(axis=axes)
    d = x - _bc(mean, x)
    var = (d * d).mean(axis=axes)
    return mean, var, count


def batch_norm_combine_stats(parts: Sequence[tuple[Any, Any, int]]) -> tuple[Any, Any, int]:
    """Combine per-tile ``(mean, var, count)`` into the global ones (Chan et al.)."""
    mean, var, n = parts[0]
    m2 = var * n
    for mb, vb, nb in parts[1:]:
        tot = n + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + vb * nb + delta * delta * (n * nb / tot)
        n = tot
    return mean, m2 / n, n


def batch_norm_forward(
    x: Any,
    gamma: Any,
    beta: Any,
    mean: Any | None = None,
    var: Any | None = None,
    eps: float = 1e-5,
    training: bool = True,
    count: int | None = None,
) -> tuple[Any, BatchNormCache, tuple[Any, Any, int]]:
    """Normalise x (N, C[, H, W]) -> ``(y, cache, (mean, var, count))``.

    Training: ``mean``/``var`` (biased) default to this tile's batch
    statistics; pass the global ones (and their ``count``) for a sample
    split. Eval (``training=False``): pass the running mean and variance.
    The returned statistics feed :func:`batch_norm_update_running`.
    """
    xp = array_module(x, gamma)
    if mean is None or var is None:
        if not training:
            raise ValueError("batch_norm eval needs the running mean and var")
        mean, var, count = batch_norm_stats(x)
    elif count is None:
        count = 1
        for a in _axes(x):
            count *= x.shape[a]
    invstd = (1.0 / xp.sqrt(var + eps)).astype(x.dtype, copy=False)
    xhat = (x - _bc(mean, x)) * _bc(invstd, x)
    y = xhat * _bc(gamma, x) + _bc(beta, x)
    return y, BatchNormCache(xhat, invstd, int(count), training), (mean, var, int(count))


def batch_norm_backward_sums(dy: Any, cache: BatchNormCache) -> tuple[Any, Any]:
    """Per-channel ``(sum dy, sum dy * xhat)`` of a tile: the partial ``dbeta``
    and ``dgamma``, summed across sample tiles into the global ones."""
    axes = _axes(dy)
    return dy.sum(axis=axes), (dy * cache.xhat).sum(axis=axes)


def batch_norm_backward(
    dy: Any,
    cache: BatchNormCache,
    gamma: Any,
    sums: tuple[Any, Any] | None = None,
) -> tuple[Any, Any, Any]:
    """Gradients ``(dx, dgamma (C,), dbeta (C,))``.

    ``sums``: the global ``(sum dy, sum dy*xhat)`` for a sample-split tile
    (default: this tile's own). The returned dgamma/dbeta are this tile's
    share (its own sums), to be reduced with ``+`` like any weight gradient.
    """
    own_db, own_dg = batch_norm_backward_sums(dy, cache)
    if not cache.training:
        dx = dy * _bc(gamma * cache.invstd, dy)
        return dx, own_dg, own_db
    sdy, sdyx = (own_db, own_dg) if sums is None else sums
    n = cache.count
    k = _bc(gamma * cache.invstd / n, dy)
    dx = k * (n * dy - _bc(sdy, dy) - cache.xhat * _bc(sdyx, dy))
    return dx.astype(dy.dtype, copy=False), own_dg, own_db


def batch_norm_update_running(
    running_mean: Any,
    running_var: Any,
    mean: Any,
    var: Any,
    count: int,
    momentum: float = 0.1,
) -> tuple[Any, Any]:
    """New ``(running_mean, running_var)``; var is the biased batch variance,
    stored unbiased (``* count / (count - 1)``) as PyTorch does."""
    unbiased = var * (count / max(count - 1, 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * unbiased
    return (
        new_mean.astype(running_mean.dtype, copy=False),
        new_var.astype(running_var.dtype, copy=False),
    )


def layer_norm_forward(x: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> tuple[Any, Any]:
    """Layer norm over the last dim -> ``(y, (xhat, invstd))``."""
    xp = array_module(x, gamma)
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    invstd = (1.0 / xp.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)).astype(x.dtype,
                                                                               copy=False)
    xhat = d * invstd
    return xhat * gamma + beta, (xhat, invstd)


def layer_norm_backward(dy: Any, cache: tuple[Any, Any], gamma: Any) -> tuple[Any, Any, Any]:
    """``(dx, dgamma, dbeta)``; the parameter gradients summed over every row."""
    xhat, invstd = cache
    lead = tuple(range(dy.ndim - 1))
    dg, db = (dy * xhat).sum(axis=lead), dy.sum(axis=lead)
    g = dy * gamma
    dx = invstd * (g - g.mean(axis=-1, keepdims=True)
                   - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx.astype(dy.dtype, copy=False), dg, db
