"""Issue 18 item 1: every method keeps its deadline and says so; the
elimination DP ties the repeated steps of an unrolled RNN."""

from __future__ import annotations

import time

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy
from legionpy.optimizer.search import eliminate, exhaustive, partition, run_all, run_mcmc
from legionpy.optimizer.search.costs import AdditiveCosts
from legionpy.optimizer.search.elimination import tied_groups
from legionpy.optimizer.search.space import ConfigSpace


def _rnn(steps: int = 4):
    return models.rnnlm(batch_size=16, steps=steps, hidden=64, layers=2, vocab=128).graph


def _lenet():
    return models.lenet(batch_size=16).graph


def test_a_passed_deadline_stops_every_method():
    g, m = _lenet(), Machine.parse("p100:1x4")
    past = time.perf_counter()
    dp = eliminate(g, m, deadline=past)
    assert dp.stopped_on_budget and dp.strategy == Strategy.data_parallel(g, m)
    pr = partition(g, m, deadline=past)
    assert pr.stopped_on_budget and pr.moves == 0
    ex = exhaustive(g, m, ConfigSpace(degrees=(1, 4), placement="zero"), deadline=past)
    assert ex.stopped_on_budget and not ex.complete and ex.leaves == 1
    mr = run_mcmc(g, m, budget_s=0.0, seed=0, elimination=False, polish_limit=0)
    assert mr.stopped_on_budget and mr.iterations == 0


def test_run_all_table_says_which_method_stopped_on_the_budget():
    g, m = _lenet(), Machine.parse("p100:1x4")
    rep = run_all(g, m, budget_s=0.0, seed=0)
    assert rep.rows["elimination"]["stop"] == "budget"
    assert rep.rows["mcmc"]["stop"] == "budget"
    assert rep.details["mcmc"]["iterations"] == 0
    assert "budget" in rep.table() and "scoring" in rep.table()
    # with proposals instead of a clock nothing stops on a budget
    rep = run_all(g, m, budget_s=0.0, seed=0, iterations=20)
    assert rep.rows["elimination"]["stop"] == "done" and rep.rows["mcmc"]["stop"] == "done"
    assert rep.details["mcmc"]["iterations"] == 20


def test_tied_dp_is_exact_on_an_unrolled_rnn_and_ties_each_layer():
    g, m = _rnn(steps=6), Machine.parse("p100:1x4")
    groups = tied_groups(g)
    assert groups[g.op("lstm0.t0").index] == groups[g.op("lstm0.t5").index]
    assert groups[g.op("lstm0.t0").index] != groups[g.op("lstm1.t0").index]
    dp = eliminate(g, m)
    assert dp.exact and not dp.fixed_nodes and dp.groups == len(g.ops) - 3 * 5
    for layer in ("lstm0", "lstm1", "embed"):
        assert len({dp.strategy[f"{layer}.t{t}"] for t in range(6)}) == 1
    assert Simulator(g, m).simulate(dp.strategy) < float("inf")
    untied = eliminate(g, m, tie=False)
    assert not untied.exact and dp.groups < untied.groups


def test_tied_dp_minimises_additive_cost_over_tied_strategies():
    g, m = _rnn(steps=3), Machine.parse("p100:1x4")
    space, costs = ConfigSpace.dp_default(), AdditiveCosts(g, m)
    dp = eliminate(g, m, space, costs=costs)
    best = costs.total(dp.strategy)
    groups = tied_groups(g)
    table = space.table(g, m)
    for op in g.ops:  # any change of one whole group never lowers the additive cost
        members = [o.name for o in g.ops if groups[o.index] == groups[op.index]]
        for c in table[op.name]:
            s = dp.strategy
            for n in members:
                s = s.with_config(n, c)
            assert costs.total(s) >= best * (1 - 1e-9)


def test_shared_parameter_syncs_once_in_the_additive_cost():
    g, m = _rnn(steps=4), Machine.parse("p100:1x4")
    costs = AdditiveCosts(g, m)
    cfg = Strategy.data_parallel(g, m)["lstm0.t0"]
    per_cell = costs.sync(g.op("lstm0.t0"), cfg)
    assert per_cell > 0
    one = _rnn(steps=1)
    whole = AdditiveCosts(one, m).sync(one.op("lstm0.t0"), cfg)
    assert abs(4 * per_cell - whole) < 1e-12 * whole + 1e-15
