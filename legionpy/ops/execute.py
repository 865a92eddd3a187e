"""Tile execution: the forward and backward of one output tile of an operator.

The runtime runs an operator as one task per output tile (DESIGN.md section
2). Such a task holds arrays of exactly the rects the operator's rules name:

- ``xs[i]``: input ``i`` over ``op.input_rect(i, out)`` (in the input's view
  coordinates: an LSTM ``state.h`` view arrives with its fixed axis dropped),
  clipped halos included;
- ``ws[pname]``: parameter ``pname`` over ``op.weight_rect(pname, out)``.

``tile_forward(op, tile)`` returns the output tile ``y`` (shape ``out.shape``);
``tile_backward(op, tile, y, dy)`` returns ``(dxs, dws)``: the gradient of
every input over exactly its ``input_rect`` (``None`` where not needed) and
of every parameter over its ``weight_rect``. Both are partial sums where a
rect is shared by several tiles (a dense layer split by output features
produces a partial ``dx`` per tile; a sample split a partial ``dW`` per
tile); the runtime sums them with ``Reduce("+")``. Computing every tile of
any tiling and summing gives exactly the whole-tensor gradients, which
``tests/unit/test_ops_exec_*.py`` check for every operator.

Windowed operators (conv2d, pool2d) get their per-side padding from
:mod:`legionpy.ops.kernels.tiling`: padding only at the image border, so a
tile with a clipped halo computes the same numbers as the whole tensor.

One registry, keyed by ``op.kind`` like :data:`legionpy.ops.REGISTRY`:
``@tile_kernel("relu")`` registers a class with ``forward(op, t)`` and
``backward(op, t, y, dy)``. Per-tile state kept from forward to backward
(fused-gelu pre-activations, dropout masks, batch-norm caches, LSTM gates)
lives in ``tile.cache``, which the caller keeps with the tile (the F and B
task of one tile run on the same device). Batch norm's running statistics
live in ``tile.buffers`` (one dict per operator, shared by its tiles, which
write disjoint channel ranges).

The loss belongs to the last operator: :func:`loss_gradient` turns the
output tile and its targets into the loss share and the gradient to feed
``tile_backward`` (or, for softmax + cross-entropy, directly the gradient of
the logits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GraphError, StrategyError
from ..geometry import Rect
from . import kernels as K
from .base import Operator, reduce_slice
from .kernels.rnn import lstm_activate, lstm_dgates

__all__ = ["Tile", "tile_kernel", "tile_forward", "tile_backward", "loss_gradient",
           "check_tiling", "EXECUTABLE", "LOSSES"]

LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "mse")


@dataclass
class Tile:
    """Everything one tile task computes with. ``out``: the output tile;
    ``xs``/``ws``: see the module docstring; ``need_dx[i]``: whether input
    ``i`` wants a gradient; ``step``: training step (dropout seeds)."""

    out: Rect
    xs: list
    ws: dict
    training: bool = True
    step: int = 0
    need_dx: Sequence[bool] | None = None
    cache: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)
    #: (r, n): slice r of n of the op's reduction dim (ParallelConfig.reduce)
    part: tuple = (0, 1)

    def need(self, i: int) -> bool:
        return True if self.need_dx is None else bool(self.need_dx[i])


_KERNELS: dict[str, Any] = {}


def tile_kernel(*kinds: str) -> Callable:
    """Class decorator: register tile forward/backward for op ``kinds``."""
    def deco(cls):
        for k in kinds:
            _KERNELS[k] = cls
        return cls
    return deco


def _rule(op: Operator):
    try:
        return _KERNELS[op.kind]
    except KeyError:
        raise GraphError(f"operator {op.name!r} of kind {op.kind!r} has no tile kernels; "
                         f"executable kinds: {sorted(_KERNELS)}") from None


def tile_forward(op: Operator, t: Tile) -> Any:
    """The output tile ``t.out`` of ``op`` (an array of shape ``t.out.shape``)."""
    return _rule(op).forward(op, t)


def tile_backward(op: Operator, t: Tile, y: Any, dy: Any) -> tuple[list, dict]:
    """``(dxs, dws)`` of the tile from its output ``y`` and output gradient ``dy``."""
    return _rule(op).backward(op, t, y, dy)


def check_tiling(op: Operator, degrees: Sequence[int]) -> None:
    """Raise StrategyError for tilings the rules allow but the kernels cannot
    run: a grouped conv's channel tile must hold whole groups."""
    if op.kind == "conv2d" and op.attrs["groups"] > 1 and degrees[1] > 1:
        if op.attrs["groups"] % degrees[1]:
            raise StrategyError(
                f"op {op.name!r}: {degrees[1]} channel tiles cut its {op.attrs['groups']} "
                f"groups; use a channel degree that divides the number of groups")


# -- fused activations -------------------------------------------------------------
def _act_fwd(act: str | None, z: Any, cache: dict) -> Any:
    if act is None:
        return z
    if act in K.FUSABLE:
        return K.apply_activation_(act, z)
    cache["z"] = z
    return K.activation_forward(act, z)


def _act_bwd(act: str | None, dy: Any, y: Any, cache: dict) -> Any:
    if act is None:
        return dy
    if act in K.FUSABLE:
        return K.activation_grad_from_output(act, dy, y)
    return K.activation_backward(act, dy, cache["z"], None)


def _with_bias_grad(t: Tile, dws: dict, db: Any) -> dict:
    """``dws`` plus the bias gradient: ``db``, or an empty one for a later
    slice of a reduction split (its bias rect is empty: slice 0 owns it)."""
    if db is not None:
        dws["bias"] = db
    elif "bias" in t.ws:
        dws["bias"] = t.ws["bias"] * 0
    return dws


# -- operators -------------------------------------------------------------------
@tile_kernel("conv2d")
class _Conv:
    @staticmethod
    def _geom(op, t):
        a = op.attrs
        rect, pad = K.conv2d_input_rect(op.inputs[0].shape, t.out, a["kernel"], a["stride"],
                                        a["padding"], a["groups"], a["out_channels"],
                                        a.get("dilation", 1))
        g = 1
        if a["groups"] > 1:
            g0, g1 = K.conv2d_tile_groups(t.out, a["out_channels"], a["groups"])
            g = g1 - g0
        return pad, g

    @staticmethod
    def forward(op, t):
        pad, g = _Conv._geom(op, t)
        bias = t.ws.get("bias") if t.part[0] == 0 else None  # added by slice 0 only
        z = K.conv2d_forward(t.xs[0], t.ws["weight"], bias, op.attrs["stride"], pad, g,
                             dilation=op.attrs.get("dilation", 1))
        return _act_fwd(op.attrs.get("activation"), z, t.cache)

    @staticmethod
    def backward(op, t, y, dy):
        pad, g = _Conv._geom(op, t)
        act = op.attrs.get("activation")
        dz = _act_bwd(act, dy, y, t.cache)
        dx, dw, db = K.conv2d_backward(dz, t.xs[0], t.ws["weight"], op.attrs["stride"], pad, g,
                                       has_bias="bias" in t.ws and t.part[0] == 0,
                                       need_input_grad=t.need(0),
                                       dilation=op.attrs.get("dilation", 1))
        return [dx], _with_bias_grad(t, {"weight": dw}, db)


@tile_kernel("pool2d")
class _Pool:
    @staticmethod
    def _pad(op, t):
        a = op.attrs
        return K.pool2d_input_rect(op.inputs[0].shape, t.out, a["kernel"], a["stride"],
                                   a["padding"])[1]

    @staticmethod
    def forward(op, t):
        a = op.attrs
        return K.pool2d_forward(t.xs[0], a["kernel"], a["stride"], _Pool._pad(op, t),
                                a["pool_type"])

    @staticmethod
    def backward(op, t, y, dy):
        a = op.attrs
        if not t.need(0):
            return [None], {}
        return [K.pool2d_backward(dy, t.xs[0], y, a["kernel"], a["stride"], _Pool._pad(op, t),
                                  a["pool_type"])], {}


@tile_kernel("dense")
class _Dense:
    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        bias = t.ws.get("bias") if t.part[0] == 0 else None  # added by slice 0 only
        z = K.dense_forward(x.reshape(-1, x.shape[-1]), t.ws["weight"], bias)
        return _act_fwd(op.attrs.get("activation"), z, t.cache).reshape(t.out.shape)

    @staticmethod
    def backward(op, t, y, dy):
        x = t.xs[0]
        n = x.shape[-1]
        act = op.attrs.get("activation")
        dz = _act_bwd(act, dy.reshape(-1, dy.shape[-1]),
                      None if act is None else y.reshape(-1, y.shape[-1]), t.cache)
        first = t.part[0] == 0
        dx, dw, db = K.dense_backward(dz, x.reshape(-1, n), t.ws["weight"],
                                      "bias" in t.ws and first, t.need(0))
        dws = _with_bias_grad(t, {"weight": dw}, db)
        return [None if dx is None else dx.reshape(x.shape)], dws


@tile_kernel("tied_dense")
class _TiedDense:
    """``y = x @ W.T`` over the tile's vocabulary rows of the tied table."""

    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        return K.dense_forward(x.reshape(-1, x.shape[-1]), t.ws["weight"].T).reshape(
            t.out.shape)

    @staticmethod
    def backward(op, t, y, dy):
        x = t.xs[0]
        n = x.shape[-1]
        dz = dy.reshape(-1, dy.shape[-1])
        dx, dwt, _ = K.dense_backward(dz, x.reshape(-1, n), t.ws["weight"].T, False,
                                      t.need(0))
        return [None if dx is None else dx.reshape(x.shape)], {"weight": dwt.T}


@tile_kernel("relu", "sigmoid", "tanh", "gelu")
class _Unary:
    @staticmethod
    def _name(op):
        return "gelu_erf" if op.kind == "gelu" and op.attrs.get("approximate") == "none" \
            else op.kind

    @staticmethod
    def forward(op, t):
        return K.activation_forward(_Unary._name(op), t.xs[0])

    @staticmethod
    def backward(op, t, y, dy):
        return [K.activation_backward(_Unary._name(op), dy, t.xs[0], y) if t.need(0)
                else None], {}


@tile_kernel("dropout")
class _Dropout:
    @staticmethod
    def forward(op, t):
        y, keep = K.dropout_forward(t.xs[0], op.attrs["rate"], op.attrs["seed"], t.step,
                                    t.out.lo, op.output_shape, t.training)
        t.cache["keep"] = keep
        return y

    @staticmethod
    def backward(op, t, y, dy):
        return [K.dropout_backward(dy, t.cache.get("keep"), op.attrs["rate"])], {}


def _host(a: Any) -> np.ndarray:
    """A numpy copy of a numpy or cupy array."""
    return a.get() if hasattr(a, "get") else np.array(a)


@tile_kernel("batch_norm")
class _BatchNorm:
    """Training: statistics of the tile's own samples (ops/layers.py: channel
    tiles see the whole batch; sample tiles normalise locally, as FlexFlow
    and DDP do). The tile holding sample 0 leaves its batch statistics in
    ``t.cache["running"]`` as ``(c0, c1, mean, var, count)``; the F task
    returns them and the executor folds them into the running statistics on
    the host (:meth:`legionpy.nn.execution.Executor.fold_running_stats`), the
    same on every rank and whatever order tiles run in. Eval: normalise with
    ``t.buffers["running_mean"/"running_var"]``."""

    @staticmethod
    def forward(op, t):
        c0, c1 = t.out.lo[1], t.out.hi[1]
        eps = op.attrs.get("eps", 1e-5)
        if t.training:
            y, cache, (m, v, n) = K.batch_norm_forward(t.xs[0], t.ws["gamma"], t.ws["beta"],
                                                       eps=eps)
            if t.out.lo[0] == 0:
                t.cache["running"] = (c0, c1, _host(m), _host(v), n)
        else:
            xp = K.array_module(t.xs[0])
            rm, rv = (xp.asarray(t.buffers[k][c0:c1]) for k in ("running_mean", "running_var"))
            y, cache, _ = K.batch_norm_forward(t.xs[0], t.ws["gamma"], t.ws["beta"], rm, rv,
                                               eps=eps, training=False)
        t.cache["bn"] = cache
        return K.apply_activation_("relu" if op.attrs.get("relu") else None, y)

    @staticmethod
    def backward(op, t, y, dy):
        if op.attrs.get("relu"):
            dy = K.relu_backward(dy, y)
        dx, dg, db = K.batch_norm_backward(dy, t.cache["bn"], t.ws["gamma"])
        return [dx], {"gamma": dg, "beta": db}


@tile_kernel("flat", "reshape")
class _Reshape:
    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        return K.array_module(x).ascontiguousarray(x).reshape(t.out.shape)

    @staticmethod
    def backward(op, t, y, dy):
        return [dy.reshape(t.xs[0].shape)], {}


@tile_kernel("concat")
class _Concat:
    @staticmethod
    def _pieces(op, t):
        ax = op.attrs["axis"]
        off = 0
        for i, ref in enumerate(op.inputs):
            r = op.input_rect(i, t.out)
            if r.volume:
                sl = [slice(None)] * t.out.ndim
                sl[ax] = slice(r.lo[ax] + off - t.out.lo[ax], r.hi[ax] + off - t.out.lo[ax])
                yield i, tuple(sl)
            off += ref.shape[ax]

    @staticmethod
    def forward(op, t):
        y = K.array_module(t.xs[0]).empty(t.out.shape, t.xs[0].dtype)
        for i, sl in _Concat._pieces(op, t):
            y[sl] = t.xs[i]
        return y

    @staticmethod
    def backward(op, t, y, dy):
        dxs = [K.array_module(dy).zeros(x.shape, dy.dtype) for x in t.xs]
        for i, sl in _Concat._pieces(op, t):
            dxs[i] = dy[sl]
        return dxs, {}


@tile_kernel("add")
class _Add:
    @staticmethod
    def forward(op, t):
        return _act_fwd(op.attrs.get("activation"), t.xs[0] + t.xs[1], t.cache)

    @staticmethod
    def backward(op, t, y, dy):
        dz = _act_bwd(op.attrs.get("activation"), dy, y, t.cache)
        return [dz, dz], {}


@tile_kernel("multiply")
class _Multiply:
    @staticmethod
    def forward(op, t):
        return t.xs[0] * t.xs[1]

    @staticmethod
    def backward(op, t, y, dy):
        return [dy * t.xs[1], dy * t.xs[0]], {}


@tile_kernel("softmax")
class _Softmax:
    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        if op.attrs.get("causal"):
            x = K.causal_mask(x, t.out.lo[-2])
        return K.softmax_forward(x)

    @staticmethod
    def backward(op, t, y, dy):
        return [K.softmax_backward(dy, y)], {}


@tile_kernel("batch_matmul")
class _BatchMatmul:
    @staticmethod
    def forward(op, t):
        b = t.xs[1]
        if op.attrs.get("transpose_b"):
            b = np.swapaxes(b, -1, -2)
        return np.matmul(t.xs[0], b)

    @staticmethod
    def backward(op, t, y, dy):
        a, b = t.xs
        tb = op.attrs.get("transpose_b")
        bb = np.swapaxes(b, -1, -2) if tb else b
        da = np.matmul(dy, np.swapaxes(bb, -1, -2))
        db = np.matmul(np.swapaxes(a, -1, -2), dy)
        return [da, np.swapaxes(db, -1, -2) if tb else db], {}


@tile_kernel("embedding")
class _Embedding:
    @staticmethod
    def _ids(op, t):
        """Ids relative to the tile's rows, and the mask of those it holds
        (all of them unless the vocabulary is reduce-split)."""
        ids = t.xs[0].astype(np.int64, copy=False)
        r, n = t.part
        if n == 1:
            return ids, None
        v0, v1 = reduce_slice(op.attrs["vocab"], r, n)
        mask = (ids >= v0) & (ids < v1)
        return np.where(mask, ids - v0, 0), mask

    @staticmethod
    def forward(op, t):
        ids, mask = _Embedding._ids(op, t)
        y = K.embedding_forward(ids, t.ws["weight"])
        return y if mask is None else y * mask[..., None]

    @staticmethod
    def backward(op, t, y, dy):
        w = t.ws["weight"]
        xp = K.array_module(dy)
        dw = xp.zeros(w.shape, dy.dtype)
        ids, mask = _Embedding._ids(op, t)
        g = dy.reshape(-1, w.shape[1])
        if mask is not None:
            g = g * mask.reshape(-1, 1)
        K.scatter_add(xp, dw, ids.reshape(-1), g)
        return [None], {"weight": dw}


@tile_kernel("lstm")
class _LSTM:
    """Gate-major weights ``w_ih`` (4, h, I), ``w_hh`` (4, h, H), ``bias`` (4, h)
    of a unit tile ``[a, b)`` (h = b - a), used as (4h, I) / (4h, H) views
    (no copies): ``z = x w_ih^T + h_prev w_hh^T + bias``, gates as in
    :mod:`legionpy.ops.kernels.rnn`; the backward's weight gradients come out
    in the weights' own layout."""

    @staticmethod
    def forward(op, t):
        x = t.xs[0]
        n, hs, units = x.shape[0], t.out.shape[2], op.attrs["units"]
        w_ih = t.ws["w_ih"].reshape(4 * hs, -1)
        z = x @ w_ih.T
        if len(t.xs) > 1:
            h_prev, c_prev = t.xs[1][:, 0], t.xs[1][:, 1, t.out.lo[2]:t.out.hi[2]]
            z += h_prev @ t.ws["w_hh"].reshape(4 * hs, units).T
        else:
            h_prev, c_prev = None, K.array_module(x).zeros((n, hs), x.dtype)
        z += t.ws["bias"].reshape(-1)
        h, c, tanh_c = lstm_activate(z, c_prev)
        t.cache["lstm"] = (h_prev, z, c_prev, tanh_c)
        y = K.array_module(x).empty(t.out.shape, x.dtype)
        y[:, 0], y[:, 1] = h, c
        return y

    @staticmethod
    def backward(op, t, y, dy):
        h_prev, gates, c_prev, tanh_c = t.cache["lstm"]
        x = t.xs[0]
        hs, units = t.out.shape[2], op.attrs["units"]
        dz = K.array_module(gates).empty_like(gates)
        dc_prev = lstm_dgates(dy[:, 0], dy[:, 1], gates, c_prev, tanh_c, dz)
        w_ih = t.ws["w_ih"].reshape(4 * hs, -1)
        dws = {"w_ih": (dz.T @ x).reshape(4, hs, -1), "bias": dz.sum(axis=0).reshape(4, hs)}
        dxs = [dz @ w_ih if t.need(0) else None]
        if h_prev is None:
            dws["w_hh"] = K.array_module(dy).zeros(t.ws["w_hh"].shape, dy.dtype)
        else:
            w_hh = t.ws["w_hh"].reshape(4 * hs, units)
            dws["w_hh"] = (dz.T @ h_prev).reshape(4, hs, units)
            ds = K.array_module(dy).zeros(t.xs[1].shape, dy.dtype)
            ds[:, 0] = dz @ w_hh
            ds[:, 1, t.out.lo[2]:t.out.hi[2]] = dc_prev
            dxs.append(ds)
        return dxs, dws


@tile_kernel("attention")
class _Attention:
    """``out = tanh([ctx; q] @ w_c_tile.T)``; every tile computes the whole
    context (``w_a`` whole), its share of ``d w_a`` and ``dq`` is partial."""

    @staticmethod
    def forward(op, t):
        q, keys = t.xs[0], np.stack(t.xs[1:], axis=1)
        ctx, _, cache = K.attention_forward(q, keys, keys, t.ws["w_a"])
        cat = np.concatenate([ctx, q], axis=1)
        t.cache["att"] = (keys, cache, cat)
        return np.tanh(cat @ t.ws["w_c"].T)

    @staticmethod
    def backward(op, t, y, dy):
        keys, cache, cat = t.cache["att"]
        q = t.xs[0]
        h = q.shape[1]
        dpre = dy * (1 - y * y)
        dwc = dpre.T @ cat
        dcat = dpre @ t.ws["w_c"]
        dq, dk, dv, dwa = K.attention_backward(dcat[:, :h], q, keys, keys, cache, t.ws["w_a"])
        dkeys = dk + dv
        return [dq + dcat[:, h:]] + [dkeys[:, i] for i in range(keys.shape[1])], \
            {"w_a": dwa, "w_c": dwc}


from . import execute_elementwise, execute_sequence  # noqa: E402,F401  (their kernels)

EXECUTABLE = tuple(sorted(_KERNELS))


# -- losses ----------------------------------------------------------------------------
def loss_gradient(loss: str, op: Operator, out: Rect, y: Any, target: Any,
                  global_batch: int) -> tuple[float, Any, bool]:
    """``(loss share, gradient, of_input)`` of output tile ``out`` of the last op.

    ``target``: the targets of the tile's samples (int labels (n,) or dense
    (n, ...) like ``y``; a sequence output (n, T, K) takes labels (n, T) and
    its loss is the mean over all n * T positions). With softmax +
    cross-entropy the gradient is that of the softmax INPUT (``of_input``
    True: skip the softmax backward); otherwise of the output ``y``. Shares
    sum over tiles to the batch mean."""
    fused = op.kind == "softmax" and op.attrs.get("loss", True)
    if loss in ("sparse_categorical_crossentropy", "categorical_crossentropy"):
        if not fused:
            raise GraphError(f"loss {loss!r} needs the model to end with softmax; it ends "
                             f"with {op.kind} {op.name!r}")
        # sequence outputs (N, T, K): the mean over every position of the batch
        count = global_batch * int(np.prod(op.output_shape[1:-1], dtype=np.int64))
        if loss == "sparse_categorical_crossentropy":
            l, g = K.sparse_cross_entropy_from_probs(y.reshape(-1, y.shape[-1]), target, count)
            g = g.reshape(y.shape)
        else:
            ls = np.log(np.maximum(y, np.finfo(y.dtype).tiny))
            l = float(-(target * ls).sum()) / count
            g = ((y * target.sum(axis=-1, keepdims=True) - target)
                 * y.dtype.type(1.0 / count)).astype(y.dtype, copy=False)
        return l, g, True
    if loss == "mse":
        feats = int(np.prod(op.output_shape[1:]))
        l, g = K.mse_loss(y, target.astype(y.dtype, copy=False).reshape(y.shape),
                          global_batch, feats)
        return l, g, False
    raise GraphError(f"unknown loss {loss!r}; choose one of {LOSSES}")
