"""StrategyMapper: every point of an operator's launches runs where the
strategy says (DESIGN.md section 2).

The layer API (``legionpy.nn``) tags each index launch with
``LaunchOptions(tag=(name, phase, model_id))``: ``phase`` is ``"F"`` or
``"B"`` for the forward/backward tiles of operator ``name`` and ``"U"`` for
the updates of parameter ``name``. :meth:`StrategyMapper.add` registers a
(graph, strategy) under a model id; from it the mapper knows, per tag, the
device of every point:

- F and B of op ``o``: point ``k`` (row-major in the degree grid) ->
  ``strategy[o].devices[k]``;
- U of parameter ``p``: point ``t`` (the ``t``-th update shard: shards of
  the distinct weight tiles, tiles in first-use order over (op order, k))
  -> the shard's home (:func:`legionpy.placement.weight_tiles`, the rule
  the optimizer's task-graph builder calls too; re-exported here).

Launches without such a tag (user tasks) fall back to the DefaultMapper's
policy. Every answer is a pure function of the tag, the point and the
registered strategies, so MPI ranks agree without talking.
"""

from __future__ import annotations

from typing import Any

from ..errors import MappingError
from ..placement import WeightTile, param_tiles, update_points, update_shards, weight_tiles
from ..runtime.devices import Device
from ..runtime.mapping import DefaultMapper, MapperTask

__all__ = ["StrategyMapper", "weight_tiles", "WeightTile", "update_shards", "param_tiles",
           "update_points"]


class StrategyMapper(DefaultMapper):
    """Places the tiles of registered models per their strategies."""

    def __init__(self) -> None:
        self.table: dict[tuple, tuple[int, ...]] = {}
        self.strategies: dict[Any, Any] = {}
        self.specs: dict[Any, Any] = {}

    def consult(self, model_or_graph: Any, machine: Any = None, strategy: Any = "search",
                model_id: Any = None) -> Any:
        """Ask the optimizer for ``strategy`` (a spec: ``"search"`` -- searched
        and cached on disk --, a named baseline, a JSON path or a Strategy) of
        the model on ``machine`` (default: this runtime's devices), register
        it under ``model_id`` and return it. ``select_parallel_config`` then
        answers from it."""
        from ..optimizer import Machine
        from .resolve import resolve_strategy

        graph = getattr(model_or_graph, "graph", model_or_graph)
        if model_id is None:
            model_id = getattr(model_or_graph, "id", id(graph))
        if machine is None:
            from ..runtime import get_runtime

            machine = Machine.local(len(get_runtime().devices))
        s = resolve_strategy(strategy, graph, machine)
        self.add(model_id, graph, s)
        self.specs[model_id] = strategy
        return s

    def add(self, model_id: Any, graph: Any, strategy: Any) -> None:
        """Register (or replace) the strategy of model ``model_id``."""
        self.table = {k: v for k, v in self.table.items() if k[2] != model_id}
        self.strategies[model_id] = (graph, strategy)
        for op in graph.ops:
            devs = tuple(strategy[op.name].devices)
            self.table[(op.name, "F", model_id)] = devs
            self.table[(op.name, "B", model_id)] = devs
        for pname, tiles in weight_tiles(graph, strategy).items():
            self.table[(pname, "U", model_id)] = tuple(h for _, h in update_points(tiles))

    def select_parallel_config(self, op: Any, graph: Any, machine: Any) -> Any:
        for g, s in self.strategies.values():
            if g is graph:
                return s[op.name]
        return super().select_parallel_config(op, graph, machine)

    def devices_of(self, tag: Any) -> tuple[int, ...] | None:
        if isinstance(tag, tuple) and len(tag) == 3:
            return self.table.get(tag)
        return None

    def slice_task(self, task: MapperTask, domain: list[tuple]) -> list[tuple[tuple, Device]]:
        devs = self.devices_of(task.tag)
        if devs is None:
            return super().slice_task(task, domain)
        if task.points is not None:  # some of the op's points (a pipeline's micro-batch)
            if not all(0 <= k < len(devs) for k in task.points):
                raise MappingError(f"launch {task.name!r}: points {list(task.points)} outside "
                                   f"the {len(devs)} tiles its strategy places")
            devs = [devs[k] for k in task.points]
        elif len(devs) != len(domain):
            raise MappingError(f"launch {task.name!r} has {len(domain)} points but its "
                               f"strategy places {len(devs)} tiles")
        n = len(self.devices)
        out = []
        for p, d in zip(domain, devs):
            if not 0 <= d < n:
                what = "parameter" if task.tag[1] == "U" else "op"
                raise MappingError(
                    f"{what} {task.tag[0]!r}: its strategy places a tile on device {d}, but "
                    f"the runtime has {n} device(s) (0..{n - 1}); start it with "
                    f"lp.init(cpus={d + 1}) or use a strategy for this machine")
            out.append((p, self.devices[d]))
        return out
