"""Handlers of :mod:`legionpy.frontends.torch_fx`: leaf modules
(``module_handler(mod)(ctx, node, mod) -> value``) and functions/methods
(``calls()[target](ctx, node) -> value``; methods keyed ``".name"``).
PyTorch's LSTM gates (i, f, g, o) are legionpy's order already.

Values: a :class:`~legionpy.ops.TensorRef` (batch first), a numpy array
(a constant: a ``get_attr`` parameter, a number), a
:class:`~legionpy.frontends.onnx_import.Stack` (LSTM states over layers) or
a tuple (module outputs such as LSTM's ``(out, (h, c))``).
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np

from ..ops import TensorRef
from .onnx_import import Stack, Unsupported
from .onnx_math import ceil_pad

__all__ = ["calls", "module_handler"]


def _act(ctx, a: Any) -> TensorRef:
    v = ctx.arg(a)
    if not isinstance(v, TensorRef):
        raise Unsupported("an operand that is not a batch-first tensor")
    return v


def _shape(node: Any) -> tuple[int, ...]:
    return tuple(node.meta["tensor_meta"].shape)


# -- modules ---------------------------------------------------------------------------
def _conv(ctx, node, mod):
    if mod.padding_mode != "zeros" or isinstance(mod.padding, str):
        raise Unsupported("padding_mode or string padding")
    t = ctx.model.conv2d(_act(ctx, node.args[0]), mod.out_channels, mod.kernel_size,
                         mod.stride, mod.padding, mod.groups, bias=mod.bias is not None,
                         name=ctx.name(node), dilation=tuple(mod.dilation))
    ctx.param(t, "weight", f"{node.target}.weight")
    if mod.bias is not None:
        ctx.param(t, "bias", f"{node.target}.bias")
    return t


def _linear(ctx, node, mod):
    t = ctx.model.dense(_act(ctx, node.args[0]), mod.out_features, bias=mod.bias is not None,
                        name=ctx.name(node))
    ctx.param(t, "weight", f"{node.target}.weight", lambda a: a.T)
    if mod.bias is not None:
        ctx.param(t, "bias", f"{node.target}.bias")
    return t


def _bn(ctx, node, mod):
    if not mod.affine or not mod.track_running_stats:
        raise Unsupported("affine=False or track_running_stats=False")
    t = ctx.model.batch_norm(_act(ctx, node.args[0]), momentum=mod.momentum or 0.1,
                             eps=mod.eps, name=ctx.name(node))
    ctx.param(t, "gamma", f"{node.target}.weight")
    ctx.param(t, "beta", f"{node.target}.bias")
    t.op.initial_state = {"running_mean": mod.running_mean.detach().cpu().numpy(),
                          "running_var": mod.running_var.detach().cpu().numpy()}
    return t


def _ln(ctx, node, mod):
    x = _act(ctx, node.args[0])
    if tuple(mod.normalized_shape) != (x.shape[-1],) or not mod.elementwise_affine:
        raise Unsupported("normalisation over more than the last dim, or no affine")
    t = ctx.model.layer_norm(x, eps=mod.eps, name=ctx.name(node))
    ctx.param(t, "gamma", f"{node.target}.weight")
    if mod.bias is not None:
        ctx.param(t, "beta", f"{node.target}.bias")
    return t


def _embedding(ctx, node, mod):
    t = ctx.model.embedding(_act(ctx, node.args[0]), mod.num_embeddings, mod.embedding_dim,
                            name=ctx.name(node))
    ctx.param(t, "weight", f"{node.target}.weight")
    return t


def _activation(kind):
    def h(ctx, node, mod):
        x = _act(ctx, node.args[0])
        if kind == "gelu":
            return ctx.model.gelu(x, approximate=getattr(mod, "approximate", "none"),
                                  name=ctx.name(node))
        return getattr(ctx.model, kind)(x, name=ctx.name(node))
    return h


def _pool(ctx, node, mod):
    if getattr(mod, "dilation", 1) not in (1, (1, 1)):
        raise Unsupported("dilation")
    avg = type(mod).__name__ == "AvgPool2d"
    if avg and mod.padding and mod.count_include_pad:
        raise Unsupported("count_include_pad=True with padding")
    x = _act(ctx, node.args[0])
    k, s, p = (v if isinstance(v, tuple) else (v, v) for v in
               (mod.kernel_size, mod.stride or mod.kernel_size, mod.padding))
    if getattr(mod, "ceil_mode", False):
        if avg:
            raise Unsupported("ceil_mode of an average pool")
        x = ceil_pad(ctx.model, x, k, s, p, ctx.name(node, ".ceil"))
    return ctx.model.pool2d(x, k, s, p, "avg" if avg else "max", name=ctx.name(node))


def _adaptive(ctx, node, mod):
    return _adaptive_to(ctx, node, _act(ctx, node.args[0]), mod.output_size)


def _adaptive_fn(ctx, node):
    size = node.args[1] if len(node.args) > 1 else node.kwargs["output_size"]
    return _adaptive_to(ctx, node, _act(ctx, node.args[0]), size)


def _adaptive_to(ctx, node, x, size):
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,) * 2
    if tuple(size) != (1, 1):
        raise Unsupported(f"output_size {size} (only 1)")
    return ctx.model.pool2d(x, x.shape[2:], 1, 0, "avg", name=ctx.name(node))


def _flatten(ctx, node, mod):
    if mod.start_dim != 1 or mod.end_dim != -1:
        raise Unsupported("start_dim other than 1")
    return ctx.model.flat(_act(ctx, node.args[0]), name=ctx.name(node))


def _dropout(ctx, node, mod):
    x = _act(ctx, node.args[0])
    return ctx.model.dropout(x, mod.p, name=ctx.name(node)) if mod.p > 0 else x


def _softmax_mod(ctx, node, mod):
    return _softmax(ctx, node, _act(ctx, node.args[0]), mod.dim)


def _softmax(ctx, node, x, dim):
    if dim not in (-1, x.ndim - 1):
        raise Unsupported(f"dim={dim} (only the last dim)")
    last = all(u.op == "output" for u in node.users)
    return ctx.model.softmax(x, loss=last, name=ctx.name(node))


def _lstm(ctx, node, mod):
    if not mod.batch_first or mod.bidirectional or mod.proj_size or not mod.bias or \
            len(node.args) > 1:
        raise Unsupported("batch_first=False, bidirectional, proj_size, bias=False or an "
                          "initial state")
    x = _act(ctx, node.args[0])
    h = mod.hidden_size
    xs = [x.select(1, t) for t in range(x.shape[1])]
    lasts = []
    for layer in range(mod.num_layers):
        states, first = [], None
        for t, xt in enumerate(xs):
            s = ctx.model.lstm(xt, states[-1] if states else None, h, share=first,
                               name=ctx.name(node, f".l{layer}.t{t}"))
            first = first or s
            states.append(s)
        cells = [s.op for s in states]
        pre = f"{node.target}."
        for pname, src in (("w_ih", f"weight_ih_l{layer}"), ("w_hh", f"weight_hh_l{layer}")):
            ctx.param(cells, pname, pre + src, lambda a, h=h: a.reshape(4, h, -1))
        ctx.param(cells, "bias", lambda sd, p=pre, k=layer, h=h: (
            sd[f"{p}bias_ih_l{k}"] + sd[f"{p}bias_hh_l{k}"]).reshape(4, h))
        xs = [s.h for s in states]
        lasts.append(states[-1])
    return ("lstm", xs, Stack([s.h for s in lasts]), Stack([s.c for s in lasts]))


def _mha_weights(ctx, name, mod_path, ref_dense):
    """q, k, v and out projections of the multihead_attention block ``name``
    from PyTorch's ``in_proj_weight``/``in_proj_bias``/``out_proj``."""
    g = ctx.model.graph
    d = ref_dense
    for i, w in enumerate("qkv"):
        op = g.op(f"{name}.{w}")
        ctx.param(TensorRef(op), "weight", f"{mod_path}in_proj_weight",
                  lambda a, i=i: a[i * d:(i + 1) * d].T)
        ctx.param(TensorRef(op), "bias", f"{mod_path}in_proj_bias",
                  lambda a, i=i: a[i * d:(i + 1) * d])
    op = TensorRef(g.op(f"{name}.out"))
    ctx.param(op, "weight", f"{mod_path}out_proj.weight", lambda a: a.T)
    ctx.param(op, "bias", f"{mod_path}out_proj.bias")


def _mha(ctx, node, mod):
    q = _act(ctx, node.args[0])
    same = all(a is node.args[0] for a in node.args[1:3])
    if not mod.batch_first or not same or not mod._qkv_same_embed_dim or \
            mod.in_proj_bias is None or mod.bias_k is not None:
        raise Unsupported("only batch_first self-attention with biases")
    if any(k not in ("need_weights",) for k in node.kwargs) or len(node.args) > 3:
        raise Unsupported("masks")
    name = ctx.name(node)
    out = ctx.model.multihead_attention(q, mod.num_heads, name=name)
    _mha_weights(ctx, name, f"{node.target}.", q.shape[-1])
    return (out, None)


def _encoder_layer(ctx, x, node, mod, prefix, name):
    m = ctx.model
    act = getattr(mod, "activation_relu_or_gelu", 0)
    if act not in (1, 2) or not mod.self_attn.batch_first:
        raise Unsupported("an activation other than relu/gelu, or batch_first=False")
    d = x.shape[-1]

    def sa(t):
        a = m.multihead_attention(t, mod.self_attn.num_heads, name=f"{name}.attn")
        _mha_weights(ctx, f"{name}.attn", f"{prefix}self_attn.", d)
        return a

    def ff(t):
        h = m.dense(t, mod.linear1.out_features, activation="relu" if act == 1 else "gelu_erf",
                    name=f"{name}.ff1")
        o = m.dense(drop(h, "dropout"), d, name=f"{name}.ff2")
        for ref, lin in ((h, "linear1"), (o, "linear2")):
            ctx.param(ref, "weight", f"{prefix}{lin}.weight", lambda a: a.T)
            ctx.param(ref, "bias", f"{prefix}{lin}.bias")
        return o

    def ln(t, which):
        r = m.layer_norm(t, eps=getattr(mod, which).eps, name=f"{name}.{which}")
        ctx.param(r, "gamma", f"{prefix}{which}.weight")
        ctx.param(r, "beta", f"{prefix}{which}.bias")
        return r

    def drop(t, which):
        p = getattr(mod, which).p
        return m.dropout(t, p, name=f"{name}.{which}") if p > 0 else t

    if mod.norm_first:
        x = m.add(x, drop(sa(ln(x, "norm1")), "dropout1"), name=f"{name}.res1")
        return m.add(x, drop(ff(ln(x, "norm2")), "dropout2"), name=f"{name}.res2")
    x = ln(m.add(x, drop(sa(x), "dropout1"), name=f"{name}.res1"), "norm1")
    return ln(m.add(x, drop(ff(x), "dropout2"), name=f"{name}.res2"), "norm2")


def _encoder(ctx, node, mod):
    if len(node.args) > 1 or node.kwargs:
        raise Unsupported("masks")
    x = _act(ctx, node.args[0])
    if type(mod).__name__ == "TransformerEncoderLayer":
        return _encoder_layer(ctx, x, node, mod, f"{node.target}.", ctx.name(node))
    if mod.norm is not None:
        raise Unsupported("a final norm")
    base = ctx.name(node)
    for i, layer in enumerate(mod.layers):
        x = _encoder_layer(ctx, x, node, layer, f"{node.target}.layers.{i}.", f"{base}.{i}")
    return x


def _unary_mod(fn, **kw):
    def h(ctx, node, mod):
        params = {k: (getattr(mod, a) if isinstance(a, str) else a) for k, a in kw.items()}
        return ctx.model.unary(_act(ctx, node.args[0]), fn, name=ctx.name(node), **params)
    return h


def _ln2d(ctx, node, mod):
    """torchvision's LayerNorm2d (ConvNeXt): layer_norm over channels of NCHW."""
    x = ctx.model.transpose(_act(ctx, node.args[0]), (0, 2, 3, 1), name=ctx.name(node, ".nhwc"))
    t = ctx.model.layer_norm(x, eps=mod.eps, name=ctx.name(node))
    ctx.param(t, "gamma", f"{node.target}.weight")
    ctx.param(t, "beta", f"{node.target}.bias")
    return ctx.model.transpose(t, (0, 3, 1, 2), name=ctx.name(node, ".nchw"))


_MODULES = {
    "LayerNorm2d": _ln2d,
    "ReLU6": _unary_mod("clip", min=0.0, max=6.0), "SiLU": _unary_mod("silu"),
    "Hardswish": _unary_mod("hardswish"), "Mish": _unary_mod("mish"),
    "Hardsigmoid": _unary_mod("hardsigmoid", alpha=1 / 6, beta=0.5),
    "LeakyReLU": _unary_mod("leaky_relu", alpha="negative_slope"),
    "ELU": _unary_mod("elu", alpha="alpha"), "Softplus": _unary_mod("softplus"),
    "AdaptiveAvgPool1d": lambda ctx, node, mod: _reduce_to(ctx, node, mod.output_size, 1),
    "Conv2d": _conv, "Linear": _linear, "BatchNorm1d": _bn, "BatchNorm2d": _bn,
    "LayerNorm": _ln, "Embedding": _embedding, "ReLU": _activation("relu"),
    "GELU": _activation("gelu"), "Tanh": _activation("tanh"),
    "Sigmoid": _activation("sigmoid"), "MaxPool2d": _pool, "AvgPool2d": _pool,
    "AdaptiveAvgPool2d": _adaptive, "Flatten": _flatten, "Dropout": _dropout,
    "Softmax": _softmax_mod, "LSTM": _lstm, "MultiheadAttention": _mha,
    "TransformerEncoderLayer": _encoder, "TransformerEncoder": _encoder,
    "Identity": lambda ctx, node, mod: ctx.arg(node.args[0]),
}


def module_handler(mod: Any) -> Any:
    return _MODULES.get(type(mod).__name__)


# -- functions and methods --------------------------------------------------------------
_PLAIN = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
          "div": operator.truediv}


def _param_source(ctx, a: Any) -> str | None:
    """The state-dict name of the trained parameter that fx node ``a`` is,
    seen through ``expand``/``view``/``reshape``/``repeat``/``contiguous``
    (ViT's ``class_token.expand(n, -1, -1)``); None for a buffer, a
    constant or anything computed."""
    import torch.fx as fx

    while isinstance(a, fx.Node) and a.op == "call_method" and \
            a.target in ("expand", "view", "reshape", "repeat", "contiguous", "expand_as"):
        a = a.args[0]
    if not isinstance(a, fx.Node) or a.op != "get_attr":
        return None
    return a.target if a.target in ctx.trained() else None


def _binary(kind):
    def h(ctx, node):
        a, b = ctx.arg(node.args[0]), ctx.arg(node.args[1])
        m = ctx.model
        if all(isinstance(v, (int, float)) for v in (a, b)):  # shape arithmetic
            return _PLAIN[kind](a, b)
        if isinstance(a, TensorRef) and isinstance(b, TensorRef):
            if a.shape != b.shape or kind in ("sub", "div"):
                if a.ndim != b.ndim:
                    raise Unsupported(f"broadcasting {a.shape} and {b.shape} (ranks differ)")
                return m.binary(a, b, kind, name=ctx.name(node))
            return (m.add if kind == "add" else m.multiply)(a, b, name=ctx.name(node))
        x, c = (a, b) if isinstance(a, TensorRef) else (b, a)
        if not isinstance(x, TensorRef):
            raise Unsupported("no tensor operand")
        c = np.asarray(c, np.float32)
        src = next((_param_source(ctx, v) for v in node.args
                    if _param_source(ctx, v) is not None), None)
        if kind == "mul" and src is not None:
            shape = _channel_vector(c, x.shape)
            if shape is not None:  # a trained factor: ConvNeXt's layer scale, a scalar
                t = m.layer_scale(x, shape, name=ctx.name(node))
                ctx.param(t, "gamma", src, lambda v, s=shape: v.reshape(s))
                return t
        if c.size == 1:
            v = float(c.reshape(-1)[0])
            if kind == "mul":
                return m.scale(x, v, name=ctx.name(node))
            if kind == "div" and x is a:
                return m.scale(x, 1.0 / v, name=ctx.name(node))
        if kind == "add":
            while c.ndim > 1 and c.shape[0] == 1:
                c = c[0]
            if c.ndim < x.ndim and tuple(x.shape[x.ndim - c.ndim:]) == c.shape:
                t = m.add_bias(x, ndim=c.ndim, name=ctx.name(node))
                src = next((a for a in node.args if getattr(a, "op", "") == "get_attr"), None)
                if src is None:
                    raise Unsupported("a constant that is not a module attribute")
                ctx.param(t, "bias", src.target, lambda v, k=c.ndim: v.reshape(v.shape[-k:]))
                return t
        nd = x.ndim
        if c.ndim > nd or (c.ndim == nd and c.shape[0] != 1):
            raise Unsupported(f"{kind} with a constant of shape {c.shape}")
        return m.binary(a if x is a else c, b if x is b else c, kind, name=ctx.name(node))
    return h


def _channel_vector(c: np.ndarray, xshape) -> tuple[int, ...] | None:
    """``c`` as a parameter over x's trailing dims (leading size-1 dims
    dropped), or None when it does not broadcast so."""
    c = c.reshape(1) if c.ndim == 0 else c
    while c.ndim > 1 and c.shape[0] == 1:
        c = c[0]
    k = c.ndim
    if k >= len(xshape) or \
            any(a not in (1, b) for a, b in zip(c.shape, xshape[len(xshape) - k:])):
        return None
    return tuple(int(s) for s in c.shape)


def _unary_call(fn, **params):
    def h(ctx, node):
        return ctx.model.unary(_act(ctx, node.args[0]), fn, name=ctx.name(node), **params)
    return h


def _reduce_to(ctx, node, size, nd):
    x = _act(ctx, node.args[0])
    if size not in (1, (1,)):
        raise Unsupported(f"output_size {size} (only 1)")
    return ctx.model.reduce(x, list(range(x.ndim - nd, x.ndim)), "mean", name=ctx.name(node))


def _mean(ctx, node):
    x = _act(ctx, node.args[0])
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if dim is None:
        raise Unsupported("a mean over every dim, the batch included")
    dims = [d % x.ndim for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
    if 0 in dims:
        raise Unsupported("a mean over the batch dim")
    return ctx.model.reduce(x, dims, "mean", keepdims=bool(keep), name=ctx.name(node))


def _chunk(ctx, node):
    x = _act(ctx, node.args[0])
    k = node.args[1] if len(node.args) > 1 else node.kwargs["chunks"]
    dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % x.ndim
    if dim == 0:
        raise Unsupported("chunks of the batch dim")
    n = x.shape[dim]
    step = -(-n // k)
    return tuple(ctx.model.slice(x, dim, lo, min(lo + step, n), name=ctx.name(node, f".{i}"))
                 for i, lo in enumerate(range(0, n, step)))


def _layer_norm_fn(ctx, node):
    x = _act(ctx, node.args[0])
    shape = node.args[1]
    w = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    b = node.args[3] if len(node.args) > 3 else node.kwargs.get("bias")
    eps = node.args[4] if len(node.args) > 4 else node.kwargs.get("eps", 1e-5)
    if tuple(shape) != (x.shape[-1],):
        raise Unsupported("normalisation over more than the last dim")
    t = ctx.model.layer_norm(x, eps=eps, name=ctx.name(node))
    for pname, src in (("gamma", w), ("beta", b)):
        if src is not None:
            if getattr(src, "op", "") != "get_attr":
                raise Unsupported(f"a layer_norm {pname} that is not a module attribute")
            ctx.param(t, pname, src.target)
    return t


def _stochastic_depth(ctx, node):
    """torchvision's stochastic depth: the identity in eval mode (as imported)."""
    args = list(node.args) + [None] * 4
    p = args[1] if args[1] is not None else node.kwargs.get("p", 0.0)
    training = args[3] if args[3] is not None else node.kwargs.get("training", True)
    if p and training:
        raise Unsupported("stochastic depth in training mode (import the module in eval mode)")
    return _act(ctx, node.args[0])


def _getattr(ctx, node):
    v, what = ctx.arg(node.args[0]), node.args[1]
    if what == "shape" and isinstance(v, TensorRef):
        return (ctx.batch,) + tuple(v.shape[1:])
    raise Unsupported(f"attribute {what!r}")


def _unary_fn(kind):
    def h(ctx, node):
        x = _act(ctx, node.args[0])
        if kind == "gelu":
            return ctx.model.gelu(x, approximate=node.kwargs.get("approximate", "none"),
                                  name=ctx.name(node))
        return getattr(ctx.model, kind)(x, name=ctx.name(node))
    return h


def _flatten_fn(ctx, node):
    x = _act(ctx, node.args[0])
    start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    if start != 1:
        raise Unsupported("flatten from a dim other than 1")
    return ctx.model.flat(x, name=ctx.name(node))


def _cat(ctx, node):
    vals = [ctx.arg(a) for a in node.args[0]]
    if any(isinstance(v, np.ndarray) for v in vals):
        return _cat_params(ctx, node, vals)
    xs = [_act(ctx, a) for a in node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    dim = dim % xs[0].ndim
    if dim == 0:
        raise Unsupported("concatenating along the batch dim")
    return ctx.model.concat(xs, axis=dim, name=ctx.name(node))


def _cat_params(ctx, node, vals):
    """``torch.cat`` of one activation with trained parameters expanded over
    the batch (ViT's class token) -> ``concat_param`` on each side."""
    acts = [k for k, v in enumerate(vals) if isinstance(v, TensorRef)]
    if len(acts) != 1:
        raise Unsupported("concatenating constants with several activations")
    x = vals[acts[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    dim = dim % x.ndim
    if dim == 0:
        raise Unsupported("concatenating along the batch dim")
    for k, (a, v) in enumerate(zip(node.args[0], vals)):
        if k == acts[0]:
            continue
        src = _param_source(ctx, a)
        if src is None or not isinstance(v, np.ndarray) or v.ndim != x.ndim:
            raise Unsupported("concatenating a constant that is not a trained parameter")
        rows = int(v.shape[dim])
        name = ctx.name(node, ".param" if k < acts[0] else ".param_after")
        shape = tuple(x.shape[1:dim]) + (rows,) + tuple(x.shape[dim + 1:])
        t = ctx.model.concat_param(x, rows, axis=dim, first=k < acts[0], name=name)
        ctx.param(t, "value", src, lambda p, s=shape: np.broadcast_to(p, (1,) + s)[0].copy())
        x = t
    return x


def _expand(ctx, node):
    """``Tensor.expand`` of a constant (a parameter broadcast over the
    batch: the value, broadcast; :func:`_param_source` keeps its origin)."""
    v = ctx.arg(node.args[0])
    if not isinstance(v, np.ndarray):
        raise Unsupported("expanding an activation")
    shape = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) \
        else node.args[1:]
    shape = [ctx.arg(d) for d in shape]
    lead = len(shape) - v.ndim
    full = tuple(v.shape[i - lead] if d == -1 else int(d) for i, d in enumerate(shape))
    return np.broadcast_to(v, full)


def _reshape_m(ctx, node):
    x = _act(ctx, node.args[0])
    shape = node.args[1:] if not isinstance(node.args[1], (tuple, list)) else node.args[1]
    shape = [ctx.arg(s) for s in shape]
    out, src = _shape(node), _shape(node.args[0])  # at the example's batch
    if len(shape) == 0 or out[0] != src[0]:
        raise Unsupported(f"a view to {out} that moves the batch dim")
    if tuple(out[1:]) == tuple(x.shape[1:]):
        return x
    return ctx.model.reshape(x, tuple(out[1:]), name=ctx.name(node))


def _permute(ctx, node):
    x = _act(ctx, node.args[0])
    if getattr(node.target, "__name__", node.target) == "transpose":
        a, b = (d % x.ndim for d in node.args[1:3])
        perm = list(range(x.ndim))
        perm[a], perm[b] = b, a
    else:
        perm = node.args[1] if isinstance(node.args[1], (tuple, list)) else node.args[1:]
        perm = [p % x.ndim for p in perm]
    if perm[0] != 0:
        raise Unsupported(f"perm {perm} moves the batch dim")
    return ctx.model.transpose(x, tuple(perm), name=ctx.name(node))


def _getitem(ctx, node):
    v, idx = ctx.arg(node.args[0]), node.args[1]
    if isinstance(v, tuple):
        if v and v[0] == "lstm":
            if idx == 0:
                steps = v[1]
                cat = ctx.model.concat(steps, axis=1, name=ctx.name(node, ".steps"))
                return ctx.model.reshape(cat, (len(steps), steps[0].shape[1]),
                                         name=ctx.name(node))
            return (v[2], v[3])
        return v[idx]
    if isinstance(v, Stack):
        return v.items[idx]
    if not isinstance(v, TensorRef):
        raise Unsupported("indexing a constant")
    idx = idx if isinstance(idx, tuple) else (idx,)
    if not idx or idx[0] != slice(None):
        raise Unsupported(f"an index {idx} into the batch dim")
    out, ax = v, 0
    for k in idx[1:]:
        ax += 1
        if k == slice(None):
            continue
        if isinstance(k, int):
            if out.view is not None or out is not v:
                raise Unsupported("several integer indices")
            out = out.select(ax, k % v.shape[ax])
            ax -= 1
        elif isinstance(k, slice) and k.step in (None, 1):
            lo, hi, _ = k.indices(out.shape[ax])
            out = ctx.model.slice(out, ax, lo, hi, name=ctx.name(node))
        else:
            raise Unsupported(f"the index {k!r}")
    return out


def _softmax_fn(ctx, node):
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else -1)
    return _softmax(ctx, node, _act(ctx, node.args[0]), dim)


def _size(ctx, node):
    s = _shape(node.args[0]) if "tensor_meta" in node.args[0].meta else None
    if s is None:
        raise Unsupported("size of an untracked value")
    s = (ctx.batch,) + tuple(s[1:])
    return s[node.args[1]] if len(node.args) > 1 else s


def _ndim(ctx, node):
    """``Tensor.dim()`` (shape checks such as torchvision's ``torch._assert``)."""
    v = ctx.arg(node.args[0])
    if not hasattr(v, "shape"):
        raise Unsupported("dim() of a value without a shape")
    return len(v.shape)


def _identity(ctx, node):
    return ctx.arg(node.args[0])


def _dropout_fn(ctx, node):
    x = _act(ctx, node.args[0])
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    return ctx.model.dropout(x, p, name=ctx.name(node)) if p > 0 else x


def _calls() -> dict:
    import torch
    import torch.nn.functional as F

    try:
        from torchvision.ops import stochastic_depth
    except ImportError:  # pragma: no cover - torchvision is optional
        stochastic_depth = None
    c = {operator.add: _binary("add"), torch.add: _binary("add"),
         operator.mul: _binary("mul"), torch.mul: _binary("mul"),
         operator.truediv: _binary("div"), operator.getitem: _getitem,
         torch.relu: _unary_fn("relu"), F.relu: _unary_fn("relu"),
         torch.tanh: _unary_fn("tanh"), torch.sigmoid: _unary_fn("sigmoid"),
         F.gelu: _unary_fn("gelu"), torch.flatten: _flatten_fn, torch.cat: _cat,
         torch.softmax: _softmax_fn, F.softmax: _softmax_fn, F.dropout: _dropout_fn,
         ".view": _reshape_m, ".reshape": _reshape_m, ".permute": _permute,
         ".transpose": _permute, ".contiguous": _identity, ".relu": _unary_fn("relu"),
         ".softmax": _softmax_fn, ".size": _size, ".flatten": _flatten_fn,
         ".tanh": _unary_fn("tanh"), ".sigmoid": _unary_fn("sigmoid"),
         operator.sub: _binary("sub"), torch.sub: _binary("sub"), torch.div: _binary("div"),
         F.relu6: _unary_call("clip", min=0.0, max=6.0), F.silu: _unary_call("silu"),
         F.hardswish: _unary_call("hardswish"), F.mish: _unary_call("mish"),
         F.hardsigmoid: _unary_call("hardsigmoid", alpha=1 / 6, beta=0.5),
         torch.exp: _unary_call("exp"), torch.sqrt: _unary_call("sqrt"),
         torch.rsqrt: _unary_call("rsqrt"), torch.erf: _unary_call("erf"),
         torch.mean: _mean, ".mean": _mean, F.adaptive_avg_pool2d: _adaptive_fn,
         torch.transpose: _permute, torch.permute: _permute, torch.chunk: _chunk,
         ".chunk": _chunk, getattr: _getattr, F.layer_norm: _layer_norm_fn,
         ".expand": _expand, ".dim": _ndim}
    if stochastic_depth is not None:
        c[stochastic_depth] = _stochastic_depth
    return c


@functools.cache
def calls() -> dict:
    """``{function or ".method": handler}`` (built on first use: needs torch)."""
    return _calls()
