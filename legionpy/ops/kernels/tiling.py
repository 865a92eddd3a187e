"""Which input tile a tile of a windowed operator's output needs.

For a convolution or pooling along one spatial dim with kernel ``k``, stride
``s`` and padding ``p`` before the first element, output rows ``[a, b)`` read
input rows ``[a*s - p, (b-1)*s - p + k)``. Clipping that range to the image
``[0, H)`` gives the input rect the runtime fetches; the clipped amounts are
the per-side padding the kernel applies to that tile. Padding therefore only
ever appears at the image borders, and computing the tile with it gives
exactly the rows ``[a, b)`` of the full computation.

>>> window_input_range(0, 3, size=8, kernel=3, stride=2, pad_lo=1)
(0, 6, 1, 0)
>>> window_input_range(2, 4, size=8, kernel=3, stride=2, pad_lo=1)
(3, 8, 0, 0)

The operator-rules engineer computes the same rects independently in
``legionpy/ops``; tests keep the two consistent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...geometry import Rect
from .common import Padding2d, normalize_padding, pair

__all__ = [
    "window_output_size",
    "window_input_range",
    "conv2d_input_rect",
    "conv2d_tile_groups",
    "pool2d_input_rect",
]


def window_output_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int) -> int:
    """Number of windows: ``(size + pad_lo + pad_hi - kernel) // stride + 1`` (floor mode)."""
    span = size + pad_lo + pad_hi - kernel
    if span < 0:
        raise ValueError(
            f"window of {kernel} does not fit an input of {size} padded by ({pad_lo}, {pad_hi})"
        )
    return span // stride + 1


def window_input_range(
    out_lo: int, out_hi: int, size: int, kernel: int, stride: int, pad_lo: int
) -> tuple[int, int, int, int]:
    """Input range and per-side padding for output positions ``[out_lo, out_hi)``.

    Returns ``(in_lo, in_hi, pad_before, pad_after)`` with ``0 <= in_lo <= in_hi
    <= size`` and ``pad_before + (in_hi - in_lo) + pad_after`` exactly the span
    the windows cover, so the tile yields ``out_hi - out_lo`` outputs.
    """
    if out_hi <= out_lo:
        return 0, 0, 0, 0
    lo = out_lo * stride - pad_lo
    hi = (out_hi - 1) * stride - pad_lo + kernel
    if hi <= 0:  # only padding above the image
        return 0, 0, hi - lo, 0
    if lo >= size:  # only padding below the image
        return size, size, 0, hi - lo
    in_lo, in_hi = max(lo, 0), min(hi, size)
    return in_lo, in_hi, in_lo - lo, hi - in_hi


def _spatial(
    input_shape: Sequence[int],
    out_rect: Rect,
    kernel: Any,
    stride: Any,
    padding: Any,
) -> tuple[tuple[int, int], tuple[int, int], Padding2d]:
    kh, kw = pair(kernel, "kernel")
    sh, sw = pair(stride, "stride")
    (pt, _), (pl, _) = normalize_padding(padding)
    h0, h1, ptop, pbot = window_input_range(
        out_rect.lo[2], out_rect.hi[2], input_shape[2], kh, sh, pt
    )
    w0, w1, pleft, pright = window_input_range(
        out_rect.lo[3], out_rect.hi[3], input_shape[3], kw, sw, pl
    )
    return (h0, h1), (w0, w1), ((ptop, pbot), (pleft, pright))


def conv2d_input_rect(
    input_shape: Sequence[int],
    out_rect: Rect,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    groups: int = 1,
    out_channels: int | None = None,
    dilation: int | Sequence[int] = 1,
) -> tuple[Rect, Padding2d]:
    """Input rect (NCHW) and per-side padding that output tile ``out_rect`` needs.

    ``out_rect`` is a rect of the (N, O, Ho, Wo) output. Samples map one to
    one; every input channel is needed when ``groups == 1``, else the
    channels of the groups the tile's output channels belong to (tiles must
    then be aligned to groups: see :func:`conv2d_tile_groups`). The weight
    tile is ``weight[out_rect.lo[1]:out_rect.hi[1]]``. A dilated kernel
    spans ``d * (k - 1) + 1`` rows: that is the window here.
    """
    (kh, kw), (dh, dw) = pair(kernel, "kernel"), pair(dilation, "dilation")
    kernel = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    (h0, h1), (w0, w1), pad = _spatial(input_shape, out_rect, kernel, stride, padding)
    c0, c1 = 0, int(input_shape[1])
    if groups > 1:
        if out_channels is None:
            raise ValueError("conv2d_input_rect with groups > 1 needs out_channels")
        g0, g1 = conv2d_tile_groups(out_rect, out_channels, groups)
        cg = int(input_shape[1]) // groups
        c0, c1 = g0 * cg, g1 * cg
    lo = (out_rect.lo[0], c0, h0, w0)
    hi = (out_rect.hi[0], c1, h1, w1)
    return Rect(lo, hi), pad


def conv2d_tile_groups(out_rect: Rect, out_channels: int, groups: int) -> tuple[int, int]:
    """Groups ``[g0, g1)`` an output-channel tile covers; the tile's kernel call
    uses ``groups=g1 - g0``. Raises when the tile cuts a group in two."""
    og = out_channels // groups
    o0, o1 = out_rect.lo[1], out_rect.hi[1]
    if o0 % og or o1 % og:
        raise ValueError(
            f"output-channel tile [{o0}, {o1}) of a conv with {out_channels} channels in "
            f"{groups} groups cuts a group of {og} channels; split channels by whole groups"
        )
    return o0 // og, o1 // og


def pool2d_input_rect(
    input_shape: Sequence[int],
    out_rect: Rect,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: Any = 0,
) -> tuple[Rect, Padding2d]:
    """Input rect (NCHW) and per-side padding for pooling output tile ``out_rect``.

    Samples and channels map one to one; ``stride`` defaults to ``kernel``.
    """
    stride = kernel if stride is None else stride
    (h0, h1), (w0, w1), pad = _spatial(input_shape, out_rect, kernel, stride, padding)
    lo = (out_rect.lo[0], out_rect.lo[1], h0, w0)
    hi = (out_rect.hi[0], out_rect.hi[1], h1, w1)
    return Rect(lo, hi), pad
