"""A process whose threads share one core and that runs a link's or a
communicator's thread yields that core from its launching thread while it
submits (runtime/scheduler.py): a trace replay is pure Python for a
millisecond or more, and a cross-rank send waited for it."""

import time

import pytest

import legionpy.runtime.scheduler as S


def _submit_for(sched: S.Scheduler, queue, seconds: float) -> int:
    """Submit ready ops that do nothing on ``queue`` for ``seconds``; then
    wait for them."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sched.submit(S.Op(n, "compute", f"op{n}", queue, lambda op: None), [])
        n += 1
    sched.wait(None, timeout=10)
    return n


@pytest.fixture
def threaded(monkeypatch):
    yields: list[float] = []
    monkeypatch.setattr(S, "_sched_yield", lambda: yields.append(time.perf_counter()))
    sched = S.Scheduler()
    sched.executor = S.ThreadExecutor(sched)
    sched.one_core = True
    yield sched, yields
    sched.executor.close()


def test_a_process_on_one_core_with_a_link_yields_every_interval(threaded):
    sched, yields = threaded
    ops = _submit_for(sched, (0, 1), 0.02)
    # 20 ms of submitting (200 intervals): it yields again and again, not per op
    assert 10 <= len(yields) < ops / 2
    gaps = [b - a for a, b in zip(yields, yields[1:])]
    assert min(gaps) >= S.YIELD_EVERY_S
    assert sched.outstanding == 0


def test_a_process_with_devices_alone_never_yields(threaded):
    sched, yields = threaded
    _submit_for(sched, 0, 0.02)
    assert yields == []
    assert sched.outstanding == 0


def test_a_process_on_several_cores_never_yields(threaded):
    sched, yields = threaded
    sched.one_core = False
    _submit_for(sched, (0, 1), 0.02)
    assert yields == []


def test_submitting_in_batches_yields_too(threaded):
    sched, yields = threaded
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.01:
        sched.submit_many([(S.Op(n + k, "collective", "x", "comm:0,1", lambda op: None), [])
                           for k in range(8)])
        n += 8
    sched.wait(None, timeout=10)
    assert 5 <= len(yields) < n / 8
    assert sched.outstanding == 0
