"""The launching thread yields its core while it submits (runtime/scheduler.py):
a trace replay is pure Python for a millisecond or more, and under mpirun a
rank's link and device threads share its one core."""

import time

import legionpy.runtime.scheduler as S


def _submit_for(sched: S.Scheduler, seconds: float) -> int:
    """Submit no-op ops, each after its predecessor, for ``seconds``."""
    n, prev, t0 = 0, [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        op = S.Op(n, "compute", f"op{n}", None, None)
        sched.submit(op, prev)
        prev, n = [op], n + 1
    return n


def test_a_thread_that_keeps_submitting_yields_its_core_every_interval(monkeypatch):
    yields: list[float] = []
    monkeypatch.setattr(S, "_sched_yield", lambda: yields.append(time.perf_counter()))
    sched = S.Scheduler()
    ops = _submit_for(sched, 0.02)
    # 20 ms of submitting (200 intervals): it yields again and again, and not per op
    assert 10 <= len(yields) < ops / 2
    gaps = [b - a for a, b in zip(yields, yields[1:])]
    assert min(gaps) >= S.YIELD_EVERY_S
    assert sched.outstanding == 0


def test_submitting_in_batches_yields_too(monkeypatch):
    yields: list[float] = []
    monkeypatch.setattr(S, "_sched_yield", lambda: yields.append(time.perf_counter()))
    sched = S.Scheduler()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.01:
        sched.submit_many([(S.Op(n + k, "compute", "x", None, None), []) for k in range(8)])
        n += 8
    assert 5 <= len(yields) < n / 8
    assert sched.outstanding == 0
