"""``compile(strategy=...)``: from a name, a Strategy or a JSON path to a
validated :class:`~legionpy.optimizer.Strategy` for this graph and machine.

``"search"`` goes through :func:`search_strategy`, the one function the
search engineer replaces to wire the optimizer's search in.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ModelError, StrategyError
from ..ops.execute import check_tiling
from ..optimizer import Strategy

__all__ = ["resolve_strategy", "search_strategy", "NAMED"]

NAMED = {"data": Strategy.data_parallel, "model": Strategy.model_parallel, "owt": Strategy.owt}


def search_strategy(graph: Any, machine: Any) -> Strategy:
    """The strategy ``compile(strategy="search")`` uses."""
    raise ModelError("strategy='search' is not available yet in legionpy.nn; use one of "
                     f"{sorted(NAMED)}, a legionpy.optimizer.Strategy, or the path of a "
                     "strategy JSON file (e.g. written by `legionpy search ... --out FILE`)")


def resolve_strategy(spec: Any, graph: Any, machine: Any) -> Strategy:
    if isinstance(spec, Strategy):
        s = spec
    elif spec == "search":
        s = search_strategy(graph, machine)
    elif isinstance(spec, str) and spec in NAMED:
        s = NAMED[spec](graph, machine)
    elif isinstance(spec, (str, os.PathLike)) and os.path.exists(spec):
        s = Strategy.load(os.fspath(spec), graph)
    else:
        raise ModelError(f"unknown strategy {spec!r}: not one of {sorted(NAMED)} or 'search', "
                         "not a Strategy and not an existing JSON file")
    try:
        s.validate(graph, machine)
        for op in graph.ops:
            check_tiling(op, s[op.name].degrees)
    except StrategyError as e:
        raise StrategyError(f"strategy {spec if isinstance(spec, str) else 'given'} does not "
                            f"fit model {graph.name!r} on {machine.name}: {e}") from None
    return s
