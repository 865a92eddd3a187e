"""A StrategyMapper that consults the optimizer (issue 9 item 1).

:func:`consulting_mapper` is the constructor ``compile(strategy=...)``
needs: from a model (or its operator graph), a machine and a strategy spec
it asks the optimizer for the strategy -- ``"search"`` runs
:func:`legionpy.optimizer.search.search_for_model` (cached on disk by model
and machine; under ``mpirun`` rank 0 searches and broadcasts), ``"data" |
"model" | "owt" | "expert"`` and JSON paths go through
:meth:`Strategy.resolve`, a Strategy is validated -- and returns a
:class:`~legionpy.mapper.strategy.StrategyMapper` with it registered, so
``select_parallel_config``, ``slice_task`` and ``map_task`` all answer from
the strategy.

>>> import legionpy as lp
>>> from legionpy.optimizer import Machine
>>> m = lp.models.lenet(batch_size=8, scale="small")
>>> mapper = consulting_mapper(m, Machine.local(2), "data", model_id=m.id)
>>> mapper.strategy_of(m.id)["conv1"].devices
(0, 1)
"""

from __future__ import annotations

from typing import Any

from .strategy import StrategyMapper

__all__ = ["consulting_mapper", "ConsultingMapper"]


class ConsultingMapper(StrategyMapper):
    """The mapper ``compile`` installs in place of the runtime's own
    :class:`~legionpy.mapper.DefaultMapper` (same policy for untagged
    launches): a StrategyMapper whose strategies come from the optimizer
    (:meth:`StrategyMapper.consult`; ``specs`` remembers each model's spec)."""

    def strategy_of(self, model_id: Any) -> Any:
        """The registered Strategy of ``model_id``."""
        return self.strategies[model_id][1]


def consulting_mapper(model_or_graph: Any, machine: Any = None, strategy: Any = "search",
                      model_id: Any = None) -> ConsultingMapper:
    """A :class:`ConsultingMapper` with the optimizer's strategy for the model
    registered (see the module doc). Pure per rank: every MPI rank gets the
    same strategy (searches are broadcast from rank 0 or deterministic)."""
    m = ConsultingMapper()
    m.consult(model_or_graph, machine, strategy, model_id)
    return m
