"""Embedding lookup with a sparse gradient.

Forward gathers rows ``weight[ids]``. Backward returns the gradient as
``(unique_ids, rows)``: the distinct ids of the batch and the summed
gradient rows for each, so an update (or a copy to the weight's home) touches
only those rows; :func:`embedding_apply_sparse` adds it into a dense array.
"""

from __future__ import annotations

from typing import Any

from .common import array_module, scatter_add

__all__ = ["embedding_forward", "embedding_backward", "embedding_apply_sparse"]


def embedding_forward(ids: Any, weight: Any) -> Any:
    """ids: integer array of any shape S; weight (V, D) -> (*S, D)."""
    xp = array_module(ids, weight)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0]):
        raise IndexError(
            f"embedding ids must lie in [0, {weight.shape[0]}), got range "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )
    return xp.take(weight, ids, axis=0)


def embedding_backward(dy: Any, ids: Any) -> tuple[Any, Any]:
    """Sparse weight gradient of :func:`embedding_forward`.

    dy: (*S, D); ids: (*S,). Returns ``(unique_ids (U,) int64, rows (U, D))``
    with ``rows[u] = sum of dy where ids == unique_ids[u]``; ids sorted.
    """
    xp = array_module(dy, ids)
    d = dy.shape[-1]
    uniq, inverse = xp.unique(ids.reshape(-1), return_inverse=True)
    rows = xp.zeros((uniq.shape[0], d), dtype=dy.dtype)
    scatter_add(xp, rows, inverse.reshape(-1), dy.reshape(-1, d))
    return uniq.astype(xp.int64, copy=False), rows


def embedding_apply_sparse(dense: Any, unique_ids: Any, rows: Any, scale: float = 1.0) -> Any:
    """``dense[unique_ids] += scale * rows`` in place (ids unique); returns ``dense``."""
    dense[unique_ids] += scale * rows if scale != 1.0 else rows
    return dense
