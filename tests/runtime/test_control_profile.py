"""The control thread's cost profiled per model on one device
(legionpy/measure/control.py): the prediction's level for the model, the
calibration's regression for how strategies differ."""

from __future__ import annotations

import json

import numpy as np
import pytest

from legionpy import nn
from legionpy.measure import control
from legionpy.measure.fidelity import measure_runtime, predict_model
from legionpy.optimizer import Machine, Strategy
from legionpy.optimizer.fidelity import RuntimeOverhead


def _mlp() -> nn.Model:
    m = nn.Model(batch_size=8, seed=0, name="tiny_mlp")
    x = m.input((8,))
    for _ in range(3):
        x = m.dense(x, 8, activation="relu")
    m.softmax(m.dense(x, 4))
    return m


#: figures of a calibration, small enough that the one-device profile differs
OVERHEAD = RuntimeOverhead(step_s=1e-5, launch_s=1e-6, task_s=5e-6)


def test_the_profile_is_the_one_device_control_time_and_is_cached(cache, rt2):
    machine = Machine.local()
    m = _mlp()
    m.compile(optimizer=nn.SGD(lr=1e-3), strategy="data", machine=machine)
    got = control.control_profile(m, machine, measure_runtime)
    assert got is not None and 1e-5 < got < 0.05
    table = json.loads((cache / "control-v1.json").read_text())
    assert [v[0] for v in table.values()] == [got]

    def fails(*a, **k):
        raise AssertionError("a cached profile is not measured again")
    assert control.control_profile(m, machine, fails) == got
    # the user's model is untouched: it still trains under its own strategy
    x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    h = m.fit(x, np.zeros(16, dtype=np.int64), epochs=1, verbose=0)
    assert len(h["step_loss"]) == 2 and m.strategy != Strategy.single_device(m.graph, machine)


def test_the_prediction_moves_the_control_level_to_the_profile(cache, rt2):
    """On one device the model's control time becomes the profile; another
    strategy keeps the regression's difference from it."""
    machine = Machine.local()
    m = _mlp()
    m.compile(optimizer=nn.SGD(lr=1e-3), strategy="data", machine=machine)
    single = Strategy.single_device(m.graph, machine)
    plain = predict_model(m, single, overhead=OVERHEAD, cost="analytic",
                          profile_control=False)
    out = predict_model(m, single, overhead=OVERHEAD, cost="analytic")
    assert "control_profile_s" not in plain
    assert out["control_busy_s"] == pytest.approx(out["control_profile_s"], rel=1e-9)
    assert out["control_offset_s"] == pytest.approx(
        out["control_profile_s"] - plain["control_busy_s"], rel=1e-9)
    data_plain = predict_model(m, overhead=OVERHEAD, cost="analytic", profile_control=False)
    data = predict_model(m, overhead=OVERHEAD, cost="analytic")
    assert data["control_busy_s"] - data_plain["control_busy_s"] == pytest.approx(
        out["control_offset_s"], rel=1e-6)
    # without the runtime's overhead there is no control thread to profile
    bare = predict_model(m, overhead=False, cost="analytic")
    assert "control_profile_s" not in bare


def test_control_offset():
    assert control.control_offset(2e-3, 5e-4) == pytest.approx(1.5e-3)
    assert control.control_offset(1e-4, 5e-4) == pytest.approx(-4e-4)
    assert control.control_offset(None, 1.0) == 0.0 and control.control_offset(1.0, None) == 0.0


def test_a_long_step_is_not_profiled(cache, rt2, monkeypatch):
    """Over CONTROL_MAX_STEP_S of predicted busy time a step, no profile (it
    would take minutes, and the control thread is a small part of a step)."""
    from legionpy.measure import fidelity

    machine = Machine.local()
    m = _mlp()
    m.compile(optimizer=nn.SGD(lr=1e-3), strategy="data", machine=machine)
    monkeypatch.setattr(fidelity, "CONTROL_MAX_STEP_S", 0.0)
    out = predict_model(m, overhead=OVERHEAD, cost="analytic")
    assert "control_profile_s" not in out
    assert not (cache / "control-v1.json").exists()


def test_the_profile_is_scaled_to_the_quiet_host_speed(cache, rt2):
    """A profile taken while the host ran Python 1.5x slower than the
    calibration's quiet figure is scaled back to it, cached raw, and scaled
    again against whatever reference a later calibration gives."""
    machine = Machine.local()
    m = _mlp()
    m.compile(optimizer=nn.SGD(lr=1e-3), strategy="data", machine=machine)

    def slow(*a, **k):
        return {"measured_control_cpu_s": 3e-3, "measured_host_probe_s": 15e-6}
    assert control.control_profile(m, machine, slow, reference=10e-6) == pytest.approx(2e-3)
    table = json.loads((cache / "control-v1.json").read_text())
    assert [v[0] for v in table.values()] == [3e-3]
    assert control.control_profile(m, machine, slow, reference=15e-6) == pytest.approx(3e-3)
    assert control.control_profile(m, machine, slow, reference=None) == pytest.approx(3e-3)


def test_gpus_are_not_profiled(cache, emu):
    """On GPUs the control thread's CPU time includes the driver's spin in
    every synchronisation (one H200: 37 ms of alexnet's 94 ms step), so it
    is no measure of its cost: no profile, and nothing trained for one."""
    emu(1)
    machine = Machine.local()
    assert [d.kind for d in machine.devices] == ["gpu"]
    m = _mlp()
    m.compile(optimizer=nn.SGD(lr=1e-3), strategy="data", machine=machine)
    out = predict_model(m, overhead=OVERHEAD, cost="analytic")
    assert "control_profile_s" not in out
    assert not (cache / "control-v1.json").exists()
