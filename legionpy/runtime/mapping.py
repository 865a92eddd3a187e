"""The mapper plugin interface and the DefaultMapper (Legion's names,
Python shapes). As in Legion (``legion_mapping.h`` and the default mapper),
both belong to the runtime; mappers that know the application (the
StrategyMapper, the AdaptiveMapper) live above it in :mod:`legionpy.mapper`.

The runtime asks its mapper, at launch time and in program order:

1. ``select_task_options(task) -> TaskOptions``: for a single launch, the
   initial device (``TaskOptions.device``; None lets ``map_task`` decide).
2. ``slice_task(task, domain) -> [(point, Device), ...]``: for an index
   launch, the device of every point of ``domain`` (a list of colors).
3. ``map_task(task) -> Mapping``: for every point task, the final device
   and, per region requirement, the memory its instance lives in
   (``Mapping.memories``; None = the device's own memory; -1 = host memory).
4. ``select_parallel_config(op, graph, machine)``: for the layer API, how
   an operator is partitioned. ``Model.compile`` asks it for every op; an
   answer (a ``ParallelConfig``) is kept as given, ``None`` (the default)
   leaves the op to the optimizer -- compile's ``strategy=`` (search with
   its cache, a named baseline, a JSON file). See docs/search.md.

Every decision must be a pure function of its inputs (the
:class:`MapperTask` and the device list), so every MPI rank makes the same
decisions without talking to the others. ``MapperTask.tag`` carries an
opaque value from the launch (``LaunchOptions(tag=...)``) for mappers such
as the StrategyMapper to key their answers on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .devices import Device

__all__ = ["Mapper", "MapperTask", "TaskOptions", "Mapping", "DefaultMapper", "RandomMapper"]


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """Answer of ``select_task_options``: the initial device (None: map_task decides)."""

    device: Device | None = None


@dataclass(frozen=True, slots=True)
class Mapping:
    """Answer of ``map_task``: ``device`` runs the task; ``memories[i]`` is the
    memory id of requirement i's instance (None: all in the device's memory)."""

    device: Device
    memories: tuple[int, ...] | None = None


class MapperTask:
    """What a mapper sees of a task launch (read-only by convention).

    ``name``, ``kind`` (compute | update), ``tag``, ``op_id`` (global op id,
    deterministic), ``seq`` (how many launches came before), ``point`` and
    ``index`` (None for a single launch), ``domain`` (the colors of the index
    launch), ``points`` (when the launch covers some points of a larger
    space, e.g. a pipeline's micro-batch: each color's index in it, from
    ``LaunchOptions.points``; else None), ``requirements`` (RegionRequirements
    in argument order, one per privilege), ``target`` (device from
    select_task_options/slice_task)."""

    __slots__ = ("name", "kind", "tag", "op_id", "seq", "point", "index", "domain",
                 "points", "requirements", "target", "_locality")

    def __init__(self, name: str, kind: str, tag: Any, op_id: int, seq: int,
                 requirements: list, point: tuple | None = None, index: int | None = None,
                 domain: list | None = None, locality: Any = None,
                 points: tuple | None = None) -> None:
        self.name = name
        self.kind = kind
        self.tag = tag
        self.op_id = op_id
        self.seq = seq
        self.requirements = requirements
        self.point = point
        self.index = index
        self.domain = domain
        self.points = points
        self.target: Device | None = None
        self._locality = locality

    def locality(self) -> dict[int, int]:
        """``{memory: points of the task's read requirements valid there}``,
        from the runtime's (deterministic) coherence state."""
        return self._locality(self) if self._locality is not None else {}

    def __repr__(self) -> str:
        where = f" point {self.point}" if self.point is not None else ""
        return f"<task {self.name!r} op {self.op_id}{where}>"


class Mapper:
    """Base mapper. Subclasses override any of the four calls; ``devices``
    (list of :class:`Device`, global ids) is set by ``runtime().set_mapper``."""

    devices: list[Device] = []

    def select_task_options(self, task: MapperTask) -> TaskOptions:
        return TaskOptions(None)

    def slice_task(self, task: MapperTask, domain: list[tuple]) -> list[tuple[tuple, Device]]:
        n = len(self.devices)
        return [(p, self.devices[i % n]) for i, p in enumerate(domain)]

    def map_task(self, task: MapperTask) -> Mapping:
        dev = task.target
        if dev is None:
            dev = self.devices[task.seq % len(self.devices)]
        return Mapping(dev)

    def select_parallel_config(self, op: Any, graph: Any, machine: Any) -> Any:
        """The ParallelConfig of ``op`` in ``graph`` on ``machine``, or None: no
        opinion, the optimizer decides (compile's ``strategy=``)."""
        return None


class DefaultMapper(Mapper):
    """Point i of an index launch -> device ``i mod n`` (so the tiles of
    equal partitions spread over every device, and the same tile of
    successive launches stays on the same device); a single task goes where
    most of the data it reads is already valid (ties and data-less tasks:
    round robin by launch sequence number). All answers are pure functions
    of the task and the device list."""

    def select_task_options(self, task: MapperTask) -> TaskOptions:
        devs = self.devices
        if task.requirements and len(devs) > 1:
            loc = task.locality()
            best = None
            for m, vol in loc.items():
                if 0 <= m < len(devs) and vol > 0 and (best is None or vol > loc[best]
                                                       or (vol == loc[best] and m < best)):
                    best = m
            if best is not None:
                return TaskOptions(devs[best])
        return TaskOptions(devs[task.seq % len(devs)])


class RandomMapper(Mapper):
    """Seeded random device per point and random host/device memory (for
    tests): every device choice and, with probability 1/4 per requirement,
    host memory instead of the device's memory, drawn from a PRNG seeded by
    (seed, op id): random but reproducible, and the same on every rank."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def _rng(self, op_id: int) -> random.Random:
        return random.Random(self.seed * 1_000_003 + op_id)

    def select_task_options(self, task: MapperTask) -> TaskOptions:
        return TaskOptions(self._rng(task.op_id).choice(self.devices))

    def slice_task(self, task: MapperTask, domain: list[tuple]) -> list[tuple[tuple, Device]]:
        rng = self._rng(task.op_id)
        return [(p, rng.choice(self.devices)) for p in domain]

    def map_task(self, task: MapperTask) -> Mapping:
        rng = self._rng(task.op_id + 7)
        dev = task.target or rng.choice(self.devices)
        mems = tuple(-1 if rng.random() < 0.25 else dev.memory for _ in task.requirements)
        return Mapping(dev, mems)
