"""Pipeline search: stages x device blocks x micro-batches x recomputation,
memory as a hard limit (issue 25; docs/pipeline.md).

The stage slicing of Alpa (Zheng et al., "Alpa", OSDI 2022, section 5.2)
minimises ``sum_i t_i + (B - 1) max_i t_i`` over contiguous stage cuts,
where ``t_i`` is stage ``i``'s time per micro-batch and ``B`` the number of
micro-batches; PipeDream's partitioner (Narayanan et al., SOSP 2019,
section 3.1) balances the slowest stage the same way. ``sum_i t_i`` is the
whole model's time per micro-batch plus what crosses the cuts, which does
not depend on where the cuts are for a chain of equal-width layers; what a
cut decides is the slowest stage. So for each (stage count ``p``, micro-
batch count ``m``, recomputation) this module finds the cuts that minimise
the slowest stage subject to every stage's memory (its parameters with
their gradients and optimizer state, plus the activations its schedule
keeps alive: ``pipeline.in_flight``), by bisection on the bottleneck with a
greedy pack per guess. The pack is exact for this problem: each stage's
constraints (time, memory) depend only on its own ops and its index, so
taking as much as fits into earlier stages never makes a later one
infeasible (a later stage only loses ops).

Cuts go where one tensor crosses graph order (a transformer's residual
stream between blocks, a CNN's trunk between modules), so GPT-sized graphs
have tens of candidate cuts, not hundreds; when there are too few, every
position is a candidate. Inside a stage, ops are data parallel over the
stage's block (the intra-stage half of Alpa's split; the per-op methods
cover tensor parallelism without micro-batches). The estimated iteration
ranks the candidates; the best few are simulated in full (``score``), which
decides.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...pipeline import cut_points, in_flight, max_microbatches
from ..memory import INFEASIBLE_BASE_S
from ..strategy import Strategy, largest_divisor

__all__ = ["pipeline_search", "PipelineResult", "cut_points", "refine"]


@dataclass
class PipelineResult:
    """The best pipelined strategy found (None when the machine has one
    device or nothing was tried), its search cost, and every candidate's
    estimate (``tried``: (p, m, recompute) -> estimated seconds)."""

    strategy: Strategy | None
    cost_s: float = math.inf
    tried: dict = field(default_factory=dict)
    simulated: dict = field(default_factory=dict)
    moves: int = 0
    search_time_s: float = 0.0
    stopped_on_budget: bool = False


def _op_figures(graph, machine, cost, devices_per_stage: int, m: int,
                optimizer_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per op, for one micro-batch data parallel over ``devices_per_stage``:
    seconds (forward + backward of one device's tile), activation bytes
    per device (output and gradient), parameter bytes per device (weights,
    gradients and the optimizer state of its share), forward seconds."""
    spec = machine.devices[0]
    batch = graph.batch_size
    k = largest_divisor(batch // m, devices_per_stage)
    secs, fwd, act, par = [], [], [], []
    seen: set[int] = set()
    for op in graph.ops:
        r = op.output_rect
        s = list(op.dims).index("sample") if "sample" in op.dims else None
        if s is not None:
            hi = list(r.hi)
            hi[s] = r.lo[s] + max(1, (r.hi[s] - r.lo[s]) // (m * k))
            tile = type(r)(r.lo, tuple(hi))
        else:
            tile = r
        if op.kind == "input":
            f = b = 0.0
        else:
            f, b = cost.op_time(op, tile, spec)
            if not op.has_backward:
                b = 0.0
        secs.append(f + b)
        fwd.append(f)
        act.append(2.0 * tile.volume * op.itemsize)
        pb = 0.0
        for p in op.params.values():
            if id(p) not in seen:
                seen.add(id(p))
                nb = float(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
                # a replica and its gradient on every device, the update state sharded
                pb += 2 * nb + optimizer_slots * nb / k + nb / k
        par.append(pb)
    return np.array(secs), np.array(act), np.array(par), np.array(fwd)


def _pack(limit: float, starts: list[int], n: int, p: int, secs_c: np.ndarray,
          mem_ok: Callable[[int, int, int], bool]) -> list[int] | None:
    """Greedy: stage ``s`` takes the most candidate-aligned ops ``[a, b)``
    with time <= ``limit`` and memory within its cap; the stage starts, or
    None when ``p`` stages cannot cover the graph."""
    cuts = [0]
    a = 0
    for s in range(p):
        if a >= n:
            return None  # fewer stages than p would do: not this p
        if s == p - 1:
            b = n
            if secs_c[b] - secs_c[a] > limit * (1 + 1e-9) or not mem_ok(s, a, b):
                return None
        else:
            best = None
            # candidate ends after a, keeping at least one op per later stage
            for b in starts:
                if b <= a:
                    continue
                if b > n - (p - 1 - s):
                    break
                if secs_c[b] - secs_c[a] > limit * (1 + 1e-9) or not mem_ok(s, a, b):
                    break
                best = b
            if best is None:
                return None
            cuts.append(best)
            a = best
    return cuts


#: the share of a device's memory the estimate may fill (it leaves out the
#: staging and reduction buffers the simulator counts)
MEMORY_MARGIN = 0.85


def _candidates_m(graph, p: int, per: int) -> list[int]:
    """Micro-batch counts: ``p``, ``2p``, ``4p``, ``8p`` (the bubble ``(p - 1) /
    (m + p - 1)`` shrinks with ``m``) that divide the batch, leave every
    device of a block a sample and stay within ``max_microbatches`` (the
    simulation's size), else the largest such count."""
    batch = graph.batch_size
    ok = [m for m in range(1, batch + 1) if batch % m == 0 and batch // m >= per
          and m <= max_microbatches(graph, per)]
    want = {p, 2 * p, 4 * p, 8 * p}
    return sorted({m for m in ok if m in want} or ({max(ok)} if ok else set()))


def pipeline_search(graph, machine, cost_model, score: Callable[[Strategy], float],
                    deadline: float | None = None, schedule: str = "1f1b",
                    optimizer_slots: int = 1, keep: int = 6,
                    also: list | None = None,
                    sim_s: Callable[[], float] | None = None,
                    moves: int | None = None, seed: int = 0) -> PipelineResult:
    """The best pipelined strategy (see the module docstring): every stage
    count dividing the devices (2 .. ops), each with its micro-batch
    candidates, without and with recomputation; the estimates are simulated
    by ``score`` (strategy -> search cost) best first until ``keep`` of them
    fit in memory (the estimate of memory is rougher than the simulator's),
    and the strategies
    in ``also`` (already scored, e.g. the even-cut baseline) compete with
    them; nothing new starts after ``deadline`` (a ``perf_counter`` time), nor
    a simulation that would end after it by ``sim_s()`` seconds (the longest
    one so far), once one candidate has been simulated. Then :func:`refine`
    walks from the best (``moves`` proposals, or until the deadline)."""
    t0 = time.perf_counter()
    D = machine.num_devices
    n = len(graph.ops)
    res = PipelineResult(None)
    if D < 2 or n < 2:
        return res
    starts = cut_points(graph)
    cap = MEMORY_MARGIN * min(d.memory for d in machine.devices)
    est: list[tuple[float, Strategy]] = []
    stopped = False
    for p in [q for q in range(2, D + 1) if D % q == 0 and q <= len(starts) + 1]:
        per = D // p
        for m in _candidates_m(graph, p, per):
            if deadline is not None and time.perf_counter() >= deadline:
                stopped = True
                break
            secs, act, par, fwd = _op_figures(graph, machine, cost_model, per, m,
                                              optimizer_slots)
            for recompute in (False, True):
                c = _plan(graph, machine, p, m, schedule, recompute, starts, secs, act,
                          par, fwd, cap)
                res.tried[(p, m, recompute)] = c[0] if c else math.inf
                if c is not None:
                    est.append(c)
                if c is not None and not recompute:
                    break  # it fits without recomputation: no need to trade time for memory
        if stopped:
            break
    est.sort(key=lambda x: x[0])
    best = None
    for s in also or ():
        c = score(s)
        res.simulated[s.pipeline] = c
        if best is None or c < best[1]:
            best = (s, c)
    tried_one, fits = False, 0
    for _, s in est:
        if fits >= keep:
            break
        if deadline is not None and tried_one and (
                time.perf_counter() + (sim_s() if sim_s else 0.0) >= deadline):
            stopped = True
            break
        tried_one = True
        c = score(s)
        fits += c < INFEASIBLE_BASE_S
        res.simulated[s.pipeline] = c
        if best is None or c < best[1]:
            best = (s, c)
    if best is not None and (moves or (moves is None and deadline is not None)):
        # MCMC moves on the stage cuts, m and recomputation (issue 25)
        s, c, res.moves = refine(graph, machine, best[0], score, deadline, moves, seed,
                                 sim_s, start_cost=best[1])
        if c < best[1]:
            best = (s, c)
    if best is not None:
        res.strategy, res.cost_s = best
    res.search_time_s = time.perf_counter() - t0
    res.stopped_on_budget = stopped
    return res


def _plan(graph, machine, p, m, schedule, recompute, starts, secs, act, par, fwd, cap):
    """(estimated seconds, Strategy) of the best cuts for (p, m, recompute),
    or None when no cut fits in memory."""
    n = len(graph.ops)
    if recompute:  # a recomputing backward runs the forward again
        secs = secs + fwd
    secs_c = np.concatenate([[0.0], np.cumsum(secs)])
    act_c = np.concatenate([[0.0], np.cumsum(act)])
    par_c = np.concatenate([[0.0], np.cumsum(par)])
    live = [in_flight(s, p, m, schedule) for s in range(p)]

    def mem_ok(s: int, a: int, b: int) -> bool:
        acts = act_c[b] - act_c[a]
        held = live[s] * acts if not recompute else live[s] * act[b - 1] + acts
        return par_c[b] - par_c[a] + held <= cap

    lo, hi = float(secs.max()), float(secs_c[-1])
    cuts = _pack(hi, starts, n, p, secs_c, mem_ok)
    if cuts is None:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        got = _pack(mid, starts, n, p, secs_c, mem_ok)
        if got is None:
            lo = mid
        else:
            cuts, hi = got, mid
        if hi - lo <= 1e-6 * hi:
            break
    bounds = list(zip(cuts, cuts[1:] + [n]))
    t = [float(secs_c[b] - secs_c[a]) for a, b in bounds]
    estimate = sum(t) + (m - 1) * max(t)
    return estimate, _strategy(graph, machine, bounds, m, schedule, recompute)


def _strategy(graph, machine, bounds, m, schedule, recompute) -> Strategy:
    """:meth:`Strategy.staged` of ``[a, b)`` op ranges; ``recompute``: True
    for every stage, or stage indices."""
    if recompute is True:
        recompute = range(len(bounds))
    return Strategy.staged(graph, machine, [(a, b - 1) for a, b in bounds], m, schedule,
                           tuple(recompute or ()))


def refine(graph, machine, start: Strategy, score: Callable[[Strategy], float],
           deadline: float | None = None, moves: int | None = None, seed: int = 0,
           sim_s: Callable[[], float] | None = None, beta: float = 20.0,
           start_cost: float | None = None) -> tuple[Strategy, float, int]:
    """Metropolis-Hastings over a pipelined strategy (FlexFlow's search,
    section 6.2, with pipeline moves): shift one stage boundary to the
    neighbouring cut point, double or halve the micro-batches, or switch one
    stage's recomputation; a proposal ``c' `` replaces the current ``c`` when
    it is cheaper or with probability ``exp(-beta (c' - c) / c)``. Runs
    ``moves`` proposals, or until ``deadline`` (no proposal starts whose
    simulation, ``sim_s()`` seconds, would end after it). Returns the best
    (strategy, cost, proposals)."""
    import random

    rng = random.Random(seed)
    pipe = start.pipeline
    stage = pipe.stage_of(graph)
    n = len(graph.ops)
    bounds = []
    for sidx in range(pipe.num_stages):
        idx = [i for i in range(n) if stage[i] == sidx]
        bounds.append((idx[0], idx[-1] + 1))
    per, m = len(pipe.devices[0]), pipe.microbatches
    rec = set(pipe.recompute)
    starts = sorted(set(cut_points(graph)))
    batch = graph.batch_size
    cur = (list(bounds), m, frozenset(rec))
    cur_c = score(start) if start_cost is None else start_cost
    best = (start, cur_c)
    done = 0
    while True:
        if moves is not None and done >= moves:
            break
        if moves is None and (deadline is None or time.perf_counter()
                              + (sim_s() if sim_s else 0.0) >= deadline):
            break
        bnd, mm, rr = list(cur[0]), cur[1], set(cur[2])
        kind = rng.randrange(3)
        if kind == 0 and len(bnd) > 1:  # move the start of stage k + 1
            k = rng.randrange(len(bnd) - 1)
            a = bnd[k + 1][0]
            lo, hi = bnd[k][0], bnd[k + 1][1]
            opts = [x for x in starts if lo < x < hi and x != a]
            near = [x for x in opts if abs(x - a) == min((abs(y - a) for y in opts), default=0)]
            if not near:
                done += 1
                continue
            x = rng.choice(near)
            bnd[k], bnd[k + 1] = (bnd[k][0], x), (x, bnd[k + 1][1])
        elif kind == 1:
            mm = mm * 2 if rng.random() < 0.5 else mm // 2
            if mm < 1 or batch % mm or batch // mm < per or mm > max_microbatches(graph, per):
                done += 1
                continue
        else:
            rr ^= {rng.randrange(len(bnd))}
        cand = _strategy(graph, machine, bnd, mm, pipe.schedule, tuple(sorted(rr)))
        c = score(cand)
        done += 1
        if c <= cur_c or (math.isfinite(c) and rng.random() < math.exp(
                -beta * (c - cur_c) / max(cur_c, 1e-30))):
            cur, cur_c = (bnd, mm, frozenset(rr)), c
            if c < best[1]:
                best = (cand, c)
    return best[0], best[1], done
