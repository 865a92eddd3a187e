"""Operator base class, tensor references, parameters and the registry.

An operator (paper section 4, "SOAP") is described by its *output* tensor: a
parallel config partitions the output, and every rule here maps one output
tile (a :class:`~legionpy.geometry.Rect`) to what the tile needs:

- ``input_rect(i, out)``: the rect of input ``i`` that tile ``out`` reads
  (halos for convolution and pooling, full feature rows for dense);
- ``weight_rect(pname, out)``: the rect of parameter ``pname`` it reads;
- ``flops(out)`` / ``bytes(out)``: (forward, backward) work in FLOPs and bytes.

``dims[d]`` labels output dim ``d`` as in the paper's Table 1: ``"sample"``,
``"attribute"`` (splitting it needs no parameter split), ``"parameter"``
(splitting it splits the parameters) or ``None`` (not parallelizable).

Parameters are first-class: several operators may hold the same
:class:`Parameter` (the LSTM cells of one layer share weights across time
steps), and the task graph keys weight tiles by ``(parameter, rect)``.

The input-gradient rect of a tile equals its ``input_rect`` (what a tile read
in forward is what it writes a gradient for in backward), so no separate rule
exists for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import GraphError
from ..geometry import Rect

__all__ = ["Operator", "Parameter", "TensorRef", "REGISTRY", "register", "op_class"]

REGISTRY: dict[str, type[Operator]] = {}


def register(cls: type[Operator]) -> type[Operator]:
    """Class decorator: add an operator class to the registry under ``cls.kind``."""
    if not cls.kind:
        raise GraphError(f"operator class {cls.__name__} has no kind")
    REGISTRY[cls.kind] = cls
    return cls


def op_class(kind: str) -> type[Operator]:
    """The operator class registered under ``kind``."""
    try:
        return REGISTRY[kind]
    except KeyError:
        raise GraphError(
            f"unknown operator kind {kind!r}; known kinds: {sorted(REGISTRY)}"
        ) from None


@dataclass(frozen=True, eq=False)
class Parameter:
    """A trainable tensor: ``name`` (unique in a graph), ``shape``, dtype and an
    initialiser spec such as ``{"kind": "glorot_uniform", "fan_in": 9216,
    "fan_out": 4096}``, ``{"kind": "zeros"}`` or ``{"kind": "ones"}``. Compared
    by identity, so two ops share a parameter only when they hold this object."""

    name: str
    shape: tuple[int, ...]
    init: dict = field(default_factory=lambda: {"kind": "zeros"})
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def rect(self) -> Rect:
        return Rect.from_shape(self.shape)


@dataclass(frozen=True, eq=False)
class TensorRef:
    """The output of operator ``op``, or a view of it.

    ``view`` is ``None`` or ``(axis, index)``: the output with ``axis`` fixed to
    ``index`` (dropped). LSTM cells output their state ``[h; c]`` stacked as
    ``(N, 2, H)``; ``state.h`` is the view ``(1, 0)`` of shape ``(N, H)``.
    Consumers compute rects in view coordinates; :meth:`to_base` maps them to
    the producer's output."""

    op: Operator
    view: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        s = self.op.output_shape
        if self.view is None:
            return s
        axis, _ = self.view
        return s[:axis] + s[axis + 1:]

    @property
    def dtype(self) -> str:
        return self.op.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def name(self) -> str:
        if self.view is None:
            return self.op.name
        return f"{self.op.name}[{self.view[0]}={self.view[1]}]"

    def select(self, axis: int, index: int) -> TensorRef:
        """A view with ``axis`` fixed to ``index``."""
        if self.view is not None:
            raise GraphError(f"cannot take a view of the view {self.name}")
        s = self.op.output_shape
        if not (0 <= axis < len(s)) or not (0 <= index < s[axis]):
            raise GraphError(f"select(axis={axis}, index={index}) is outside {self.name} {s}")
        return TensorRef(self.op, (axis, index))

    @property
    def h(self) -> TensorRef:
        """Hidden state of an LSTM state tensor ``(N, 2, H)``."""
        return self.select(1, 0)

    @property
    def c(self) -> TensorRef:
        """Cell state of an LSTM state tensor ``(N, 2, H)``."""
        return self.select(1, 1)

    def to_base(self, rect: Rect) -> Rect:
        """Map a rect in view coordinates to the producer's output coordinates."""
        if self.view is None:
            return rect
        axis, index = self.view
        return Rect(rect.lo[:axis] + (index,) + rect.lo[axis:],
                    rect.hi[:axis] + (index + 1,) + rect.hi[axis:])

    def __repr__(self) -> str:
        return f"TensorRef({self.name}, shape={self.shape})"


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


class Operator:
    """Base class of every operator. Subclasses set ``kind`` and override
    :meth:`infer_shape`, :meth:`infer_dims`, :meth:`make_params`, the rect
    rules and :meth:`flops` where the defaults (element-wise) do not fit.

    Attributes: ``name``, ``kind``, ``inputs`` (list of TensorRef), ``attrs``
    (dict of plain values), ``output_shape``, ``dtype``, ``dims``, ``params``
    (dict param-name -> Parameter), ``index`` (position in its graph)."""

    kind: ClassVar[str] = ""
    #: number of inputs, or None for any number >= 1
    arity: ClassVar[int | None] = 1

    def __init__(self, name: str, inputs: Sequence[TensorRef], *,
                 shared: dict[str, Parameter] | None = None, dtype: str = "float32",
                 **attrs: Any) -> None:
        self.name = name
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.dtype = dtype
        self.index = -1
        if self.arity is not None and len(self.inputs) != self.arity:
            raise GraphError(f"{self.kind} {name!r} takes {self.arity} input(s), "
                             f"got {len(self.inputs)}")
        self.output_shape = tuple(int(s) for s in self.infer_shape())
        if any(s < 1 for s in self.output_shape):
            raise GraphError(f"{self.kind} {name!r} has an empty output shape "
                             f"{self.output_shape} (inputs {[r.shape for r in self.inputs]})")
        self.dims = tuple(self.infer_dims())
        self.params: dict[str, Parameter] = {}
        for pname, (shape, init) in self.make_params().items():
            if shared and pname in shared:
                p = shared[pname]
                if tuple(p.shape) != tuple(shape):
                    raise GraphError(f"{name!r} shares parameter {p.name!r} of shape "
                                     f"{p.shape} but needs {tuple(shape)} for {pname!r}")
            else:
                p = Parameter(f"{name}.{pname}", tuple(int(s) for s in shape), init)
            self.params[pname] = p

    # -- rules to override ---------------------------------------------------
    def infer_shape(self) -> tuple[int, ...]:
        return self.inputs[0].shape

    def infer_dims(self) -> tuple[str | None, ...]:
        n = len(self.output_shape)
        return ("sample",) + ("attribute",) * (n - 1)

    def make_params(self) -> dict[str, tuple[tuple[int, ...], dict]]:
        return {}

    def input_rect(self, i: int, out: Rect) -> Rect:
        """Rect of input ``i`` read by the output tile ``out`` (element-wise default)."""
        return out

    def weight_rect(self, pname: str, out: Rect) -> Rect:
        """Rect of parameter ``pname`` read by the output tile ``out`` (whole by default)."""
        return self.params[pname].rect

    # -- reduction-dim splits (issue 18; ParallelConfig.reduce) ----------------
    def reduce_extent(self) -> int:
        """Size of the op's reduction dim a config may split (``ParallelConfig.
        reduce``: every point computes a partial output from one slice and
        the output is their sum), or 0 when it has none (the default)."""
        return 0

    def part_input_rect(self, i: int, out: Rect, r: int = 0, n: int = 1) -> Rect:
        """Rect of input ``i`` read by point ``(out, r)`` of a config with
        ``reduce = n`` (``n == 1``: :meth:`input_rect`)."""
        return self.input_rect(i, out)

    def part_weight_rect(self, pname: str, out: Rect, r: int = 0, n: int = 1) -> Rect:
        """Rect of parameter ``pname`` read by point ``(out, r)`` (``n == 1``:
        :meth:`weight_rect`)."""
        return self.weight_rect(pname, out)

    def flops(self, out: Rect) -> tuple[float, float]:
        """(forward, backward) floating-point operations of the tile ``out``."""
        v = float(out.volume)
        return v, 2.0 * v

    def bytes(self, out: Rect) -> tuple[float, float]:
        """(forward, backward) bytes touched by the tile: inputs read, weights read,
        output written; backward reads and writes about twice as much."""
        b = out.volume * _itemsize(self.dtype)
        for i, ref in enumerate(self.inputs):
            b += self.input_rect(i, out).volume * _itemsize(ref.dtype)
        for pname, p in self.params.items():
            b += self.weight_rect(pname, out).volume * _itemsize(p.dtype)
        return float(b), 2.0 * float(b)

    # -- derived ---------------------------------------------------------------
    @property
    def output_rect(self) -> Rect:
        return Rect.from_shape(self.output_shape)

    @property
    def itemsize(self) -> int:
        return _itemsize(self.dtype)

    @property
    def parallel_dims(self) -> tuple[int, ...]:
        """Indices of the output dims that may be split."""
        return tuple(d for d, lab in enumerate(self.dims) if lab is not None)

    @property
    def has_backward(self) -> bool:
        """False for ops with nothing to differentiate (inputs)."""
        return True

    @property
    def is_loss(self) -> bool:
        return False

    def signature(self) -> str:
        """Stable text of kind + attrs + input shapes (cost-cache keys)."""
        attrs = ",".join(f"{k}={self.attrs[k]!r}" for k in sorted(self.attrs))
        ins = ";".join(str(r.shape) for r in self.inputs)
        return f"{self.kind}({attrs})[{ins}]"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, out={self.output_shape}, dims={self.dims})"


def reduce_slice(n: int, r: int, parts: int) -> tuple[int, int]:
    """``[lo, hi)`` of slice ``r`` of ``parts`` equal slices of an extent ``n``."""
    return r * n // parts, (r + 1) * n // parts


def reduce_part(rect: Rect, d: int, extent: int, r: int, n: int) -> Rect:
    """``rect`` with dim ``d`` narrowed to slice ``r`` of ``n`` equal slices of
    the reduction extent ``extent`` (``rect`` itself when ``n == 1``)."""
    return rect if n == 1 else replace_dim(rect, d, *reduce_slice(extent, r, n))


def bias_part(rect: Rect, r: int, n: int) -> Rect:
    """A bias under a reduction split is added once, by the first slice: the
    other slices read none of it (an empty rect)."""
    return rect if n == 1 or r == 0 else replace_dim(rect, 0, rect.lo[0], rect.lo[0])


def replace_dim(rect: Rect, d: int, lo: int, hi: int) -> Rect:
    """``rect`` with dim ``d`` set to ``[lo, hi)``."""
    rl, rh = list(rect.lo), list(rect.hi)
    rl[d], rh[d] = lo, hi
    return Rect(tuple(rl), tuple(rh))


def window(lo: int, hi: int, k: int, s: int, p: int, n: int) -> tuple[int, int]:
    """Input rows read by output rows ``[lo, hi)`` of a sliding window (kernel
    ``k``, stride ``s``, padding ``p``) over an input of extent ``n``, clipped."""
    a = lo * s - p
    b = (hi - 1) * s - p + k
    return max(0, a), min(n, b)
