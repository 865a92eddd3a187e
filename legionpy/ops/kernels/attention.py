"""Luong attention of one decoder state over encoder states.

``general`` style with a weight ``Wa`` (H, H), or ``dot`` style with
``Wa=None``::

    u       = query @ Wa                      (N, H)   (dot: u = query)
    score   = keys[n] @ u[n]                  (N, T)
    weights = softmax(score, over T)          (N, T)
    context = weights[n] @ values[n]          (N, H)

query (N, H), keys (N, T, H), values (N, T, H) (usually keys is values, the
encoder's outputs); an optional boolean ``mask`` (N, T), False for padded
steps, excludes those steps. All products are batched matmuls.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .common import array_module

__all__ = ["AttentionCache", "attention_forward", "attention_backward"]


class AttentionCache(NamedTuple):
    u: Any  # (N, H)
    weights: Any  # (N, T)


def attention_forward(
    query: Any, keys: Any, values: Any, wa: Any | None = None, mask: Any | None = None
) -> tuple[Any, Any, AttentionCache]:
    """Returns ``(context (N, H), weights (N, T), cache)``."""
    xp = array_module(query, keys, values)
    u = query if wa is None else xp.matmul(query, wa)
    score = xp.matmul(keys, u[:, :, None])[:, :, 0]
    if mask is not None:
        score = xp.where(mask, score, -xp.inf)
    score = score - score.max(axis=1, keepdims=True)
    w = xp.exp(score)
    w /= w.sum(axis=1, keepdims=True)
    context = xp.matmul(w[:, None, :], values)[:, 0, :]
    return context, w, AttentionCache(u, w)


def attention_backward(
    dcontext: Any,
    query: Any,
    keys: Any,
    values: Any,
    cache: AttentionCache,
    wa: Any | None = None,
    dweights: Any | None = None,
) -> tuple[Any, Any, Any, Any | None]:
    """Gradients ``(dquery (N, H), dkeys (N, T, H), dvalues (N, T, H), dWa | None)``.

    ``dweights`` (N, T): optional gradient flowing into the returned weights.
    When keys and values are the same array, add dkeys and dvalues.
    """
    xp = array_module(dcontext, keys)
    w = cache.weights
    dvalues = w[:, :, None] * dcontext[:, None, :]
    dw = xp.matmul(values, dcontext[:, :, None])[:, :, 0]
    if dweights is not None:
        dw = dw + dweights
    dscore = w * (dw - (dw * w).sum(axis=1, keepdims=True))
    dkeys = dscore[:, :, None] * cache.u[:, None, :]
    du = xp.matmul(dscore[:, None, :], keys)[:, 0, :]
    if wa is None:
        return du, dkeys, dvalues, None
    return xp.matmul(du, wa.T), dkeys, dvalues, xp.matmul(query.T, du)
