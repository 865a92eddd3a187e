"""2-D convolution, NCHW, with stride, per-side padding, dilation, groups,
bias and an optional fused activation.

Algorithm (CPU and GPU alike): im2col through a strided view of the padded
input, materialised once as ``cols`` of shape (N, G, Cg*kh*kw, Ho*Wo), then
one batched GEMM ``W[g] @ cols[n, g]`` whose result already is NCHW (no
transpose of the output). Backward recomputes ``cols`` from ``x`` (cheaper in
memory than caching it), gets ``dW`` by a batched GEMM summed over samples,
and ``dx`` by ``W^T @ dy`` followed by col2im: a scatter-add loop over the
``kh*kw`` kernel positions, each a strided slice over all pixels at once.

Dilation ``(dh, dw)`` (atrous convolution: Yu and Koltun, "Multi-Scale
Context Aggregation by Dilated Convolutions", ICLR 2016) spaces the kernel
taps ``d`` pixels apart: the strided view steps ``d`` rows per kernel row,
and the window spans ``d * (k - 1) + 1`` input rows (the *effective* kernel
of the output-size and tiling rules).

Padding is per side, ``((top, bottom), (left, right))``: a spatial tile of
the output is computed from the input tile clipped at the image border with
the clipped amounts as padding (see :mod:`.tiling`), which gives exactly the
same numbers as slicing the full result.

Fused activation: ``relu``, ``sigmoid`` or ``tanh`` (gradient from the
output); pass the same name and the forward output ``y`` to the backward.
The bench (``bench/kernels.py``) compares this with a numba im2col; numpy's
strided copy was as fast, so numpy stays (no compile time, runs on cupy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .activation import activation_grad_from_output, apply_activation_
from .common import Padding2d, array_module, normalize_padding, pair
from .tiling import window_output_size

__all__ = ["conv2d_forward", "conv2d_backward", "conv2d_output_shape", "im2col",
           "effective_kernel"]


def conv2d_output_shape(
    input_shape: Sequence[int],
    out_channels: int,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    dilation: int | Sequence[int] = 1,
) -> tuple[int, int, int, int]:
    """(N, O, Ho, Wo) of a convolution of an (N, C, H, W) input (floor mode)."""
    kh, kw = effective_kernel(kernel, dilation)
    sh, sw = pair(stride, "stride")
    (pt, pb), (pl, pr) = normalize_padding(padding)
    n, _, h, w = input_shape
    return (
        int(n),
        int(out_channels),
        window_output_size(h, kh, sh, pt, pb),
        window_output_size(w, kw, sw, pl, pr),
    )


def effective_kernel(kernel: Any, dilation: Any = 1) -> tuple[int, int]:
    """Input rows and columns one window spans: ``d * (k - 1) + 1``."""
    (kh, kw), (dh, dw) = pair(kernel, "kernel"), pair(dilation, "dilation")
    return dh * (kh - 1) + 1, dw * (kw - 1) + 1


def _pad(xp: Any, x: Any, pad: Padding2d, value: float = 0.0) -> Any:
    (pt, pb), (pl, pr) = pad
    if pt == pb == pl == pr == 0:
        return x
    return xp.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=value)


def _as_strided(xp: Any, a: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    if xp.__name__ == "numpy":
        from numpy.lib.stride_tricks import as_strided
    elif xp.__name__ == "cupy":
        from cupy.lib.stride_tricks import as_strided
    else:  # the emulated GPU backend
        as_strided = xp.as_strided
    return as_strided(a, shape=shape, strides=strides)


def windows(xp: Any, xpad: Any, kh: int, kw: int, sh: int, sw: int, ho: int, wo: int,
            dh: int = 1, dw: int = 1) -> Any:
    """Read-only strided view (N, C, kh, kw, Ho, Wo) of the padded input: no
    copy; kernel taps ``dh``/``dw`` pixels apart (dilation)."""
    n, c = xpad.shape[:2]
    s_n, s_c, s_h, s_w = xpad.strides
    return _as_strided(xp, xpad, (n, c, kh, kw, ho, wo),
                       (s_n, s_c, s_h * dh, s_w * dw, s_h * sh, s_w * sw))


def im2col(
    x: Any,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    groups: int = 1,
    dilation: int | Sequence[int] = 1,
) -> tuple[Any, tuple[int, int]]:
    """Columns (N, G, Cg*kh*kw, Ho*Wo), contiguous, and (Ho, Wo).

    Row ``(c, i, j)`` of ``cols[n, g]`` holds input channel ``g*Cg + c`` shifted
    by kernel position ``(i, j)``; a 1x1 stride-1 unpadded conv is a reshape.
    """
    xp = array_module(x)
    kh, kw = pair(kernel, "kernel")
    sh, sw = pair(stride, "stride")
    dh, dw = pair(dilation, "dilation")
    pad = normalize_padding(padding)
    n, c, h, w = x.shape
    _, _, ho, wo = conv2d_output_shape(x.shape, 1, (kh, kw), (sh, sw), pad, (dh, dw))
    if c % groups:
        raise ValueError(f"conv2d: {c} input channels are not divisible by groups={groups}")
    k = (c // groups) * kh * kw
    if kh == kw == sh == sw == 1 and pad == ((0, 0), (0, 0)):
        return xp.ascontiguousarray(x).reshape(n, groups, k, h * w), (ho, wo)
    view = windows(xp, _pad(xp, x, pad), kh, kw, sh, sw, ho, wo, dh, dw)
    return xp.ascontiguousarray(view).reshape(n, groups, k, ho * wo), (ho, wo)


def conv2d_forward(
    x: Any,
    weight: Any,
    bias: Any | None = None,
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    groups: int = 1,
    activation: str | None = None,
    dilation: int | Sequence[int] = 1,
) -> Any:
    """Convolution ``y = act(conv(x, weight) + bias)``.

    x: (N, C, H, W); weight: (O, C // groups, kh, kw); bias: (O,) or None;
    padding: ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``.
    Returns y: (N, O, Ho, Wo), same dtype as x, C-contiguous.
    """
    xp = array_module(x, weight)
    o, cg, kh, kw = weight.shape
    n, c = x.shape[:2]
    if c != cg * groups or o % groups:
        raise ValueError(
            f"conv2d: input has {c} channels, weight {tuple(weight.shape)} with groups={groups} "
            f"expects {cg * groups} channels and out channels divisible by groups"
        )
    cols, (ho, wo) = im2col(x, (kh, kw), stride, padding, groups, dilation)
    wmat = weight.reshape(groups, o // groups, cg * kh * kw)
    y = xp.matmul(wmat, cols)  # (N, G, Og, P)
    y = y.reshape(n, o, ho, wo)
    if bias is not None:
        y += bias.reshape(1, o, 1, 1)
    return apply_activation_(activation, y)


def conv2d_backward(
    dy: Any,
    x: Any,
    weight: Any,
    stride: int | Sequence[int] = 1,
    padding: Any = 0,
    groups: int = 1,
    has_bias: bool = True,
    need_input_grad: bool = True,
    activation: str | None = None,
    y: Any | None = None,
    dilation: int | Sequence[int] = 1,
) -> tuple[Any | None, Any, Any | None]:
    """Gradients ``(dx, dweight, dbias)`` of :func:`conv2d_forward`.

    dy, y: (N, O, Ho, Wo) (``y``, the forward output, only with a fused
    activation); x: (N, C, H, W) the forward input; returns dx (N, C, H, W)
    or None when ``need_input_grad`` is False, dweight (O, C // groups, kh, kw),
    dbias (O,) or None when ``has_bias`` is False.
    """
    xp = array_module(dy, x, weight)
    if activation is not None:
        if y is None:
            raise ValueError("conv2d_backward with a fused activation needs the forward output y")
        dy = activation_grad_from_output(activation, dy, y)
    o, cg, kh, kw = weight.shape
    n, c, h, w = x.shape
    sh, sw = pair(stride, "stride")
    dh, dw_ = pair(dilation, "dilation")
    pad = normalize_padding(padding)
    ho, wo = dy.shape[2:]
    og = o // groups
    k = cg * kh * kw
    dyg = xp.ascontiguousarray(dy).reshape(n, groups, og, ho * wo)
    db = dy.sum(axis=(0, 2, 3)) if has_bias else None
    cols, _ = im2col(x, (kh, kw), (sh, sw), pad, groups, (dh, dw_))
    dw = xp.matmul(dyg, cols.transpose(0, 1, 3, 2)).sum(axis=0)  # (G, Og, K)
    dw = dw.reshape(weight.shape).astype(weight.dtype, copy=False)
    if not need_input_grad:
        return None, dw, db
    del cols
    wmat = weight.reshape(groups, og, k)
    dcols = xp.matmul(wmat.transpose(0, 2, 1), dyg)  # (N, G, K, P)
    dcols = dcols.reshape(n, c, kh, kw, ho, wo)
    (pt, pb), (pl, pr) = pad
    if kh == kw == sh == sw == 1 and pad == ((0, 0), (0, 0)):
        return dcols.reshape(n, c, h, w), dw, db
    dxp = xp.zeros((n, c, h + pt + pb, w + pl + pr), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            r, q = i * dh, j * dw_
            dxp[:, :, r : r + sh * (ho - 1) + 1 : sh, q : q + sw * (wo - 1) + 1 : sw] += dcols[
                :, :, i, j
            ]
    dx = dxp[:, :, pt : pt + h, pl : pl + w]
    return xp.ascontiguousarray(dx), dw, db
