"""The layer API: ``Model``, optimizers, losses, metrics, data loading.

>>> import legionpy as lp
>>> m = lp.nn.Model(batch_size=8)
>>> x = m.input((1, 8, 8))
>>> t = m.conv2d(x, 4, 3, padding=1, activation="relu")
>>> t = m.softmax(m.dense(m.flat(m.pool2d(t, 2)), 10))
>>> t.shape
(8, 10)

See :mod:`legionpy.nn.model` (the API), :mod:`legionpy.nn.execution` (how a
compiled model becomes regions and index launches, DESIGN.md section 2).
"""

from __future__ import annotations

from ..mapper.resolve import resolve_strategy, search_strategy
from .data import DataLoader, shard
from .losses import LOSSES, METRICS
from .model import History, Model
from .optimizers import SGD, Adam, Optimizer

__all__ = ["Model", "History", "SGD", "Adam", "Optimizer", "DataLoader", "shard", "LOSSES",
           "METRICS", "resolve_strategy", "search_strategy"]
