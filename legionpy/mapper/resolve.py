"""``compile(strategy=...)``: from a name, a Strategy or a JSON path to a
validated :class:`~legionpy.optimizer.Strategy` for this graph and machine
(moved from ``nn/strategies.py``: the StrategyMapper resolves the same specs,
and mappers sit below ``nn``; ``legionpy.nn`` re-exports both functions).

``"search"`` runs the optimizer's search (all methods, best by the
simulator) for this graph on this machine and caches the result by model and
machine (:func:`legionpy.optimizer.search.search_for_model`): search and run
in one step. The budget is ``LEGIONPY_SEARCH_BUDGET`` seconds (default 10),
or ``LEGIONPY_SEARCH_ITERATIONS`` proposals for a clock-free, reproducible
search. Under ``mpirun`` rank 0 searches and broadcasts its strategy, so every
rank runs the same one.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ModelError, StrategyError
from ..ops.execute import check_tiling
from ..optimizer import Strategy
from ..optimizer.strategy import NAMED

__all__ = ["resolve_strategy", "search_strategy", "NAMED"]


def search_strategy(graph: Any, machine: Any) -> Strategy:
    """The strategy ``compile(strategy="search")`` uses (see the module doc)."""
    from ..optimizer.search import search_for_model
    from ..runtime.mpi import bcast_root, launched_under_mpi

    budget = float(os.environ.get("LEGIONPY_SEARCH_BUDGET", "10"))
    iterations = os.environ.get("LEGIONPY_SEARCH_ITERATIONS")
    iterations = int(iterations) if iterations else None

    def run() -> Strategy:
        return search_for_model(graph, machine, budget_s=budget, seed=0, iterations=iterations)

    if not launched_under_mpi():
        return run()
    from ..runtime.mpi import cluster

    found = run().to_dict() if cluster().rank == 0 else None
    return Strategy.from_dict(bcast_root(found), graph)


def resolve_strategy(spec: Any, graph: Any, machine: Any) -> Strategy:
    """A validated strategy whose channel tiles also respect grouped convs."""
    try:
        s = search_strategy(graph, machine) if spec == "search" else spec
        s = Strategy.resolve(s, graph, machine)
        for op in graph.ops:
            check_tiling(op, s[op.name].degrees)
    except StrategyError as e:
        if not isinstance(spec, (str, os.PathLike, Strategy)) or (
                isinstance(spec, str) and spec not in NAMED and spec != "search"
                and not os.path.exists(spec)):
            raise ModelError(f"unknown strategy {spec!r}: not one of {sorted(NAMED)} or "
                             "'search', not a Strategy and not an existing JSON file") from None
        raise StrategyError(f"strategy {spec if isinstance(spec, str) else 'given'} does not "
                            f"fit model {graph.name!r} on {machine.name}: {e}") from None
    return s
