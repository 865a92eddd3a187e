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
  -> the shard's home (:func:`weight_tiles`: a tile used by devices ``U``
  is split into ``min(|U|, extent, bytes // SHARD_MIN_BYTES)`` shards along
  its largest dim, shard ``c`` homed on ``U[c]``; an unsharded tile rotates
  its home over ``U`` by parameter position; the same function the
  optimizer's task-graph builder calls).

Launches without such a tag (user tasks) fall back to the DefaultMapper's
policy. Every answer is a pure function of the tag, the point and the
registered strategies, so MPI ranks agree without talking.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import MappingError
from ..geometry import Rect
from ..runtime.devices import Device
from .base import MapperTask
from .default import DefaultMapper

__all__ = ["StrategyMapper", "weight_tiles", "WeightTile", "update_shards", "param_tiles",
           "update_points", "SHARD_MIN_BYTES"]


class WeightTile(NamedTuple):
    """One distinct weight tile of a parameter: its ``rect``, the devices
    that use it (``users``, in first-use order over (op order, tile k)) and
    its update ``shards``: ``(shard rect, home device)`` pairs."""

    rect: Rect
    users: tuple[int, ...]
    shards: tuple[tuple[Rect, int], ...]


SHARD_MIN_BYTES = 16 << 10
"""Smallest update shard worth its copies (bytes): a weight tile of ``b``
bytes is split into at most ``b // SHARD_MIN_BYTES`` shards, so small
parameters (biases, batch-norm scales) keep ONE update on one home instead
of ``O(users^2)`` tiny copies and update tasks. 16 KiB: Inception-v3 data
parallel on p100:4x4 simulates at 58 ms with 159k tasks (no minimum: 67.5
ms, 475k tasks; 64 KiB: 70 ms, 116k; 1 MiB: 110 ms, 39k -- its sub-MiB
convolution weights then go back to a single home each)."""


def update_shards(rect: Rect, users: tuple[int, ...], itemsize: int = 4,
                  rotate: int = 0) -> tuple[tuple[Rect, int], ...]:
    """Sharded weight update (docs/taskgraph.md): ``rect`` used by the devices
    ``users`` is cut into ``s = min(len(users), extent, max(1, bytes //
    SHARD_MIN_BYTES))`` shards along its largest dim (the first on ties;
    ``numpy.array_split`` bounds), shard ``c`` homed on ``users[c]``. An
    unsharded tile (``s = 1``) is homed on ``users[rotate % len(users)]``, so
    the small parameters of a model spread over their users (``rotate``: the
    parameter's position, see :func:`param_tiles`)."""
    shape = rect.shape
    d = max(range(len(shape)), key=lambda i: (shape[i], -i)) if shape else 0
    nbytes = rect.volume * itemsize
    s = max(1, min(len(users), shape[d] if shape else 1, nbytes // SHARD_MIN_BYTES))
    if s == 1:
        return ((rect, users[rotate % len(users)]),)
    degrees = tuple(s if i == d else 1 for i in range(len(shape)))
    return tuple(zip(rect.split(degrees), users[:s]))


def param_tiles(name: str, uses: Any) -> list[WeightTile]:
    """The weight tiles of one parameter from ``uses``: ``(op, pname, config)``
    of every op using it, in op order. The one rule both halves use.
    Overlapping weight rects (a shared parameter whose users have different
    configs) are merged into their bounding box, users in first-use order.
    Unsharded tiles rotate their home by the parameter's position: the index
    of its first user op plus its position among that op's parameters (a
    pure function of ``uses``, so both halves agree)."""
    tiles: dict[Rect, list[int]] = {}
    itemsize, rotate = 4, 0
    for op, pnames, cfg in _grouped(uses):
        if not tiles:
            itemsize = np.dtype(op.params[pnames[0]].dtype).itemsize
            rotate = op.index + list(op.params).index(pnames[0])
        for k, tile in enumerate(op.output_rect.split(cfg.degrees)):
            dev = cfg.devices[k]
            for pname in pnames:
                users = tiles.setdefault(op.weight_rect(pname, tile), [])
                if dev not in users:
                    users.append(dev)
    items = list(tiles.items())
    merged = True
    while merged:  # overlapping tiles (a shared parameter under different configs)
        merged = False
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, ua), (b, ub) = items[i], items[j]
                if (a & b).volume:
                    items[i] = (a.bounding(b), ua + [d for d in ub if d not in ua])
                    del items[j]
                    merged = True
                    break
            if merged:
                break
    return [WeightTile(r, tuple(u), update_shards(r, tuple(u), itemsize, rotate + j))
            for j, (r, u) in enumerate(items)]


def _grouped(uses: Any) -> list:
    out: list = []
    for op, pname, cfg in uses:
        if out and out[-1][0] is op:
            out[-1][1].append(pname)
        else:
            out.append((op, [pname], cfg))
    return out


def weight_tiles(graph: Any, strategy: Any) -> dict[str, list[WeightTile]]:
    """``{parameter name: [WeightTile, ...]}``: the distinct weight tiles of
    every parameter (parameters and tiles in first-use order over (op order,
    tile k)) with their users and update shards (:func:`update_shards`).
    Partially overlapping tiles of one parameter (shared parameters under
    different configs) are merged into their bounding box."""
    uses: dict[str, list] = {}
    for op in graph.ops:
        for pname, p in op.params.items():
            uses.setdefault(p.name, []).append((op, pname, strategy[op.name]))
    return {name: param_tiles(name, u) for name, u in uses.items()}


def update_points(tiles: list[WeightTile]) -> list[tuple[Rect, int]]:
    """The points of a parameter's update launch: ``(shard rect, home)`` of
    every shard of every tile, in order (point index = position)."""
    return [sh for t in tiles for sh in t.shards]


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
        from ..nn.strategies import resolve_strategy
        from ..optimizer import Machine

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
        if len(devs) != len(domain):
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
