"""Launches, futures, devices, launch options, mapper calls, FIFO order, trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import legionpy as lp
import legionpy.runtime as lr
from legionpy.mapper import DefaultMapper, Mapper, Mapping, TaskOptions
from legionpy.runtime import LaunchOptions


@lp.task
def add(a, b):
    return a + b


def test_design_axpy_example(rt):
    R = lp.Region((16, 8), {"x": np.float32, "y": np.float32})
    P = lp.Partition.equal(R, (4, 1))
    lp.fill(R, "x", 1.0)
    R.write("y", np.arange(128, dtype=np.float32).reshape(16, 8))

    @lp.task(privileges=[lp.RW("x"), lp.R("y")])
    def axpy(a: float, r):
        r.x[...] += a * r.y
        return float(r.x.sum())

    x = np.ones((16, 8), np.float32)
    y = np.arange(128, dtype=np.float32).reshape(16, 8)
    assert axpy(2.0, R).get() == pytest.approx(float((x + 2 * y).sum()))
    fm = lp.index_launch(axpy, P.colors, 2.0, P)
    want = x + 4 * y
    assert fm.get() == pytest.approx([float(want[4 * i:4 * i + 4].sum()) for i in range(4)])
    lp.fence()
    np.testing.assert_array_equal(R.read("x"), want)
    np.testing.assert_array_equal(P[1, 0].read("x"), want[4:8])


def test_futures_pass_values_and_futuremaps_project(rt):
    assert add(1, add(2, 3)).get() == 6
    assert add(a=1, b=add(2, 3)).get() == 6
    fm = lp.index_launch(add, [0, 1, 2], 10, 5)
    fm2 = lp.index_launch(add, fm.colors, fm, 1)
    assert fm2.get() == [16, 16, 16]
    assert fm2[(2,)].get() == 16 and fm2[2].get() == 16 and len(fm2) == 3


def test_devices_and_env(monkeypatch):
    rt = lr.init(cpus=3, executor="serial")
    assert [(d.id, d.kind, d.rank, d.local_index) for d in rt.devices] == [
        (0, "cpu", 0, 0), (1, "cpu", 0, 1), (2, "cpu", 0, 2)]
    monkeypatch.setenv("LEGIONPY_CPUS", "4")
    monkeypatch.setenv("LEGIONPY_EXECUTOR", "serial")
    rt = lp.runtime(reset=True)
    assert len(rt.devices) == 4 and rt.executor == "serial"
    lr.shutdown()


def test_default_mapper_spreads_points_and_follows_data():
    rt = lr.init(cpus=4, executor="serial")
    rt.trace.start()
    A = lp.Region((8,), {"x": np.float64})
    P = lp.Partition.equal(A, (8,))

    @lp.task(privileges=[lp.WD("x")])
    def w(r):
        r.x[...] = 1

    @lp.task(privileges=[lp.R("x")])
    def rd(r):
        return float(r.x.sum())

    lp.index_launch(w, P.colors, P)
    rd(P[5])  # data of tile 5 lives on device 5 % 4 = 1
    lp.fence()
    recs = rt.trace.stop()
    assert [r["device"] for r in recs if r["name"] == "w"] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [r["device"] for r in recs if r["name"] == "rd"] == [1]
    assert not [r for r in recs if r["kind"] == "copy"]
    lr.shutdown()


class Recording(DefaultMapper):
    def __init__(self):
        self.seen = []

    def select_task_options(self, task):
        self.seen.append(("options", task.name, task.kind, task.tag))
        return TaskOptions(self.devices[-1])

    def map_task(self, task):
        self.seen.append(("map", task.name, task.point))
        return Mapping(task.target)


def test_launch_options_reach_mapper_and_trace():
    rec = Recording()
    rt = lr.init(cpus=2, executor="serial", mapper=rec)
    rt.trace.start()
    opts = LaunchOptions(name="sgd.update", kind="update", tag=("w", 3))
    assert add(1, 2, launch_options=opts).get() == 3
    lp.index_launch(add, [0, 1], 1, 2, launch_options=LaunchOptions(name="fwd", tag="t"))
    lp.fence()
    assert rec.seen[0] == ("options", "sgd.update", "update", ("w", 3))
    assert ("map", "fwd", (1,)) in rec.seen
    recs = rt.trace.records()
    assert (recs[0]["name"], recs[0]["kind"], recs[0]["device"]) == ("sgd.update", "update", 1)
    assert [r["tag"] for r in recs[1:]] == ["t", "t"]
    with pytest.raises(ValueError, match="kind"):
        LaunchOptions(kind="backward")
    lr.shutdown()


class AllOnZero(Mapper):
    def slice_task(self, task, domain):
        return [(p, self.devices[0]) for p in domain]


def test_fifo_per_device_and_copies_on_links(rt4):
    rt4.trace.start()
    A = lp.Region((64, 8), {"x": np.float64})
    P = lp.Partition.equal(A, (4, 1))

    @lp.task(privileges=[lp.WD("x")])
    def init(r):
        r.x[...] = r.rect.lo[0]

    @lp.task(privileges=[lp.R("x")])
    def total(r):
        return float(r.x.sum())

    lp.index_launch(init, P.colors, P)
    s = total(A).get()  # gathers every tile to one device: copies on links
    for _ in range(3):
        lp.index_launch(total, P.colors, P)
    lp.fence()
    assert s == sum(16 * 8 * 16 * i for i in range(4))
    recs = rt4.trace.stop()
    copies = [r for r in recs if r["kind"] == "copy"]
    assert len(copies) == 3 and all(r["bytes"] == 16 * 8 * 8 for r in copies)
    assert all(r["link"][1] == next(x["device"] for x in recs if x["name"] == "total")
               for r in copies)
    by_dev: dict = {}
    for r in recs:
        if r["device"] is not None:
            by_dev.setdefault(r["device"], []).append(r)
    for dev, rs in by_dev.items():
        rs.sort(key=lambda r: r["start"])
        for a, b in zip(rs, rs[1:]):
            assert a["end"] <= b["start"], f"device {dev} ran two ops at once"
        # independent index-launch points entered each queue in id order
        ids = [r["id"] for r in rs if r["name"] == "total" and r["point"] is not None]
        assert ids == sorted(ids)
    t = next(r for r in recs if r["name"] == "total" and r["point"] is None)
    assert {c["id"] for c in copies} <= set(t["deps"])


def test_serial_executor_runs_in_caller_thread():
    import threading

    lr.init(cpus=4, executor="serial")
    me = threading.get_ident()

    @lp.task
    def where():
        return threading.get_ident()

    assert set(lp.index_launch(where, range(8)).get()) == {me}
    lr.shutdown()


def test_chrome_trace_file_and_debug_output(tmp_path):
    out = tmp_path / "t.json"
    prog = (
        "import numpy as np, legionpy as lp\n"
        "A = lp.Region((8,), {'x': np.float64})\n"
        "P = lp.Partition.equal(A, (2,))\n"
        "lp.fill(A, 'x', 2.0)\n"
        "@lp.task(privileges=[lp.RW('x')])\n"
        "def inc(r):\n    r.x[...] += 1\n"
        "lp.index_launch(inc, P.colors, P)\n"
        "print(A.read('x').sum())\n"
        "lp.fence()\n"
    )
    env = dict(os.environ, LEGIONPY_TRACE=str(out), LEGIONPY_DEBUG="3", LEGIONPY_CPUS="2")
    p = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "24.0"
    assert "map inc" in p.stderr and "fence:" in p.stderr and "us," in p.stderr
    data = json.loads(out.read_text())
    ev = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in ev} >= {"compute", "copy", "fill"}
    for e in ev:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e)
        assert {"id", "kind", "device", "link", "bytes", "deps"} <= set(e["args"])
    names = [e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"]
    assert "device 0" in names and "link mem0->host" in names


def test_a_tap_records_inside_a_traced_run_and_leaves_the_trace_whole(rt4):
    """Measurements (calibration, fidelity) read a tap: the user's trace
    (``LEGIONPY_TRACE``) keeps recording, and keeps what it had."""
    A = lp.Region((8,), {"x": np.float64})
    P = lp.Partition.equal(A, (2,))

    @lp.task(privileges=[lp.RW("x")])
    def inc(r):
        r.x[...] += 1

    rt4.trace.start()
    lp.index_launch(inc, P.colors, P)
    lp.fence()
    before = len(rt4.trace)
    with rt4.trace.tap() as tap:
        lp.index_launch(inc, P.colors, P)
        lp.fence()
    assert tap not in rt4.trace.taps and rt4.trace.recording
    assert len([r for r in tap.records() if r["kind"] == "compute"]) == 2
    assert len(rt4.trace) == before + len(tap.records())
