"""MCMC search (legionpy.optimizer.search.mcmc): determinism, never worse
than its starts, local optimality, and the exhaustive optimum on tiny cases."""

from __future__ import annotations

import math

import pytest

from legionpy import models
from legionpy.optimizer import Machine, ParallelConfig, Simulator
from legionpy.optimizer.search import exhaustive, run_mcmc
from legionpy.optimizer.search.space import ConfigSpace, neighbours
from legionpy.optimizer.strategy import largest_divisor


@pytest.fixture(scope="module")
def m4():
    return Machine.parse("p100:1x4")


def _lenet():
    return models.lenet(batch_size=16).graph


def _rnn2():
    return models.rnnlm(batch_size=16, steps=2, hidden=128, layers=2, vocab=512).graph


def _tiny_table(graph):
    """Per op: data parallel over 4 and, when the op has a parameter dim, a
    4-way parameter split; ops without one may instead run whole on device 0."""
    out = {}
    for op in graph.ops:
        nd = len(op.output_shape)
        cfgs = [ParallelConfig.along(nd, 0, 4, range(4))]
        d = op.dims.index("parameter") if "parameter" in op.dims else None
        k = largest_divisor(op.output_shape[d], 4) if d is not None else 1
        if k > 1:
            cfgs.append(ParallelConfig.along(nd, d, k, range(4)))
        else:
            cfgs.append(ParallelConfig.single(nd, 0))
        out[op.name] = cfgs
    return out


@pytest.mark.parametrize("build", [_lenet, _rnn2], ids=["lenet", "rnn2"])
def test_mcmc_finds_exhaustive_optimum(build, m4):
    g = build()
    table = _tiny_table(g)
    ex = exhaustive(g, m4, table=table)
    assert ex.complete
    init = {"data": {n: c[0] for n, c in table.items()}}
    from legionpy.optimizer import Strategy
    init = {k: Strategy(v, g.name, m4.name) for k, v in init.items()}
    res = run_mcmc(g, m4, iterations=1000, seed=0, table=table, initial=init)
    assert abs(res.cost_s - ex.cost_s) <= 1e-9 * ex.cost_s
    assert all(res.strategy[n] in table[n] for n in table)


def test_same_seed_same_strategy(m4):
    g = _lenet()
    a = run_mcmc(g, m4, iterations=120, seed=3)
    b = run_mcmc(g, m4, iterations=120, seed=3)
    assert a.strategy == b.strategy and a.cost_s == b.cost_s
    assert a.chains == b.chains


def test_never_worse_than_initial(m4):
    g = _rnn2()
    res = run_mcmc(g, m4, iterations=60, seed=1)
    assert res.cost_s <= min(res.initial_costs.values())
    sim = Simulator(g, m4)
    assert math.isclose(sim.simulate(res.strategy), res.cost_s, rel_tol=1e-9)


def test_result_is_locally_optimal(m4):
    g = _lenet()
    space = ConfigSpace()
    res = run_mcmc(g, m4, iterations=100, seed=0, space=space)
    sim = Simulator(g, m4)
    base = sim.simulate(res.strategy)
    table = space.table(g, m4)
    for name, cfg in neighbours(res.strategy, table):
        assert sim.simulate(res.strategy.with_config(name, cfg)) >= base * (1 - 1e-12), name
