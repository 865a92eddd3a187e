"""Every misuse raises a legionpy error naming the task, point and field;
nothing hangs."""

from __future__ import annotations

import numpy as np
import pytest

import legionpy as lp
import legionpy.runtime as lr
from legionpy.errors import LaunchError, PrivilegeError, TaskError


@lp.task(privileges=[lp.R("x")])
def sneaky_write(r):
    r.x[...] = 1.0


@lp.task
def boom(point_tag):
    raise ValueError(f"bad value {point_tag}")


@lp.task
def plus_one(v):
    return v + 1


def test_writing_a_read_only_field_is_a_task_error(rt):
    A = lp.Region((4,), {"x": np.float64}, name="A")
    f = sneaky_write(A)
    with pytest.raises(TaskError, match="sneaky_write") as ei:
        f.get()
    assert "read-only" in str(ei.value) and "R('x')" in str(ei.value)
    assert isinstance(ei.value.__cause__, PrivilegeError)
    with pytest.raises(TaskError):
        lp.fence()
    assert (A.read("x") == 0).all()


def test_raising_task_reaches_get_and_fence_with_point(rt):
    P = lp.Partition.equal(lp.Region((4,), {"x": np.float64}), (2,))
    fm = lp.index_launch(boom, P.colors, "t")
    with pytest.raises(TaskError, match=r"boom.*point \(1,\)") as ei:
        fm[1].get(timeout=10)
    assert isinstance(ei.value.__cause__, ValueError)
    with pytest.raises(TaskError, match="boom"):
        lp.fence(timeout=10)
    lp.fence()  # failures are reported once


def test_dependents_of_a_failed_task_fail_fast(rt):
    f = plus_one(boom("x"))
    g = plus_one(f)
    with pytest.raises(TaskError, match="did not run because") as ei:
        g.get(timeout=10)
    assert "boom" in str(ei.value)
    with pytest.raises(TaskError, match="boom"):  # fence names the root failure
        lp.fence(timeout=10)


def test_region_dependents_of_a_failed_task_fail_fast(rt):
    A = lp.Region((4,), {"x": np.float64})

    @lp.task(privileges=[lp.RW("x")])
    def bad(r):
        raise RuntimeError("kaput")

    @lp.task(privileges=[lp.R("x")])
    def reader(r):
        return float(r.x.sum())

    bad(A)
    with pytest.raises(TaskError, match="did not run because.*bad"):
        reader(A).get(timeout=10)
    with pytest.raises(TaskError, match="kaput"):
        lp.fence(timeout=10)


def test_privilege_count_mismatch(rt):
    A, B = lp.Region((4,), {"x": np.float64}), lp.Region((4,), {"x": np.float64})

    @lp.task(privileges=[lp.R("x"), lp.RW("x"), lp.R("x")])
    def three(a, b):
        pass

    with pytest.raises(PrivilegeError, match=r"three.*2 region argument.*3 privilege"):
        three(A, B)

    @lp.task
    def none(a):
        pass

    with pytest.raises(PrivilegeError, match="none"):
        none(A)


def test_interfering_index_launch_names_task_region_field_and_rects(rt):
    A = lp.Region((8, 4), {"x": np.float64}, name="A")
    H = lp.Partition.restriction(A, (2, 4), halo=(1, 0))

    @lp.task(privileges=[lp.RW("x")])
    def smooth(r):
        pass

    with pytest.raises(LaunchError) as ei:
        lp.index_launch(smooth, H.colors, H)
    msg = str(ei.value)
    assert "smooth" in msg and "'A'" in msg and "'x'" in msg and "Rect(lo=" in msg

    @lp.task(privileges=[lp.Reduce("+", "x")])
    def acc(r):
        r.x[...] += 1

    lp.index_launch(acc, H.colors, H)  # same reduction op: fine
    lp.fence()
    assert A.read("x").sum() == sum(H[c].rect.volume for c in H.colors)
    with pytest.raises(LaunchError, match="smooth"):
        lp.index_launch(smooth, H.colors, A)  # a whole region written by every point


def test_partition_in_a_single_launch_is_rejected(rt):
    P = lp.Partition.equal(lp.Region((4,), {"x": np.float64}), (2,))

    @lp.task(privileges=[lp.R("x")])
    def t(r):
        pass

    with pytest.raises(LaunchError, match="index_launch"):
        t(P)


def test_missing_field_privilege_names_field(rt):
    A = lp.Region((4,), {"x": np.float64, "y": np.float64}, name="A")

    @lp.task(privileges=[lp.R("x")])
    def peek(r):
        return r.y

    with pytest.raises(TaskError, match="'y'"):
        peek(A).get(timeout=10)
    with pytest.raises(TaskError):
        lp.fence()


def test_wait_timeout_is_a_way_out():
    import threading

    lr.init(cpus=1, executor="threads")
    gate = threading.Event()

    @lp.task
    def blocked():
        gate.wait(10)

    f = blocked()
    with pytest.raises(TimeoutError):
        f.get(timeout=0.05)
    gate.set()
    f.get(timeout=10)
    lr.shutdown()
