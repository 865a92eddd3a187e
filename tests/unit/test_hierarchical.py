"""Hierarchical decomposition (stages across nodes, data parallel within):
valid staged strategies along the link hierarchy, and a strategy that fits
where data parallelism does not."""

from __future__ import annotations

import pytest
from simhelpers import with_memory

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy, search
from legionpy.optimizer.search.hierarchical import (
    hierarchical,
    op_work,
    stage_counts,
    staged_strategy,
)


def test_stage_counts_follow_nodes_then_devices():
    assert stage_counts(Machine.parse("p100:4x4")) == [1, 2, 4, 8, 16]
    assert stage_counts(Machine.parse("h100:3x8")) == [1, 3, 6, 12, 24]
    assert stage_counts(Machine.parse("p100:1x4")) == [1, 2, 4]


def test_staged_strategies_are_contiguous_blocks_and_one_stage_is_data_parallel():
    g = models.lenet(batch_size=16).graph
    m = Machine.parse("p100:2x4")
    w = op_work(g, m)
    assert staged_strategy(g, m, 1, w) == Strategy.data_parallel(g, m)
    for S in (2, 4, 8):
        s = staged_strategy(g, m, S, w)
        s.validate(g, m)
        blocks = []
        for op in g.ops:
            devs = s[op.name].devices
            assert len(set(d // (8 // S) for d in devs)) == 1  # one aligned block
            b = devs[0] // (8 // S)
            if not blocks or blocks[-1] != b:
                blocks.append(b)
        assert blocks == sorted(blocks)  # contiguous stages in op order
        assert len(blocks) > 1


@pytest.fixture(scope="module")
def tight():
    """lenet on 4 devices with memory between the peaks of 1 and 2 stages (batch
    16: the weights, which stages split, outweigh the activations)."""
    g = models.lenet(batch_size=16).graph
    m0 = Machine.parse("p100:1x4")
    sim = Simulator(g, m0)
    w = op_work(g, m0)
    peak = {S: sim.feasibility(staged_strategy(g, m0, S, w)).max_peak_bytes for S in (1, 2)}
    assert peak[2] < peak[1]
    return g, with_memory(m0, (peak[1] + peak[2]) / 2)


def test_hierarchical_fits_where_data_parallelism_does_not(tight):
    g, m = tight
    sim = Simulator(g, m)
    assert not sim.feasibility(Strategy.data_parallel(g, m)).feasible
    h = hierarchical(g, m, simulator=sim)
    assert h.stages > 1 and set(h.tried) >= {1, h.stages}
    assert sim.feasibility(h.strategy).feasible
    assert h.cost_s == sim.run(h.strategy).iteration_time_s


def test_search_reports_infeasible_data_and_picks_a_strategy_that_fits(tight):
    g, m = tight
    rep = search.run_all(g, m, seed=0, iterations=20,
                         methods=["data", "model", "hierarchical", "mcmc"])
    j = rep.to_json()
    assert not j["strategies"]["data"]["feasible"] and "data" in j["infeasible"]
    assert j["infeasible"]["data"]["over_bytes"] > 0
    assert j["strategies"]["hierarchical"]["feasible"]
    assert j["strategies"][j["best"]]["feasible"]
    assert j["strategies"]["mcmc"]["feasible"]  # started from the hierarchical result
    assert "data: " in rep.table() and "over by" in rep.table()
