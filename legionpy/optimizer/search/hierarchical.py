"""Hierarchical decomposition along the machine's link hierarchy: decide
within a node, then across nodes (issue 17; the two-level structure of
Megatron-LM/PipeDream-style training and of Alpa's inter-/intra-op split,
Zheng et al., OSDI'22, section 4: stages across nodes, operator parallelism
inside a stage).

The flat space of a 1,024-GPU machine (every op x every degree x every
device block) is far too big to walk; the machine's hierarchy (fast links
inside a node, slower ones between nodes) suggests a much smaller one:

1. **across nodes**: cut the graph, in op order, into ``S`` contiguous
   *stages* of about equal work, where ``S`` runs over the divisors of the
   node count (1 = every op on every node) and then, when a stage must be
   smaller than a node, over ``nodes x`` the divisors of a node's size;
   stage ``j`` gets the ``j``-th aligned block of ``D / S`` devices (whole
   nodes while ``S`` divides the node count);
2. **within a stage**: every op of the stage is data parallel over the
   stage's devices (its sample dim split by the largest divisor, as
   :meth:`Strategy.data_parallel`), the choice that keeps traffic inside the
   block.

Work per op balances compute and memory: its share of the model's forward
+ backward seconds (cost model, whole op on one device) plus its share of
the bytes it keeps (output and gradient, parameters with gradient and
optimizer state). Each candidate is scored by the full simulator with
memory (:attr:`SimResult.search_cost`), so a model that does not fit data
parallel (``S = 1``) gets the fewest stages that fit. ``S = 1`` is data
parallelism itself, so the method is never worse than it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..costmodel import default_cost_model
from ..memory import INFEASIBLE_BASE_S
from ..simulator import Simulator
from ..strategy import Strategy, split_first

__all__ = ["hierarchical", "HierarchicalResult", "stage_counts", "staged_strategy"]


@dataclass
class HierarchicalResult:
    """The best staged strategy, its cost and every stage count tried
    (``tried``: stages -> search cost in seconds)."""

    strategy: Strategy
    stages: int
    cost_s: float
    tried: dict = field(default_factory=dict)
    search_time_s: float = 0.0
    stopped_on_budget: bool = False


def stage_counts(machine) -> list[int]:
    """Stage counts along the hierarchy: divisors of the node count, then
    ``nodes x`` the divisors (> 1) of the GPUs per node (equal nodes only)."""
    n = machine.num_nodes
    D = machine.num_devices
    out = [s for s in range(1, n + 1) if n % s == 0]
    if D % n == 0:
        g = D // n
        out += [n * d for d in range(2, g + 1) if g % d == 0]
    return out


def op_work(graph, machine, cost_model=None, optimizer_slots: int = 1) -> np.ndarray:
    """Per op: its share of forward + backward seconds plus its share of bytes kept."""
    cost = cost_model or default_cost_model(machine)
    spec = machine.devices[0]
    secs, mem = [], []
    seen: set[int] = set()
    for op in graph.ops:
        if op.kind == "input":
            secs.append(0.0)
        else:
            f, b = cost.op_time(op, op.output_rect, spec)
            secs.append(f + b)
        pb = 0.0
        for p in op.params.values():
            if id(p) not in seen:
                seen.add(id(p))
                pb += float(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
        mem.append(2.0 * op.output_rect.volume * op.itemsize + (2 + optimizer_slots) * pb)
    secs, mem = np.array(secs), np.array(mem)
    return secs / max(secs.sum(), 1e-30) + mem / max(mem.sum(), 1e-30)


def staged_strategy(graph, machine, stages: int, work: np.ndarray) -> Strategy:
    """Ops cut into ``stages`` contiguous runs of about equal ``work``; run
    ``j`` data parallel on the ``j``-th aligned block of ``D / stages`` devices."""
    D = machine.num_devices
    size = D // stages
    cum = np.cumsum(work)
    total = cum[-1] if len(cum) else 0.0
    # op i goes to the stage its work midpoint falls in
    mid = cum - work / 2
    stage = np.minimum((mid / max(total, 1e-30) * stages).astype(int), stages - 1)
    stage = np.maximum.accumulate(stage)  # contiguous, in op order
    out = {}
    for op, j in zip(graph.ops, stage.tolist()):
        devs = list(range(j * size, (j + 1) * size))
        out[op.name] = split_first(op, ("sample", "parameter", "attribute"), devs)
    return Strategy(out, graph.name, machine.name)


def hierarchical(graph, machine, cost_model=None, simulator: Simulator | None = None,
                 deadline: float | None = None,
                 score: Callable[[Strategy], float] | None = None,
                 progress: Callable[[int, int, float], None] | None = None,
                 ) -> HierarchicalResult:
    """Try the stage counts of :func:`stage_counts` (fewest first) and keep
    the lowest search cost; stop at the first count slower than the best
    one once the best fits in memory. ``score``: strategy -> search cost (default: a
    full simulation on ``simulator``); ``deadline``: a ``perf_counter`` time
    after which no new candidate is started (data parallelism, ``S = 1``,
    always is); ``progress(done, total, best cost)`` after each candidate."""
    t0 = time.perf_counter()
    sim = simulator or Simulator(graph, machine, cost_model)
    score = score or (lambda s: sim.run(s).search_cost)
    work = op_work(graph, machine, cost_model or sim.cost, sim.tg.optimizer_slots)
    counts = stage_counts(machine)
    best = None
    tried: dict[int, float] = {}
    stopped = False
    for i, S in enumerate(counts):
        if i and deadline is not None and time.perf_counter() >= deadline:
            stopped = True
            break
        s = staged_strategy(graph, machine, S, work)
        c = score(s)
        tried[S] = c
        worse = best is not None and c > best[2]
        if best is None or c < best[2]:
            best = (s, S, c)
        if progress:
            progress(i + 1, len(counts), best[2])
        if worse and best[2] < INFEASIBLE_BASE_S:  # fits, and more stages only slow it
            break
    return HierarchicalResult(best[0], best[1], best[2], tried, time.perf_counter() - t0,
                              stopped)
