"""MCMC search (FlexFlow paper section 6): Metropolis-Hastings over
strategies with the simulator as the cost.

The cost of strategy ``S`` is its simulated iteration time ``cost(S)``
(``inf`` when it does not fit in memory). From the current ``S`` a proposal
``S*`` re-draws the config of one uniformly chosen op uniformly from that
op's other valid configs (:mod:`.space`), a symmetric proposal, so the
Metropolis-Hastings acceptance is

    alpha(S -> S*) = min(1, exp(beta * (cost(S) - cost(S*))))

and the chain samples ``p(S) ~ exp(-beta * cost(S))``: it mostly goes
downhill but can climb out of local minima. ``beta``: FlexFlow accepts a
proposal ``delta`` ms worse with probability ``exp(-alpha * delta_ms)``,
``alpha`` 1.0-1.2; here ``beta = alpha / min(1 ms, rel_scale * cost0)``
(``cost0``: the best initial cost), i.e. FlexFlow's per-ms tuning for
iterations above 20 ms and a scale-free one (a proposal 5% worse is
accepted with probability ``exp(-alpha)``) for short iterations, where a
per-ms temperature would accept everything.

Every proposal is evaluated by *delta simulation* (Algorithm 2,
:meth:`Simulator.delta`); a rejected one is undone by a second delta back
to the old config (one simulator; cheaper than keeping two in step, since
an accepted proposal would have to be replayed on the second). With
``use_delta=False`` every proposal is a full simulation instead (the
benchmark's delta-vs-full comparison).

Group moves (issue 18): with probability ``group_moves`` a proposal
re-draws the config of a whole *tied group* instead -- the ops that share a
parameter, such as the cells of one unrolled LSTM layer -- so a layer can
move to its own block of devices in one step (a single cell moving alone
is always worse, so single-op moves never find layers pipelined on
disjoint devices). Also symmetric; evaluated by a full simulation.

Chains: one per initial candidate (data parallel, the expert strategy
(OWT for CNNs, the RNN expert for graphs with LSTM cells), a random strategy
from the space and the elimination DP's result), run one after the other;
each gets an equal share of what is left of the budget. A chain returns to
its best strategy after ``reset_every`` proposals without improvement
(FlexFlow resets every budget/100 iterations). It stops when its share is
spent or, under a wall-clock budget, when its best has not improved for half
of its elapsed time.

Determinism (DESIGN.md invariant 5): with ``iterations=N`` the wall clock is
never consulted; chain ``k`` draws from ``random.Random(f"{seed}:{k}")`` and
the simulator is deterministic, so the same seed gives the same strategy on
every run and every MPI rank.

Polishing: when the best strategy has at most ``polish_limit`` single-op
neighbours, a final hill-climb tries them all (in a fixed order) until none
improves, so the returned strategy is locally optimal (the paper's second
experiment in 8.4). MCMC never returns anything worse than its best initial
candidate: every chain starts at one and only ever keeps its best.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..simulator import Simulator
from ..strategy import Strategy
from .baselines import is_rnn
from .space import ConfigSpace

__all__ = ["mcmc", "MCMCResult", "initial_candidates", "polish", "is_rnn"]

ProgressFn = Callable[[int, int | None, float], None]


@dataclass
class MCMCResult:
    """Best strategy and its simulated iteration time (seconds), per-chain stats."""

    strategy: Strategy
    cost_s: float
    initial_costs: dict = field(default_factory=dict)
    chains: list = field(default_factory=list)
    iterations: int = 0
    accepted: int = 0
    polish_moves: int = 0
    search_time_s: float = 0.0
    stopped_on_budget: bool = False
    result: object = None


def initial_candidates(graph, machine, seed: int = 0, space: ConfigSpace | None = None,
                       elimination: Strategy | None = None) -> dict[str, Strategy]:
    """FlexFlow's starting points: data parallel, the expert strategy, a random
    strategy from ``space`` and (when given) the elimination DP's result."""
    space = space or ConfigSpace()
    out = {"data": Strategy.data_parallel(graph, machine)}
    out["expert"] = (Strategy.rnn_expert(graph, machine) if is_rnn(graph)
                     else Strategy.owt(graph, machine))
    out["random"] = space.random_strategy(graph, machine, random.Random(f"{seed}:random"))
    if elimination is not None:
        out["elimination"] = elimination
    return out


def _cost(r) -> float:
    """What every method minimises (docs/search.md): the iteration time when
    the strategy fits in memory, else a penalty shrinking with the overflow."""
    return r.search_cost


class Walker:
    """One simulator positioned at ``current``; moves by delta (or full runs)."""

    def __init__(self, sim: Simulator, use_delta: bool) -> None:
        self.sim, self.use_delta = sim, use_delta
        self.current: Strategy | None = None
        self.evals = 0
        self.full_s = 0.0  # seconds of the latest full simulation (a unit of work)

    def goto(self, strategy: Strategy) -> float:
        cur = self.current
        diff = [] if cur is None else [n for n in strategy if cur[n] != strategy[n]]
        if cur is None or not self.use_delta or len(diff) > 8:
            t = time.perf_counter()
            c = _cost(self.sim.run(strategy))
            self.full_s = time.perf_counter() - t
        elif not diff:
            c = _cost(self.sim.result())
        else:
            for n in diff:
                r = self.sim.delta(n, strategy[n])
            c = _cost(r)
        self.current = strategy
        self.evals += 1
        return c

    def move(self, name: str, config) -> float:
        self.evals += 1
        new = self.current.with_config(name, config)
        if self.use_delta:
            c = _cost(self.sim.delta(name, config))
        else:
            c = _cost(self.sim.run(new))
        self.current = new
        return c


def _groups(graph, table: Mapping[str, list]) -> list[list[str]]:
    """Tied groups (:func:`.elimination.tied_groups`) of two or more movable
    ops with one config table, as op-name lists."""
    from .elimination import tied_groups

    by: dict[int, list[str]] = {}
    for op, g in zip(graph.ops, tied_groups(graph)):
        if op.name in table:
            by.setdefault(g, []).append(op.name)
    return [ns for ns in by.values() if len(ns) > 1 and len(table[ns[0]]) > 1
            and all(table[n] == table[ns[0]] for n in ns)]


def polish(walker: Walker, strategy: Strategy, cost: float, table: Mapping[str, list],
           max_sweeps: int = 20, deadline: float | None = None) -> tuple[Strategy, float, int]:
    """Hill-climb over single-op changes until none improves (or ``max_sweeps``)."""
    cost = walker.goto(strategy)
    moves = 0
    for _ in range(max_sweeps):
        improved = False
        for name, cfgs in table.items():
            for c in cfgs:
                old = walker.current[name]
                if c == old:
                    continue
                new_cost = walker.move(name, c)
                if new_cost < cost * (1 - 1e-12):
                    cost, improved, moves = new_cost, True, moves + 1
                else:
                    walker.move(name, old)
                if deadline is not None and time.perf_counter() > deadline:
                    return walker.current, cost, moves
        if not improved:
            break
    return walker.current, cost, moves


def mcmc(graph, machine, budget_s: float = 30, seed: int = 0, iterations: int | None = None,
         *, space: ConfigSpace | None = None, initial: Mapping[str, Strategy] | None = None,
         alpha: float = 1.1, rel_scale: float = 0.05, reset_every: int | None = None,
         use_delta: bool = True, polish_limit: int = 4000, cost_model=None,
         simulator: Simulator | None = None, progress: ProgressFn | None = None,
         elimination: bool = True, table: Mapping[str, list] | None = None,
         known_costs: Mapping[str, float] | None = None,
         group_moves: float = 0.25, full_sim_s: float = 0.0) -> MCMCResult:
    """Metropolis-Hastings search; see the module docstring.

    ``budget_s``: wall-clock seconds (ignored when ``iterations`` is given);
    ``iterations``: total proposals over all chains (deterministic mode);
    ``initial``: ``{name: Strategy}`` starting points (default
    :func:`initial_candidates`, with the elimination DP's result when
    ``elimination``); ``table``: an explicit ``{op name: configs}`` instead of
    ``space``; ``group_moves``: the probability that a proposal re-draws
    the config of a whole tied group (ops sharing a parameter, e.g. the cells
    of one LSTM layer) instead of one op; ``full_sim_s``: the expected
    seconds of one full simulation (until one is timed here);
    ``known_costs``: simulated costs of some ``initial`` strategies (by
    name), not simulated again. Under a wall-clock budget nothing starts
    after the deadline (a chain, a proposal, a polishing move), nor a full
    simulation expected to overrun it, so the search ends within one
    proposal of it; ``stopped_on_budget`` says whether the deadline, rather
    than convergence, ended it. Returns an
    :class:`MCMCResult` (``result``: the best strategy's SimResult)."""
    t0 = time.perf_counter()
    space = space or ConfigSpace()
    sim = simulator or Simulator(graph, machine, cost_model)
    if initial is None:
        dp = None
        if elimination:
            from .elimination import eliminate
            dp = eliminate(graph, machine, cost_model=cost_model).strategy
        initial = initial_candidates(graph, machine, seed, space, dp)
        if table is not None:
            rng = random.Random(f"{seed}:random")
            initial["random"] = Strategy({n: rng.choice(c) for n, c in table.items()},
                                         graph.name, machine.name)
    table = dict(table) if table is not None else space.table(graph, machine)
    movable = [n for n, c in table.items() if len(c) > 1]
    groups = _groups(graph, table) if group_moves > 0 else []
    walker = Walker(sim, use_delta)
    walker.full_s = full_sim_s
    known = dict(known_costs or {})
    names = list(initial)
    if iterations is None and known:
        # under a clock: best known start first, the others simulated when their
        # chain starts (a chain the budget never reaches costs nothing)
        init_costs = {n: known[n] for n in names if n in known}
        names = sorted(init_costs, key=lambda n: (init_costs[n], names.index(n))) + \
            [n for n in names if n not in known]
    else:
        init_costs = {name: known[name] if name in known else walker.goto(s)
                      for name, s in initial.items()}
    finite = [c for c in init_costs.values() if math.isfinite(c)]
    cost0 = min(finite) if finite else 1.0
    beta = alpha / max(1e-12, min(1e-3, rel_scale * cost0))
    best_name = min(init_costs, key=lambda n: (init_costs[n], names.index(n)))
    best, best_cost = initial[best_name], init_costs[best_name]
    reset_every = reset_every or max(50, 2 * len(movable))
    deadline = t0 + budget_s
    chains, total_it, total_acc = [], 0, 0
    on_budget = False
    for k, name in enumerate(names):
        rng = random.Random(f"{seed}:{k}")
        if iterations is not None:
            share = iterations // len(names) + (1 if k < iterations % len(names) else 0)
            chain_deadline = math.inf
        else:
            share = None
            if time.perf_counter() + walker.full_s >= deadline:  # no time to start it
                on_budget = True
                break
            chain_deadline = time.perf_counter() + max(
                0.0, deadline - time.perf_counter()) / (len(names) - k)
        cur_cost = walker.goto(initial[name])
        init_costs.setdefault(name, cur_cost)
        cb, cb_cost = walker.current, cur_cost
        t_start, t_improved, since = time.perf_counter(), time.perf_counter(), 0
        it = acc = 0
        while movable:
            if share is not None and it >= share:
                break
            if share is None:
                now = time.perf_counter()
                if now >= chain_deadline:
                    on_budget = on_budget or now >= deadline
                    break
                if it >= 50 and now - t_improved > 0.5 * (now - t_start):
                    break
            it += 1
            members = groups[rng.randrange(len(groups))] if groups and \
                rng.random() < group_moves else None
            if members and share is None and \
                    time.perf_counter() + 2 * walker.full_s >= chain_deadline:
                members = None  # two full simulations would overrun: a single-op move
            op = members[0] if members else movable[rng.randrange(len(movable))]
            cfgs = table[op]
            old = walker.current[op]
            j = rng.randrange(len(cfgs) - 1) if old in cfgs else rng.randrange(len(cfgs))
            cfg = cfgs[j] if old not in cfgs or cfgs.index(old) > j else cfgs[j + 1]
            if members:  # a whole layer at once (its ops share parameters)
                before = walker.current
                new_cost = walker.goto(Strategy({**before, **dict.fromkeys(members, cfg)},
                                                graph.name, machine.name))
            else:
                new_cost = walker.move(op, cfg)
            u = rng.random()
            if new_cost <= cur_cost or (math.isfinite(new_cost) and
                                         u < math.exp(beta * (cur_cost - new_cost))):
                cur_cost = new_cost
                acc += 1
                if new_cost < cb_cost:
                    cb, cb_cost, since = walker.current, new_cost, 0
                    t_improved = time.perf_counter()
                    continue
            elif members:
                walker.goto(before)
            else:
                walker.move(op, old)
            since += 1
            if since >= reset_every:
                cur_cost, since = walker.goto(cb), 0
            if progress is not None and it % 16 == 0:
                progress(total_it + it, iterations, min(best_cost, cb_cost))
        chains.append({"start": name, "initial_cost_s": init_costs[name], "best_cost_s": cb_cost,
                       "iterations": it, "accepted": acc})
        total_it += it
        total_acc += acc
        if cb_cost < best_cost:
            best, best_cost = cb, cb_cost
        if progress is not None:
            progress(total_it, iterations, best_cost)
    moves = 0
    n_neigh = sum(len(c) - 1 for c in table.values())
    timed = iterations is None
    if n_neigh <= polish_limit and math.isfinite(best_cost) and not (
            timed and time.perf_counter() >= deadline):
        best, best_cost, moves = polish(walker, best, best_cost, table,
                                        deadline=deadline if timed else None)
    if timed and time.perf_counter() >= deadline:
        on_budget = True
    res = sim.result() if walker.current is not None and walker.current == best else None
    return MCMCResult(strategy=Strategy(dict(best), graph.name, machine.name), cost_s=best_cost,
                      initial_costs=init_costs, chains=chains, iterations=total_it,
                      accepted=total_acc, polish_moves=moves,
                      search_time_s=time.perf_counter() - t0, stopped_on_budget=on_budget,
                      result=res)
