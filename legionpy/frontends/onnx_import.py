"""ONNX -> :class:`legionpy.nn.Model` (FlexFlow's ONNX front end, in legionpy terms).

The importer walks the graph's nodes in their (topological) order and keeps
one *value* per ONNX tensor name:

- a numpy array for constants: initializers, ``Constant`` nodes and every
  node whose inputs are all constants (folded with ONNX's reference
  evaluator), plus ``Shape`` of any tensor (shapes are static here, with
  the batch dim set to the model's batch size), so the shape arithmetic
  PyTorch exports around ``Reshape`` disappears;
- a :class:`~legionpy.ops.TensorRef` for an activation, batch first;
- a :class:`Stack` for a tensor whose leading axis is not the batch: time
  steps of an ONNX ``LSTM`` output (T, 1, N, H), its last states (1, N, H),
  and a batch-first sequence transposed to time-major for an LSTM.

Every other node goes to its handler in :mod:`legionpy.frontends.onnx_ops`,
which adds layers to the model. Operators without a handler (or used in a
way legionpy cannot express, e.g. a Reshape that moves the batch dim) are
collected, and the import then fails with ONE error naming every
unsupported operator type and the nodes using it; no partial model is
returned. Weights come from the initializers (``Parameter.init`` of kind
``"array"``), batch-norm running statistics from its inputs.

>>> import onnx                                          # doctest: +SKIP
>>> m = lp.frontends.from_onnx("resnet18.onnx", batch_size=64)   # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelError

__all__ = ["from_onnx", "Stack", "UnsupportedOperatorError", "Importer"]


#: Operators of shape arithmetic, folded when their inputs are constants;
#: not reported when they only follow an unsupported node.
SHAPE_OPS = frozenset({"Constant", "Shape", "Cast", "Sqrt", "Mod", "Expand", "ConstantOfShape",
                       "Range", "Equal", "Where", "Floor", "Ceil", "Less", "Greater", "Not"})


class UnsupportedOperatorError(ModelError):
    """The ONNX graph uses operators (or operator forms) legionpy cannot import."""


class Unsupported(Exception):
    """Raised by a handler: this node's form is not supported (``reason``)."""


@dataclass
class Stack:
    """An ONNX tensor ``(len(items), [1,] *item.shape)`` whose axis 0 lists
    batch-first refs (``unit``: a size-1 axis 1, LSTM's num_directions)."""

    items: list
    unit: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.items),) + ((1,) if self.unit else ()) + tuple(self.items[0].shape)


@dataclass
class Indexed:
    """A tensor whose every element is one element of activation ``base``:
    ``index`` (the tensor's shape) holds the element numbers of ``base``
    (flat, batch included). Shape ops on it (a ``Flatten`` that merges the
    batch, a ``Gather`` with computed positions: the TorchScript exporter's
    padding masks) are run on ``index``; a consumer gets it as one
    ``gather`` op when every sample reads only its own elements."""

    base: Any
    index: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.index.shape)


#: operators whose constant results are masks or index arithmetic, never weights
MASK_OPS = frozenset({"Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                      "Not", "And", "Or", "Xor", "Trilu", "ConstantOfShape", "Range", "IsNaN",
                      "IsInf", "CumSum", "Max", "Min"})

#: operators that keep a constant's values (a parameter seen through them stays one)
VIEW_OPS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Expand", "Identity"})

#: operators that only move elements: run on an Indexed value's numbers
INDEX_OPS = frozenset({"Flatten", "Gather", "Reshape", "Squeeze", "Unsqueeze", "Transpose",
                       "Slice", "Expand", "GatherND", "GatherElements", "Identity"})


@dataclass
class Importer:
    """State of one import: the model under construction and the values."""

    model: Any
    graph_name: str
    batch: int
    export_batch: int | None
    values: dict = field(default_factory=dict)
    names: set = field(default_factory=set)
    unsupported: dict = field(default_factory=dict)
    outputs: set = field(default_factory=set)
    opset: int = 17
    #: gamma inputs of folded layer norms without a scale: ones
    ones: set = field(default_factory=set)
    #: constants that are trained weights: float initializers and values folded from them
    weights: set = field(default_factory=set)
    #: float initializers as stored, and pure views of them (Reshape, Unsqueeze,
    #: Squeeze, Expand, Identity folded): model parameters, not values computed
    #: from them by constant folding (see :func:`onnx_math.trained_factor`)
    params: set = field(default_factory=set)

    def name(self, node: Any, suffix: str = "") -> str:
        """A unique op name from the node's name (or op type and position)."""
        base = (node.name or f"{node.op_type}_{len(self.names)}") + suffix
        n, k = base, 1
        while n in self.names:
            n, k = f"{base}_{k}", k + 1
        self.names.add(n)
        return n

    def const(self, name: str, what: str) -> np.ndarray:
        v = self.values.get(name)
        if not isinstance(v, np.ndarray):
            raise Unsupported(f"{what} must be a constant (an initializer)")
        return v

    def lay(self, name: str, what: str = "input") -> Any:
        """The value as a :class:`~legionpy.frontends.onnx_layout.Lay`."""
        from ..ops import TensorRef
        from .onnx_layout import Lay, lay

        v = self.values.get(name)
        if isinstance(v, Indexed):
            v = self.act(name, what)
        if isinstance(v, (TensorRef, Lay)):
            return lay(v)
        raise Unsupported(f"{what} must be an activation")

    def act(self, name: str, what: str = "input") -> Any:
        """The value as a batch-first ref (a layout is materialised)."""
        from ..ops import TensorRef
        from .onnx_layout import Lay, materialize

        v = self.values.get(name)
        if isinstance(v, Indexed):
            v = self.values[name] = _gathered(self, name, v)
        if isinstance(v, Lay):
            x = materialize(self, _Named(name), v)
            if x.canonical:
                self.values[name] = x.base
                return x.base
            if x.groups and x.batch in x.groups[0] and \
                    all(x.size[a] == 1 for a in x.groups[0] if a != x.batch):
                # batch first, in ONNX order; only size-1 axes differ (Unsqueeze)
                r = self.model.reshape(x.base, v.shape[1:], name=self.name(_Named(name),
                                                                            ".shape"))
                self.values[name] = r
                return r
            raise Unsupported(f"{what} {v.shape} does not have the batch first")
        if not isinstance(v, TensorRef):
            raise Unsupported(f"{what} must be a batch-first activation")
        return v


def _gathered(imp: Importer, name: str, v: Indexed) -> Any:
    """An Indexed value as one ``gather`` of its base (samples stay put)."""
    x, res = v.base, v.index
    n, per = x.shape[0], int(np.prod(x.shape[1:]))
    # positions computed for the export's batch size (a Gather's constant
    # indices) hold that many samples (several, when the graph's batch is
    # symbolic): the same per-sample pattern serves any batch
    k = res.shape[0] if res.ndim else -1
    if k not in (n, imp.export_batch) and (imp.export_batch is not None or k < 2):
        k = -1
    own = np.arange(k).reshape((k,) + (1,) * (res.ndim - 1)) * per if k > 0 else None
    if k < 1 or np.any(res - own != res[:1]):
        raise Unsupported(f"{name}: a reshape or gather that moves values between samples")
    return imp.model.gather(x, res[0], name=imp.name(_Named(name), ".gather"))


@dataclass
class _Named:
    """Stands for a node when naming the ops that materialise a value."""

    name: str
    op_type: str = "Layout"


def _load(model: Any) -> Any:
    """The ModelProto of a path or proto: weights in external data files
    (``torch.onnx.export(..., dynamo=True)`` writes ``model.onnx.data``)
    loaded, local functions inlined. Bad files raise ModelError naming the
    file and what to do."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ModelError(f"from_onnx: no file {path!r}")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as e:  # noqa: BLE001 - a corrupt file: say which
            raise ModelError(f"from_onnx: {path!r} is not an ONNX model (truncated, or "
                             f"another format: {type(e).__name__}); export it again with "
                             "torch.onnx.export") from None
        if not proto.graph.node and not proto.graph.input:
            raise ModelError(f"from_onnx: {path!r} is not an ONNX model (it holds no graph); "
                             "export it again with torch.onnx.export")
        _load_external(proto, path)
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        raise ModelError(f"from_onnx takes a path or an onnx.ModelProto, got "
                         f"{type(model).__name__}")
    if proto.functions:
        from onnx import inliner

        proto = inliner.inline_local_functions(proto)
    return proto


def _load_external(proto: Any, path: str) -> None:
    """Read the initializers stored outside ``path`` (next to it)."""
    from onnx import external_data_helper as ext

    base = os.path.dirname(os.path.abspath(path))
    files = sorted({dict((e.key, e.value) for e in t.external_data).get("location", "")
                    for t in ext._get_all_tensors(proto) if ext.uses_external_data(t)})
    for f in files:
        if not os.path.exists(os.path.join(base, f)):
            raise ModelError(f"from_onnx: {path!r} keeps its weights in {f!r}, which is "
                             f"missing from {base!r}; copy it next to the .onnx file (or "
                             "export with external_data=False)")
    if files:
        try:
            ext.load_external_data_for_model(proto, base)
        except Exception as e:  # noqa: BLE001 - a short or corrupt data file
            raise ModelError(f"from_onnx: cannot read the weights of {path!r} from "
                             f"{', '.join(files)} ({type(e).__name__}: {e}); export the "
                             "model again") from None


def _dims(vi: Any) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in vi.type.tensor_type.shape.dim]


def fold(node: Any, ins: list[np.ndarray], opset: int) -> list[np.ndarray]:
    """Evaluate a node on constant inputs with ONNX's reference implementation."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(ins))]
    n = helper.make_node(node.op_type, [names[k] if x else "" for k, x in enumerate(node.input)],
                         [f"o{k}" for k in range(len(node.output))], domain=node.domain)
    n.attribute.extend(node.attribute)
    g = helper.make_graph([n], "fold", [], [helper.make_tensor_value_info(
        f"o{k}", onnx.TensorProto.UNDEFINED, None) for k in range(len(node.output))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {nm: x for nm, x, used in zip(names, ins, node.input) if used}
    return [np.asarray(o) for o in ReferenceEvaluator(m).run(None, feeds)]


def from_onnx(model: Any, batch_size: int | None = None, seed: int = 0,
              add_softmax: bool = False, name: str | None = None) -> Any:
    """Import an ONNX model (a path or ``onnx.ModelProto``) as an uncompiled
    :class:`legionpy.nn.Model`: layers named after the graph's nodes,
    parameters from the initializers. ``batch_size``: default the graph
    input's static batch dim (required when it is symbolic).
    ``add_softmax``: if the graph ends in logits, append a softmax so the
    model trains with cross-entropy (its ``predict`` then returns
    probabilities); a graph that ends in Softmax always carries the loss.

    Raises :class:`UnsupportedOperatorError` listing every operator type the
    graph uses that legionpy cannot import, with the nodes using it."""
    from onnx import numpy_helper

    from ..nn import Model
    from ..ops import TensorRef
    from .onnx_ops import HANDLERS

    proto = _load(model)
    src = repr(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else \
        f"ONNX graph {proto.graph.name!r}"
    g = proto.graph
    opset = max([o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] or [13])
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    inputs = [vi for vi in g.input if vi.name not in consts]
    if not inputs:
        raise ModelError(f"ONNX graph {g.name!r} has no inputs besides its initializers")
    dims0 = [_dims(vi) for vi in inputs]
    export_batch = dims0[0][0] if dims0[0] and isinstance(dims0[0][0], int) else None
    batch = int(batch_size) if batch_size is not None else export_batch
    if not batch:
        raise ModelError(f"{src}: ONNX input {inputs[0].name!r} has a symbolic batch dim "
                         f"{dims0[0][:1]}; pass batch_size=... (--batch-size on the command "
                         "line)")
    m = Model(batch, seed=seed, name=name or g.name or "onnx")
    imp = Importer(m, g.name, batch, export_batch, dict(consts))
    imp.outputs = {o.name for o in g.output}
    imp.opset = opset
    imp.weights = {k for k, v in consts.items() if v.dtype.kind == "f" and v.size > 1}
    imp.params = set(imp.weights)
    for vi, dims in zip(inputs, dims0):
        if len(dims) < 2 or any(not isinstance(d, int) or d < 1 for d in dims[1:]):
            raise ModelError(f"{src}: ONNX input {vi.name!r} has shape {dims}; legionpy needs "
                             "a batch dim followed by static dims: export with fixed sizes")
        elem = vi.type.tensor_type.elem_type
        dtype = "int32" if elem in (6, 7) else "float32"  # INT32, INT64: token ids
        imp.names.add(vi.name)
        imp.values[vi.name] = m.input(tuple(dims[1:]), dtype=dtype, name=vi.name)
    from .onnx_fuse import fuse_layer_norm
    from .onnx_layout import Lay
    from .onnx_lstm import fuse_erf_gelu

    consts_seen = dict(consts)
    for node in g.node:
        if node.op_type == "Constant":
            consts_seen[node.output[0]] = _constant(node)
    poisoned: set[str] = set()
    nodes, imp.ones = fuse_layer_norm(fuse_erf_gelu(list(g.node), consts_seen), consts_seen)
    for node in nodes:
        if any(i and i in poisoned for i in node.input):  # after an unsupported node
            poisoned.update(node.output)
            if node.op_type not in HANDLERS and node.op_type not in SHAPE_OPS:
                imp.unsupported.setdefault(node.op_type, []).append((node.name or "?", ""))
            continue
        ins = [imp.values.get(i) if i else None for i in node.input]
        if ins and node.op_type in INDEX_OPS and isinstance(ins[0], (Indexed, TensorRef, Lay)) \
                and all(isinstance(v, np.ndarray) for v in ins[1:] if v is not None) and \
                (isinstance(ins[0], Indexed) or _merges_batch(node, ins)):
            x = ins[0]
            if isinstance(x, Lay):  # a layout: its values in ONNX order first
                try:
                    x = imp.act(node.input[0], f"{node.op_type} input")
                except Unsupported as e:
                    imp.unsupported.setdefault(node.op_type, []).append((node.name or "?",
                                                                          str(e)))
                    poisoned.update(node.output)
                    continue
            if not isinstance(x, Indexed):
                x = Indexed(x, np.arange(int(np.prod(x.shape))).reshape(x.shape))
            try:
                res = fold(node, [x.index, *ins[1:]], opset)[0]
                imp.values[node.output[0]] = Indexed(x.base, res)
                continue
            except Exception as e:  # noqa: BLE001 - reported with the node below
                reason = f"index folding failed: {e}"
                imp.unsupported.setdefault(node.op_type, []).append((node.name or "?", reason))
                poisoned.update(node.output)
                continue
        if node.op_type == "Constant":
            imp.values[node.output[0]] = _constant(node)
            continue
        if node.op_type == "Shape" and ins[0] is not None:
            imp.values[node.output[0]] = _shape(node, ins[0])
            continue
        if ins and all(x is None or isinstance(x, np.ndarray) for x in ins) and \
                any(isinstance(x, np.ndarray) for x in ins):
            try:
                for o, v in zip(node.output, fold(node, ins, opset)):
                    imp.values[o] = v
                    if node.op_type not in MASK_OPS and v.dtype.kind == "f" and \
                            any(i in imp.weights for i in node.input):
                        imp.weights.add(o)
                    if node.op_type in VIEW_OPS and node.input[0] in imp.params:
                        imp.params.add(o)
                continue
            except Exception as e:  # noqa: BLE001 - reported with the node below
                uniform = _uniform_expand(node, ins)
                if uniform is not None:  # a baked batch size meets the model's
                    imp.values[node.output[0]] = uniform
                    continue
                reason = f"constant folding failed: {e}"
        else:
            handler = HANDLERS.get(node.op_type)
            if handler is not None:
                try:
                    outs = handler(imp, node, ins)
                    for o, v in zip(node.output, outs):
                        if o:
                            imp.values[o] = v
                    continue
                except Unsupported as e:
                    reason = str(e)
            else:
                reason = ""
        imp.unsupported.setdefault(node.op_type, []).append((node.name or "?", reason))
        poisoned.update(node.output)
    if imp.unsupported:
        raise UnsupportedOperatorError(_report(g.name, imp.unsupported))
    return _finish(imp, g, add_softmax)


def _merges_batch(node: Any, ins: list) -> bool:
    """A ``Flatten`` whose first axis swallows the batch with other dims, or
    a ``Reshape`` to one dim (dynamo's ``as_strided``: the whole tensor
    flattened, then a ``Gather`` of computed positions; ConvNeXt)."""
    x = ins[0]
    if node.op_type == "Reshape":
        return len(ins) > 1 and isinstance(ins[1], np.ndarray) and ins[1].size == 1
    if node.op_type != "Flatten":
        return False
    a = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return (a + len(x.shape) if a < 0 else a) > 1


def _uniform_expand(node: Any, ins: list) -> np.ndarray | None:
    """``Expand`` of a constant holding one value (an LSTM's zero initial
    state) to a shape taken from the model's batch, when the constant was
    built for the exported batch size: that value over the new shape."""
    if node.op_type != "Expand" or len(ins) != 2 or ins[0].size == 0:
        return None
    data, shape = ins
    flat = data.reshape(-1)
    if not np.all(flat == flat[0]):
        return None
    return np.full(tuple(int(s) for s in shape), flat[0], dtype=data.dtype)


def _constant(node: Any) -> np.ndarray:
    from onnx import helper, numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        v = helper.get_attribute_value(a)
        if a.name.startswith("value_"):
            return np.asarray(v, np.float32 if "float" in a.name else np.int64)
    raise Unsupported("Constant without a value")


def _shape(node: Any, v: Any) -> np.ndarray:
    s = v.shape if not isinstance(v, np.ndarray) else v.shape
    start = end = None
    for a in node.attribute:
        if a.name == "start":
            start = a.i
        elif a.name == "end":
            end = a.i
    return np.asarray(s[start:end], np.int64)


def _report(graph: str, bad: dict) -> str:
    from .onnx_ops import HANDLERS

    lines = [f"ONNX graph {graph!r} uses {len(bad)} operator type(s) legionpy cannot "
             "import (nothing was built):"]
    for op, nodes in sorted(bad.items()):
        shown = ", ".join(n for n, _ in nodes[:8]) + (" ..." if len(nodes) > 8 else "")
        why = sorted({r for _, r in nodes if r})
        lines.append(f"  {op}: {len(nodes)} node(s): {shown}" + (f" ({'; '.join(why)})"
                                                                 if why else ""))
    lines.append(f"supported: {', '.join(sorted(HANDLERS))}; export the model without the "
                 "others (or replace them by supported ones) and import again")
    return "\n".join(lines)


def _finish(imp: Importer, g: Any, add_softmax: bool) -> Any:
    from ..ops import TensorRef

    m = imp.model
    if len(g.output) != 1:
        raise ModelError(f"ONNX graph {g.name!r} has {len(g.output)} outputs; legionpy models "
                         "have one (export the one the loss applies to)")
    try:
        out = imp.act(g.output[0].name, "the output")
    except Unsupported as e:
        raise ModelError(f"ONNX output {g.output[0].name!r}: {e}") from None
    if not isinstance(out, TensorRef):
        raise ModelError(f"ONNX output {g.output[0].name!r} is not a batch-first activation")
    if out.view is not None or out.op is not m.graph.ops[-1]:
        out = m.reshape(out, out.shape[1:], name=f"{g.output[0].name}.out")
    if add_softmax and out.op.kind != "softmax":
        out = m.softmax(out, name="softmax")
    m.outputs = out
    return m
