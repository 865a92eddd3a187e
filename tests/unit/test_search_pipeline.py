"""The pipeline search (optimizer/search/pipeline.py): its pick is never
slower than the even-cut baseline it competes with, fits where the
baseline does not, keeps its deadline, round-trips through JSON, and shows
in legionpy search's table."""

from __future__ import annotations

import json
import math
import time

from simhelpers import with_memory

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy
from legionpy.optimizer.costmodel import default_cost_model
from legionpy.optimizer.memory import INFEASIBLE_BASE_S
from legionpy.optimizer.search import DEFAULT_METHODS, run_all
from legionpy.optimizer.search.pipeline import pipeline_search
from legionpy.pipeline import cut_points


def _search(g, m, **kw):
    sim = Simulator(g, m)
    return pipeline_search(g, m, default_cost_model(m), lambda s: sim.run(s).search_cost,
                           **kw), sim


def test_cuts_go_where_one_tensor_crosses():
    g = models.graph("gpt2", scale="small").graph
    pts = cut_points(g)
    names = [g.ops[i].name for i in pts]
    assert "h1.ln1" in names  # between blocks: the residual stream only
    assert not any(".attn.probs" in n or ".attn.scores" in n for n in names)


def test_the_pick_is_never_slower_than_the_even_cut_baseline():
    g = models.graph("transformer", scale="small", batch_size=32).graph
    m = Machine.parse("p100:2x4")
    even = Strategy.pipeline(g, m)
    r, sim = _search(g, m, also=[even])
    assert r.strategy is not None and r.strategy.pipeline is not None
    assert r.cost_s <= sim.run(even).search_cost
    assert r.simulated and r.tried


def test_the_pick_fits_where_the_baseline_does_not():
    """Little memory: the even cut (no recomputation, many micro-batches
    alive on the first stage) overflows; the search finds cuts, micro-
    batches or recomputation that fit."""
    g = models.graph("gpt2", scale="small", batch_size=64, seq=64, d_model=64).graph
    base = Machine.parse("p100:1x4")
    even = Strategy.pipeline(g, base, stages=4, microbatches=16)
    need = Simulator(g, base).run(even).peak_memory["n0gpu0"]
    m = with_memory(base, 0.6 * need)
    assert not Simulator(g, m).run(even).feasible
    r, _ = _search(g, m)
    assert r.strategy is not None and r.cost_s < INFEASIBLE_BASE_S
    assert Simulator(g, m).run(r.strategy).feasible


def test_a_passed_deadline_stops_after_one_candidate():
    g = models.graph("transformer", scale="small", batch_size=32).graph
    m = Machine.parse("p100:2x4")
    r, _ = _search(g, m, deadline=time.perf_counter())
    assert r.stopped_on_budget and len(r.simulated) <= 1


def test_run_all_has_a_pipeline_row_and_keeps_its_pipeline():
    g = models.graph("transformer", scale="small", batch_size=32).graph
    m = Machine.parse("p100:2x4")
    assert "pipeline" in DEFAULT_METHODS
    rep = run_all(g, m, budget_s=5, seed=0, methods=["data", "pipeline"])
    assert "pipeline" in rep.rows and "pipeline" in rep.table()
    s = rep.strategies["pipeline"]
    assert s.pipeline is not None
    back = Strategy.from_dict(json.loads(json.dumps(s.to_dict())), g)
    assert back == s and math.isfinite(Simulator(g, m).simulate(back))


def test_mcmc_moves_on_cuts_and_micro_batches_never_lose_the_start():
    """Metropolis-Hastings from a poor pipeline (badly cut, few micro-
    batches): boundary shifts, m doubled or halved, recomputation switched;
    the best is never worse than the start and here strictly better."""
    from legionpy.optimizer.search.pipeline import refine

    g = models.graph("gpt2", scale="small", batch_size=32, layers=4).graph
    m = Machine.parse("p100:1x4")
    sim = Simulator(g, m)
    pts = cut_points(g)
    poor = Strategy.pipeline(g, m, stages=2, microbatches=2)
    poor = poor.with_pipeline(poor.pipeline.__class__(
        ((g.ops[0].name, g.ops[pts[0] - 1].name), (g.ops[pts[0]].name, g.ops[-1].name)),
        poor.pipeline.devices, 2, "1f1b", ()))
    stage = poor.pipeline.stage_of(g)
    fixed = {op.name: poor[g.ops[0].name].__class__.along(
        len(op.output_shape), 0, 2, poor.pipeline.devices[stage[op.index]]) for op in g.ops}
    poor = Strategy(fixed, g.name, m.name, poor.pipeline)
    start = sim.run(poor).search_cost
    best, cost, moves = refine(g, m, poor, lambda s: sim.run(s).search_cost, moves=40, seed=1)
    assert moves == 40 and cost <= start
    assert cost < start and best.pipeline != poor.pipeline
