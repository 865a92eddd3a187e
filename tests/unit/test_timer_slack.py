"""``affinity.fine_timers``: a thread's timer slack, and its children's, is
1 us, so the naps of a wait between ranks (runtime/mpi.py) end on time."""

from __future__ import annotations

import ctypes
import sys
import threading

import pytest

from legionpy import affinity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


def _slack() -> int:
    return ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK


def test_the_calling_thread_and_the_threads_it_starts_get_the_fine_slack():
    got: dict[str, int] = {}

    def parent() -> None:
        got["before"] = _slack()
        got["set"] = affinity.fine_timers()
        got["after"] = _slack()
        child = threading.Thread(target=lambda: got.__setitem__("child", _slack()))
        child.start()
        child.join()

    t = threading.Thread(target=parent)
    t.start()
    t.join()
    assert got["set"] is True
    assert got["after"] == got["child"] == affinity.TIMER_SLACK_NS


def test_a_runtime_sets_it_before_its_workers_start():
    import legionpy.runtime as lr

    seen: list[int] = []

    def body() -> None:
        ctypes.CDLL(None).prctl(29, 50_000, 0, 0, 0)  # Linux's default, whatever ran before
        lr.init(cpus=1)
        try:
            import numpy as np

            import legionpy as lp

            A = lp.Region((4,), {"x": np.float64})
            t = lp.task(lambda r: seen.append(_slack()), name="s", privileges=[lp.R("x")])
            A.write("x", np.zeros(4))
            t(A).get()
        finally:
            lr.shutdown()

    th = threading.Thread(target=body)  # a fresh thread: the test process's own is left alone
    th.start()
    th.join()
    assert seen == [affinity.TIMER_SLACK_NS]
