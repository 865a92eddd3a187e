"""Helpers shared by every kernel family: the array module, padding specs.

Kernels are pure functions of arrays. They run unchanged on numpy (CPU) and
cupy (GPU): each takes the array module ``xp`` from :func:`array_module`, which
looks at the arrays it is given, and uses only the array API both share.

Conventions used by every kernel module:

- dtype: float32 in, float32 out (float64 works too, which the
  finite-difference tests use); integer index arrays are int64.
- layout: images are NCHW, dense activations (N, F), weights of dense layers
  (in, out).
- a ``*_forward`` function returns the output when its ``*_backward`` needs
  only the forward inputs and outputs (conv, pool, dense, activations), and
  ``(output, cache)`` when it needs more (batch norm, LSTM cell, attention);
  the runtime keeps the cache between the two tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "array_module",
    "like",
    "Padding2d",
    "normalize_padding",
    "pair",
    "scatter_add",
]

# ((top, bottom), (left, right))
Padding2d = tuple[tuple[int, int], tuple[int, int]]


def array_module(*arrays: Any) -> Any:
    """The array module (``numpy`` or ``cupy``) of the first non-numpy array.

    >>> import numpy as np
    >>> array_module(np.zeros(2)) is np
    True
    """
    for a in arrays:
        mod = type(a).__module__
        if mod.startswith("cupy"):
            import cupy

            return cupy
        if mod != "numpy" and hasattr(a, "__array_namespace__"):
            # another array type that names its module (the Array API's way):
            # the emulated GPU backend of runtime/emugpu.py
            return a.__array_namespace__()
    return np


def like(a: Any, ref: Any) -> Any:
    """``a`` (host numpy) in ``ref``'s array module, on the current device:
    host data (an input batch, targets) a GPU task uses.

    >>> like([1, 2], np.zeros(2)).tolist()
    [1, 2]
    """
    xp = array_module(ref)
    return np.asarray(a) if xp is np else xp.asarray(a)


def pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    """``3 -> (3, 3)``; ``(2, 3) -> (2, 3)``."""
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    vals = tuple(int(v) for v in value)
    if len(vals) != 2:
        raise ValueError(f"{what} must be an int or a pair of ints, got {value!r}")
    return vals  # type: ignore[return-value]


def normalize_padding(padding: int | Sequence[Any]) -> Padding2d:
    """Padding as ``((top, bottom), (left, right))``.

    Accepts ``p`` (all sides), ``(ph, pw)`` (symmetric per dim) or
    ``((top, bottom), (left, right))`` (per side, what tiles use).

    >>> normalize_padding(1)
    ((1, 1), (1, 1))
    >>> normalize_padding((1, 2))
    ((1, 1), (2, 2))
    >>> normalize_padding(((0, 1), (2, 0)))
    ((0, 1), (2, 0))
    """
    if isinstance(padding, (int, np.integer)):
        p = int(padding)
        out: Padding2d = ((p, p), (p, p))
    else:
        items = list(padding)
        if len(items) != 2:
            raise ValueError(
                f"padding must be p, (ph, pw) or ((top, bottom), (left, right)), got {padding!r}"
            )
        sides = []
        for item in items:
            if isinstance(item, (int, np.integer)):
                sides.append((int(item), int(item)))
            else:
                lo, hi = (int(v) for v in item)
                sides.append((lo, hi))
        out = (sides[0], sides[1])
    if min(out[0] + out[1]) < 0:
        raise ValueError(f"padding must be non-negative, got {padding!r}")
    return out


def scatter_add(xp: Any, target: Any, index: Any, values: Any) -> None:
    """``target[index[i]] += values[i]`` with repeated indices summed (in place)."""
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        xp.add.at(target, index, values)
        return
    import cupyx  # older cupy without ufunc.at

    cupyx.scatter_add(target, index, values)
