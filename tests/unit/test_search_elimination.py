"""Elimination DP (DeePa): exact on chains, compared with MCMC under the
full simulator on linear graphs."""

from __future__ import annotations

import random

import pytest

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy
from legionpy.optimizer.search import eliminate, run_mcmc
from legionpy.optimizer.search.costs import AdditiveCosts
from legionpy.optimizer.search.space import ConfigSpace


def _alexnet():
    return models.alexnet(batch_size=32, image_size=67, width=0.25, hidden=256).graph


def _vgg():
    return models.vgg16(batch_size=16, image_size=32, width=0.125, hidden=128).graph


@pytest.mark.parametrize("build", [_alexnet, _vgg], ids=["alexnet", "vgg16"])
def test_mcmc_within_one_percent_of_elimination(build):
    g, m = build(), Machine.parse("p100:1x4")
    dp = eliminate(g, m)
    assert dp.exact and not dp.fixed_nodes
    sim = Simulator(g, m)
    t_dp = sim.simulate(dp.strategy)
    res = run_mcmc(g, m, iterations=200, seed=0, polish_limit=0)
    assert res.cost_s <= 1.01 * t_dp


def test_elimination_minimises_additive_cost():
    g, m = _alexnet(), Machine.parse("p100:1x4")
    space = ConfigSpace.dp_default()
    costs = AdditiveCosts(g, m)
    dp = eliminate(g, m, space, costs=costs)
    assert abs(dp.additive_cost_s - costs.total(dp.strategy)) < 1e-12
    rng = random.Random(0)
    table = space.table(g, m)
    best = dp.additive_cost_s
    for _ in range(200):
        s = Strategy({n: rng.choice(c) for n, c in table.items()})
        assert costs.total(s) >= best * (1 - 1e-9)
    # single-op changes of the optimum never lower the additive cost
    for n, cfgs in table.items():
        for c in cfgs:
            assert costs.total(dp.strategy.with_config(n, c)) >= best * (1 - 1e-9)


def test_fallback_on_rnn_grid():
    g = models.rnnlm(batch_size=16, steps=3, hidden=64, layers=2, vocab=128).graph
    m = Machine.parse("p100:1x4")
    dp = eliminate(g, m)
    dp.strategy.validate(g, m)
    assert Simulator(g, m).simulate(dp.strategy) < float("inf")
