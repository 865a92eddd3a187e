"""Operators of Transformer encoders and imported graphs: layer_norm,
transpose, slice, scale, add_bias, layer_scale, concat_param,
positional_encoding.

With ``batch_matmul`` over any number of leading dims and ``softmax``'s
causal mask (ops/layers.py), they express multi-head self-attention
(Vaswani et al., "Attention Is All You Need", 2017, section 3.2) as
PyTorch and ONNX exports do: ``(N, S, D) -> reshape (N, S, h, d) ->
transpose (N, h, S, d)``, scores ``(N, h, S, S)``, and back. The head dim
of the scores, the softmax and the context is an ``attribute`` dim (paper
Table 1), so the search can split heads across devices (attribute
parallelism: no parameter is split, each head tile reads its own slice).

Every rule maps an output tile to what it reads, as in ops/base.py:

- ``transpose`` (the batch dim stays first) reads the permuted tile, so
  every dim splits;
- ``slice`` reads the tile shifted by ``start`` along ``axis``;
- ``layer_norm`` normalises the last dim, which is therefore not split;
- ``add_bias`` adds a parameter over the trailing dims (a bias, or a
  learned positional table), read over the tile's trailing rect;
- ``layer_scale`` multiplies by a parameter broadcast over the trailing
  dims (ConvNeXt's and CaiT's per-channel layer scale: Touvron et al.,
  "Going deeper with Image Transformers", 2021; Liu et al., "A ConvNet for
  the 2020s", 2022); a tile reads the parameter over its own trailing rect
  (whole along the parameter's size-1 dims);
- ``concat_param`` concatenates a parameter, the same for every sample, to
  the activation along a non-batch axis (ViT's class token: Dosovitskiy et
  al., "An Image is Worth 16x16 Words", 2021, eq. 1). Every output dim
  splits: a tile reads the part of the activation it covers (shifted by
  the parameter's extent when the parameter comes first) and the part of
  the parameter it covers, possibly none of either;
- ``positional_encoding`` adds the fixed sinusoidal table of section 3.5.
"""

from __future__ import annotations

from ..errors import GraphError
from ..geometry import Rect
from .base import Operator, register, replace_dim

__all__ = ["LayerNorm", "Transpose", "Slice", "Scale", "AddBias", "LayerScale", "ConcatParam",
           "PositionalEncoding"]


def _attr_dims(n: int) -> tuple[str, ...]:
    return ("sample",) + ("attribute",) * (n - 1)


@register
class LayerNorm(Operator):
    """Normalise over the last dim: ``(x - mean) / sqrt(var + eps) * gamma +
    beta``. attrs: eps. Params ``gamma`` and ``beta`` (D,)."""

    kind = "layer_norm"

    def infer_dims(self):
        return _attr_dims(len(self.output_shape))[:-1] + (None,)

    def make_params(self):
        d = self.inputs[0].shape[-1]
        return {"gamma": ((d,), {"kind": "ones"}), "beta": ((d,), {"kind": "zeros"})}

    def flops(self, out):
        return 8.0 * out.volume, 12.0 * out.volume


@register
class Transpose(Operator):
    """Permute the dims; ``perm[0] == 0`` (samples stay first). Output dim
    ``d`` is input dim ``perm[d]``."""

    kind = "transpose"

    def infer_shape(self):
        x, perm = self.inputs[0].shape, tuple(int(p) for p in self.attrs["perm"])
        if sorted(perm) != list(range(len(x))) or perm[0] != 0:
            raise GraphError(f"transpose {self.name!r}: perm {perm} is not a permutation of "
                             f"the {len(x)} dims of {x} keeping dim 0 (samples) first")
        self.attrs["perm"] = perm
        return tuple(x[p] for p in perm)

    def input_rect(self, i, out):
        perm, n = self.attrs["perm"], out.ndim
        lo, hi = [0] * n, [0] * n
        for d, p in enumerate(perm):
            lo[p], hi[p] = out.lo[d], out.hi[d]
        return Rect(tuple(lo), tuple(hi))

    def flops(self, out):
        return 0.0, 0.0


@register
class Slice(Operator):
    """``x[..., start:end, ...]`` along ``axis`` (not the sample dim)."""

    kind = "slice"

    def infer_shape(self):
        x, a = self.inputs[0].shape, self.attrs
        ax = a["axis"] % len(x)
        if ax == 0 or not 0 <= a["start"] < a["end"] <= x[ax]:
            raise GraphError(f"slice {self.name!r}: [{a['start']}:{a['end']}] along axis "
                             f"{a['axis']} is not inside {x} (or cuts the sample dim)")
        a["axis"] = ax
        return x[:ax] + (a["end"] - a["start"],) + x[ax + 1:]

    def input_rect(self, i, out):
        ax, s = self.attrs["axis"], self.attrs["start"]
        lo, hi = list(out.lo), list(out.hi)
        lo[ax], hi[ax] = lo[ax] + s, hi[ax] + s
        return Rect(tuple(lo), tuple(hi))

    def flops(self, out):
        return 0.0, 0.0


@register
class Scale(Operator):
    """``alpha * x`` for a constant ``alpha`` (attention's 1/sqrt(d))."""

    kind = "scale"

    def flops(self, out):
        return float(out.volume), float(out.volume)


@register
class AddBias(Operator):
    """``x + bias`` with a parameter over the last ``ndim`` dims of x,
    broadcast over the others (a bias, or a learned positional table)."""

    kind = "add_bias"

    def infer_shape(self):
        x, k = self.inputs[0].shape, int(self.attrs["ndim"])
        if not 1 <= k < len(x):
            raise GraphError(f"add_bias {self.name!r}: ndim={k} must be in [1, {len(x) - 1}] "
                             f"for input {x}")
        return x

    def make_params(self):
        return {"bias": (self.inputs[0].shape[-int(self.attrs["ndim"]):], {"kind": "zeros"})}

    def weight_rect(self, pname, out):
        k = int(self.attrs["ndim"])
        return Rect(out.lo[-k:], out.hi[-k:])


@register
class LayerScale(Operator):
    """``x * gamma`` with a parameter ``gamma`` of rank ``k < x.ndim`` over the
    last ``k`` dims of x, numpy-broadcast (an extent 1 repeats: ConvNeXt's
    (C, 1, 1) scale of NCHW activations). attrs: ``shape`` (gamma's shape),
    ``init`` (its initial value, default 1)."""

    kind = "layer_scale"

    def infer_shape(self):
        x, g = self.inputs[0].shape, tuple(int(s) for s in self.attrs["shape"])
        k = len(g)
        if not 1 <= k < len(x) or any(a not in (1, b) for a, b in zip(g, x[len(x) - k:])):
            raise GraphError(f"layer_scale {self.name!r}: a parameter of shape {g} does not "
                             f"broadcast over the trailing dims of {x} (batch excluded)")
        self.attrs["shape"] = g
        return x

    def make_params(self):
        v = float(self.attrs.get("init", 1.0))
        init = {"kind": "ones"} if v == 1.0 else {"kind": "constant", "value": v}
        return {"gamma": (self.attrs["shape"], init)}

    def weight_rect(self, pname, out):
        g = self.attrs["shape"]
        k = len(g)
        lo = tuple(0 if s == 1 else a for s, a in zip(g, out.lo[-k:]))
        hi = tuple(1 if s == 1 else b for s, b in zip(g, out.hi[-k:]))
        return Rect(lo, hi)

    def flops(self, out):
        return float(out.volume), 3.0 * out.volume


@register
class ConcatParam(Operator):
    """``concat([p broadcast over the batch, x], axis)`` (``first=True``) or
    ``concat([x, p], axis)``: parameter ``value`` has x's non-batch shape
    with ``size`` along ``axis`` (ViT's class token: ``size=1`` on axis 1 of
    (N, S, D)). attrs: axis, size, first."""

    kind = "concat_param"

    def infer_shape(self):
        x, a = self.inputs[0].shape, self.attrs
        ax = int(a["axis"]) % len(x) if len(x) > 1 else 0
        if ax == 0 or int(a["size"]) < 1:
            raise GraphError(f"concat_param {self.name!r}: axis {a['axis']} of {x} must not "
                             f"be the batch and size {a['size']} must be >= 1")
        a["axis"], a["size"], a["first"] = ax, int(a["size"]), bool(a.get("first", True))
        return x[:ax] + (x[ax] + a["size"],) + x[ax + 1:]

    def make_params(self):
        x, a = self.inputs[0].shape, self.attrs
        shape = x[1:a["axis"]] + (a["size"],) + x[a["axis"] + 1:]
        return {"value": (shape, {"kind": "zeros"})}

    def _ranges(self):
        """``(param [lo, hi), input [lo, hi))`` along the axis, in output rows."""
        a, n = self.attrs, self.inputs[0].shape[self.attrs["axis"]]
        k = a["size"]
        return ((0, k), (k, k + n)) if a["first"] else ((n, n + k), (0, n))

    def input_rect(self, i, out):
        ax = self.attrs["axis"]
        _, (lo, hi) = self._ranges()
        a, b = max(out.lo[ax], lo) - lo, min(out.hi[ax], hi) - lo
        return replace_dim(out, ax, a, max(a, b))

    def weight_rect(self, pname, out):
        ax = self.attrs["axis"]
        (lo, hi), _ = self._ranges()
        a, b = max(out.lo[ax], lo) - lo, min(out.hi[ax], hi) - lo
        r = replace_dim(out, ax, a, max(a, b))
        return Rect(r.lo[1:], r.hi[1:])

    def flops(self, out):
        return 0.0, float(out.volume)


@register
class PositionalEncoding(Operator):
    """``x + PE`` on (N, S, D): ``PE[s, 2i] = sin(s / 10000^(2i/D))``,
    ``PE[s, 2i+1] = cos(s / 10000^(2i/D))`` (no parameters)."""

    kind = "positional_encoding"

    def infer_shape(self):
        x = self.inputs[0].shape
        if len(x) != 3:
            raise GraphError(f"positional_encoding {self.name!r} needs (N, S, D), got {x}")
        return x

    def flops(self, out):
        return 4.0 * out.volume, float(out.volume)
