"""Structural kernels: concat/split, add, multiply, reshape, batch matmul.

All are shape-generic and dtype-preserving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import array_module

__all__ = [
    "concat_forward",
    "concat_backward",
    "split_forward",
    "split_backward",
    "add_forward",
    "add_backward",
    "multiply_forward",
    "multiply_backward",
    "reshape_forward",
    "reshape_backward",
    "flat_forward",
    "flat_backward",
    "batch_matmul_forward",
    "batch_matmul_backward",
    "unbroadcast",
]


def concat_forward(xs: Sequence[Any], axis: int = 1) -> Any:
    """Concatenate arrays along ``axis``."""
    xp = array_module(*xs)
    return xp.concatenate(list(xs), axis=axis)


def concat_backward(dy: Any, sizes: Sequence[int], axis: int = 1) -> list[Any]:
    """Split ``dy`` into the gradients of the concatenated inputs (``sizes`` along axis).
    Returns views of ``dy``."""
    return split_forward(dy, sizes, axis)


def split_forward(x: Any, sizes: Sequence[int], axis: int = 1) -> list[Any]:
    """Split ``x`` along ``axis`` into pieces of ``sizes`` (views)."""
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {list(sizes)} do not sum to {x.shape[axis]} (axis {axis})")
    out, start = [], 0
    for s in sizes:
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(start, start + s)
        out.append(x[tuple(idx)])
        start += s
    return out


def split_backward(dys: Sequence[Any], axis: int = 1) -> Any:
    """Gradient of :func:`split_forward`: concatenation of the pieces' gradients."""
    return concat_forward(dys, axis)


def unbroadcast(g: Any, shape: Sequence[int]) -> Any:
    """Sum ``g`` over the axes along which an operand of ``shape`` was broadcast."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1
    )
    return g.sum(axis=axes).reshape(shape)


def add_forward(a: Any, b: Any) -> Any:
    """``a + b`` (numpy broadcasting)."""
    return a + b


def add_backward(dy: Any, a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[Any, Any]:
    """``(da, db)``, reduced over broadcast axes."""
    return unbroadcast(dy, a_shape), unbroadcast(dy, b_shape)


def multiply_forward(a: Any, b: Any) -> Any:
    """Element-wise ``a * b`` (numpy broadcasting)."""
    return a * b


def multiply_backward(dy: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """``(dy * b, dy * a)``, reduced over broadcast axes."""
    return unbroadcast(dy * b, a.shape), unbroadcast(dy * a, b.shape)


def reshape_forward(x: Any, shape: Sequence[int]) -> Any:
    """Reshape (a view when ``x`` is contiguous)."""
    return x.reshape(tuple(shape))


def reshape_backward(dy: Any, input_shape: Sequence[int]) -> Any:
    return dy.reshape(tuple(input_shape))


def flat_forward(x: Any) -> Any:
    """(N, ...) -> (N, prod(...)); on an NCHW tile the features are C*H*W row-major."""
    return x.reshape(x.shape[0], -1)


def flat_backward(dy: Any, input_shape: Sequence[int]) -> Any:
    return dy.reshape(tuple(input_shape))


def batch_matmul_forward(a: Any, b: Any) -> Any:
    """(B, M, K) @ (B, K, N) -> (B, M, N)."""
    xp = array_module(a, b)
    return xp.matmul(a, b)


def batch_matmul_backward(dy: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """``(da, db) = (dy @ b^T, a^T @ dy)``; shapes of ``a`` and ``b``."""
    xp = array_module(dy, a, b)
    return xp.matmul(dy, xp.swapaxes(b, -1, -2)), xp.matmul(xp.swapaxes(a, -1, -2), dy)
