"""Feed-forward operators: input, conv2d, pool2d, dense, element-wise unary and
binary ops, batch_norm, dropout, flat, reshape, concat, softmax, batch_matmul.

Parallelizable dims follow the paper's Table 1 (section 4) and FlexFlow: an
NCHW conv2d output has N sample, C parameter, H and W attribute; a dense
output has its rows sample and its last dim parameter.

``batch_norm`` splits the channel dim (exact: a channel tile sees the whole
batch) and the sample dim with *local* statistics: a sample tile normalises
with the mean and variance of its own samples, which is what FlexFlow, cuDNN
per replica and PyTorch DDP without SyncBatchNorm do. Keeping it
channel-only would turn every data-parallel conv -> batch_norm edge into an
all-to-all exchange of activations (hundreds of thousands of tasks for
ResNet-101 on 16 GPUs) and make the data-parallel baseline unrealistic. The
price: DESIGN.md invariant 2 (identical numbers under every strategy) holds
for batch_norm only between strategies that give it the same sample degree;
spatial dims are not split (statistics cover them whole).
``softmax`` with ``loss=True`` (softmax + cross-entropy, the end of the
forward pass) splits the sample dim only.
"""

from __future__ import annotations

import math

from ..errors import GraphError
from ..geometry import Rect
from .base import Operator, bias_part, reduce_part, register, replace_dim, window

__all__ = [
    "Input", "Conv2D", "Pool2D", "Dense", "Relu", "Sigmoid", "Tanh", "Gelu",
    "BatchNorm", "Dropout", "Flat", "Reshape", "Concat", "Add", "Multiply",
    "Softmax", "BatchMatmul",
]

ACTIVATIONS = (None, "relu", "sigmoid", "tanh", "gelu", "gelu_erf")


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise GraphError(f"expected an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _check_activation(name: str, act) -> None:
    if act not in ACTIVATIONS:
        raise GraphError(f"{name!r}: unknown activation {act!r}; choose one of {ACTIVATIONS}")


@register
class Input(Operator):
    """A graph input of ``shape`` (batch first). Split along the sample dim
    only; its load task costs the host-to-device copy of the tile."""

    kind = "input"
    arity = 0

    def infer_shape(self):
        return tuple(self.attrs["shape"])

    def infer_dims(self):
        return ("sample",) + (None,) * (len(self.output_shape) - 1)

    def flops(self, out: Rect):
        return 0.0, 0.0

    def bytes(self, out: Rect):
        return float(out.volume * self.itemsize), 0.0

    @property
    def has_backward(self) -> bool:
        return False


@register
class Conv2D(Operator):
    """2-D convolution, NCHW. attrs: out_channels, kernel, stride, padding
    (pairs), groups, bias, activation, and ``dilation`` (a pair, present only
    when not 1: a dilated kernel reads a window of ``d * (k - 1) + 1`` rows,
    which the output size and the input halo use; the FLOPs stay ``k``
    taps). Params: ``weight`` (Cout, Cin/groups, kh, kw) and ``bias`` (Cout,)."""

    kind = "conv2d"

    def infer_shape(self):
        x = self.inputs[0].shape
        if len(x) != 4:
            raise GraphError(f"conv2d {self.name!r} needs an NCHW input, got {x}")
        a = self.attrs
        a["kernel"], a["stride"], a["padding"] = (
            _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"]))
        _check_activation(self.name, a.get("activation"))
        g, cout = a["groups"], a["out_channels"]
        if x[1] % g or cout % g:
            raise GraphError(f"conv2d {self.name!r}: groups={g} must divide in_channels="
                             f"{x[1]} and out_channels={cout}")
        if "dilation" in a:
            a["dilation"] = _pair(a["dilation"])
            if min(a["dilation"]) < 1:
                raise GraphError(f"conv2d {self.name!r}: dilation {a['dilation']} must be >= 1")
            if a["dilation"] == (1, 1):
                del a["dilation"]  # the plain convolution's attrs (and cost-cache keys)
        (kh, kw), (sh, sw), (ph, pw) = self.span(), a["stride"], a["padding"]
        return (x[0], cout, (x[2] + 2 * ph - kh) // sh + 1, (x[3] + 2 * pw - kw) // sw + 1)

    def span(self) -> tuple[int, int]:
        """Input rows and columns one window covers (the kernel, dilated)."""
        (kh, kw), (dh, dw) = self.attrs["kernel"], self.attrs.get("dilation", (1, 1))
        return dh * (kh - 1) + 1, dw * (kw - 1) + 1

    def infer_dims(self):
        return ("sample", "parameter", "attribute", "attribute")

    def make_params(self):
        a, cin = self.attrs, self.inputs[0].shape[1]
        kh, kw = a["kernel"]
        fan_in = cin // a["groups"] * kh * kw
        p = {"weight": ((a["out_channels"], cin // a["groups"], kh, kw),
                        {"kind": "glorot_uniform", "fan_in": fan_in,
                         "fan_out": a["out_channels"] * kh * kw})}
        if a["bias"]:
            p["bias"] = ((a["out_channels"],), {"kind": "zeros"})
        return p

    def input_rect(self, i, out):
        x = self.inputs[0].shape
        a = self.attrs
        g = a["groups"]
        opg, ipg = a["out_channels"] // g, x[1] // g
        c0, c1 = (out.lo[1] // opg) * ipg, ((out.hi[1] - 1) // opg + 1) * ipg
        kh, kw = self.span()
        h0, h1 = window(out.lo[2], out.hi[2], kh, a["stride"][0], a["padding"][0], x[2])
        w0, w1 = window(out.lo[3], out.hi[3], kw, a["stride"][1], a["padding"][1], x[3])
        return Rect((out.lo[0], c0, h0, w0), (out.hi[0], c1, h1, w1))

    def weight_rect(self, pname, out):
        return replace_dim(self.params[pname].rect, 0, out.lo[1], out.hi[1])

    def reduce_extent(self):
        """The input channels (ungrouped, no fused activation)."""
        a = self.attrs
        return 0 if a.get("activation") or a["groups"] != 1 else self.inputs[0].shape[1]

    def part_input_rect(self, i, out, r=0, n=1):
        return reduce_part(self.input_rect(i, out), 1, self.inputs[0].shape[1], r, n)

    def part_weight_rect(self, pname, out, r=0, n=1):
        w = self.weight_rect(pname, out)
        if pname == "bias":
            return bias_part(w, r, n)
        return reduce_part(w, 1, self.inputs[0].shape[1], r, n)

    def flops(self, out):
        kh, kw = self.attrs["kernel"]
        per = 2.0 * self.inputs[0].shape[1] // self.attrs["groups"] * kh * kw
        f = out.volume * per
        return f, 2.0 * f


@register
class Pool2D(Operator):
    """Max or average pooling, NCHW. attrs: kernel, stride, padding, pool_type."""

    kind = "pool2d"

    def infer_shape(self):
        x = self.inputs[0].shape
        if len(x) != 4:
            raise GraphError(f"pool2d {self.name!r} needs an NCHW input, got {x}")
        a = self.attrs
        a["kernel"] = _pair(a["kernel"])
        a["stride"] = _pair(a["stride"] if a.get("stride") is not None else a["kernel"])
        a["padding"] = _pair(a["padding"])
        if a["pool_type"] not in ("max", "avg"):
            raise GraphError(f"pool2d {self.name!r}: pool_type must be 'max' or 'avg', "
                             f"got {a['pool_type']!r}")
        (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
        return (x[0], x[1], (x[2] + 2 * ph - kh) // sh + 1, (x[3] + 2 * pw - kw) // sw + 1)

    def input_rect(self, i, out):
        x, a = self.inputs[0].shape, self.attrs
        h0, h1 = window(out.lo[2], out.hi[2], a["kernel"][0], a["stride"][0], a["padding"][0],
                        x[2])
        w0, w1 = window(out.lo[3], out.hi[3], a["kernel"][1], a["stride"][1], a["padding"][1],
                        x[3])
        return Rect((out.lo[0], out.lo[1], h0, w0), (out.hi[0], out.hi[1], h1, w1))

    def flops(self, out):
        kh, kw = self.attrs["kernel"]
        f = float(out.volume * kh * kw)
        return f, f


@register
class Dense(Operator):
    """``y = act(x @ weight + bias)`` over the last dim. Params ``weight``
    (in_features, units) -- the kernels' layout (legionpy.ops.kernels.dense) --
    and ``bias`` (units,); an output-feature tile reads weight columns."""

    kind = "dense"

    def infer_shape(self):
        _check_activation(self.name, self.attrs.get("activation"))
        return self.inputs[0].shape[:-1] + (self.attrs["units"],)

    def infer_dims(self):
        n = len(self.output_shape)
        return ("sample",) + ("attribute",) * (n - 2) + ("parameter",)

    def make_params(self):
        fin, units = self.inputs[0].shape[-1], self.attrs["units"]
        p = {"weight": ((fin, units), {"kind": "glorot_uniform", "fan_in": fin,
                                       "fan_out": units})}
        if self.attrs.get("bias", True):
            p["bias"] = ((units,), {"kind": "zeros"})
        return p

    def input_rect(self, i, out):
        return replace_dim(out, out.ndim - 1, 0, self.inputs[0].shape[-1])

    def weight_rect(self, pname, out):
        r = self.params[pname].rect  # weight (in, units) or bias (units,): last dim
        return replace_dim(r, r.ndim - 1, out.lo[-1], out.hi[-1])

    def reduce_extent(self):
        """The input features (Megatron's row-parallel split), unless a fused
        activation needs the whole sum first."""
        return 0 if self.attrs.get("activation") else self.inputs[0].shape[-1]

    def part_input_rect(self, i, out, r=0, n=1):
        q = self.input_rect(i, out)
        return reduce_part(q, q.ndim - 1, self.inputs[0].shape[-1], r, n)

    def part_weight_rect(self, pname, out, r=0, n=1):
        w = self.weight_rect(pname, out)
        if pname == "bias":
            return bias_part(w, r, n)
        return reduce_part(w, 0, self.inputs[0].shape[-1], r, n)

    def flops(self, out):
        f = 2.0 * out.volume * self.inputs[0].shape[-1]
        return f, 2.0 * f


class _Unary(Operator):
    def flops(self, out):
        return float(out.volume), float(out.volume)


@register
class Relu(_Unary):
    kind = "relu"


@register
class Sigmoid(_Unary):
    kind = "sigmoid"


@register
class Tanh(_Unary):
    kind = "tanh"


@register
class Gelu(_Unary):
    kind = "gelu"


@register
class Dropout(_Unary):
    """attrs: rate, seed. The mask is a function of (seed, global index), so
    it is the same under every strategy."""

    kind = "dropout"


@register
class BatchNorm(Operator):
    """Batch normalisation over every dim but the channel dim 1 (optionally
    fused relu). Channel-parallel, and sample-parallel with per-tile
    statistics: see the module docstring."""

    kind = "batch_norm"

    def infer_dims(self):
        n = len(self.output_shape)
        return ("sample", "parameter") + (None,) * (n - 2)

    def make_params(self):
        c = self.inputs[0].shape[1]
        return {"gamma": ((c,), {"kind": "ones"}), "beta": ((c,), {"kind": "zeros"})}

    def weight_rect(self, pname, out):
        return Rect((out.lo[1],), (out.hi[1],))

    def flops(self, out):
        return 8.0 * out.volume, 12.0 * out.volume


@register
class Flat(Operator):
    """``(N, d1, d2, ...) -> (N, d1*d2*...)``; sample-parallel only."""

    kind = "flat"

    def infer_shape(self):
        s = self.inputs[0].shape
        return (s[0], math.prod(s[1:]))

    def infer_dims(self):
        return ("sample", None)

    def input_rect(self, i, out):
        s = self.inputs[0].shape
        return Rect((out.lo[0],) + (0,) * (len(s) - 1), (out.hi[0],) + tuple(s[1:]))

    def flops(self, out):
        return 0.0, 0.0


@register
class Reshape(Flat):
    """Reshape keeping the batch dim; sample-parallel only. attrs: shape
    (without the batch dim)."""

    kind = "reshape"

    def infer_shape(self):
        s, new = self.inputs[0].shape, tuple(self.attrs["shape"])
        if math.prod(new) != math.prod(s[1:]):
            raise GraphError(f"reshape {self.name!r}: {s[1:]} has {math.prod(s[1:])} "
                             f"elements per sample, {new} has {math.prod(new)}")
        return (s[0],) + new

    def infer_dims(self):
        return ("sample",) + (None,) * (len(self.output_shape) - 1)


@register
class Concat(Operator):
    """Concatenation along ``axis``; an output tile reads from each input the
    part of the tile that input provides (possibly nothing)."""

    kind = "concat"
    arity = None

    def infer_shape(self):
        ax = self.attrs["axis"]
        shapes = [r.shape for r in self.inputs]
        base = shapes[0]
        for s in shapes[1:]:
            if len(s) != len(base) or any(a != b for d, (a, b) in enumerate(zip(s, base))
                                          if d != ax):
                raise GraphError(f"concat {self.name!r} along axis {ax}: shapes {shapes} "
                                 f"differ outside that axis")
        return base[:ax] + (sum(s[ax] for s in shapes),) + base[ax + 1:]

    def input_rect(self, i, out):
        ax = self.attrs["axis"]
        offs = self.__dict__.get("_offsets")
        if offs is None or len(offs) != len(self.inputs) + 1:  # prefix sums, once
            offs = [0]
            for r in self.inputs:
                offs.append(offs[-1] + r.shape[ax])
            self._offsets = offs
        off = offs[i]
        n = self.inputs[i].shape[ax]
        lo, hi = max(out.lo[ax] - off, 0), min(out.hi[ax] - off, n)
        return replace_dim(out, ax, lo, max(lo, hi))

    def flops(self, out):
        return 0.0, 0.0


@register
class Add(Operator):
    kind = "add"
    arity = 2

    def infer_shape(self):
        a, b = self.inputs[0].shape, self.inputs[1].shape
        if a != b:
            raise GraphError(f"{self.kind} {self.name!r}: input shapes {a} and {b} differ")
        _check_activation(self.name, self.attrs.get("activation"))
        return a


@register
class Multiply(Add):
    kind = "multiply"


@register
class Softmax(Operator):
    """Softmax over the last dim. With ``loss=True`` it is softmax +
    cross-entropy: it ends the forward pass, and splits the sample dim only.
    ``causal=True`` (attention scores ``(..., S, S)``) masks the entries
    above the diagonal: position ``i`` attends to keys ``j <= i``."""

    kind = "softmax"

    def infer_dims(self):
        n = len(self.output_shape)
        if self.attrs.get("loss", True):
            return ("sample",) + (None,) * (n - 1)
        return ("sample",) + ("attribute",) * (n - 2) + (None,)

    def flops(self, out):
        return 5.0 * out.volume, 3.0 * out.volume

    @property
    def is_loss(self) -> bool:
        return bool(self.attrs.get("loss", True))


@register
class BatchMatmul(Operator):
    """``(N, ..., M, K) @ (N, ..., K, P) -> (N, ..., M, P)``; with
    ``transpose_b`` the second input is ``(N, ..., P, K)``. The leading dims
    after N (attention heads) are attribute dims like M and P."""

    kind = "batch_matmul"
    arity = 2

    def infer_shape(self):
        a, b = self.inputs[0].shape, self.inputs[1].shape
        tb = self.attrs.get("transpose_b", False)
        kb, p = (b[-1], b[-2]) if tb else (b[-2], b[-1])
        if len(a) < 3 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != kb:
            raise GraphError(f"batch_matmul {self.name!r}: shapes {a} and {b} do not "
                             f"multiply (transpose_b={tb})")
        return a[:-1] + (p,)

    def input_rect(self, i, out):
        k, n = self.inputs[0].shape[-1], out.ndim
        if i == 0:
            return replace_dim(out, n - 1, 0, k)
        lead_lo, lead_hi = out.lo[:-2], out.hi[:-2]
        if self.attrs.get("transpose_b", False):
            return Rect(lead_lo + (out.lo[-1], 0), lead_hi + (out.hi[-1], k))
        return Rect(lead_lo + (0, out.lo[-1]), lead_hi + (k, out.hi[-1]))

    def flops(self, out):
        f = 2.0 * out.volume * self.inputs[0].shape[-1]
        return f, 2.0 * f
