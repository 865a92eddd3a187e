"""Execution simulator: full simulation (paper Algorithm 1) and delta
simulation (Algorithm 2) over the task graph of :mod:`.taskgraph`.

>>> from legionpy.optimizer import Machine, Simulator, Strategy
>>> from legionpy import models
>>> g = models.lenet(batch_size=16).graph
>>> m = Machine.preset("p100", nodes=1)
>>> sim = Simulator(g, m)
>>> t = sim.simulate(Strategy.data_parallel(g, m))     # seconds per iteration
>>> r = sim.delta(g.ops[3].name, Strategy.data_parallel(g, m)[g.ops[3].name])

Reports (:class:`SimResult`): iteration time (s), busy seconds per compute
device and per link, bytes per link, and a static memory estimate per device:
every output tile and its gradient, every received input copy, each update
shard held (weight + gradient + optimizer state) and the reduction buffers
the runtime holds at its peak -- FlexFlow does not reuse activation memory
within an iteration, nor does legionpy (:mod:`.memory` has the rules and the
feasibility API every search calls; docs/memory.md the runtime's side). A
strategy whose estimate exceeds a device's capacity is
*infeasible*: ``SimResult.feasible`` is False, :meth:`Simulator.simulate`
returns ``inf`` and :attr:`SimResult.search_cost` a penalty above every
feasible strategy that shrinks with the overflow; the schedule itself is
still computed (``iteration_time_s``) for inspection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import StrategyError
from . import memory
from . import simkernels as K
from .costmodel import CostModel, default_cost_model
from .memory import Feasibility
from .taskgraph import COLLECTIVE, COPY, TaskGraph

__all__ = ["Simulator", "SimResult"]


@dataclass
class SimResult:
    """Outcome of one simulated iteration (times in seconds, sizes in bytes)."""

    iteration_time_s: float
    per_device_busy_s: dict = field(default_factory=dict)
    per_link_busy_s: dict = field(default_factory=dict)
    bytes_per_link: dict = field(default_factory=dict)
    peak_memory: dict = field(default_factory=dict)
    feasible: bool = True
    infeasible_devices: list = field(default_factory=list)
    num_tasks: int = 0
    #: the largest overflow of any device's memory (0.0 when feasible)
    memory_over_bytes: float = 0.0
    capacity: dict = field(default_factory=dict)
    #: symmetric simulation (optimizer/symmetry.py): the number of identical
    #: nodes node 0 stood for (1: the full graph was simulated); link
    #: figures are then node 0's links and the communicators
    classes: int = 1

    @property
    def search_cost(self) -> float:
        """What searches minimise (:func:`.memory.search_cost`): the
        iteration time when feasible, else a penalty above every feasible
        strategy that shrinks with the overflow."""
        return memory.search_cost(self.iteration_time_s, self.over_fraction)

    @property
    def over_fraction(self) -> float:
        """The largest overflow as a fraction of that device's capacity."""
        return max(((self.peak_memory[d] - self.capacity[d]) / self.capacity[d]
                    for d in self.infeasible_devices), default=0.0)

    @property
    def bytes_moved(self) -> float:
        """Bytes over all links (a multi-hop copy counts once per hop; a
        collective, every link of every step; node 0's copies ``classes``
        times under symmetric simulation)."""
        comm = sum(v for k, v in self.bytes_per_link.items() if k.startswith("comm:"))
        rest = sum(v for k, v in self.bytes_per_link.items() if not k.startswith("comm:"))
        return float(comm + self.classes * rest)

    def to_dict(self) -> dict:
        return {"iteration_time_s": self.iteration_time_s, "bytes_moved": self.bytes_moved,
                "per_device_busy_s": self.per_device_busy_s,
                "per_link_busy_s": self.per_link_busy_s, "bytes_per_link": self.bytes_per_link,
                "peak_memory_bytes": self.peak_memory, "feasible": self.feasible,
                "infeasible_devices": self.infeasible_devices, "num_tasks": self.num_tasks,
                "memory_over_bytes": self.memory_over_bytes}


class Simulator:
    """Simulates iterations of ``graph`` on ``machine`` (cost model: any
    :class:`CostModel`; by default :func:`default_cost_model` of the machine,
    the analytic roofline unless a packaged GPU profile backs its preset).
    Keeps the last task graph so :meth:`delta` can update it op by op."""

    def __init__(self, graph, machine, cost_model: CostModel | None = None,
                 optimizer_slots: int = 1, sync: str | None = None) -> None:
        self.graph, self.machine = graph, machine
        self.cost = cost_model or default_cost_model(machine)
        #: gradient synchronisation (:func:`legionpy.collectives.resolve_sync`:
        #: ``sync``, else LEGIONPY_SYNC, else collective; docs/seam.md)
        self.tg = TaskGraph(graph, machine, self.cost, optimizer_slots, sync)
        self.sync = self.tg.sync
        #: heap pops of the last delta(), or -1 if it fell back to a full
        #: reschedule (only on an internal invariant failure; never expected)
        self.last_delta_pops = 0
        self._ws: tuple | None = None  # delta scratch space, per task slot
        #: ``f(stage)`` before each stage of :meth:`run` ("task graph",
        #: "schedule"): ``legionpy simulate`` draws them as a progress bar
        self.on_stage = None

    @property
    def strategy(self):
        return self.tg.strategy

    def _args(self):
        tg = self.tg
        return (tg.alive, tg.dur, tg.res, tg.key, tg.esrc, tg.edst, tg.out_head, tg.out_next,
                tg.in_head, tg.in_next, tg.ready, tg.start, tg.end, tg.dprev, tg.dnext,
                tg.dhead, tg.dtail)

    def run(self, strategy) -> SimResult:
        """Full simulation (Algorithm 1): build the task graph, schedule it."""
        if self.on_stage is not None:
            self.on_stage("task graph")
        self.tg.build(strategy)
        if self.on_stage is not None:
            self.on_stage(f"schedule {int(self.tg.alive.sum()):,} tasks")
        n = K.full_sim(*self._args())
        alive = int(self.tg.alive.sum())
        if n != alive:
            raise StrategyError(f"the task graph has a cycle: {alive - n} of {alive} tasks "
                                f"never became ready")
        return self.result()

    def simulate(self, strategy) -> float:
        """Seconds per iteration of ``strategy`` (``inf`` when infeasible)."""
        r = self.run(strategy)
        return r.iteration_time_s if r.feasible else float("inf")

    def delta(self, op_name: str, config) -> SimResult:
        """Delta simulation (Algorithm 2): change one op's config in the last
        simulated strategy and re-simulate what that changes."""
        if self.tg.strategy is None:
            raise StrategyError("delta() needs a previous run(); simulate a strategy first")
        if self.tg.sym is not None or self.tg.pipe is not None:
            # a symmetric graph (node 0's tasks only) or a pipeline (its chains
            # join every op's tasks): simulate the new strategy whole
            return self.run(self.tg.strategy.with_config(op_name, config))
        new, new_hint, pend, checks = self.tg.change(op_name, config)
        tg = self.tg
        if self._ws is None or len(self._ws[0]) != tg.cap_t or len(self._ws[4]) != tg.n_res:
            n = tg.cap_t
            self._ws = (np.zeros(n, np.int8), np.zeros(n), np.zeros(n, np.int64),
                        np.zeros(n, np.int64), np.zeros(tg.n_res, np.int64),
                        np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(2 * n),
                        np.zeros(2 * n, np.int64), np.zeros(n), np.zeros(n, np.int64),
                        np.zeros(n, np.int64), np.full(n, -1, np.int64))
        pops = K.delta_sim(new, new_hint, pend, checks, *self._args(), *self._ws)
        self.last_delta_pops = pops
        if pops < 0:  # an internal invariant failed: reschedule in place
            self._ws = None
            n = K.full_sim(*self._args())
            alive = int(tg.alive.sum())
            if n != alive:
                raise StrategyError(f"the task graph has a cycle: {alive - n} of {alive} "
                                    f"tasks never became ready")
            self.last_delta_pops = -1
        return self.result()

    def feasibility(self, strategy=None) -> Feasibility:
        """Per-device peak memory against capacity (:mod:`.memory`) of
        ``strategy`` (built and simulated first), or of the task graph held
        now (after :meth:`run` or :meth:`delta`) when ``strategy`` is None."""
        if strategy is not None:
            self.run(strategy)
        return memory.check(self)

    def iteration_time(self) -> float:
        tg = self.tg
        return float(tg.end[tg.alive].max()) if tg.alive.any() else 0.0

    def result(self) -> SimResult:
        tg, m = self.tg, self.machine
        D = tg.D
        busy, nbytes, mem, last, n = K.summarize(tg.alive, tg.res, tg.dur, tg.kind, tg.nbytes,
                                                 tg.mdev, tg.mbytes, tg.end, len(tg.dhead), D, COPY,
                                                 COLLECTIVE)
        mem = mem + tg.buffer_bytes()  # reduction and staging buffers (optimizer/memory.py)
        classes = 1
        if tg.sym is not None:  # node m's figures are node 0's (optimizer/symmetry.py)
            classes, G = tg.sym
            rep = np.arange(D) % G
            busy = busy.copy()
            busy[:D] = busy[rep]
            mem = mem[rep]
            local = int((tg.res[tg.alive] < D + m.num_links).sum())  # node 0's tasks
            n = n + (classes - 1) * local
        bad = [m.devices[d].name for d in range(D) if mem[d] > m.devices[d].memory]
        cap = {m.devices[d].name: float(m.devices[d].memory) for d in range(D)}
        links = {ln.name: float(busy[D + ln.id]) for ln in m.links if busy[D + ln.id] > 0}
        comm = {tg.resource_name(r): r for r in tg.comms.values()}
        links.update({c: float(busy[r]) for c, r in comm.items() if busy[r] > 0})
        link_bytes = {ln.name: float(nbytes[D + ln.id]) for ln in m.links
                      if nbytes[D + ln.id] > 0}
        link_bytes.update({c: float(nbytes[r]) for c, r in comm.items() if nbytes[r] > 0})
        return SimResult(
            iteration_time_s=float(last),
            per_device_busy_s={m.devices[d].name: float(busy[d]) for d in range(D)},
            per_link_busy_s=links,
            bytes_per_link=link_bytes,
            peak_memory={m.devices[d].name: float(mem[d]) for d in range(D)},
            feasible=not bad, infeasible_devices=bad, num_tasks=int(n),
            memory_over_bytes=max((float(mem[d] - m.devices[d].memory) for d in range(D)
                                   if mem[d] > m.devices[d].memory), default=0.0),
            capacity=cap, classes=classes)

    def timeline(self) -> dict:
        """``{key: (start_s, end_s)}`` for every task (keys: stable ids)."""
        tg = self.tg
        idx = np.flatnonzero(tg.alive)
        return dict(zip(tg.key[idx].tolist(), zip(tg.start[idx].tolist(),
                                                   tg.end[idx].tolist())))

    def tasks(self) -> list[dict]:
        """Scheduled tasks in stable-id order: id, name, kind, device, start_s,
        end_s, bytes (the input of :func:`legionpy.optimizer.trace.chrome_trace`)."""
        return self.tg.to_json(include_times=True)["tasks"]
