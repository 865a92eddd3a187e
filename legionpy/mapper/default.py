"""DefaultMapper and a seeded RandomMapper (for tests).

DefaultMapper: point i of an index launch -> device ``i mod n`` (so the
tiles of equal partitions spread over every device, and the same tile of
successive launches stays on the same device); a single task goes where
most of the data it reads is already valid (ties and data-less tasks:
round robin by launch sequence number). All answers are pure functions of
the task and the device list.

RandomMapper(seed): every device choice and, with probability 1/4 per
requirement, host memory instead of the device's memory, drawn from a PRNG
seeded by (seed, op id): random but reproducible, and the same on every rank.
"""

from __future__ import annotations

import random

from ..runtime.devices import Device
from .base import Mapper, MapperTask, Mapping, TaskOptions

__all__ = ["DefaultMapper", "RandomMapper"]


class DefaultMapper(Mapper):
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
    """Seeded random device per point and random host/device memory."""

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
