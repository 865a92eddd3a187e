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
