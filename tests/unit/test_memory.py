"""Memory feasibility (legionpy.optimizer.memory): per-device peak bytes
from the task graph against capacity, and how searches see it."""

from __future__ import annotations

import math

import pytest
from simhelpers import with_memory

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy, search
from legionpy.optimizer.memory import CATEGORIES, INFEASIBLE_BASE_S, check, feasibility, search_cost


@pytest.fixture(scope="module")
def lenet():
    return models.lenet(batch_size=64).graph


def test_breakdown_sums_to_the_simulators_peak(lenet):
    m = Machine.parse("p100:1x4")
    sim = Simulator(lenet, m)
    s = Strategy.data_parallel(lenet, m)
    r = sim.run(s)
    f = check(sim)
    assert f.feasible and f.over_bytes == 0.0 and f.over == {}
    for d, peak in r.peak_memory.items():
        assert f.peak[d] == pytest.approx(peak)
        assert sum(f.breakdown[d][c] for c in CATEGORIES) == pytest.approx(peak)
        assert f.capacity[d] == m.devices[0].memory
    # activations: every forward output tile and its gradient (inputs: no
    # gradient), over the devices
    acts = sum(f.breakdown[d]["activations"] for d in f.peak)
    out = sum(op.output_rect.volume * op.itemsize * (1 if op.kind == "input" else 2)
              for op in lenet.ops)
    assert acts == pytest.approx(out)


@pytest.mark.parametrize("sync", ["shards", "collective"])
def test_optimizer_state_counts_once_per_parameter_element(lenet, sync):
    m = Machine.parse("p100:1x4")
    s = Strategy.data_parallel(lenet, m)
    got = {}
    for slots in (0, 2):
        sim = Simulator(lenet, m, optimizer_slots=slots, sync=sync)
        f = feasibility(sim, s)
        got[slots] = sum(f.breakdown[d]["parameters"] for d in f.peak)
    # the update shards (collective: the members' chunks of each flat bucket,
    # padded to equal chunks) tile every parameter once (fp32)
    tol = 0 if sync == "shards" else 4 * 4 * 4 / (2 * 4 * lenet.num_parameters())
    assert got[2] - got[0] == pytest.approx(2 * 4 * lenet.num_parameters(), rel=tol or 1e-6)
    if sync == "shards":
        assert got[0] == pytest.approx(2 * 4 * lenet.num_parameters())
    else:  # every member keeps a flat replica of the weights and gradients (ZeRO-1)
        assert got[0] == pytest.approx(4 * 2 * 4 * lenet.num_parameters(), rel=tol)


def test_over_capacity_is_infeasible_by_the_overflow(lenet):
    m0 = Machine.parse("p100:1x4")
    peak = max(feasibility(Simulator(lenet, m0), Strategy.data_parallel(lenet, m0))
               .peak.values())
    m = with_memory(m0, peak * 0.8)
    sim = Simulator(lenet, m)
    s = Strategy.data_parallel(lenet, m)
    f = sim.feasibility(s)
    r = sim.result()
    assert not f.feasible and not r.feasible
    assert f.over_bytes == pytest.approx(peak - 0.8 * peak)
    assert f.over_fraction == pytest.approx(0.25)
    assert r.memory_over_bytes == pytest.approx(f.over_bytes)
    assert r.search_cost == pytest.approx(search_cost(r.iteration_time_s, f.over_fraction))
    assert r.search_cost > INFEASIBLE_BASE_S > r.iteration_time_s
    assert sim.simulate(s) == math.inf
    assert "over by" in f.describe() and f.worst_device in f.over


def test_search_cost_ranks_every_feasible_first_then_smaller_overflow():
    assert search_cost(5.0, 0.0) == 5.0
    assert search_cost(0.001, 0.1) < search_cost(0.001, 0.2)
    assert search_cost(1e3, 0.0) < search_cost(1e-6, 1e-9)


def test_search_table_names_infeasible_methods_and_their_overflow(lenet):
    m0 = Machine.parse("p100:1x4")
    sim = Simulator(lenet, m0)
    dp = feasibility(sim, Strategy.data_parallel(lenet, m0)).max_peak_bytes
    mp = feasibility(sim, Strategy.model_parallel(lenet, m0)).max_peak_bytes
    assert mp > dp
    m = with_memory(m0, (dp + mp) / 2)  # data fits, model does not
    rep = search.run_all(lenet, m, seed=0, iterations=10, methods=["data", "model"])
    j = rep.to_json()
    assert j["strategies"]["data"]["feasible"]
    assert not j["strategies"]["model"]["feasible"]
    assert j["infeasible"]["model"]["over_bytes"] == pytest.approx(mp - (dp + mp) / 2)
    assert rep.best == "data"
    table = rep.table()
    assert "infeasible" in table and "model: " in table and "over by" in table
