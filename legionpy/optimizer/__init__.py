"""The optimizer: machine model, operator graph, strategies, cost models,
task-graph builder, full and delta simulation (paper sections 4-5).
Search algorithms live in :mod:`legionpy.optimizer.search`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Graph": "legionpy.optimizer.graph",
    "Machine": "legionpy.optimizer.machine",
    "DeviceSpec": "legionpy.optimizer.machine",
    "LinkSpec": "legionpy.optimizer.machine",
    "ParallelConfig": "legionpy.optimizer.strategy",
    "Strategy": "legionpy.optimizer.strategy",
    "CostModel": "legionpy.optimizer.costmodel",
    "AnalyticCostModel": "legionpy.optimizer.costmodel",
    "MeasuredCostModel": "legionpy.optimizer.costmodel",
    "TableCostModel": "legionpy.optimizer.costmodel",
    "TaskGraph": "legionpy.optimizer.taskgraph",
    "Simulator": "legionpy.optimizer.simulator",
    "SimResult": "legionpy.optimizer.simulator",
    "chrome_trace": "legionpy.optimizer.trace",
    "write_chrome_trace": "legionpy.optimizer.trace",
    "plot_strategy": "legionpy.optimizer.trace",
}
__all__ = sorted(_EXPORTS) + ["search"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name == "search":
        return importlib.import_module("legionpy.optimizer.search")
    raise AttributeError(f"module 'legionpy.optimizer' has no attribute {name!r}")
