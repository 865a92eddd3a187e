"""Memory feasibility: per-device peak bytes from the simulated task graph
against each device's capacity (the one check every search method calls).

What a device holds during one training iteration: what legionpy's
runtime holds (docs/memory.md; ``tests/runtime/test_instances_tiles.py``
checks the runtime's measured peak against this within 10%):

==================  ========================================================
``activations``     every output tile a forward task writes, kept for the
                    backward pass, and its gradient instance (2x the tile)
``copies``          every piece received by a forward copy (activation halos
                    and weight replicas fetched from their update homes)
``parameters``      every update shard homed on the device: weight and
                    gradient instance (2x) plus the optimizer state
                    (``optimizer_slots`` x: 0 plain SGD, 1 momentum, 2 Adam)
``buffers``         reduction buffers (:meth:`TaskGraph.buffer_bytes`): every
                    weight-gradient buffer (they wait for the updates), the
                    largest of any one block's other buffers (activation
                    gradients, a home's staged shards: consumed one block at
                    a time), and the slack of instances that are bounding
                    boxes of rects which do not tile them
==================  ========================================================

The sum per device is its peak. A strategy is *feasible* when no device's
peak exceeds its memory.

>>> from legionpy import models
>>> from legionpy.optimizer import Machine, Simulator, Strategy
>>> from legionpy.optimizer.memory import feasibility
>>> g = models.lenet(batch_size=16).graph
>>> m = Machine.parse("p100:1x4")
>>> sim = Simulator(g, m)
>>> f = feasibility(sim, Strategy.data_parallel(g, m))
>>> f.feasible, f.over_bytes
(True, 0.0)

The search methods call :func:`feasibility` (or
:meth:`Simulator.feasibility`) on a strategy, or :func:`check` on the
result of a simulation they already ran, and :func:`search_cost`
(:attr:`SimResult.search_cost`) to rank strategies so that every feasible
one beats every infeasible one and, among infeasible ones, less overflow
wins (a chain that starts out of memory walks towards a strategy that
fits). docs/search.md describes the seam.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Feasibility", "feasibility", "check", "search_cost", "INFEASIBLE_BASE_S",
           "format_bytes", "CATEGORIES"]

#: search_cost of an infeasible strategy: this many seconds times (1 + the
#: worst device's overflow as a fraction of its capacity); far above any
#: simulated iteration, so every feasible strategy ranks first
INFEASIBLE_BASE_S = 1e4
CATEGORIES = ("activations", "copies", "parameters", "buffers")


def format_bytes(b: float) -> str:
    """``1.23 GB`` style (decimal units)."""
    for unit, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= s:
            return f"{b / s:.2f} {unit}"
    return f"{b:.0f} B"


@dataclass(frozen=True)
class Feasibility:
    """Peak bytes per device (by device name) against capacity.

    ``over``: bytes above capacity per device that does not fit (empty when
    feasible); ``breakdown``: per device name, bytes per :data:`CATEGORIES`."""

    peak: dict = field(default_factory=dict)
    capacity: dict = field(default_factory=dict)
    over: dict = field(default_factory=dict)
    breakdown: dict = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return not self.over

    @property
    def over_bytes(self) -> float:
        """The largest overflow of any device (0.0 when feasible)."""
        return float(max(self.over.values(), default=0.0))

    @property
    def over_fraction(self) -> float:
        """The largest overflow as a fraction of that device's capacity."""
        return float(max((b / self.capacity[d] for d, b in self.over.items()), default=0.0))

    @property
    def search_cost_penalty(self) -> float:
        """:func:`search_cost` of an infeasible strategy with this overflow."""
        return search_cost(0.0, self.over_fraction)

    @property
    def worst_device(self) -> str | None:
        """The device with the highest peak relative to its capacity."""
        if not self.peak:
            return None
        return max(self.peak, key=lambda d: self.peak[d] / self.capacity[d])

    @property
    def max_peak_bytes(self) -> float:
        return float(max(self.peak.values(), default=0.0))

    def describe(self) -> str:
        """One line: the worst device, its need, its capacity, the overflow."""
        d = self.worst_device
        if d is None:
            return "no devices"
        need, cap = self.peak[d], self.capacity[d]
        parts = ", ".join(f"{c} {format_bytes(b)}" for c, b in self.breakdown[d].items())
        verdict = (f"over by {format_bytes(need - cap)} on {len(self.over)} device(s)"
                   if self.over else "fits")
        return (f"{d} needs {format_bytes(need)} of {format_bytes(cap)} ({parts}); "
                f"{verdict}")

    def to_dict(self) -> dict:
        return {"feasible": self.feasible, "over_bytes": self.over_bytes,
                "over_fraction": self.over_fraction, "worst_device": self.worst_device,
                "max_peak_bytes": self.max_peak_bytes,
                "infeasible_devices": sorted(self.over)}


def check(sim) -> Feasibility:
    """Feasibility of the task graph ``sim`` (a :class:`Simulator`) holds now
    (after :meth:`Simulator.run` or :meth:`Simulator.delta`); no scheduling."""
    from .taskgraph import COPY, UPDATE

    tg, m = sim.tg, sim.machine
    D = tg.D
    a = np.flatnonzero(tg.alive)
    kind, dev, mb = tg.kind[a], tg.mdev[a], tg.mbytes[a]
    cat = np.where(kind == COPY, 1, np.where(kind == UPDATE, 2, 0))
    per = np.bincount(cat * D + dev, mb, minlength=3 * D).reshape(3, D)
    per = np.vstack([per, tg.buffer_bytes()[None, :]])
    if tg.sym is not None:  # symmetric simulation: device d is node 0's d % G
        per = per[:, np.arange(D) % tg.sym[1]]
    total = per.sum(0)
    peak, cap, over, brk = {}, {}, {}, {}
    for d in range(D):
        name = m.devices[d].name
        peak[name] = float(total[d])
        cap[name] = float(m.devices[d].memory)
        brk[name] = {c: float(per[i, d]) for i, c in enumerate(CATEGORIES)}
        if total[d] > cap[name]:
            over[name] = float(total[d] - cap[name])
    return Feasibility(peak, cap, over, brk)


def feasibility(sim, strategy) -> Feasibility:
    """Feasibility of ``strategy`` on ``sim``'s machine: builds its task graph
    (a full simulation: :meth:`Simulator.run`) and checks every device."""
    sim.run(strategy)
    return check(sim)


def search_cost(iteration_time_s: float, over_fraction: float) -> float:
    """The number searches minimise: the iteration time when nothing is over
    capacity (``over_fraction`` 0: :attr:`Feasibility.over_fraction`,
    :attr:`SimResult.over_fraction`), else ``INFEASIBLE_BASE_S * (1 +
    over_fraction)`` -- above every feasible strategy, and lower for a smaller
    overflow."""
    if over_fraction <= 0:
        return float(iteration_time_s)
    return INFEASIBLE_BASE_S * (1.0 + over_fraction)
