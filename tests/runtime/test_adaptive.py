"""AdaptiveMapper: tags, the migration rule, and recovery from a slowed device
(issue 9 item 4; Intel paper section 3)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import legionpy as lp
from legionpy.mapper import AdaptiveMapper
from legionpy.nn import execution
from legionpy.optimizer import Graph, Machine, Simulator, Strategy
from legionpy.optimizer.rebalance import modelled_busy, op_tags
from legionpy.optimizer.strategy import ParallelConfig


def _mlp_graph(batch=64, width=512, layers=4):
    g = Graph(batch)
    t = g.input((width,))
    for _ in range(layers):
        t = g.dense(t, width, activation="relu")
    g.softmax(g.dense(t, 8))
    return g


def test_tags_compute_memory_network():
    g = Graph(4096)  # large batch: the GEMM outweighs the weight synchronisation
    d = g.dense(g.input((1024,)), 1024)
    r = g.relu(d)
    m = Machine.parse("p100:1x2")
    s = Strategy.data_parallel(g, m)
    tags = op_tags(g, s, m)
    assert tags[d.op.name] == "compute" and tags[r.op.name] == "memory"
    # relu's tiles away from their producer: its input crosses NVLink
    moved = s.with_config(r.op.name, ParallelConfig(s[r.op.name].degrees, (1, 0)))
    assert op_tags(g, moved, m)[r.op.name] == "network"


def _slowed(machine, dev, factor):
    devs = list(machine.devices)
    devs[dev] = dataclasses.replace(devs[dev], flops=devs[dev].flops / factor,
                                    mem_bw=devs[dev].mem_bw / factor)
    return Machine(devs, machine.links, machine.switches, machine.name + "-slowed")


def test_propose_moves_tiles_off_the_busy_device_and_helps_in_simulation():
    g = _mlp_graph(batch=8192, width=1024)  # compute-bound: big GEMMs per weight byte
    m = Machine.parse("p100:1x4")
    s = Strategy.data_parallel(g, m)
    mapper = AdaptiveMapper(machine=m, high=0.9, low=0.5, max_moves=4)
    model, _ = modelled_busy(g, s, m, mapper.cost)
    busy = {d: b * (4.0 if d == 3 else 1.0) for d, b in model.items()}  # device 3 at 1/4 speed
    new, moves = mapper.propose(g, s, busy, max(busy.values()))
    assert moves and all(mv.src == 3 and mv.dst != 3 for mv in moves)
    tags = op_tags(g, s, m)
    assert all(mv.tag == tags[mv.op] == "compute" for mv in moves)
    on3 = sum(d == 3 for c in new.values() for d in c.devices)
    assert on3 == sum(d == 3 for c in s.values() for d in c.devices) - len(moves)
    assert max(mv.predicted[0] for mv in moves[-1:]) < busy[3]
    # the pure rule is deterministic, and balanced load triggers nothing
    assert mapper.propose(g, s, busy, max(busy.values()))[0] == new
    assert mapper.propose(g, s, model, max(model.values()))[1] == []
    # the simulator, with device 3 really 4x slower, agrees it is faster
    sim = Simulator(g, _slowed(m, 3, 4.0))
    before, after = sim.run(s), sim.run(new)
    assert after.iteration_time_s < before.iteration_time_s
    spread = [max(r.per_device_busy_s.values()) - min(r.per_device_busy_s.values())
              for r in (before, after)]
    assert spread[1] < spread[0]


def _train_model() -> lp.nn.Model:
    m = lp.nn.Model(batch_size=64, seed=0)
    t = m.input((256,))
    for _ in range(4):
        t = m.dense(t, 256, activation="relu")
    m.softmax(m.dense(t, 8))
    return m


def _train_graph() -> Graph:
    return _train_model().graph


def _train(enabled: bool, steps: int = 10):
    lp.init(cpus=2, executor="threads")
    try:
        mapper = AdaptiveMapper(high=0.7, low=0.5, patience=1, max_moves=2, enabled=enabled)
        lp.runtime().set_mapper(mapper)
        m = _train_model()
        m.compile(optimizer=lp.nn.SGD(lr=0.05), strategy="data")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((64 * steps, 256)).astype(np.float32)
        y = rng.integers(0, 8, 64 * steps)
        m.fit(x, y, epochs=1, verbose=0, shuffle=False)
        return mapper, m.strategy, m.parameters()
    finally:
        lp.shutdown()


@pytest.fixture
def slow_device_1():
    execution.SLOW_DEVICES[1] = 6.0
    yield
    execution.SLOW_DEVICES.clear()


def test_adaptive_recovers_from_a_slowed_device(slow_device_1):
    """One device is slowed 6x; static and adaptive training in the same run.
    The adaptive mapper sees the imbalance in the trace and moves tiles off
    the slow device, with identical numbers. That the new placement recovers
    throughput is judged by the simulator with that device really 6x slower
    (deterministic); the measured recovery is bench/adaptive.py's figure, not
    a wall-clock assertion here."""
    static_m, static_s, static_p = _train(False)
    adapt_m, adapt_s, adapt_p = _train(True)
    assert static_m.moves == [] and len(static_m.history) >= 6
    assert adapt_m.moves and adapt_m.moves[0].src == 1 and adapt_m.moves[0].dst == 0
    assert all(mv.dst != 1 for mv in adapt_m.moves)  # never taken back (cooldown)

    def on1(s):
        return sum(d == 1 for c in s.values() for d in c.devices)

    assert on1(adapt_s) < on1(static_s)
    # same numbers whatever the placement
    for k in static_p:
        np.testing.assert_allclose(adapt_p[k], static_p[k], rtol=1e-5, atol=1e-6)

    # the mapper acted on what it measured: device 1 was the busy one
    assert all(h["busy"][1] > h["busy"][0] for h in static_m.history[-3:])
    # and its placement is faster where device 1 is 6x slower
    sim = Simulator(_train_graph(), _slowed(Machine.local(2), 1, 6.0))
    assert sim.simulate(adapt_s) < sim.simulate(static_s)


def test_no_move_onto_a_device_just_relieved():
    """The rule that keeps a noisy measurement from taking a move back: a
    device in ``avoid`` takes no tile, even when it is the idlest."""
    g = _mlp_graph(batch=8192, width=1024)
    m = Machine.parse("p100:1x4")
    s = Strategy.data_parallel(g, m)
    mapper = AdaptiveMapper(machine=m, high=0.9, low=0.5, max_moves=4)
    model, _ = modelled_busy(g, s, m, mapper.cost)
    busy = {d: b * (4.0 if d == 3 else 1.0) for d, b in model.items()}
    busy[0] *= 0.5  # the idlest device
    _, moves = mapper.propose(g, s, busy, max(busy.values()))
    assert moves[0].dst == 0
    _, moves = mapper.propose(g, s, busy, max(busy.values()), avoid={0})
    assert moves and all(mv.dst not in (0, 3) for mv in moves)


def test_slow_devices_env_parsing():
    assert execution._parse_slow("3=4, 1=2.5") == {3: 4.0, 1: 2.5}
    with pytest.raises(lp.errors.ModelError, match="DEVICE=FACTOR"):
        execution._parse_slow("three")


def test_thresholds_are_checked():
    with pytest.raises(ValueError, match="low < high"):
        AdaptiveMapper(high=0.4, low=0.5)


@pytest.mark.parametrize("user_trace", [False, True])
def test_the_mapper_reads_its_own_trace_never_the_users(user_trace):
    rt = lp.init(cpus=2, executor="threads")
    try:
        if user_trace:
            rt.trace.start()
        mapper = AdaptiveMapper(high=0.7, low=0.5, patience=1, max_moves=2)
        rt.set_mapper(mapper)
        m = _train_model()
        m.compile(optimizer=lp.nn.SGD(lr=0.05), strategy="data")
        rng = np.random.default_rng(0)
        m.fit(rng.standard_normal((64 * 4, 256)).astype(np.float32), rng.integers(0, 8, 64 * 4),
              epochs=1, verbose=0, shuffle=False)
        lp.fence()
        assert len(mapper.history) >= 3  # the mapper saw the steps
        recs = rt.trace.records()
        if user_trace:  # everything, from the first op: nothing cleared
            assert recs and rt.trace.recording
            cs = m._ex.csync  # collective sync: an update per bucket group and position
            per_step = len(cs.groups) if cs is not None else len(m.parameters())
            assert sum(r["kind"] == "update" for r in recs) >= 4 * per_step
        else:  # the user's trace was never started
            assert recs == [] and not rt.trace.recording
    finally:
        lp.shutdown()
