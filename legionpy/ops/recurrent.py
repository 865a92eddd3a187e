"""Sequence operators: embedding, LSTM cell, Luong attention.

LSTM representation (one cell = one time step, as FlexFlow's NMT): the op
takes ``x_t`` (N, I) and optionally the previous state ``(N, 2, H)`` and
outputs its state ``[h_t; c_t]`` stacked as ``(N, 2, H)`` (dims: N sample,
the stack dim not parallelizable, H parameter). Consumers read ``state.h`` /
``state.c``, views of that one output (:class:`~legionpy.ops.base.TensorRef`).
All cells of a layer hold the same :class:`Parameter` objects, so the task
graph reduces their weight gradients onto one home per weight tile. Weights
are laid out gate-major so a hidden-unit range is one rect: ``w_ih`` (4, H,
I), ``w_hh`` (4, H, H), ``bias`` (4, H), gates in the order i, f, g, o.

Why one op per step rather than one whole-layer op with a time dimension:
the search assigns a ParallelConfig (degrees AND devices) per op. With a
cell per step, layer ``l``'s cells can live on device ``l`` while step
``t + 1`` of layer ``l`` runs beside step ``t`` of layer ``l + 1``: the
wavefront pipelining of the paper's Figure 14 (NMT), found by the search
from per-op placements alone, and the simulator sees every step's tasks and
the hidden-state copies between devices. A whole-layer op would have to run
as one task per tile over all T steps (the recurrence forbids splitting
time), so layers could only be placed, not overlapped, unless the op grew a
time-pipelining knob the search and the simulator would both special-case.
Sharing one Parameter across the steps keeps the weights (and their update
task) single, so the search cannot give two steps diverging copies.

The embedding's gradient is applied sparsely: see
:mod:`legionpy.nn.execution` (the update task touches only nonzero rows).

A cell tile with hidden units ``[a, b)`` reads all of ``h_{t-1}`` (for the
recurrent matmul) and, because a rect cannot be ``h[:, :] + c[:, a:b]``, all
of ``c_{t-1}`` as well: a slight over-count of the bytes a split cell moves.
"""

from __future__ import annotations

from ..errors import GraphError
from ..geometry import Rect
from .base import Operator, reduce_part, register, replace_dim

__all__ = ["TiedDense", "Embedding", "LSTMCell", "Attention"]


@register
class Embedding(Operator):
    """Token ids (N,) or (N, S) -> vectors (N, [S,] D). Param ``weight``
    (vocab, D); splitting D splits the table's columns."""

    kind = "embedding"

    def infer_shape(self):
        return self.inputs[0].shape + (self.attrs["dim"],)

    def infer_dims(self):
        n = len(self.output_shape)
        return ("sample",) + ("attribute",) * (n - 2) + ("parameter",)

    def make_params(self):
        return {"weight": ((self.attrs["vocab"], self.attrs["dim"]),
                           {"kind": "normal", "std": 0.05})}

    def input_rect(self, i, out):
        return Rect(out.lo[:-1], out.hi[:-1])

    def weight_rect(self, pname, out):
        return Rect((0, out.lo[-1]), (self.attrs["vocab"], out.hi[-1]))

    def reduce_extent(self):
        """The vocabulary: slice ``r`` looks up the ids in its rows (the others
        give zeros), the output is the sum of the slices (PaSE's split)."""
        return self.attrs["vocab"]

    def part_weight_rect(self, pname, out, r=0, n=1):
        return reduce_part(self.weight_rect(pname, out), 0, self.attrs["vocab"], r, n)

    def flops(self, out):
        return float(out.volume), float(out.volume)

    def bytes(self, out):
        b = 2.0 * out.volume * self.itemsize
        return b, 2.0 * b


@register
class TiedDense(Operator):
    """The output projection tied to an embedding (Press & Wolf, "Using the
    Output Embedding to Improve Language Models", EACL 2017; GPT-2):
    ``y = x @ weight.T`` with ``weight`` the embedding's (vocab, dim) table,
    shared (``share=`` the embedding). An output-feature (vocabulary) tile
    reads the table's rows, so the search splits the vocabulary like a
    dense layer's units; both uses reduce into the one parameter's gradient."""

    kind = "tied_dense"

    def infer_shape(self):
        return self.inputs[0].shape[:-1] + (self.attrs["vocab"],)

    def infer_dims(self):
        n = len(self.output_shape)
        return ("sample",) + ("attribute",) * (n - 2) + ("parameter",)

    def make_params(self):
        return {"weight": ((self.attrs["vocab"], self.inputs[0].shape[-1]),
                           {"kind": "normal", "std": 0.05})}

    def input_rect(self, i, out):
        return Rect(out.lo[:-1] + (0,), out.hi[:-1] + (self.inputs[0].shape[-1],))

    def weight_rect(self, pname, out):
        return Rect((out.lo[-1], 0), (out.hi[-1], self.inputs[0].shape[-1]))

    def reduce_extent(self):
        """The input features (the table's columns): slice ``r`` computes
        ``x[..., slice] @ W[:, slice].T``, the output is their sum (no bias,
        so every slice is alike; tests/runtime/test_gpt_tied.py)."""
        return self.inputs[0].shape[-1]

    def part_input_rect(self, i, out, r=0, n=1):
        q = self.input_rect(i, out)
        return reduce_part(q, q.ndim - 1, self.inputs[0].shape[-1], r, n)

    def part_weight_rect(self, pname, out, r=0, n=1):
        return reduce_part(self.weight_rect(pname, out), 1, self.inputs[0].shape[-1], r, n)

    def flops(self, out):
        f = 2.0 * out.volume * self.inputs[0].shape[-1]
        return f, 2.0 * f


@register
class LSTMCell(Operator):
    """One LSTM time step; see the module docstring for the state layout."""

    kind = "lstm"
    arity = None

    def infer_shape(self):
        if len(self.inputs) not in (1, 2):
            raise GraphError(f"lstm {self.name!r} takes x and optionally a state, "
                             f"got {len(self.inputs)} inputs")
        x, h = self.inputs[0].shape, self.attrs["units"]
        if len(x) != 2:
            raise GraphError(f"lstm {self.name!r} needs x of shape (N, I), got {x}")
        if len(self.inputs) == 2 and self.inputs[1].shape != (x[0], 2, h):
            raise GraphError(f"lstm {self.name!r}: state shape {self.inputs[1].shape} is "
                             f"not (N, 2, units) = {(x[0], 2, h)}")
        return (x[0], 2, h)

    def infer_dims(self):
        return ("sample", None, "parameter")

    def make_params(self):
        h, i = self.attrs["units"], self.inputs[0].shape[1]
        init = {"kind": "uniform", "bound": h ** -0.5}
        return {"w_ih": ((4, h, i), init), "w_hh": ((4, h, h), init),
                "bias": ((4, h), {"kind": "zeros"})}

    def input_rect(self, i, out):
        if i == 0:
            return Rect((out.lo[0], 0), (out.hi[0], self.inputs[0].shape[1]))
        return Rect((out.lo[0], 0, 0), (out.hi[0], 2, self.attrs["units"]))

    def weight_rect(self, pname, out):
        return replace_dim(self.params[pname].rect, 1, out.lo[2], out.hi[2])

    def flops(self, out):
        n, hs = out.shape[0], out.shape[2]
        f = 2.0 * n * 4 * hs * (self.inputs[0].shape[1] + self.attrs["units"]) + 12.0 * n * hs
        return f, 2.0 * f


@register
class Attention(Operator):
    """Luong "general" attention: inputs ``query`` (N, H) then T encoder
    states (N, H) each; ``score_t = q W_a k_t``, ``ctx = sum softmax(score)_t
    k_t``, output ``tanh(W_c [ctx; q])`` (N, H). Params ``w_a`` (H, H), ``w_c``
    (H, 2H); splitting the output's H splits ``w_c`` rows."""

    kind = "attention"
    arity = None

    def infer_shape(self):
        q = self.inputs[0].shape
        if len(self.inputs) < 2 or len(q) != 2:
            raise GraphError(f"attention {self.name!r} needs a (N, H) query and at least "
                             f"one key, got {[r.shape for r in self.inputs]}")
        for r in self.inputs[1:]:
            if r.shape != q:
                raise GraphError(f"attention {self.name!r}: key {r.name} has shape "
                                 f"{r.shape}, query {q}")
        return q

    def infer_dims(self):
        return ("sample", "parameter")

    def make_params(self):
        h = self.inputs[0].shape[1]
        return {"w_a": ((h, h), {"kind": "glorot_uniform", "fan_in": h, "fan_out": h}),
                "w_c": ((h, 2 * h), {"kind": "glorot_uniform", "fan_in": 2 * h,
                                     "fan_out": h})}

    def input_rect(self, i, out):
        return Rect((out.lo[0], 0), (out.hi[0], self.inputs[0].shape[1]))

    def weight_rect(self, pname, out):
        if pname == "w_a":
            return self.params[pname].rect
        return replace_dim(self.params[pname].rect, 0, out.lo[1], out.hi[1])

    def flops(self, out):
        n, hs = out.shape
        h, t = self.inputs[0].shape[1], len(self.inputs) - 1
        f = 2.0 * n * h * h + 4.0 * n * t * h + 2.0 * n * hs * 2 * h
        return f, 2.0 * f
