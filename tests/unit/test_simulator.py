"""Full simulation (Algorithm 1) against a plain reference scheduler, plus
the laws of the simulator."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simhelpers import random_graph, random_strategy

from legionpy import models
from legionpy.errors import StrategyError
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy


def reference_schedule(tg_json: dict) -> dict[int, tuple[float, float]]:
    """FIFO list scheduling written plainly: repeatedly run the ready task with
    the smallest (ready time, id); a device runs its tasks in that order."""
    tasks = {t["id"]: t for t in tg_json["tasks"]}
    preds = {i: [] for i in tasks}
    for a, b in tg_json["deps"]:
        preds[b].append(a)
    done: dict[int, tuple[float, float]] = {}
    device_free: dict[str, float] = {}
    while len(done) < len(tasks):
        ready = []
        for i in tasks:
            if i not in done and all(p in done for p in preds[i]):
                r = max([done[p][1] for p in preds[i]], default=0.0)
                ready.append((r, i))
        r, i = min(ready)
        dev = tasks[i]["device"]
        start = max(r, device_free.get(dev, 0.0))
        end = start + tasks[i]["duration_s"]
        device_free[dev] = end
        done[i] = (start, end)
    return done


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000))
def test_full_matches_reference_scheduler(seed):
    rng = random.Random(seed)
    g = random_graph(seed, 2 + seed % 7)
    m = Machine.parse(rng.choice(["p100:2x2", "k80:1x4", "dgx1"]))
    sim = Simulator(g, m)
    sim.run(random_strategy(rng, g, m))
    tg = sim.tg.to_json(include_times=True)
    ref = reference_schedule(tg)
    for t in tg["tasks"]:
        assert (t["start_s"], t["end_s"]) == pytest.approx(ref[t["id"]], rel=1e-12, abs=1e-15)


def test_one_device_gives_sum_of_task_times():
    g = models.lenet(batch_size=8).graph
    m = Machine.parse("p100:1x4")
    s = Strategy({op.name: ParallelConfig.single(len(op.output_shape), 2) for op in g.ops})
    sim = Simulator(g, m)
    r = sim.run(s)
    assert r.iteration_time_s == pytest.approx(sum(t["duration_s"] for t in sim.tasks()))
    assert r.bytes_moved == 0
    assert r.per_device_busy_s["n0gpu2"] == pytest.approx(r.iteration_time_s)


@pytest.mark.parametrize("name,kw", [
    ("alexnet", dict(batch_size=16, image_size=67, width=0.25, hidden=128)),
    ("rnnlm", dict(batch_size=8, steps=3, hidden=32, vocab=64)),
])
@pytest.mark.parametrize("ctor", ["data_parallel", "model_parallel", "owt"])
def test_more_bandwidth_never_slower(name, kw, ctor):
    """FIFO list scheduling admits Graham's anomalies (a faster task can
    reorder a queue and delay the critical path), so this law cannot hold for
    every DAG; it is checked on the standard strategies of real models. The
    one known counter-example here (owt on a 3-step RNNLM: 1.7% slower at 4x
    the bandwidth) is kept as an expected failure."""
    if (name, ctor) == ("rnnlm", "owt"):
        pytest.xfail("FIFO scheduling anomaly: faster copies reorder a link queue")
    g = models.build(name, **kw).graph
    base = Machine.parse("p100:2x2")
    s = getattr(Strategy, ctor)(g, base)
    times = [Simulator(g, base.with_bandwidth_scale(f)).simulate(s) for f in (0.25, 1, 4, 16)]
    assert all(a >= b - 1e-15 for a, b in zip(times, times[1:])), times


def test_data_parallel_beats_one_device_on_compute_heavy_model():
    g = models.vgg16(batch_size=16, image_size=64, width=0.25, hidden=256).graph
    m = Machine.parse("p100:1x4")
    one = Strategy.data_parallel(g, m, num_devices=1)
    four = Strategy.data_parallel(g, m)
    sim = Simulator(g, m)
    assert sim.simulate(four) < sim.simulate(one)


def test_result_fields_and_memory_infeasible():
    g = models.vgg16(batch_size=256).graph
    m = Machine.parse("p100:1x4")
    sim = Simulator(g, m)
    one = Strategy.data_parallel(g, m, num_devices=1)
    r = sim.run(one)
    assert r.peak_memory["n0gpu0"] > 16 * 2**30
    assert not r.feasible and r.infeasible_devices == ["n0gpu0"]
    assert sim.simulate(one) == float("inf")
    r = sim.run(Strategy.data_parallel(g, m))
    d = r.to_dict()
    assert {"iteration_time_s", "bytes_moved", "per_device_busy_s"} <= set(d)
    assert r.bytes_moved > 0 and all(v > 0 for v in r.bytes_per_link.values())


def test_delta_needs_a_previous_run():
    g = models.lenet(batch_size=8).graph
    sim = Simulator(g, Machine.parse("p100:1x2"))
    with pytest.raises(StrategyError, match="previous run"):
        sim.delta("fc1", ParallelConfig((1, 1), (0,)))
