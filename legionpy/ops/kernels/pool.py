"""2-D max and average pooling, NCHW, with stride and per-side padding.

Semantics (both match PyTorch with ``ceil_mode=False``):

- max: padded cells never win (padding is ``-inf``); the gradient goes to the
  first maximal cell of each window in row-major kernel order (PyTorch's
  choice on CPU).
- avg: ``count_include_pad=False``: each window's sum is divided by the number
  of cells inside the image. Because a tile's padding is exactly the part of
  its windows outside the image (see :mod:`.tiling`), a tile divides by the
  same counts as the full computation, so tiles equal slices of the full result.

Both loop over the ``kh*kw`` kernel positions, each step an element-wise
operation on a strided slice covering all samples, channels and pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import Padding2d, array_module, normalize_padding, pair
from .tiling import window_output_size

__all__ = ["pool2d_forward", "pool2d_backward", "pool2d_output_shape"]


def _params(kernel: Any, stride: Any, padding: Any) -> tuple[int, int, int, int, Padding2d]:
    kh, kw = pair(kernel, "kernel")
    sh, sw = pair(kernel if stride is None else stride, "stride")
    return kh, kw, sh, sw, normalize_padding(padding)


def pool2d_output_shape(
    input_shape: Sequence[int],
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: Any = 0,
) -> tuple[int, int, int, int]:
    """(N, C, Ho, Wo) of pooling an (N, C, H, W) input; stride defaults to kernel."""
    kh, kw, sh, sw, ((pt, pb), (pl, pr)) = _params(kernel, stride, padding)
    n, c, h, w = input_shape
    return (
        int(n),
        int(c),
        window_output_size(h, kh, sh, pt, pb),
        window_output_size(w, kw, sw, pl, pr),
    )


def _counts(xp: Any, size: int, k: int, s: int, p_lo: int, n_out: int, dtype: Any) -> Any:
    """Cells of each window inside the image along one dim, shape (n_out,)."""
    start = xp.arange(n_out) * s - p_lo
    return (xp.minimum(start + k, size) - xp.maximum(start, 0)).astype(dtype)


def pool2d_forward(
    x: Any,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: Any = 0,
    mode: str = "max",
) -> Any:
    """Pool x (N, C, H, W) -> (N, C, Ho, Wo); ``mode`` is ``"max"`` or ``"avg"``."""
    xp = array_module(x)
    kh, kw, sh, sw, pad = _params(kernel, stride, padding)
    (pt, pb), (pl, pr) = pad
    n, c, ho, wo = pool2d_output_shape(x.shape, (kh, kw), (sh, sw), pad)
    if mode not in ("max", "avg"):
        raise ValueError(f"pool2d mode must be 'max' or 'avg', got {mode!r}")
    fill = -xp.inf if mode == "max" else 0.0
    xpad = x
    if pt or pb or pl or pr:
        xpad = xp.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    y = None
    for i in range(kh):
        for j in range(kw):
            s = xpad[:, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]
            if y is None:
                y = s.copy()
            elif mode == "max":
                xp.maximum(y, s, out=y)
            else:
                y += s
    if mode == "avg":
        h, w = x.shape[2:]
        ch = _counts(xp, h, kh, sh, pt, ho, x.dtype)
        cw = _counts(xp, w, kw, sw, pl, wo, x.dtype)
        y /= ch[:, None] * cw[None, :]
    return y


def pool2d_backward(
    dy: Any,
    x: Any,
    y: Any | None,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: Any = 0,
    mode: str = "max",
) -> Any:
    """Gradient dx (N, C, H, W) of :func:`pool2d_forward`.

    dy, y: (N, C, Ho, Wo); ``y`` (the forward output) is needed for max
    pooling and ignored for avg (pass None).
    """
    xp = array_module(dy, x)
    kh, kw, sh, sw, pad = _params(kernel, stride, padding)
    (pt, pb), (pl, pr) = pad
    n, c, h, w = x.shape
    ho, wo = dy.shape[2:]
    dxp = xp.zeros((n, c, h + pt + pb, w + pl + pr), dtype=dy.dtype)
    if mode == "avg":
        ch = _counts(xp, h, kh, sh, pt, ho, dy.dtype)
        cw = _counts(xp, w, kw, sw, pl, wo, dy.dtype)
        g = dy / (ch[:, None] * cw[None, :])
        for i in range(kh):
            for j in range(kw):
                dxp[:, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw] += g
    elif mode == "max":
        if y is None:
            raise ValueError("max pool2d_backward needs the forward output y")
        xpad = x
        if pt or pb or pl or pr:
            xpad = xp.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-xp.inf)
        todo = xp.ones(dy.shape, dtype=bool)
        for i in range(kh):
            for j in range(kw):
                sl = (
                    slice(None),
                    slice(None),
                    slice(i, i + sh * (ho - 1) + 1, sh),
                    slice(j, j + sw * (wo - 1) + 1, sw),
                )
                hit = xpad[sl] == y
                hit &= todo
                dxp[sl] += xp.multiply(dy, hit, dtype=dy.dtype)
                todo &= ~hit
    else:
        raise ValueError(f"pool2d mode must be 'max' or 'avg', got {mode!r}")
    if pt or pb or pl or pr:
        return xp.ascontiguousarray(dxp[:, :, pt : pt + h, pl : pl + w])
    return dxp
