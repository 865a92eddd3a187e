"""The operator graph (paper section 3: the computation graph the search and
the simulator take).

:class:`Graph` has builder methods named like the layer API of DESIGN.md
section 3 (``input``, ``conv2d``, ``pool2d``, ``dense``, ``flat``, ...), each
returning a :class:`~legionpy.ops.TensorRef` with ``.shape``, so ``nn.Model``
can delegate to it and the zoo builders work with either. No arrays are
allocated: a full-size ResNet-101 graph is a few hundred small objects.

Ops are stored in creation order, which is a topological order (an op can
only consume refs that already exist).

>>> g = Graph(batch_size=8)
>>> x = g.input((3, 32, 32))
>>> y = g.dense(g.flat(g.conv2d(x, 16, 3, padding=1, activation="relu")), 10)
>>> g.softmax(y).shape
(8, 10)
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import ops as O
from ..errors import GraphError
from ..ops import Operator, Parameter, TensorRef

__all__ = ["Graph", "Edge", "sparse_params"]


def sparse_params(graph: Graph) -> set[str]:
    """The embedding tables updated sparsely (the rows a batch used):
    parameters of embedding ops that no other kind of op uses (a table tied
    to an output projection gets a dense gradient: updated densely)."""
    emb = {p.name for op in graph.ops if op.kind == "embedding" for p in op.params.values()}
    return emb - {p.name for op in graph.ops if op.kind != "embedding"
                  for p in op.params.values()}


class Edge(tuple):
    """``(producer op index, consumer op index, input position)``."""

    __slots__ = ()


class Graph:
    """An operator graph under construction. ``batch_size`` is prepended to
    every ``input`` shape."""

    def __init__(self, batch_size: int = 64, name: str = "graph") -> None:
        if int(batch_size) < 1:
            raise GraphError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.name = name
        self.ops: list[Operator] = []
        self._by_name: dict[str, Operator] = {}
        self._counts: dict[str, int] = {}

    # -- structure ---------------------------------------------------------
    def add_op(self, op: Operator) -> TensorRef:
        """Append an already-constructed operator; returns its output ref."""
        if op.name in self._by_name:
            raise GraphError(f"duplicate operator name {op.name!r} in graph {self.name!r}")
        for r in op.inputs:
            if not (0 <= r.op.index < len(self.ops)) or self.ops[r.op.index] is not r.op:
                raise GraphError(f"{op.name!r} consumes {r.name!r}, which is not in this graph")
        op.index = len(self.ops)
        self.ops.append(op)
        self._by_name[op.name] = op
        return TensorRef(op)

    def op(self, name: str) -> Operator:
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no operator {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def edges(self) -> list[Edge]:
        """Every tensor edge, consumer-major."""
        return [Edge((r.op.index, o.index, i)) for o in self.ops for i, r in enumerate(o.inputs)]

    def consumers(self, op: Operator | str) -> list[tuple[Operator, int]]:
        """``(consumer, input position)`` pairs reading ``op``'s output."""
        op = self.op(op) if isinstance(op, str) else op
        return [(o, i) for o in self.ops for i, r in enumerate(o.inputs) if r.op is op]

    def edge_bytes(self, edge: Edge) -> int:
        """Bytes of the tensor (view) an edge carries, whole."""
        p, c, i = edge
        ref = self.ops[c].inputs[i]
        n = 1
        for s in ref.shape:
            n *= s
        return n * self.ops[p].itemsize

    def parameters(self) -> dict[str, Parameter]:
        """Every distinct parameter, by name, in first-use order."""
        out: dict[str, Parameter] = {}
        for o in self.ops:
            for p in o.params.values():
                prev = out.setdefault(p.name, p)
                if prev is not p:
                    raise GraphError(f"two different parameters are named {p.name!r}")
        return out

    def num_parameters(self) -> int:
        """Total number of trainable scalars (shared parameters counted once)."""
        return sum(p.size for p in self.parameters().values())

    def summary(self) -> str:
        lines = [f"{self.name}: {len(self.ops)} ops, {self.num_parameters():,} parameters"]
        for o in self.ops:
            lines.append(f"  {o.name:<28} {o.kind:<12} {o.output_shape}")
        return "\n".join(lines)

    # -- builders ------------------------------------------------------------
    def _name(self, kind: str, name: str | None) -> str:
        if name is not None:
            return name
        while True:
            k = self._counts.get(kind, 0)
            self._counts[kind] = k + 1
            cand = f"{kind}_{k}"
            if cand not in self._by_name:
                return cand

    def _make(self, cls: type[Operator], kind: str, inputs: Sequence[TensorRef],
              name: str | None, share=None, **attrs) -> TensorRef:
        shared = None
        if share is not None:
            shared = share.op.params if isinstance(share, TensorRef) else (
                share.params if isinstance(share, Operator) else dict(share))
        return self.add_op(cls(self._name(kind, name), inputs, shared=shared, **attrs))

    def input(self, shape: Sequence[int], dtype: str = "float32",
              name: str | None = None) -> TensorRef:
        """A model input; ``shape`` excludes the batch dim."""
        return self._make(O.Input, "input", [], name, dtype=dtype,
                          shape=(self.batch_size,) + tuple(int(s) for s in shape))

    def conv2d(self, x, out_channels: int, kernel, stride=1, padding=0, groups: int = 1,
               activation: str | None = None, bias: bool = True,
               name: str | None = None, dilation=1) -> TensorRef:
        """``dilation``: kernel taps that far apart (atrous convolution)."""
        extra = {} if dilation in (1, (1, 1), [1, 1]) else {"dilation": dilation}
        return self._make(O.Conv2D, "conv2d", [x], name, out_channels=int(out_channels),
                          kernel=kernel, stride=stride, padding=padding, groups=int(groups),
                          activation=activation, bias=bool(bias), **extra)

    def pool2d(self, x, kernel, stride=None, padding=0, pool_type: str = "max",
               name: str | None = None) -> TensorRef:
        return self._make(O.Pool2D, "pool2d", [x], name, kernel=kernel, stride=stride,
                          padding=padding, pool_type=pool_type)

    def dense(self, x, units: int, activation: str | None = None, bias: bool = True,
              share=None, name: str | None = None) -> TensorRef:
        """``share``: a ref/op (or dict) whose parameters this layer reuses."""
        return self._make(O.Dense, "dense", [x], name, share, units=int(units),
                          activation=activation, bias=bool(bias))

    def flat(self, x, name: str | None = None) -> TensorRef:
        return self._make(O.Flat, "flat", [x], name)

    def reshape(self, x, shape: Sequence[int], name: str | None = None) -> TensorRef:
        return self._make(O.Reshape, "reshape", [x], name, shape=tuple(shape))

    def relu(self, x, name: str | None = None) -> TensorRef:
        return self._make(O.Relu, "relu", [x], name)

    def sigmoid(self, x, name: str | None = None) -> TensorRef:
        return self._make(O.Sigmoid, "sigmoid", [x], name)

    def tanh(self, x, name: str | None = None) -> TensorRef:
        return self._make(O.Tanh, "tanh", [x], name)

    def gelu(self, x, approximate: str = "tanh", name: str | None = None) -> TensorRef:
        """GELU: ``approximate="tanh"`` (default) or ``"none"`` (exact, erf)."""
        if approximate not in ("tanh", "none"):
            raise GraphError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
        attrs = {} if approximate == "tanh" else {"approximate": "none"}
        return self._make(O.Gelu, "gelu", [x], name, **attrs)

    def batch_norm(self, x, relu: bool = False, momentum: float = 0.1, eps: float = 1e-5,
                   name: str | None = None) -> TensorRef:
        """Batch normalisation (optionally fused relu). ``momentum``: weight of
        each training batch's statistics in the running ones (PyTorch's
        convention: ``running = (1 - momentum) * running + momentum * batch``),
        which ``predict``/``evaluate`` normalise with; ``eps`` as PyTorch."""
        return self._make(O.BatchNorm, "batch_norm", [x], name, relu=bool(relu),
                          momentum=float(momentum), eps=float(eps))

    def dropout(self, x, rate: float = 0.5, seed: int = 0, name: str | None = None):
        return self._make(O.Dropout, "dropout", [x], name, rate=float(rate), seed=int(seed))

    def concat(self, xs: Sequence[TensorRef], axis: int = 1, name: str | None = None):
        return self._make(O.Concat, "concat", list(xs), name, axis=int(axis))

    def add(self, a, b, activation: str | None = None, name: str | None = None):
        """Element-wise ``a + b`` (optionally fused activation)."""
        return self._make(O.Add, "add", [a, b], name, activation=activation)

    def multiply(self, a, b, name: str | None = None) -> TensorRef:
        return self._make(O.Multiply, "multiply", [a, b], name)

    def softmax(self, x, loss: bool = True, causal: bool = False,
                name: str | None = None) -> TensorRef:
        """Softmax over the last dim; ``loss=True`` adds cross-entropy and ends
        the forward pass; ``causal=True`` masks keys after each query row."""
        attrs = {"causal": True} if causal else {}
        return self._make(O.Softmax, "softmax", [x], name, loss=bool(loss), **attrs)

    def embedding(self, x, vocab: int, dim: int, share=None, name: str | None = None):
        return self._make(O.Embedding, "embedding", [x], name, share, vocab=int(vocab),
                          dim=int(dim))

    def batch_matmul(self, a, b, transpose_b: bool = False, name: str | None = None):
        return self._make(O.BatchMatmul, "batch_matmul", [a, b], name,
                          transpose_b=bool(transpose_b))

    def tied_dense(self, x, embedding, name: str | None = None) -> TensorRef:
        """``x @ E.T``: the output projection sharing ``embedding``'s (vocab,
        dim) table (a ref or op of :meth:`embedding`)."""
        op = embedding.op if isinstance(embedding, TensorRef) else embedding
        return self._make(O.TiedDense, "tied_dense", [x], name, embedding,
                          vocab=int(op.attrs["vocab"]))

    def layer_norm(self, x, eps: float = 1e-5, name: str | None = None) -> TensorRef:
        """Layer normalisation over the last dim (params gamma, beta)."""
        return self._make(O.LayerNorm, "layer_norm", [x], name, eps=float(eps))

    def transpose(self, x, perm: Sequence[int], name: str | None = None) -> TensorRef:
        """Permute dims (``perm[0] == 0``: samples stay first)."""
        return self._make(O.Transpose, "transpose", [x], name, perm=tuple(perm))

    def slice(self, x, axis: int, start: int, end: int, name: str | None = None) -> TensorRef:
        """``x[..., start:end, ...]`` along ``axis``."""
        return self._make(O.Slice, "slice", [x], name, axis=int(axis), start=int(start),
                          end=int(end))

    def scale(self, x, alpha: float, name: str | None = None) -> TensorRef:
        """``alpha * x``."""
        return self._make(O.Scale, "scale", [x], name, alpha=float(alpha))

    def add_bias(self, x, ndim: int = 1, name: str | None = None) -> TensorRef:
        """``x`` plus a parameter over its last ``ndim`` dims (bias, or a learned
        positional table with ``ndim=2`` on (N, S, D))."""
        return self._make(O.AddBias, "add_bias", [x], name, ndim=int(ndim))

    def layer_scale(self, x, shape: Sequence[int], init: float = 1.0,
                    name: str | None = None) -> TensorRef:
        """``x * gamma``, a trained parameter of ``shape`` broadcast over x's
        trailing dims (ConvNeXt's per-channel ``(C, 1, 1)`` layer scale)."""
        return self._make(O.LayerScale, "layer_scale", [x], name,
                          shape=tuple(int(s) for s in shape), init=float(init))

    def concat_param(self, x, size: int = 1, axis: int = 1, first: bool = True,
                     name: str | None = None) -> TensorRef:
        """``x`` with a trained parameter of ``size`` rows concatenated along
        ``axis`` (before x if ``first``), the same for every sample: ViT's
        class token on (N, S, D) is ``concat_param(x, 1, axis=1)``."""
        return self._make(O.ConcatParam, "concat_param", [x], name, size=int(size),
                          axis=int(axis), first=bool(first))

    def positional_encoding(self, x, name: str | None = None) -> TensorRef:
        """``x`` (N, S, D) plus the fixed sinusoidal table (no parameters)."""
        return self._make(O.PositionalEncoding, "positional_encoding", [x], name)

    def unary(self, x, fn: str, name: str | None = None, **params) -> TensorRef:
        """Element-wise ``fn(x)``: exp, log, sqrt, rsqrt, reciprocal, neg, abs,
        erf, pow (``exponent``), clip (``min``, ``max``: ReLU6 is 0, 6),
        hardsigmoid (``alpha``, ``beta``), hardswish, silu, mish, softplus,
        leaky_relu / elu (``alpha``), sin, cos."""
        return self._make(O.Unary, "unary", [x], name, fn=fn, **params)

    def binary(self, a, b, fn: str, name: str | None = None, cond=None) -> TensorRef:
        """``fn(a, b)`` with numpy broadcasting (add, sub, mul, div, pow, max,
        min, where): ``a`` and ``b`` are activations of one rank, or one of
        them a fixed numpy constant (no parameter: a mask). ``fn="where"``
        takes ``a`` where the constant ``cond`` holds, else ``b``."""
        import numpy as np

        ins, attrs = [v for v in (a, b) if isinstance(v, TensorRef)], {"fn": fn}
        for i, v in enumerate((a, b)):
            if not isinstance(v, TensorRef):
                attrs.update(const=np.asarray(v, np.float32), const_first=i == 0)
        if cond is not None:
            attrs["cond"] = np.asarray(cond, bool)
        return self._make(O.Binary, "binary", ins, name, **attrs)

    def reduce(self, x, axes: Sequence[int], fn: str = "mean", keepdims: bool = True,
               name: str | None = None) -> TensorRef:
        """``fn`` (mean, sum, max) of ``x`` over ``axes`` (not the batch dim)."""
        return self._make(O.Reduce, "reduce", [x], name, fn=fn, axes=tuple(axes),
                          keepdims=bool(keepdims))

    def pad(self, x, pads: Sequence[tuple[int, int]], value: float = 0.0,
            name: str | None = None) -> TensorRef:
        """Pad every dim ``d`` by ``pads[d] = (before, after)`` with ``value``."""
        return self._make(O.Pad, "pad", [x], name, pads=tuple(tuple(p) for p in pads),
                          value=float(value))

    def cast(self, x, to: str = "float32", name: str | None = None) -> TensorRef:
        """``x`` as dtype ``to`` (float32 or int32)."""
        return self._make(O.Cast, "cast", [x], name, to=str(to))

    def gather(self, x, index, name: str | None = None) -> TensorRef:
        """``y[n, p...] = x[n].flat[index[p...]]`` for a fixed int array ``index``."""
        return self._make(O.Gather, "gather", [x], name, index=index)

    def multihead_attention(self, x, heads: int, causal: bool = False,
                            name: str = "mha") -> TensorRef:
        """Multi-head self-attention of ``x`` (N, S, D) as PyTorch computes it:
        q, k, v projections (D, D) with biases, ``(N, S, D) -> (N, h, S, D/h)``,
        ``softmax(q k^T / sqrt(D/h))`` (optionally causal), context back to
        (N, S, D), output projection. The head dim (dim 1 of the scores,
        softmax and context) is an attribute dim the search may split."""
        n, s, d = x.shape
        if d % heads:
            raise GraphError(f"multihead_attention {name!r}: d_model={d} is not divisible "
                             f"by heads={heads}")
        hd = d // heads

        def split(t, what):
            r = self.reshape(t, (s, heads, hd), name=f"{name}.{what}_split")
            return self.transpose(r, (0, 2, 1, 3), name=f"{name}.{what}_heads")

        q, k, v = (split(self.dense(x, d, name=f"{name}.{w}"), w) for w in "qkv")
        q = self.scale(q, hd ** -0.5, name=f"{name}.q_scaled")
        sc = self.batch_matmul(q, k, transpose_b=True, name=f"{name}.scores")
        p = self.softmax(sc, loss=False, causal=causal, name=f"{name}.probs")
        c = self.transpose(self.batch_matmul(p, v, name=f"{name}.context"), (0, 2, 1, 3),
                           name=f"{name}.merge")
        c = self.reshape(c, (s, d), name=f"{name}.concat")
        return self.dense(c, d, name=f"{name}.out")

    def lstm(self, x, state: TensorRef | None, units: int, share=None,
             name: str | None = None) -> TensorRef:
        """One LSTM time step. ``state``: previous ``(N, 2, units)`` state or
        None (zeros). ``share``: an earlier cell of the same layer. Returns the
        new state; use ``.h`` for the hidden output."""
        ins = [x] if state is None else [x, state]
        return self._make(O.LSTMCell, "lstm", ins, name, share, units=int(units))

    def attention(self, query, keys: Sequence[TensorRef], share=None,
                  name: str | None = None) -> TensorRef:
        """Luong attention of ``query`` (N, H) over encoder states ``keys``."""
        return self._make(O.Attention, "attention", [query, *keys], name, share)

