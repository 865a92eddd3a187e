"""A process whose threads share one core yields that core from its
launching thread while it submits, as long as ops of a link or a
communicator are pending (runtime/scheduler.py): a trace replay is pure
Python for a millisecond or more, and a cross-rank send waited for it."""

import threading
import time

import pytest

import legionpy.runtime.scheduler as S


@pytest.fixture
def threaded(monkeypatch):
    yields: list[float] = []
    monkeypatch.setattr(S, "_sched_yield", lambda: yields.append(time.perf_counter()))
    sched = S.Scheduler()
    sched.executor = S.ThreadExecutor(sched)
    sched.one_core = True
    yield sched, yields
    sched.executor.close()


def _submit_behind(sched: S.Scheduler, held, queue, seconds: float) -> int:
    """With ``held`` (an op on a link that waits for an event) pending,
    submit ready ops that do nothing on ``queue`` for ``seconds``."""
    gate = threading.Event()
    if held is not None:
        sched.submit(S.Op(10**6, "copy", "held", held, lambda op: gate.wait(10)), [])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sched.submit(S.Op(n, "compute", f"op{n}", queue, lambda op: None), [])
        n += 1
    gate.set()
    sched.wait(None, timeout=10)
    return n


def test_with_a_link_s_op_pending_it_yields_every_interval(threaded):
    sched, yields = threaded
    ops = _submit_behind(sched, (0, 1), 0, 0.02)
    # 20 ms of submitting (200 intervals): it yields again and again, not per op
    assert 10 <= len(yields) < ops / 2
    gaps = [b - a for a, b in zip(yields, yields[1:])]
    assert min(gaps) >= S.YIELD_EVERY_S
    assert sched.outstanding == 0 and sched.talking == 0


def test_a_pending_collective_counts_too(threaded):
    sched, yields = threaded
    _submit_behind(sched, "comm:0,1", 0, 0.01)
    assert len(yields) >= 5
    assert sched.talking == 0


def test_with_devices_alone_it_never_yields(threaded):
    sched, yields = threaded
    _submit_behind(sched, None, 0, 0.02)
    assert yields == [] and sched.talking == 0


def test_a_process_on_several_cores_never_yields(threaded):
    sched, yields = threaded
    sched.one_core = False
    _submit_behind(sched, (0, 1), 0, 0.02)
    assert yields == []


def test_submitting_in_batches_counts_and_yields(threaded):
    sched, yields = threaded
    gate = threading.Event()
    sched.submit_many([(S.Op(10**6, "copy", "held", (1, 0), lambda op: gate.wait(10)), [])])
    assert sched.talking == 1
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.01:
        sched.submit_many([(S.Op(n + k, "compute", "x", 0, lambda op: None), [])
                           for k in range(8)])
        n += 8
    gate.set()
    sched.wait(None, timeout=10)
    assert 5 <= len(yields) < n / 8
    assert sched.outstanding == 0 and sched.talking == 0


def test_staging_from_the_host_is_not_communication(threaded):
    sched, yields = threaded
    _submit_behind(sched, (-1, 0), 0, 0.02)
    assert yields == [] and sched.talking == 0


def _chain(sched: S.Scheduler, queue) -> list[str]:
    """A device op and, after it, one on ``queue``; the order things happened."""
    seen: list[str] = []
    a = S.Op(1, "compute", "a", 0, lambda op: seen.append("a"))
    b = S.Op(2, "copy", "b", queue, lambda op: seen.append("b"))
    sched.submit(a, [])
    sched.submit(b, [a])
    sched.wait(None, timeout=10)
    return seen


def test_a_worker_that_makes_a_send_ready_yields_at_once(threaded, monkeypatch):
    """The device worker that finishes a send's producer yields the core, so
    the link's thread starts the send before the worker's next kernels."""
    sched, _ = threaded
    who: list[str] = []
    monkeypatch.setattr(S, "_sched_yield", lambda: who.append(threading.current_thread().name))
    assert _chain(sched, (0, 1)) == ["a", "b"]
    assert "legionpy-0" in who  # the device's worker, as it released the send


def test_a_release_of_device_work_or_staging_does_not_yield(threaded):
    sched, yields = threaded
    assert _chain(sched, 1) == ["a", "b"] and _chain(sched, (-1, 0)) == ["a", "b"]
    assert yields == []
    sched.one_core = False
    _chain(sched, (0, 1))
    assert yields == []
