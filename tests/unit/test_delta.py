"""Invariant 4 (DESIGN.md section 4): delta simulation gives the same start
and end for every task as a full simulation, after any sequence of
single-operator changes."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from simhelpers import random_config, random_graph, random_strategy

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy

MACHINE = Machine.parse("p100:2x2")


def _check_sequence(graph, machine, seed: int, steps: int, start=None, sync=None) -> None:
    rng = random.Random(seed)
    s = start or random_strategy(rng, graph, machine)
    sim = Simulator(graph, machine, sync=sync)
    sim.run(s)
    for _ in range(steps):
        op = rng.choice(graph.ops)
        cfg = random_config(rng, op, machine.num_devices)
        s = s.with_config(op.name, cfg)
        r = sim.delta(op.name, cfg)
        assert sim.last_delta_pops >= 0, "delta fell back to a full reschedule"
        ref = Simulator(graph, machine, sync=sync)
        rf = ref.run(s)
        assert sim.timeline() == ref.timeline()
        assert _orders(sim) == _orders(ref)
        assert r.iteration_time_s == rf.iteration_time_s
        assert r.bytes_per_link == rf.bytes_per_link
        assert r.peak_memory == rf.peak_memory  # buffers counted per block, incrementally


def _orders(sim) -> dict:
    """Each resource's tasks (keys) in FIFO order, read from its list. A
    communicator is named by its group: communicators are numbered in order
    of first use, which differs between a delta and a fresh simulation."""
    tg = sim.tg
    out = {}
    for r in range(tg.n_res):
        t, keys = tg.dhead[r], []
        while t >= 0:
            keys.append(int(tg.key[t]))
            t = tg.dnext[t]
        if keys:
            out[("comm", tg._comm_group[r]) if r in tg._comm_group else r] = keys
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 10))
def test_delta_equals_full_random_dags(seed, n_ops):
    _check_sequence(random_graph(seed, n_ops), MACHINE, seed, steps=6)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 10))
def test_delta_equals_full_random_dags_shards(seed, n_ops):
    """The same with point-to-point shard updates (sync="shards")."""
    _check_sequence(random_graph(seed, n_ops), MACHINE, seed, steps=6, sync="shards")


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000))
def test_delta_equals_full_small_cnn(seed):
    g = models.alexnet(batch_size=8, image_size=67, width=0.125, hidden=64).graph
    m = Machine.parse("p100:2x2")
    _check_sequence(g, m, seed, steps=5, start=Strategy.data_parallel(g, m))


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10_000))
def test_delta_equals_full_small_rnn(seed):
    g = models.nmt(batch_size=4, steps=3, hidden=8, vocab=16).graph
    m = Machine.parse("k80:1x4")
    _check_sequence(g, m, seed, steps=5, start=Strategy.rnn_expert(g, m))


def test_delta_equals_full_resnet_slice():
    g = models.resnet101(batch_size=4, image_size=32, width=0.0625, blocks=(1, 1, 2, 1)).graph
    m = Machine.parse("p100:1x4")
    _check_sequence(g, m, 3, steps=8, start=Strategy.data_parallel(g, m))


def test_delta_then_revert_restores_timeline():
    g = models.lenet(batch_size=8).graph
    m = Machine.parse("p100:1x4")
    s = Strategy.data_parallel(g, m)
    sim = Simulator(g, m)
    sim.run(s)
    before = sim.timeline()
    rng = random.Random(1)
    op = g.op("fc1")
    sim.delta("fc1", random_config(rng, op, 4))
    sim.delta("fc1", s["fc1"])
    assert sim.timeline() == before


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.integers(6, 14))
def test_delta_long_sequences_random_dags(seed, n_ops):
    _check_sequence(random_graph(seed, n_ops), Machine.parse("k80:2x4"), seed, steps=30)


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 10_000))
def test_delta_equals_full_16_devices(seed):
    g = models.inception_v3(batch_size=16, image_size=75, width=0.0625).graph
    m = Machine.parse("p100:4x4")
    _check_sequence(g, m, seed, steps=6, start=Strategy.data_parallel(g, m))


def test_delta_equals_full_rnn_16_devices():
    g = models.rnnlm(batch_size=16, steps=4, hidden=32, vocab=64).graph
    m = Machine.parse("p100:4x4")
    _check_sequence(g, m, 11, steps=12, start=Strategy.rnn_expert(g, m))
