"""Exhaustive search with pruning (FlexFlow paper section 8.4: depth-first
search over the whole space with A*-style pruning, used to check that MCMC
finds the global optimum for LeNet and a 2-step RNNLM on 4 devices).

Depth-first over the ops in topological order; at depth ``k`` ops ``0..k-1``
have configs. A complete assignment is simulated (by delta simulation from
the previous leaf, which usually differs in one op). A partial assignment is
pruned when a *lower bound* on the iteration time of every completion is at
least the best simulated time so far. The bound is the largest of:

- **device load**: every task of an assigned op's tile runs on its device,
  so the iteration takes at least the busiest device's assigned seconds;
- **total work**: (assigned work + the least work each unassigned op can
  have over its configs) / number of devices;
- **critical path**: for any path ``a -> ... -> z`` of ops, forward tasks
  run in order along it and backward tasks in reverse, and every tile of an
  op waits for at least one tile of its producer, so the iteration takes at
  least the sum over the path of each op's *smallest* tile forward +
  backward seconds (assigned ops: under their config; others: the least
  over their configs). Copies and updates only add to all three.

Configs of each op are tried cheapest first (by their slowest tile), and the
incumbent starts at the elimination DP's strategy in the same space, so good
leaves come early and the bound prunes most of the tree.

Only for small cases: the space has ``prod_o |C_o|`` strategies. The tests
use LeNet and a 2-step RNN on 4 devices with ``ConfigSpace(degrees=(1, 4),
labels=("sample", "parameter"), placement="zero")`` plus single-device
placements (see the tests); ``max_leaves`` stops a search that would run too
long (``ExhaustiveResult.complete`` is then False), and so does
``deadline`` (a ``time.perf_counter()`` value; ``stopped_on_budget``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..simulator import Simulator
from ..strategy import Strategy
from .costs import AdditiveCosts
from .mcmc import Walker
from .space import ConfigSpace

__all__ = ["exhaustive", "ExhaustiveResult"]


@dataclass
class ExhaustiveResult:
    """The optimum over the space (when ``complete``) and search statistics."""

    strategy: Strategy
    cost_s: float
    complete: bool
    leaves: int
    nodes: int
    pruned: int
    space_size: float
    search_time_s: float
    stopped_on_budget: bool = False


def exhaustive(graph, machine, space: ConfigSpace | None = None, cost_model=None,
               table: dict | None = None, max_leaves: int = 200_000,
               simulator: Simulator | None = None,
               deadline: float | None = None) -> ExhaustiveResult:
    """Depth-first search with lower-bound pruning over ``space`` (or an explicit
    ``{op name: configs}`` ``table``)."""
    t0 = time.perf_counter()
    space = space or ConfigSpace()
    sim = simulator or Simulator(graph, machine, cost_model)
    costs = AdditiveCosts(graph, machine, sim.cost)
    table = table or space.table(graph, machine)
    ops = graph.ops
    n, D = len(ops), machine.num_devices
    cfgs = [sorted(table[op.name], key=lambda c, op=op: costs.compute(op, c)) for op in ops]
    tile = [[costs.tile_times(op, c) for c in cfgs[i]] for i, op in enumerate(ops)]
    min_tile = [[float(t.min()) for t in ts] for ts in tile]
    min_work = [min(float(t.sum()) for t in ts) for ts in tile]
    best_min_tile = [min(m) for m in min_tile]
    suffix_work = np.concatenate([np.cumsum(min_work[::-1])[::-1], [0.0]])
    preds = [[r.op.index for r in op.inputs] for op in ops]

    def bound(k: int, choice: list[int], load: np.ndarray) -> float:
        w = [min_tile[i][choice[i]] if i < k else best_min_tile[i] for i in range(n)]
        longest = [0.0] * n
        for i in range(n):
            longest[i] = w[i] + max((longest[p] for p in preds[i]), default=0.0)
        return max(float(load.max()), (float(load.sum()) + suffix_work[k]) / D, max(longest))

    walker = Walker(sim, True)
    best_strategy, best_cost = None, math.inf
    try:
        from .elimination import eliminate
        inc = eliminate(graph, machine, space, costs=costs, deadline=deadline).strategy
        if all(inc[op.name] in table[op.name] for op in ops):
            best_strategy, best_cost = inc, walker.goto(inc)
    except Exception:  # the incumbent is only a speed-up
        pass
    stats = {"leaves": 0, "nodes": 0, "pruned": 0}
    choice = [0] * n
    load = np.zeros(D)
    complete = True

    def dfs(k: int) -> bool:
        nonlocal best_strategy, best_cost
        if k == n:
            s = Strategy({op.name: cfgs[i][choice[i]] for i, op in enumerate(ops)},
                         graph.name, machine.name)
            c = walker.goto(s)
            stats["leaves"] += 1
            if c < best_cost:
                best_strategy, best_cost = s, c
            if deadline is not None and time.perf_counter() >= deadline:
                stats["budget"] = 1
                return False
            return stats["leaves"] < max_leaves
        for j, c in enumerate(cfgs[k]):
            stats["nodes"] += 1
            choice[k] = j
            devs = list(c.devices)
            load[devs] += tile[k][j]
            if bound(k + 1, choice, load) >= best_cost * (1 - 1e-9):
                stats["pruned"] += 1
                ok = True
            else:
                ok = dfs(k + 1)
            load[devs] -= tile[k][j]
            if not ok:
                return False
        return True

    complete = dfs(0)
    if best_strategy is None:
        best_strategy = Strategy({op.name: cfgs[i][0] for i, op in enumerate(ops)},
                                 graph.name, machine.name)
        best_cost = walker.goto(best_strategy)
    return ExhaustiveResult(strategy=best_strategy, cost_s=best_cost, complete=complete,
                            leaves=stats["leaves"], nodes=stats["nodes"],
                            pruned=stats["pruned"],
                            space_size=float(math.prod(len(c) for c in cfgs)),
                            search_time_s=time.perf_counter() - t0,
                            stopped_on_budget="budget" in stats)
