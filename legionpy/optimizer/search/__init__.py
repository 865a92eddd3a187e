"""Strategy search (FlexFlow paper section 6, DeePa section 4, the Intel
partitioner) and the report behind ``legionpy search``.

Methods, all compared on the full simulator's iteration time:

==============  =============================================================
``data``        data parallelism (baseline)
``model``       model parallelism (baseline)
``owt``         one weird trick for CNNs; ``expert`` (RNN expert) for RNNs
``partitioner`` whole ops on single devices, balanced min-cut (:mod:`.partitioner`)
``elimination`` DeePa's node/edge elimination DP, additive cost (:mod:`.elimination`)
``hierarchical`` stages across nodes, data parallel within a stage, following the
                machine's link hierarchy; memory-aware (:mod:`.hierarchical`)
``pipeline``    stages x device blocks x micro-batches x recomputation, memory as a
                hard limit, the best estimates simulated (:mod:`.pipeline`)
``mcmc``        Metropolis-Hastings with delta simulation (:mod:`.mcmc`), started
                from data, expert, random and the elimination result
``exhaustive``  depth-first with lower-bound pruning, small cases only (:mod:`.exhaustive`)
==============  =============================================================

>>> from legionpy import models
>>> from legionpy.optimizer import Machine, search
>>> g = models.lenet(batch_size=16).graph
>>> m = Machine.parse("p100:1x4")
>>> best = search.mcmc(g, m, iterations=40, seed=0)          # a Strategy
>>> rep = search.run_all(g, m, budget_s=5, seed=0, iterations=40)
>>> sorted(rep.to_json()["strategies"])[:3]
['data', 'elimination', 'hierarchical']

:func:`search_for_model` is what ``nn.Model.compile(strategy="search")``
calls: the same search, cached on disk by a hash of the graph's structure,
the machine and the search settings.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...collectives import resolve_sync
from ..costmodel import default_cost_model
from ..memory import check as check_memory
from ..memory import format_bytes
from ..simulator import Simulator
from ..strategy import Strategy
from .baselines import baselines, expert_name
from .elimination import EliminationResult, eliminate
from .exhaustive import ExhaustiveResult, exhaustive
from .hierarchical import HierarchicalResult, hierarchical
from .mcmc import MCMCResult, initial_candidates
from .mcmc import mcmc as run_mcmc
from .partitioner import PartitionResult, partition
from .pipeline import PipelineResult, pipeline_search
from .space import ConfigSpace, symmetric_table
from .stages import staged_candidates

__all__ = ["mcmc", "run_mcmc", "run_all", "SearchReport", "search_for_model", "eliminate",
           "exhaustive", "partition", "baselines", "ConfigSpace", "MCMCResult",
           "EliminationResult", "ExhaustiveResult", "PartitionResult", "initial_candidates",
           "hierarchical", "HierarchicalResult", "pipeline_search", "PipelineResult",
           "DEFAULT_METHODS", "LARGE_METHODS", "graph_hash", "data_tasks"]

DEFAULT_METHODS = ("data", "model", "expert", "partitioner", "elimination", "hierarchical",
                   "pipeline", "mcmc")
#: when data parallelism's full simulation takes more than :data:`LARGE_SHARE`
#: of the budget or has more than :data:`LARGE_TASKS` tasks (GPT-3-sized graphs
#: on tens of GPUs: millions of tasks, ~10 s each; the per-op baselines take
#: minutes), the default methods are these (issue 25)
LARGE_METHODS = ("data", "pipeline")
LARGE_SHARE = 0.15
#: ... or when data parallelism's task graph has more tasks than this
LARGE_TASKS = 1_000_000
#: with collective sync on more than :data:`AT_SCALE` devices (docs/seam.md):
#: the methods whose strategies simulate in seconds there (node-symmetric
#: baselines, one node per class) and MCMC started from them; the others
#: (model, OWT, the DP, the partitioner, hierarchical) build full graphs of
#: millions of tasks per strategy and are opt-in through ``methods``
SCALE_METHODS = ("data", "hybrid", "mcmc")
AT_SCALE = 256


def mcmc(graph, machine, budget_s: float = 30, seed: int = 0, iterations: int | None = None,
         **kw) -> Strategy:
    """The best strategy MCMC finds (see :func:`.mcmc.mcmc` for the options and
    :func:`run_mcmc` for the full :class:`MCMCResult`)."""
    return run_mcmc(graph, machine, budget_s, seed, iterations, **kw).strategy


@dataclass
class SearchReport:
    """Every method's strategy and simulated figures (seconds, bytes)."""

    graph: str
    machine: str
    rows: dict = field(default_factory=dict)
    strategies: dict = field(default_factory=dict)
    search_time_s: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def best(self) -> str:
        """The fastest feasible method; when none fits, the one with the
        smallest memory overflow (:func:`legionpy.optimizer.memory.search_cost`)."""
        return min(self.rows, key=lambda n: (self.rows[n]["search_cost"],
                                             list(self.rows).index(n)))

    @property
    def best_strategy(self) -> Strategy:
        return self.strategies[self.best]

    def to_json(self) -> dict:
        return {"model": self.graph, "machine": self.machine,
                "search_time_s": self.search_time_s,
                "strategies": {n: dict(r) for n, r in self.rows.items()}, "best": self.best,
                "infeasible": {n: r["memory"] for n, r in self.rows.items()
                               if not r["feasible"]}}

    def table(self) -> str:
        head = (f"{'method':<12} {'iter time (ms)':>15} {'vs data':>8} {'moved (MB)':>11} "
                f"{'search (s)':>10} {'stop':>6}")
        head += f"  {'peak memory':>11}"
        lines = [f"{self.graph} on {self.machine}", head, "-" * len(head)]
        over = []
        for n, r in self.rows.items():
            t = r["iteration_time_s"]
            ts = "infeasible" if not math.isfinite(t) else f"{t * 1e3:.3f}"
            sp = r["speedup_vs_data"]
            mem = r["memory"]
            lines.append(f"{n:<12} {ts:>15} {sp:>7.2f}x {r['bytes_moved'] / 1e6:>11.1f} "
                         f"{r['search_time_s']:>10.2f} {r.get('stop', ''):>6}  "
                         f"{format_bytes(mem['max_peak_bytes']):>11}")
            if not r["feasible"]:
                over.append(f"  {n}: {mem['detail']}")
        if over:
            lines.append("infeasible (simulated peak memory above device capacity):")
            lines += over
        b = self.details.get("budget")
        tail = f"best: {self.best}   total {self.search_time_s:.1f} s"
        if b:
            tail += (f" (searching {b['search_s']:.1f} s of a {b['budget_s']:.1f} s budget, "
                     f"scoring {b['scoring_s']:.1f} s)")
        lines.append(tail)
        cm = self.details.get("cost_model")
        if cm and "tiles" in cm:  # say when the times are a recorded GPU's
            t = cm["tiles"]
            lines.append(f"costs: {cm['name']} ({t['table']} tiles from the table, "
                         f"{t['analytic']} analytic, {t.get('scaled', 0)} of them scaled by "
                         "their op's measured efficiency)")
        return "\n".join(lines)


def run_all(graph, machine, budget_s: float = 30, seed: int = 0,
            methods: Sequence[str] | None = None, iterations: int | None = None,
            cost_model=None, space: ConfigSpace | None = None,
            progress: Callable[[int, int | None, float], None] | None = None,
            stage: Callable[[str], None] | None = None,
            found: dict | None = None, sync: str | None = None) -> SearchReport:
    """Run ``methods`` (default :data:`DEFAULT_METHODS`; add ``"exhaustive"``
    for tiny cases, ``"hybrid"`` for the data-across-nodes / tensor-inside
    baseline) and simulate each result. ``sync``: the simulator's gradient
    sync (docs/seam.md; :func:`legionpy.collectives.resolve_sync`); with
    ``"collective"`` (the default) on more than :data:`AT_SCALE` devices the
    default methods are :data:`SCALE_METHODS`.

    The budget (issues 18 and 25): the whole call takes about ``budget_s``
    seconds: the searches get what is left of it after scoring the
    baselines and a reserve for scoring each method's answer (one full
    simulation each, as long as the longest so far), and every method stops
    within one unit of its work past its deadline. The elimination DP may use up to 60% of it
    when MCMC follows (else all of it), the partitioner and the exhaustive
    search what is left, MCMC the rest; a method whose deadline passes stops
    and returns its best so far (``stop`` column ``budget``; the DP then
    returns data parallelism). Full simulations that score the results
    (every strategy once: the baselines, each method's answer) are counted
    apart (``details["budget"]["scoring_s"]``); MCMC reuses them as the costs
    of its starting points. With ``iterations`` MCMC never reads the clock
    (deterministic) and the other methods get no deadline."""
    t0 = time.perf_counter()
    sync = resolve_sync(sync)
    scale = sync == "collective" and machine.num_devices > AT_SCALE
    chosen = methods is not None
    methods = list(methods or (SCALE_METHODS if scale else DEFAULT_METHODS))
    ename = expert_name(graph)
    methods = [ename if m in ("expert", "owt") else m for m in methods]
    unknown = set(methods) - {"data", "model", ename, "partitioner", "elimination", "mcmc",
                              "exhaustive", "hierarchical", "hybrid", "pipeline",
                              "even-pipeline", "megatron"}
    if unknown:
        from ...errors import StrategyError
        raise StrategyError(f"unknown search methods {sorted(unknown)}; known: "
                            f"{list(DEFAULT_METHODS) + ['owt', 'exhaustive', 'hybrid', 'megatron']}"
                            " and 'even-pipeline'")
    cost_model = cost_model or default_cost_model(machine)  # one model for every method
    sim = Simulator(graph, machine, cost_model, sync=sync)  # sync: docs/seam.md
    rep = SearchReport(graph.name, machine.name)
    # {method: (strategy, search s)} as methods finish; a caller's dict keeps
    # the results so far when Ctrl-C ends the search (legionpy search)
    found = {} if found is None else found
    stops: dict[str, str] = {}
    scored: dict[Strategy, tuple] = {}
    scoring = [0.0, 0.0]  # total seconds, longest single simulation

    def score(s: Strategy, result=None) -> tuple:
        """(SimResult, memory Feasibility) of ``s``, simulated once."""
        r = scored.get(s)
        if r is None:
            t = time.perf_counter()
            res = result if result is not None else sim.run(s)
            r = scored[s] = (res, check_memory(sim))
            dt = time.perf_counter() - t
            scoring[0] += dt
            scoring[1] = max(scoring[1], dt)
        return r

    def cost(s: Strategy) -> float:
        return score(s)[0].search_cost

    base = baselines(graph, machine)
    if machine.num_devices < 2:  # nothing to pipeline
        methods = [m for m in methods if m not in ("pipeline", "even-pipeline")]
    est = data_tasks(graph, machine)
    if not chosen and not scale and est > 4 * LARGE_TASKS:
        # data parallelism alone would take a large part of the budget to simulate
        methods = [m for m in LARGE_METHODS if m != "data"]
        rep.details["large"] = {"data_tasks_estimate": est, "methods": methods}
    else:
        big = score(base["data"])[0].num_tasks > LARGE_TASKS
        if not chosen and not scale and (big or (iterations is None and budget_s > 0
                                                 and scoring[1] > LARGE_SHARE * budget_s)):
            methods = list(LARGE_METHODS)  # a simulation is too dear for the per-op searches
            rep.details["large"] = {"simulation_s": scoring[1], "methods": methods}
    for m in ("megatron", "even-pipeline"):
        if m in methods:
            base[m] = (Strategy.megatron(graph, machine) if m == "megatron"
                       else Strategy.pipeline(graph, machine))
    for m in methods:
        if m in base:
            found[m] = (base[m], 0.0)
    for m in ("data", ename, "hybrid", "even-pipeline", "megatron"):
        if m in methods or ("mcmc" in methods and not scale and m not in (
                "hybrid", "even-pipeline", "megatron")):
            score(base[m])
    t_search, scored_before = time.perf_counter(), scoring[0]
    timed = iterations is None
    # the budget is the whole call's (issue 25): the baselines' scoring came
    # out of it, each method's answer is scored as soon as it is found, and
    # MCMC, last, keeps back one full simulation (as long as the longest so
    # far) for scoring its answer
    window = max(0.0, t0 + budget_s - t_search)
    deadline = t_search + window if timed else None

    def share(frac: float) -> float | None:
        return t_search + frac * window if timed else None

    dp = None
    if "elimination" in methods or "mcmc" in methods:
        if stage:
            stage("elimination")
        dp = eliminate(graph, machine, cost_model=cost_model,
                       deadline=share(0.6 if "mcmc" in methods else 1.0))
        rep.details["elimination"] = {"exact": dp.exact, "additive_cost_s": dp.additive_cost_s,
                                      "fixed_nodes": len(dp.fixed_nodes), "groups": dp.groups,
                                      "stopped_on_budget": dp.stopped_on_budget}
        stops["elimination"] = "budget" if dp.stopped_on_budget else "done"
        dp_s, dp_t = dp.strategy, dp.search_time_s
        if not dp.stopped_on_budget:  # disjoint device sets for repeated layers (.stages)
            t1, sc = time.perf_counter(), scoring[0]
            tried = {"dp": cost(dp_s)}
            for name, s in staged_candidates(graph, machine, dp_s).items():
                # the unit of this pass: a full simulation of mostly new configs,
                # as long as the longest (coldest) one so far
                if timed and time.perf_counter() + scoring[1] >= share(
                        0.6 if "mcmc" in methods else 1.0):
                    stops["elimination"] = "budget"
                    break
                tried[name] = cost(s)
                if tried[name] < cost(dp_s):
                    dp_s = s
            scoring[0] = sc  # these simulations are the pass's search, not scoring
            dp_t += time.perf_counter() - t1
            rep.details["elimination"]["staged"] = tried
        if "elimination" in methods:
            found["elimination"] = (dp_s, dp_t)
            score(dp_s)
    hier = None
    if "hierarchical" in methods or "mcmc" in methods:
        if stage:
            stage("hierarchical")
        sc = scoring[0]
        hier = hierarchical(graph, machine, cost_model, sim, deadline=share(0.7), score=cost)
        scoring[0] = sc  # these simulations are the method's search, not scoring
        found["hierarchical"] = (hier.strategy, hier.search_time_s)
        score(hier.strategy)
        stops["hierarchical"] = "budget" if hier.stopped_on_budget else "done"
        rep.details["hierarchical"] = {"stages": hier.stages, "tried": hier.tried}
    if "pipeline" in methods:
        if stage:
            stage("pipeline")
        sc = scoring[0]
        pr = pipeline_search(graph, machine, cost_model, cost,
                             deadline=share(0.8) if "mcmc" in methods else deadline,
                             optimizer_slots=sim.tg.optimizer_slots,
                             also=[base[m] for m in ("even-pipeline",) if m in base],
                             sim_s=lambda: scoring[1])
        scoring[0] = sc  # its simulations are its search
        found["pipeline"] = (pr.strategy or base["data"], pr.search_time_s)
        stops["pipeline"] = "budget" if pr.stopped_on_budget else "done"
        rep.details["pipeline"] = {"estimates": len(pr.tried), "simulated": len(pr.simulated),
                                   "pick": None if pr.strategy is None
                                   else pr.strategy.pipeline.to_dict()}
    if "partitioner" in methods:
        if stage:
            stage("partitioner")
        pr = partition(graph, machine, seed=seed, cost_model=cost_model, deadline=deadline)
        found["partitioner"] = (pr.strategy, pr.search_time_s)
        score(pr.strategy)
        stops["partitioner"] = "budget" if pr.stopped_on_budget else "done"
    if "exhaustive" in methods:
        if stage:
            stage("exhaustive")
        ex = exhaustive(graph, machine, space, cost_model, simulator=sim, deadline=deadline)
        found["exhaustive"] = (ex.strategy, ex.search_time_s)
        score(ex.strategy)
        stops["exhaustive"] = "budget" if ex.stopped_on_budget else "done"
        rep.details["exhaustive"] = {"complete": ex.complete, "leaves": ex.leaves}
    if "mcmc" in methods:
        if stage:
            stage("mcmc")
        if scale:  # starts that simulate in seconds at this scale
            init = {m: base[m] for m in ("data", "hybrid") if m in methods or m == "data"}
        else:
            init = initial_candidates(graph, machine, seed, space, dp_s)
        if hier is not None and hier.stages > 1:  # a start that fits where data does not
            init["hierarchical"] = hier.strategy
        known = {n: cost(s) for n, s in init.items() if n != "random"}
        left = max(0.0, deadline - time.perf_counter() - scoring[1]) if timed else budget_s
        t1 = time.perf_counter()
        # at scale: proposals among node-symmetric configs, each simulated
        # on one node per class in about a second (docs/search.md)
        table = symmetric_table(graph, machine, space) if scale else None
        mr = run_mcmc(graph, machine, left, seed, iterations, space=space, initial=init,
                      simulator=sim, progress=progress, known_costs=known,
                      full_sim_s=scoring[0] / max(1, len(scored)), table=table)
        found["mcmc"] = (mr.strategy, time.perf_counter() - t1 + dp_t)
        if mr.result is not None:
            score(mr.strategy, mr.result)
        stops["mcmc"] = "budget" if mr.stopped_on_budget else "done"
        rep.details["mcmc"] = {"iterations": mr.iterations, "accepted": mr.accepted,
                               "chains": mr.chains, "polish_moves": mr.polish_moves,
                               "stopped_on_budget": mr.stopped_on_budget}
    search_s = time.perf_counter() - t_search - (scoring[0] - scored_before)
    results = {m: score(found[m][0]) for m in methods}
    data_t = score(base["data"])[0].iteration_time_s if "data" in methods else math.nan
    for m in methods:
        r, f = results[m]
        t = r.iteration_time_s if r.feasible else math.inf
        rep.rows[m] = {"iteration_time_s": t,
                       "speedup_vs_data": data_t / t if t and math.isfinite(data_t) else 0.0,
                       "bytes_moved": r.bytes_moved, "search_time_s": found[m][1],
                       "feasible": r.feasible, "search_cost": r.search_cost,
                       "memory": {**f.to_dict(), "detail": f.describe()},
                       "stop": stops.get(m, "")}
        s = found[m][0]
        rep.strategies[m] = Strategy(dict(s), graph.name, machine.name, s.pipeline)
    rep.search_time_s = time.perf_counter() - t0
    rep.details["budget"] = {"budget_s": budget_s, "search_s": max(0.0, search_s),
                             "scoring_s": scoring[0]}
    rep.details["cost_model"] = cost_model_summary(cost_model)
    return rep


def data_tasks(graph, machine) -> int:
    """About how many tasks data parallelism's task graph has, without
    building it: a forward and a backward per op and device, and per
    parameter shard (``placement.update_shards``) a copy to and from every
    other device."""
    from ...placement import SHARD_MIN_BYTES

    D = machine.num_devices
    n = 2 * len(graph.ops) * D
    for p in graph.parameters().values():
        nb = float(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
        n += 2 * D * max(1, min(D, int(nb // SHARD_MIN_BYTES)))
    return n


def cost_model_summary(cost_model) -> dict:
    """``{"name", "tiles"?}``: the cost model a search or simulation ran on
    (a recorded profile: its files and how many tiles came from its table)."""
    out = {"name": getattr(cost_model, "source", "") or type(cost_model).__name__}
    if hasattr(cost_model, "coverage"):
        out["tiles"] = cost_model.coverage()
    return out


def graph_hash(graph, machine, **settings) -> str:
    """A stable hash of the graph's structure (ops, shapes, dims, edges,
    parameter sharing), the machine and ``settings``."""
    ops = [[op.name, op.kind, op.output_shape, op.dims, op.dtype,
            sorted((k, repr(v)) for k, v in op.attrs.items()),
            [(r.op.name, r.view) for r in op.inputs],
            sorted((k, p.name, p.shape) for k, p in op.params.items())] for op in graph.ops]
    blob = json.dumps({"graph": ops, "batch": graph.batch_size, "machine": machine.cache_key(),
                       "settings": settings, "v": 1}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def search_for_model(graph, machine, budget_s: float = 30, seed: int = 0,
                     cache_dir: str | None = None, iterations: int | None = None,
                     methods: Sequence[str] | None = None) -> Strategy:
    """The best strategy of :func:`run_all` for ``graph`` on ``machine``, cached
    on disk (``cache_dir``, else ``$LEGIONPY_CACHE``, else ``~/.cache/legionpy``)
    by :func:`graph_hash`. With ``iterations`` the result is deterministic
    (DESIGN.md invariant 5), so every MPI rank computes the same one."""
    from ...atomic import cache_dir as default_cache_dir

    cache_dir = cache_dir or str(default_cache_dir())
    key = graph_hash(graph, machine, budget_s=budget_s, seed=seed, iterations=iterations,
                     methods=list(methods or DEFAULT_METHODS))
    path = os.path.join(cache_dir, f"strategy-{graph.name}-{key}.json")
    if os.path.exists(path):
        try:
            s = Strategy.load(path, graph)
            s.validate(graph, machine)
            return s
        except Exception:  # a stale or broken cache entry: search again
            pass
    best = run_all(graph, machine, budget_s, seed, methods, iterations).best_strategy
    try:
        os.makedirs(cache_dir, exist_ok=True)
        best.save(path)
    except OSError:
        pass
    return best
