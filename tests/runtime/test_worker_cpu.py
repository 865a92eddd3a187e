"""The device workers' CPU clocks (``Runtime.worker_cpu``, ``worker_span_cpu``):
what a worker ran, as opposed to what it waited for (issue 26: the breakdown's
``wait`` and ``between`` terms)."""

from __future__ import annotations

import time

import legionpy as lp
import legionpy.runtime as lr


@lp.task
def spin(seconds: float) -> int:
    n, end = 0, time.thread_time() + seconds
    while time.thread_time() < end:
        n += 1
    return n


@lp.task
def nap(seconds: float) -> None:
    time.sleep(seconds)


def test_a_worker_clock_counts_what_it_ran_not_what_it_waited(rt1):
    spin(0.001).get()  # the worker thread exists
    rt = lr.get_runtime()
    dev = next(iter(rt.worker_cpu()))
    c0, w0 = rt.worker_cpu()[dev], time.perf_counter()
    nap(0.05).get()
    assert time.perf_counter() - w0 >= 0.05
    assert rt.worker_cpu()[dev] - c0 < 0.02  # asleep: no CPU
    c1 = rt.worker_cpu()[dev]
    spin(0.03).get()
    assert rt.worker_cpu()[dev] - c1 >= 0.03


def test_span_cpu_counts_the_task_bodies_only_while_on(rt1):
    rt = lr.get_runtime()
    spin(0.001).get()
    assert rt.worker_span_cpu() == {}
    rt.count_span_cpu(True)
    try:
        c0 = rt.worker_cpu()
        for _ in range(5):
            spin(0.005).get()
        nap(0.02).get()
        spans, c1 = rt.worker_span_cpu(), rt.worker_cpu()
    finally:
        rt.count_span_cpu(False)
    dev = next(iter(spans))
    # the bodies: five spins of 5 ms, a nap of none; the worker also ran
    # between them (finishing, releasing, taking the next)
    assert 0.025 <= spans[dev] < 0.025 + 0.01
    assert c1[dev] - c0[dev] >= spans[dev]
    assert rt.worker_span_cpu() == {}


def test_the_serial_executor_has_no_worker_clocks():
    # the caller's thread runs every task: no worker to clock; the bodies'
    # CPU is still theirs
    rt = lr.init(cpus=2, executor="serial")
    try:
        spin(0.001).get()
        rt.count_span_cpu(True)
        spin(0.002).get()
        assert rt.worker_cpu() == {}
        assert sum(rt.worker_span_cpu().values()) >= 0.002
    finally:
        lr.shutdown()


def test_fit_keeps_the_worker_clocks_only_while_they_are_counted(rt1):
    import numpy as np

    from legionpy import nn
    from legionpy.measure.calibration import calibration_models

    m = calibration_models()[0]  # a tiny MLP
    m.compile(optimizer=nn.SGD(lr=1e-3), loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).standard_normal((4 * m.batch_size, 8)).astype(np.float32)
    y = np.zeros(4 * m.batch_size, dtype=np.int64)
    h = m.fit(x, y, epochs=1, verbose=0)
    assert h.device_cpu == [] and h.device_span_cpu == []  # a long training keeps nothing
    assert h.host_probe == []
    rt = lr.get_runtime()
    rt.count_span_cpu(True)
    try:
        h = m.fit(x, y, epochs=1, verbose=0)
    finally:
        rt.count_span_cpu(False)
    assert len(h.device_cpu) == len(h.device_span_cpu) == len(h.step_finished) == 4
    assert len(h.host_probe) == 4 and all(p > 0 for p in h.host_probe)
    dev = next(iter(h.device_span_cpu[-1]))
    assert h.device_cpu[-1][dev] >= h.device_span_cpu[-1][dev] > 0


def test_span_cpu_counts_on_a_gpu_runtime_too(emu):
    # a GPU runtime runs each body through its stream (Scheduler.run_on_streams):
    # its bodies' CPU is counted as on a CPU one, so a calibration there does
    # not take a worker's whole CPU for its time between tasks
    rt = emu(1)
    spin(0.001).get()
    rt.count_span_cpu(True)
    try:
        spin(0.01).get()
        spans = rt.worker_span_cpu()
    finally:
        rt.count_span_cpu(False)
    assert rt.sched.run == rt.sched.run_on_streams
    assert sum(spans.values()) >= 0.01


def test_measure_runtime_reports_the_host_probe_and_keeps_it_out_of_the_control_cpu(rt1):
    """The host-speed probe fit runs after each measured step
    (legionpy/probe/hostspeed.py) is reported, and its CPU is not counted as
    the control thread's: with a probe made 1000x heavier the control
    thread's CPU per step stays well under the probes' CPU per step (were the
    probe counted, the control CPU would exceed it; the margin of 5x leaves
    room for a slow host's control thread, which CI once saw at 1/18)."""
    from legionpy.measure.calibration import calibration_models
    from legionpy.measure.fidelity import measure_runtime
    from legionpy.nn import model as nn_model
    from legionpy.optimizer import Machine
    from legionpy.probe import hostspeed

    m = calibration_models()[0]
    machine = Machine.local()
    r = measure_runtime(m, "single", machine, steps=3, warmup=1)
    assert r["measured_host_probe_s"] > 0
    heavy = hostspeed.PROBE_WORK * 1000  # ~10 ms a step
    orig = nn_model.speed_probe
    nn_model.speed_probe = lambda: orig(heavy)
    try:
        r = measure_runtime(m, None, machine, steps=3, warmup=1)
    finally:
        nn_model.speed_probe = orig
    assert r["measured_host_probe_s"] > 5 * r["measured_control_cpu_s"] > 0
