"""Graph partitioner for model parallelism (Intel, "Automatic Model
Parallelism for Deep Neural Networks with Compiler and Hardware Support",
section 2): every op runs *whole* on one device; the partitioner balances
computation across devices while cutting as little communication as it can.

Weights: node weight ``w(o)`` = the op's forward + backward seconds on a
device (the cost model); edge weight ``c(p, o)`` = the seconds to move the
tensor on the edge and its gradient back over the slowest device pair's
route (bytes x 2 / bandwidth). Ops that share a parameter (the cells of one
LSTM layer) are joined by an extra edge worth the parameter's gradient
(syncing it across devices costs that much), so the partitioner keeps a
layer together when it can.

1. **Initial assignment**: *block* (default): walk the ops in topological
   order and fill device 0, 1, ... each up to ``W / D`` seconds of work
   (``W`` total); or *random*: each op on a uniformly random device.
2. **Refinement** (Kernighan-Lin / Fiduccia-Mattheyses style, as the
   paper): for op ``v`` on device ``a`` and another device ``b``, ``E_b`` is
   the weight of its edges to ops on ``b`` and ``I`` the weight of its edges
   to ops on ``a``; moving ``v`` to ``b`` changes the cut by ``-(E_b - I)``.
   Repeatedly make the move with the largest gain ``D = E_b - I > 0`` whose
   target stays within the balance bound ``load(b) + w(v) <= (1 + eps) W /
   D``. When a device is above the bound, first make *balance moves*: the
   op on it with the best gain (possibly negative) moves to the least loaded
   device that can take it. Stop when no move helps (or after ``max_passes``
   passes over the ops, or at ``deadline``, a ``time.perf_counter()``
   value: ``PartitionResult.stopped_on_budget``).

The result (degrees all 1, one device per op) is simulated by the full
simulator like every other method.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ..costmodel import default_cost_model
from ..strategy import ParallelConfig, Strategy
from .costs import AdditiveCosts

__all__ = ["partition", "PartitionResult"]


@dataclass
class PartitionResult:
    strategy: Strategy
    cut_s: float
    loads_s: list
    moves: int
    search_time_s: float
    stopped_on_budget: bool = False


def partition(graph, machine, eps: float = 0.1, init: str = "block", seed: int = 0,
              cost_model=None, max_passes: int | None = None,
              deadline: float | None = None) -> PartitionResult:
    """Place every op whole on one device (see the module docstring)."""
    t0 = time.perf_counter()
    D = machine.num_devices
    costs = AdditiveCosts(graph, machine, cost_model or default_cost_model(machine))
    ops = graph.ops
    n = len(ops)
    w = [costs.compute(op, ParallelConfig.single(len(op.output_shape), 0)) for op in ops]
    worst = float(costs.spb.max()) if D > 1 else 0.0
    adj: list[dict[int, float]] = [dict() for _ in range(n)]

    def link(a: int, b: int, seconds: float) -> None:
        if a != b:
            adj[a][b] = adj[a].get(b, 0.0) + seconds
            adj[b][a] = adj[b].get(a, 0.0) + seconds

    for op in ops:
        for ref in op.inputs:
            nbytes = op.itemsize * _vol(ref.shape)
            link(ref.op.index, op.index, 2.0 * nbytes * worst)
    users: dict[int, list[int]] = {}
    for op in ops:
        for p in op.params.values():
            users.setdefault(id(p), []).append(op.index)
    for op in ops:
        for p in op.params.values():
            us = users[id(p)]
            i = us.index(op.index)
            if i > 0:
                link(us[i - 1], op.index, 2.0 * p.nbytes * worst)
    total = sum(w)
    cap = (1.0 + eps) * total / D
    if init == "random":
        rng = random.Random(seed)
        dev = [rng.randrange(D) for _ in range(n)]
    elif init == "block":
        dev, acc = [], 0.0
        for i in range(n):
            dev.append(min(D - 1, int(acc / (total / D)) if total > 0 else 0))
            acc += w[i]
    else:
        raise ValueError(f"init must be 'block' or 'random', got {init!r}")
    load = [0.0] * D
    for i in range(n):
        load[dev[i]] += w[i]

    def gain(v: int, b: int) -> float:
        e = sum(c for u, c in adj[v].items() if dev[u] == b)
        i_ = sum(c for u, c in adj[v].items() if dev[u] == dev[v])
        return e - i_

    moves = 0
    on_budget = False
    for _ in range(max_passes if max_passes is not None else 4 * n + 10):
        if deadline is not None and time.perf_counter() >= deadline:
            on_budget = True
            break
        moved = False
        # balance moves: empty over-full devices first
        for a in range(D):
            while load[a] > cap + 1e-15:
                cands = [v for v in range(n) if dev[v] == a]
                best = None
                for v in cands:
                    for b in sorted(range(D), key=lambda d: (load[d], d)):
                        if b != a and load[b] + w[v] <= cap:
                            g = gain(v, b)
                            if best is None or g > best[0]:
                                best = (g, v, b)
                            break
                if best is None:
                    break
                _, v, b = best
                load[a] -= w[v]
                load[b] += w[v]
                dev[v] = b
                moves += 1
                moved = True
        # cut-reducing moves within the balance bound
        best = None
        for v in range(n):
            for b in {dev[u] for u in adj[v]}:
                if b == dev[v] or load[b] + w[v] > cap:
                    continue
                g = gain(v, b)
                if g > 1e-15 and (best is None or g > best[0]):
                    best = (g, v, b)
        if best is not None:
            _, v, b = best
            load[dev[v]] -= w[v]
            load[b] += w[v]
            dev[v] = b
            moves += 1
            moved = True
        if not moved:
            break
    cut = sum(c for v in range(n) for u, c in adj[v].items() if u > v and dev[u] != dev[v])
    strategy = Strategy({op.name: ParallelConfig.single(len(op.output_shape), dev[op.index])
                         for op in ops}, graph.name, machine.name)
    return PartitionResult(strategy, cut, load, moves, time.perf_counter() - t0, on_budget)


def _vol(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
