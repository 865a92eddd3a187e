"""LSTM: one cell (one time step) forward/backward, and a layer unrolled over time.

Weights are ONE matrix ``W`` of shape (I + H, 4H) applied to ``[x_t, h_prev]``
(one GEMM per step) and one bias (4H,); gate column blocks are in PyTorch's
order ``i, f, g, o``::

    z = [x, h_prev] @ W + b
    i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);  g = tanh(z_g)
    c = f * c_prev + i * g;  h = o * tanh(c)

:func:`lstm_weights_from_torch` maps ``nn.LSTM``'s ``(W_ih (4H, I), W_hh
(4H, H), b_ih, b_hh)`` to ``(W, b)``. A cell per time step as a task shares
``W`` across all steps of a layer: each step's ``dW`` is a partial sum the
runtime reduces with ``+``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .activation import sigmoid_forward
from .common import array_module

__all__ = [
    "LSTMCache",
    "LSTMLayerCache",
    "lstm_cell_forward",
    "lstm_cell_backward",
    "lstm_layer_forward",
    "lstm_layer_backward",
    "lstm_weights_from_torch",
]


class LSTMCache(NamedTuple):
    """What :func:`lstm_cell_backward` needs from one step."""

    xh: Any  # (N, I + H) the concatenated input
    gates: Any  # (N, 4H) activated i, f, g, o
    c_prev: Any  # (N, H)
    tanh_c: Any  # (N, H)


class LSTMLayerCache(NamedTuple):
    """What :func:`lstm_layer_backward` needs: per-step states stacked over T."""

    xs: Any  # (T, N, I)
    h_prev: Any  # (T, N, H) the state entering each step
    gates: Any  # (T, N, 4H)
    c_prev: Any  # (T, N, H)
    tanh_c: Any  # (T, N, H)


def lstm_activate(z: Any, c_prev: Any) -> tuple[Any, Any, Any]:
    """Turn pre-activations z (N, 4H) into gates IN PLACE; returns (h, c, tanh_c)."""
    xp = array_module(z)
    hid = c_prev.shape[1]
    sigmoid_forward(z[:, : 2 * hid], out=z[:, : 2 * hid])
    xp.tanh(z[:, 2 * hid : 3 * hid], out=z[:, 2 * hid : 3 * hid])
    sigmoid_forward(z[:, 3 * hid :], out=z[:, 3 * hid :])
    i, f, g, o = (z[:, k * hid : (k + 1) * hid] for k in range(4))
    c = f * c_prev
    c += i * g
    tanh_c = xp.tanh(c)
    return o * tanh_c, c, tanh_c


def lstm_dgates(dh: Any | None, dc: Any | None, gates: Any, c_prev: Any, tanh_c: Any,
                dz: Any) -> Any:
    """Fill dz (N, 4H) with the pre-activation gradients; return dc_prev."""
    hid = c_prev.shape[1]
    i, f, g, o = (gates[:, k * hid : (k + 1) * hid] for k in range(4))
    if dh is None:
        dct = dc.copy() if dc is not None else c_prev * 0
        dz[:, 3 * hid :] = 0
    else:
        dct = dh * o * (1 - tanh_c * tanh_c)
        if dc is not None:
            dct += dc
        dz[:, 3 * hid :] = dh * tanh_c * o * (1 - o)
    dz[:, :hid] = dct * g * i * (1 - i)
    dz[:, hid : 2 * hid] = dct * c_prev * f * (1 - f)
    dz[:, 2 * hid : 3 * hid] = dct * i * (1 - g * g)
    return dct * f


def lstm_cell_forward(
    x: Any, h_prev: Any, c_prev: Any, weight: Any, bias: Any
) -> tuple[Any, Any, LSTMCache]:
    """One step: x (N, I), h_prev (N, H), c_prev (N, H), weight (I+H, 4H),
    bias (4H,) -> ``(h (N, H), c (N, H), cache)``."""
    xp = array_module(x, h_prev, weight)
    hid = h_prev.shape[1]
    if weight.shape != (x.shape[1] + hid, 4 * hid):
        raise ValueError(
            f"lstm cell: weight {tuple(weight.shape)} does not fit input {x.shape[1]} and "
            f"hidden {hid}; expected {(x.shape[1] + hid, 4 * hid)}"
        )
    xh = xp.concatenate([x, h_prev], axis=1)
    z = xp.matmul(xh, weight)
    z += bias
    h, c, tanh_c = lstm_activate(z, c_prev)
    return h, c, LSTMCache(xh, z, c_prev, tanh_c)


def lstm_cell_backward(
    dh: Any | None, dc: Any | None, cache: LSTMCache, weight: Any
) -> tuple[Any, Any, Any, Any, Any]:
    """Gradients of one step from ``dh``, ``dc`` (N, H) (None = zero).

    Returns ``(dx (N, I), dh_prev (N, H), dc_prev (N, H), dweight (I+H, 4H),
    dbias (4H,))``.
    """
    xp = array_module(cache.xh, weight)
    dz = xp.empty_like(cache.gates)
    dc_prev = lstm_dgates(dh, dc, cache.gates, cache.c_prev, cache.tanh_c, dz)
    dw = xp.matmul(cache.xh.T, dz)
    db = dz.sum(axis=0)
    dxh = xp.matmul(dz, weight.T)
    n_in = cache.xh.shape[1] - cache.c_prev.shape[1]
    return dxh[:, :n_in], dxh[:, n_in:], dc_prev, dw, db


def lstm_layer_forward(
    xs: Any, h0: Any, c0: Any, weight: Any, bias: Any
) -> tuple[Any, Any, Any, LSTMLayerCache]:
    """The cell unrolled over time: xs (T, N, I) -> ``(hs (T, N, H), h_T, c_T, cache)``.

    Same numbers as calling :func:`lstm_cell_forward` T times, faster: the
    input projection of all steps is one GEMM, only ``h @ W_h`` is per step.
    """
    xp = array_module(xs, weight)
    steps, n, n_in = xs.shape
    hid = h0.shape[1]
    if weight.shape != (n_in + hid, 4 * hid):
        raise ValueError(
            f"lstm layer: weight {tuple(weight.shape)} does not fit input {n_in} and hidden "
            f"{hid}; expected {(n_in + hid, 4 * hid)}"
        )
    gates = xp.matmul(xs.reshape(steps * n, n_in), weight[:n_in]).reshape(steps, n, 4 * hid)
    gates += bias
    # h @ W_h through a transposed contiguous copy: OpenBLAS runs this shape 2x faster
    w_h = xp.ascontiguousarray(weight[n_in:].T).T
    hs = xp.empty((steps, n, hid), dtype=xs.dtype)
    h_prev = xp.empty_like(hs)
    c_prev = xp.empty_like(hs)
    tanh_c = xp.empty_like(hs)
    h, c = h0, c0
    for t in range(steps):
        h_prev[t], c_prev[t] = h, c
        z = gates[t]
        z += xp.matmul(h, w_h)
        h, c, tc = lstm_activate(z, c)
        hs[t], tanh_c[t] = h, tc
    return hs, h, c, LSTMLayerCache(xs, h_prev, gates, c_prev, tanh_c)


def lstm_layer_backward(
    dhs: Any | None,
    dh_last: Any | None,
    dc_last: Any | None,
    cache: LSTMLayerCache,
    weight: Any,
    need_input_grad: bool = True,
) -> tuple[Any | None, Any, Any, Any, Any]:
    """Backprop through time of :func:`lstm_layer_forward`.

    dhs (T, N, H) gradient of every step's output (or None), dh_last/dc_last
    gradients of the final state (or None). Returns ``(dxs (T, N, I) or None
    when not need_input_grad, dh0, dc0, dweight, dbias)``; weight gradients
    are one GEMM over all steps.
    """
    xp = array_module(weight)
    steps, n, n_in = cache.xs.shape
    hid = cache.h_prev.shape[2]
    w_h = weight[n_in:]
    dz = xp.empty_like(cache.gates)
    dh, dc = dh_last, dc_last
    for t in range(steps - 1, -1, -1):
        if dhs is not None:
            dh = dhs[t] if dh is None else dh + dhs[t]
        dc = lstm_dgates(dh, dc, cache.gates[t], cache.c_prev[t], cache.tanh_c[t], dz[t])
        dh = xp.matmul(dz[t], w_h.T)
    dz2 = dz.reshape(steps * n, 4 * hid)
    dw = xp.empty_like(weight)
    dw[:n_in] = xp.matmul(cache.xs.reshape(steps * n, n_in).T, dz2)
    dw[n_in:] = xp.matmul(cache.h_prev.reshape(steps * n, hid).T, dz2)
    dxs = None
    if need_input_grad:
        dxs = xp.matmul(dz2, weight[:n_in].T).reshape(steps, n, n_in)
    if dh is None:
        dh = xp.zeros((n, hid), dtype=weight.dtype)
    if dc is None:
        dc = xp.zeros((n, hid), dtype=weight.dtype)
    return dxs, dh, dc, dw, dz2.sum(axis=0)


def lstm_weights_from_torch(w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any) -> tuple[Any, Any]:
    """PyTorch ``nn.LSTM`` layer weights -> ``(W (I+H, 4H), b (4H,))``."""
    xp = array_module(w_ih)
    return xp.concatenate([w_ih.T, w_hh.T], axis=0), b_ih + b_hh
