"""PyTorch -> :class:`legionpy.nn.Model` through torch.fx (FlexFlow's PyTorch
front end, in legionpy terms).

``torch.fx`` traces the module's ``forward`` into a graph of placeholders,
calls of leaf modules, functions and tensor methods; shape propagation on
``example_input`` gives every node's shape. Leaf modules (kept whole, not
traced into): Conv2d, Linear, BatchNorm1d/2d, LayerNorm, Embedding, the
activations, pooling, Flatten, Dropout, Softmax, LSTM, MultiheadAttention,
TransformerEncoderLayer and TransformerEncoder; each becomes legionpy layers
with the module's weights (transposed to legionpy's layouts; LSTM gates
reordered, batch norm running statistics kept). Functions and methods
cover the glue of the same model families (``+``, ``*``, ``torch.flatten``,
``torch.cat``, ``view``/``reshape``/``permute``/``transpose`` keeping the
batch first, indexing like ``x[:, 0]`` or ``h[-1]``, activations,
``softmax``). Anything else fails with one error listing every
unsupported call and the nodes using it.

``model.imported`` maps each legionpy parameter name to a function of the
module's ``state_dict()`` giving that parameter in legionpy's layout (how a
test compares weights after training steps in both).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelError
from .onnx_import import Stack, Unsupported, UnsupportedOperatorError
from .onnx_ops import set_param

__all__ = ["from_torch"]


def _np(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


class _NpState(dict):
    """A state dict whose entries read as float32 numpy arrays."""

    def __getitem__(self, key: str) -> np.ndarray:
        return _np(dict.__getitem__(self, key))


class _Ctx:
    """Import state: the model, values by fx node, parameter provenance."""

    def __init__(self, model: Any, module: Any, batch: int) -> None:
        self.model, self.module, self.batch = model, module, batch
        self.values: dict[Any, Any] = {}
        self.imported: dict[str, Any] = {}
        self.names: set[str] = set()
        self._trained: set[str] | None = None

    def trained(self) -> set[str]:
        """Names of the module's trained parameters (``named_parameters``;
        buffers and plain attributes are fixed constants)."""
        if self._trained is None:
            self._trained = {n for n, _ in self.module.named_parameters()}
        return self._trained

    def name(self, node: Any, suffix: str = "") -> str:
        n, k = node.name + suffix, 1
        while n in self.names:
            n, k = f"{node.name}{suffix}_{k}", k + 1
        self.names.add(n)
        return n

    def param(self, ref: Any, pname: str, source: Any, fn: Any = None) -> None:
        """Set ``pname`` of ``ref``'s op(s) from the state-dict entry
        ``source`` (through ``fn``), or from ``source(state)`` if callable
        (``state``: name -> numpy array)."""
        if callable(source):
            get = source
        else:
            def get(sd, k=source, f=fn or (lambda a: a)):
                return f(sd[k])
        set_param(ref, pname, get(_NpState(self.module.state_dict())))
        ops = ref if isinstance(ref, list) else [ref.op]
        self.imported[ops[0].params[pname].name] = lambda sd, g=get: g(_NpState(sd))

    def arg(self, a: Any) -> Any:
        import torch.fx as fx

        if isinstance(a, fx.Node):
            return self.values[a]
        if isinstance(a, (tuple, list)):
            return type(a)(self.arg(x) for x in a)
        return a


def _tracer(nn: Any) -> Any:
    import torch.fx as fx

    leaves = (nn.Conv2d, nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.Embedding,
              nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.MaxPool2d, nn.AvgPool2d,
              nn.AdaptiveAvgPool2d, nn.Flatten, nn.Dropout, nn.Softmax, nn.LSTM,
              nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
              nn.Identity)

    class Tracer(fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, leaves) or super().is_leaf_module(m, qualname)

    return Tracer()


def from_torch(module: Any, example_input: Any, batch_size: int | None = None, seed: int = 0,
               name: str | None = None, via: str = "fx") -> Any:
    """Import ``module`` (a ``torch.nn.Module``) traced with torch.fx on
    ``example_input`` (a tensor, batch first) as an uncompiled
    :class:`legionpy.nn.Model` with the module's weights. ``batch_size``
    defaults to the example's. Raises :class:`UnsupportedOperatorError`
    listing every call legionpy cannot import. ``via="onnx"``: export with
    ``torch.onnx.export(dynamo=True)`` and import that instead (modules fx
    cannot trace, such as Hugging Face models: :mod:`.torch_onnx`)."""
    if via not in ("fx", "onnx"):
        raise ModelError(f"from_torch: via must be 'fx' or 'onnx', got {via!r}")
    try:
        import torch
        import torch.fx as fx
        from torch import nn
        from torch.fx.passes.shape_prop import ShapeProp
    except ImportError:
        raise ModelError("from_torch needs PyTorch: pip install legionpy[torch]") from None
    from ..nn import Model
    from .torch_calls import calls, module_handler

    if not isinstance(module, nn.Module):
        raise ModelError(f"from_torch takes a torch.nn.Module, got {type(module).__name__}")
    x = example_input
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ModelError("from_torch: example_input must be one batch-first tensor of rank "
                         f">= 2, got {type(x).__name__}")
    if via == "onnx":
        from .torch_onnx import from_torch_onnx

        return from_torch_onnx(module, x, batch_size, seed, name)
    tracer = _tracer(nn)
    try:
        graph = tracer.trace(module)
    except Exception as e:  # noqa: BLE001 - fx's own message says which construct
        hf = type(module).__module__.startswith("transformers")
        raise ModelError(f"from_torch: torch.fx cannot trace {type(module).__name__} ({e}); "
                         + ("transformers 5 has no fx tracer of its own (transformers.utils.fx "
                            "is gone); " if hf else "")
                         + "pass via='onnx' to export it with torch.onnx.export(dynamo=True) "
                         "and import that") from None
    gm = fx.GraphModule(tracer.root, graph)
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(x)
    finally:
        module.train(was)
    batch = int(batch_size or x.shape[0])
    m = Model(batch, seed=seed, name=name or type(module).__name__)
    ctx = _Ctx(m, module, batch)
    bad: dict[str, list] = {}
    out = None
    for node in graph.nodes:
        if node.op == "output":
            out = node.args[0]
            continue
        if any(isinstance(a, fx.Node) and a not in ctx.values for a in node.all_input_nodes):
            continue  # after an unsupported node
        try:
            if node.op == "placeholder":
                dt = "int32" if not x.is_floating_point() else "float32"
                ctx.values[node] = m.input(tuple(x.shape[1:]), dtype=dt, name=node.name)
            elif node.op == "get_attr":
                ctx.values[node] = _np(_attr(module, node.target))
            elif node.op == "call_module":
                mod = module.get_submodule(node.target)
                h = module_handler(mod)
                if h is None:
                    raise Unsupported("")
                ctx.values[node] = h(ctx, node, mod)
            else:
                key = node.target if node.op == "call_function" else f".{node.target}"
                h = calls().get(key)
                if h is None and node.op == "call_function" and _plain(ctx, node):
                    ctx.values[node] = node.target(*ctx.arg(node.args), **node.kwargs)
                    continue
                if h is None:
                    raise Unsupported("")
                ctx.values[node] = h(ctx, node)
        except Unsupported as e:
            what = _describe(node, module)
            bad.setdefault(what, []).append((node.name, str(e)))
    if bad:
        lines = [f"{type(module).__name__} uses {len(bad)} call(s) legionpy cannot import "
                 "(nothing was built):"]
        for what, nodes in sorted(bad.items()):
            why = sorted({r for _, r in nodes if r})
            lines.append(f"  {what}: {len(nodes)} node(s): {', '.join(n for n, _ in nodes)}"
                         + (f" ({'; '.join(why)})" if why else ""))
        raise UnsupportedOperatorError("\n".join(lines))
    res = ctx.values.get(out) if isinstance(out, fx.Node) else None
    if isinstance(res, Stack) or res is None or isinstance(res, (tuple, np.ndarray)):
        raise ModelError("from_torch: the module must return one batch-first tensor")
    if res.view is not None or res.op is not m.graph.ops[-1]:
        res = m.reshape(res, res.shape[1:], name="output")
    m.outputs = res
    m.imported = ctx.imported
    return m


def _plain(ctx: Any, node: Any) -> bool:
    """Whether a call's arguments are plain Python values (shape arithmetic
    such as ``channels // groups``): it is evaluated as it stands."""
    def plain(v):
        if isinstance(v, (tuple, list)):
            return all(plain(x) for x in v)
        return isinstance(v, (int, float, bool, str)) or v is None
    return plain(ctx.arg(node.args)) and plain(tuple(node.kwargs.values()))


def _attr(module: Any, target: str) -> Any:
    obj = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _describe(node: Any, module: Any) -> str:
    if node.op == "call_module":
        return type(module.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    t = node.target
    return getattr(t, "__qualname__", None) or getattr(t, "__name__", str(t))

