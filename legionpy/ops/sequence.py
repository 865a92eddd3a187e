"""Operators of Transformer encoders and imported graphs: layer_norm,
transpose, slice, scale, add_bias, positional_encoding.

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
- ``positional_encoding`` adds the fixed sinusoidal table of section 3.5.
"""

from __future__ import annotations

from ..errors import GraphError
from ..geometry import Rect
from .base import Operator, register

__all__ = ["LayerNorm", "Transpose", "Slice", "Scale", "AddBias", "PositionalEncoding"]


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
