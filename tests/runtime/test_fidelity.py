"""Fidelity report (issue 9 item 3): Kendall tau, the runtime-overhead
re-scheduler, the fidelity runner on a tiny model and ``simulate --compare``."""

from __future__ import annotations

import json
import math

import pytest

import legionpy as lp
import legionpy.runtime as lr
from legionpy.cli import main
from legionpy.optimizer import Machine, Simulator, Strategy
from legionpy.optimizer.fidelity import (
    RuntimeOverhead,
    compare,
    kendall_tau,
    relative_error,
    simulate_with_runtime,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private LEGIONPY_CACHE (cost table, overhead figures)."""
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def rt2():
    rt = lr.init(cpus=2, executor="threads")
    yield rt
    lr.shutdown()


def test_kendall_tau_hand_computed():
    # pairs of [1,2,3,4] vs [10,20,40,30]: 5 concordant, 1 discordant -> 4/6
    assert kendall_tau([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(4 / 6)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau([0.1, 0.5, 0.2], [1.0, 5.0, 2.0]) == 1.0
    # one tie in x: 5 concordant, 0 discordant, tau-b = 5 / sqrt(5 * 6)
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))
    assert kendall_tau([1, 1, 1], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError):
        kendall_tau([1, 2], [1])


def test_relative_error():
    assert relative_error(1.3, 1.0) == pytest.approx(0.3)
    assert relative_error(0.7, 1.0) == pytest.approx(0.3)
    assert relative_error(1.0, 0.0) == math.inf


def test_zero_overhead_reproduces_the_simulator():
    g = lp.models.lenet(batch_size=8, scale="small").graph
    m = Machine.local(2)
    for name in ("data", "model"):
        sim = Simulator(g, m)
        t = sim.run(Strategy.resolve(name, g, m)).iteration_time_s
        r = simulate_with_runtime(sim.tg.to_json(), RuntimeOverhead(), g)
        assert r["iteration_time_s"] == pytest.approx(t, rel=1e-9)


def test_control_thread_and_task_overhead_by_hand():
    # a -> b on one device, c independent on another; launch order a, b, c
    tg = {"tasks": [{"id": 0, "name": "F:x[0]", "kind": "compute", "device": "cpu0",
                     "duration_s": 1.0, "bytes": 0},
                    {"id": 1, "name": "F:y[0]", "kind": "compute", "device": "cpu0",
                     "duration_s": 1.0, "bytes": 0},
                    {"id": 2, "name": "F:z[0]", "kind": "compute", "device": "cpu1",
                     "duration_s": 0.5, "bytes": 0}],
          "deps": [[0, 1]]}
    r = simulate_with_runtime(tg, RuntimeOverhead(launch_s=0.0), None)
    assert r["iteration_time_s"] == 2.0
    # issued at 0.1, 0.2, 0.3; each task 0.25 s longer
    r = simulate_with_runtime(tg, RuntimeOverhead(launch_s=0.1, task_s=0.25), None)
    assert r["iteration_time_s"] == pytest.approx(0.1 + 1.25 + 1.25)
    assert r["per_device_busy_s"] == {"cpu0": pytest.approx(2.5), "cpu1": pytest.approx(0.75)}
    assert r["control_busy_s"] == pytest.approx(0.3)


def test_requirements_and_pipelined_control_thread_by_hand():
    tg = {"tasks": [{"id": 0, "name": "F:x[0]", "kind": "compute", "device": "cpu0",
                     "duration_s": 1.0, "bytes": 0},
                    {"id": 1, "name": "F:y[0]", "kind": "compute", "device": "cpu0",
                     "duration_s": 1.0, "bytes": 0}],
          "deps": [[0, 1]]}
    ovh = RuntimeOverhead(launch_s=0.1, req_launch_s=0.05, task_s=0.0, req_task_s=0.01)
    # no graph: one requirement per task; control 0.15 per task, worker +0.01
    r = simulate_with_runtime(tg, ovh, None)
    assert r["control_busy_s"] == pytest.approx(0.3)
    assert r["iteration_time_s"] == pytest.approx(0.15 + 1.01 + 1.01)
    # pipelined: the control thread works a step ahead; the longer of the two
    r = simulate_with_runtime(tg, ovh, None, pipelined=True)
    assert r["iteration_time_s"] == pytest.approx(2.02)
    slow = RuntimeOverhead(launch_s=3.0)
    r = simulate_with_runtime(tg, slow, None, pipelined=True)
    assert r["iteration_time_s"] == pytest.approx(6.0) and r["schedule_s"] == pytest.approx(2)


def test_overhead_calibration_on_empty_tasks(rt2):
    from legionpy.optimizer.fidelity import measure_runtime_overhead

    o = measure_runtime_overhead(launches=20)
    assert o.launch_s > 0 and o.req_launch_s >= 0 and o.copy_launch_s >= 0
    assert o.control_s(4) == pytest.approx(o.launch_s + 4 * o.req_launch_s)


def tiny_model() -> lp.nn.Model:
    m = lp.nn.Model(batch_size=8, name="tiny")
    t = m.dense(m.input((16,)), 32, activation="relu")
    m.softmax(m.dense(t, 4))
    return m


def test_fidelity_runner_on_a_tiny_model(cache, rt2):
    r = compare(tiny_model(), "data", steps=2, warmup=1, cost="analytic",
                overhead=RuntimeOverhead(launch_s=1e-5, task_s=1e-5))
    assert r.machine == "local:2" and r.steps == 2
    assert r.measured_time_s > 0 and r.iteration_time_s > 0
    assert len(r.measured_step_times_s) == 2
    # steady state of one pipelined fit call: the period is the mean of the step gaps
    assert r.measured_time_s == pytest.approx(sum(r.measured_step_times_s) / 2, rel=1e-6)
    assert r.relative_error == pytest.approx(
        abs(r.iteration_time_s - r.measured_time_s) / r.measured_time_s)
    assert set(r.per_device_busy_s) == set(r.measured_per_device_busy_s) == {"cpu0", "cpu1"}
    assert all(v > 0 for v in r.measured_per_device_busy_s.values())
    assert r.kernel_time_s <= r.iteration_time_s


def test_simulate_compare_json(cache, capsys):
    try:
        assert main(["simulate", "lenet", "--machine", "local", "--scale", "small",
                     "--batch-size", "8", "--cost", "measured", "--compare", "--steps", "2",
                     "--warmup", "1", "--json"]) == 0
    finally:
        lr.shutdown()
    out = json.loads(capsys.readouterr().out)
    for k in ("iteration_time_s", "bytes_moved", "per_device_busy_s", "measured_time_s",
              "relative_error", "measured_per_device_busy_s", "kernel_time_s"):
        assert k in out, k
    assert out["measured_time_s"] > 0
    assert out["relative_error"] == pytest.approx(
        abs(out["iteration_time_s"] - out["measured_time_s"]) / out["measured_time_s"])
    assert set(out["measured_per_device_busy_s"]) == set(out["per_device_busy_s"])
    assert (cache / "costs.json").exists()


def test_compare_needs_the_local_machine(capsys):
    assert main(["simulate", "lenet", "--machine", "p100:1x2", "--compare"]) == 2
    assert "only the local machine can be run" in capsys.readouterr().err
