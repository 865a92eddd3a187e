"""The model zoo: ``models.NAME(batch_size=..., scale="full", seed=0, **sizes)``
returns an uncompiled :class:`legionpy.nn.Model` whose ``.graph`` is the
operator graph. ``scale="full"`` (default) gives the paper's shapes, with
nothing allocated until ``compile``; ``scale="small"`` starts from
:data:`SMALL`, sizes that train in seconds on a CPU; keyword sizes override
either (they go to the ``build_*`` function, e.g. ``hidden=``, ``steps=``,
``width=``, ``image_size=``). ``model.outputs`` is what the builder returned
(the final softmax ref); ``model.zoo_name`` the zoo name.

The ``build_*`` functions only use layer methods that
:class:`~legionpy.optimizer.graph.Graph` and ``nn.Model`` share, so the
optimizer can also build a bare graph (:func:`graph`) without the layer API.

>>> from legionpy import models
>>> models.alexnet().num_parameters()
61100840
>>> m = models.rnntc(batch_size=8, scale="small")
>>> m.graph.ops[-1].output_shape
(8, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import GraphError
from ..optimizer.graph import Graph
from .cnn import build_alexnet, build_inception_v3, build_lenet, build_resnet101, build_vgg16
from .gpt import CONFIGS as GPT_CONFIGS
from .gpt import builder as gpt_builder
from .rnn import build_nmt, build_rnnlm, build_rnntc
from .transformer import build_transformer

__all__ = ["ZooModel", "MODELS", "BUILDERS", "SMALL", "lenet", "alexnet", "vgg16",
           "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt", "transformer", "gpt2", "build",
           "graph", "sizes_for", "check_model", "is_onnx"]

#: name -> (builder, the paper's batch size)
BUILDERS: dict[str, tuple[Callable, int]] = {
    "lenet": (build_lenet, 64), "alexnet": (build_alexnet, 256), "vgg16": (build_vgg16, 64),
    "inception_v3": (build_inception_v3, 64), "resnet101": (build_resnet101, 64),
    "rnntc": (build_rnntc, 64), "rnnlm": (build_rnnlm, 64), "nmt": (build_nmt, 64),
    "transformer": (build_transformer, 64),
    # GPT-2 small and the GPT-3 family (models/gpt.py); batch 8 sequences
    **{name: (gpt_builder(name), 8) for name in GPT_CONFIGS},
}

#: sizes (and batch) of ``scale="small"``: each trains a step in well under a
#: second on one CPU core, and the synthetic tasks of :mod:`legionpy.data`
#: are learnable at these sizes.
SMALL: dict[str, dict[str, Any]] = {
    "lenet": {"batch_size": 16, "image_size": 28},
    "alexnet": {"batch_size": 16, "image_size": 67, "width": 0.125, "hidden": 128,
                "num_classes": 4},
    "vgg16": {"batch_size": 16, "image_size": 32, "width": 0.125, "hidden": 64,
              "num_classes": 4},
    "inception_v3": {"batch_size": 8, "image_size": 75, "width": 0.0625, "num_classes": 4},
    "resnet101": {"batch_size": 8, "image_size": 32, "width": 0.125, "blocks": (1, 1, 1, 1),
                  "num_classes": 10},
    "rnntc": {"batch_size": 16, "steps": 8, "hidden": 32, "layers": 2, "vocab": 32},
    "rnnlm": {"batch_size": 16, "steps": 8, "hidden": 64, "layers": 2, "vocab": 32},
    "nmt": {"batch_size": 16, "steps": 6, "hidden": 32, "layers": 1, "vocab": 16},
    "transformer": {"batch_size": 8, "seq": 8, "d_model": 32, "heads": 4, "ff": 64,
                    "layers": 2, "vocab": 32},
    **{name: {"batch_size": 8, "seq": 8, "d_model": 32, "heads": 4, "layers": 2, "vocab": 32}
       for name in GPT_CONFIGS},
}


@dataclass
class ZooModel:
    """A bare zoo graph (``name``, ``graph``, ``outputs``), from :func:`graph`."""

    name: str
    graph: Graph
    outputs: object = None

    def num_parameters(self) -> int:
        return self.graph.num_parameters()


def sizes_for(name: str, scale: str = "full", **sizes: Any) -> dict[str, Any]:
    """The keyword sizes (batch_size included) ``NAME(scale=..., **sizes)`` uses."""
    if name not in BUILDERS:
        raise GraphError(f"unknown model {name!r}; models: {sorted(BUILDERS)}")
    if scale not in ("full", "small"):
        raise GraphError(f"scale must be 'full' or 'small', got {scale!r}")
    out: dict[str, Any] = {"batch_size": BUILDERS[name][1]}
    if scale == "small":
        out.update(SMALL[name])
    out.update({k: v for k, v in sizes.items() if v is not None})
    return out


def _split(name: str, scale: str, sizes: dict) -> tuple[Callable, int, dict]:
    kw = sizes_for(name, scale, **sizes)
    fn = BUILDERS[name][0]
    batch = int(kw.pop("batch_size"))
    allowed = fn.__code__.co_varnames[1:fn.__code__.co_argcount]
    bad = sorted(set(kw) - set(allowed))
    if bad:
        raise GraphError(f"{name}: unknown size argument(s) {bad}; it takes {list(allowed)}")
    return fn, batch, kw


def is_onnx(name: str) -> bool:
    """True when ``name`` is a path to an ONNX file rather than a zoo name."""
    return str(name).lower().endswith(".onnx")


def check_model(name: str) -> None:
    """Raise for a MODEL argument that is neither a zoo name nor an existing
    ``.onnx`` file (what every command taking MODEL accepts)."""
    import os

    if is_onnx(name):
        if not os.path.isfile(name):
            raise GraphError(f"no ONNX file {name!r}; pass a zoo model {sorted(BUILDERS)} or "
                             "the path of a .onnx file")
    elif name not in BUILDERS:
        raise GraphError(f"unknown model {name!r}; the zoo has {sorted(BUILDERS)} "
                         "(`legionpy models` lists them), or pass the path of a .onnx file")


def _onnx(path: str, batch_size: int | None = None, seed: int = 0, scale: str | None = None,
          **sizes: Any) -> Any:
    """An imported ONNX model for the commands: a softmax is appended when the
    graph ends in logits, so it trains with cross-entropy on class labels."""
    from ..frontends import from_onnx

    check_model(path)
    sizes = {k: v for k, v in sizes.items() if v is not None}
    if sizes:
        raise GraphError(f"{path}: size overrides {sorted(sizes)} apply to zoo models only")
    m = from_onnx(path, batch_size=batch_size, seed=seed, add_softmax=True)
    m.zoo_name = path
    return m


def graph(name: str, scale: str = "full", **sizes: Any) -> ZooModel:
    """A bare operator graph of zoo model ``name`` (no layer API involved),
    or of the ONNX file at path ``name``."""
    if is_onnx(name):
        m = _onnx(name, **sizes)
        return ZooModel(name, m.graph, m.outputs)
    fn, batch, kw = _split(name, scale, sizes)
    g = Graph(batch, name=name)
    return ZooModel(name, g, fn(g, **kw))


def _maker(name: str) -> Callable[..., Any]:
    fn, batch = BUILDERS[name]

    def make(batch_size: int | None = None, scale: str = "full", seed: int = 0,
             **sizes: Any) -> Any:
        from ..nn import Model

        fn_, b, kw = _split(name, scale, {"batch_size": batch_size, **sizes})
        m = Model(b, seed=seed, name=name)
        m.outputs = fn_(m, **kw)
        m.zoo_name = name
        return m

    make.__name__ = name
    allowed = fn.__code__.co_varnames[1:fn.__code__.co_argcount]
    make.__doc__ = (f"{name} as an uncompiled nn.Model, the paper's shapes by default "
                    f"(batch {batch}); ``scale='small'`` uses SMALL[{name!r}]; keyword "
                    f"sizes go to ``{fn.__name__}``: {', '.join(allowed)}.")
    return make


lenet = _maker("lenet")
alexnet = _maker("alexnet")
vgg16 = _maker("vgg16")
inception_v3 = _maker("inception_v3")
resnet101 = _maker("resnet101")
rnntc = _maker("rnntc")
rnnlm = _maker("rnnlm")
nmt = _maker("nmt")
transformer = _maker("transformer")

gpt2 = _maker("gpt2")

MODELS = {f.__name__: f for f in (lenet, alexnet, vgg16, inception_v3, resnet101, rnntc,
                                  rnnlm, nmt, transformer, gpt2)}
MODELS.update({name: _maker(name) for name in GPT_CONFIGS if name != "gpt2"})


def build(name: str, **kw: Any) -> Any:
    """``build("alexnet", batch_size=32)``: ``MODELS[name](**kw)``; a path
    ending in ``.onnx`` imports that model (``legionpy.frontends.from_onnx``)."""
    if is_onnx(name):
        return _onnx(name, **kw)
    if name not in MODELS:
        raise GraphError(f"unknown model {name!r}; models: {sorted(MODELS)}")
    return MODELS[name](**kw)
