"""Counter-based random numbers and dropout, identical under any tiling.

The random bits of element ``i`` (its row-major linear index in the FULL
tensor) are ``splitmix64(i * GOLDEN + key(seed, step))`` mixed twice, in
wrapping uint64 arithmetic. They depend only on (seed, step, global
coordinates), never on how the tensor is cut into tiles, on which device a
tile runs, or on the order tiles run in: a tile computed from its global
offset equals the same slice of the full mask, bit for bit, on numpy and cupy.

>>> import numpy as np
>>> full = uniform_tile(7, 0, (4, 6), (0, 0), (4, 6))
>>> bool((uniform_tile(7, 0, (4, 6), (1, 2), (2, 3)) == full[1:3, 2:5]).all())
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import array_module

__all__ = ["uniform_tile", "dropout_mask", "dropout_forward", "dropout_backward"]

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def _mix_int(z: int) -> int:
    """splitmix64 finaliser on a Python int (for the per-(seed, step) key)."""
    z = (z + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * _MUL1) & _M64
    z = ((z ^ (z >> 27)) * _MUL2) & _M64
    return z ^ (z >> 31)


def _mix(xp: Any, z: Any) -> Any:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic, in place)."""
    u = xp.uint64
    z ^= z >> u(30)
    z *= u(_MUL1)
    z ^= z >> u(27)
    z *= u(_MUL2)
    z ^= z >> u(31)
    return z


def _key(seed: int, step: int) -> int:
    return _mix_int(_mix_int(int(seed) & _M64) ^ (int(step) & _M64))


def uniform_tile(
    seed: int,
    step: int,
    full_shape: Sequence[int],
    offset: Sequence[int],
    tile_shape: Sequence[int],
    xp: Any = np,
    dtype: Any = np.float32,
) -> Any:
    """Uniform [0, 1) numbers (24 random bits) of the tile of a ``full_shape``
    tensor that starts at global ``offset`` and has ``tile_shape``."""
    if len(full_shape) != len(offset) or len(offset) != len(tile_shape):
        raise ValueError(
            f"full_shape {tuple(full_shape)}, offset {tuple(offset)} and tile_shape "
            f"{tuple(tile_shape)} must have the same number of dims"
        )
    nd = len(full_shape)
    idx = xp.zeros(tuple(int(s) for s in tile_shape), dtype=xp.uint64)
    stride = 1
    for d in range(nd - 1, -1, -1):
        if offset[d] < 0 or offset[d] + tile_shape[d] > full_shape[d]:
            raise ValueError(
                f"tile [{offset[d]}, {offset[d] + tile_shape[d]}) leaves dim {d} of size "
                f"{full_shape[d]}"
            )
        shape = [1] * nd
        shape[d] = int(tile_shape[d])
        coord = xp.arange(offset[d], offset[d] + tile_shape[d], dtype=xp.uint64)
        idx += (coord * xp.uint64(stride)).reshape(shape)
        stride *= int(full_shape[d])
    u = xp.uint64
    idx *= u(_GOLDEN)
    idx += u(_key(seed, step))
    _mix(xp, idx)
    idx += u(_GOLDEN)
    _mix(xp, idx)
    return (idx >> u(40)).astype(dtype) * dtype(2.0**-24)


def dropout_mask(
    p: float,
    seed: int,
    step: int,
    full_shape: Sequence[int],
    offset: Sequence[int],
    tile_shape: Sequence[int],
    xp: Any = np,
) -> Any:
    """Boolean keep-mask of a tile: element kept when its uniform number >= p."""
    return uniform_tile(seed, step, full_shape, offset, tile_shape, xp) >= p


def dropout_forward(
    x: Any,
    p: float,
    seed: int,
    step: int,
    offset: Sequence[int] | None = None,
    full_shape: Sequence[int] | None = None,
    training: bool = True,
) -> tuple[Any, Any | None]:
    """Inverted dropout of tile ``x`` -> ``(y, keep_mask)``.

    ``x`` is the tile at global ``offset`` (default zeros) of a tensor of
    ``full_shape`` (default ``x.shape``). Kept elements are scaled by
    ``1 / (1 - p)``. In eval mode (or ``p == 0``) returns ``(x, None)``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x, None
    xp = array_module(x)
    offset = (0,) * x.ndim if offset is None else tuple(offset)
    full_shape = tuple(x.shape) if full_shape is None else tuple(full_shape)
    keep = dropout_mask(p, seed, step, full_shape, offset, x.shape, xp)
    y = xp.multiply(x, keep, dtype=x.dtype)
    y *= x.dtype.type(1.0 / (1.0 - p))
    return y, keep


def dropout_backward(dy: Any, keep: Any | None, p: float) -> Any:
    """``dy * keep / (1 - p)``; ``keep`` None (eval or p == 0) passes dy through."""
    if keep is None:
        return dy
    xp = array_module(dy)
    dx = xp.multiply(dy, keep, dtype=dy.dtype)
    dx *= dy.dtype.type(1.0 / (1.0 - p))
    return dx
