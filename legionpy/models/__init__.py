"""The model zoo: ``models.NAME(batch_size=..., **sizes)`` returns a
:class:`ZooModel` whose ``.graph`` is the operator graph at the paper's
shapes by default (nothing allocated). The layer-API session will make these
return ``nn.Model`` objects built by the same ``build_*`` functions, which
only use the layer methods shared by :class:`~legionpy.optimizer.graph.Graph`
and ``nn.Model``.

>>> from legionpy import models
>>> models.alexnet().graph.num_parameters()
61100840
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..optimizer.graph import Graph
from .cnn import build_alexnet, build_inception_v3, build_lenet, build_resnet101, build_vgg16
from .rnn import build_nmt, build_rnnlm, build_rnntc, build_transformer

__all__ = ["ZooModel", "MODELS", "lenet", "alexnet", "vgg16", "inception_v3", "resnet101",
           "rnntc", "rnnlm", "nmt", "transformer", "build"]


@dataclass
class ZooModel:
    """A built zoo model: ``name``, ``graph``, ``outputs`` (the final refs)."""

    name: str
    graph: Graph
    outputs: object = None

    def num_parameters(self) -> int:
        return self.graph.num_parameters()


def _maker(name: str, fn: Callable, batch: int) -> Callable[..., ZooModel]:
    def make(batch_size: int = batch, **sizes) -> ZooModel:
        g = Graph(batch_size, name=name)
        return ZooModel(name, g, fn(g, **sizes))

    make.__name__ = name
    make.__doc__ = (f"{name} at the paper's shapes (batch {batch}); keyword sizes go to "
                    f"``{fn.__name__}``: {fn.__code__.co_varnames[1:fn.__code__.co_argcount]}")
    return make


lenet = _maker("lenet", build_lenet, 64)
alexnet = _maker("alexnet", build_alexnet, 256)
vgg16 = _maker("vgg16", build_vgg16, 64)
inception_v3 = _maker("inception_v3", build_inception_v3, 64)
resnet101 = _maker("resnet101", build_resnet101, 64)
rnntc = _maker("rnntc", build_rnntc, 64)
rnnlm = _maker("rnnlm", build_rnnlm, 64)
nmt = _maker("nmt", build_nmt, 64)
transformer = _maker("transformer", build_transformer, 64)

MODELS = {f.__name__: f for f in (lenet, alexnet, vgg16, inception_v3, resnet101, rnntc,
                                  rnnlm, nmt, transformer)}


def build(name: str, **kw) -> ZooModel:
    """``build("alexnet", batch_size=32)``."""
    from ..errors import GraphError
    if name not in MODELS:
        raise GraphError(f"unknown model {name!r}; models: {sorted(MODELS)}")
    return MODELS[name](**kw)
