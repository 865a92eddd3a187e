"""On a process whose threads share one core, a small copy's wait between
ranks sleeps while every device worker is busy and polls again as soon as
one runs out of work (runtime/scheduler.py ``DeviceIdle``, runtime/mpi.py
``Cluster.wait``, ``copy_bytes``): its data is not needed before then, and
each poll took the busy worker's core."""

import threading
import time
from types import SimpleNamespace

import pytest

import legionpy.runtime.mpi as M
import legionpy.runtime.scheduler as S


@pytest.fixture
def sched():
    s = S.Scheduler()
    s.executor = S.ThreadExecutor(s)
    s.one_core = True
    yield s
    s.executor.close()


def _until(cond, seconds: float = 5.0) -> bool:
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > seconds:
            return False
        time.sleep(1e-3)
    return True


def test_a_device_worker_says_when_it_has_nothing_to_run(sched):
    idle = sched.device_idle.event
    assert not idle.is_set()  # no device worker yet: busy
    gate, running = threading.Event(), threading.Event()
    sched.submit(S.Op(1, "compute", "busy", 0, lambda op: (running.set(), gate.wait(10))), [])
    assert running.wait(5)
    assert not idle.is_set()  # its only device runs a task
    gate.set()
    sched.wait(None, timeout=10)
    assert _until(idle.is_set)  # and now waits on an empty queue
    gate2 = threading.Event()
    sched.submit(S.Op(2, "compute", "again", 0, lambda op: gate2.wait(10)), [])
    assert _until(lambda: not idle.is_set())
    gate2.set()
    sched.wait(None, timeout=10)
    assert _until(idle.is_set)


def test_two_devices_one_idle_counts_as_idle(sched):
    idle = sched.device_idle.event
    gate = threading.Event()
    sched.submit(S.Op(1, "compute", "short", 0, lambda op: None), [])
    sched.submit(S.Op(2, "compute", "long", 1, lambda op: gate.wait(10)), [])
    assert _until(idle.is_set)  # device 0 is done while device 1 still runs
    gate.set()
    sched.wait(None, timeout=10)


def test_links_and_several_cores_keep_no_count():
    s = S.Scheduler()
    s.executor = S.ThreadExecutor(s)
    try:
        s.submit(S.Op(1, "compute", "t", 0, lambda op: None), [])
        s.wait(None, timeout=10)
        time.sleep(0.02)
        assert not s.device_idle.event.is_set()  # several cores: not kept
        s.one_core = True
        s.submit(S.Op(2, "copy", "c", (0, 1), lambda op: None), [])
        s.wait(None, timeout=10)
        time.sleep(0.02)
        assert not s.device_idle.event.is_set()  # a link's worker is no device
    finally:
        s.executor.close()


def _cluster(idle, one_core: bool = True):
    """What Cluster.wait reads of its cluster, without MPI: the scheduler
    it is bound to (its device-idle event, on a one-core process)."""
    mpi = SimpleNamespace(Request=SimpleNamespace(Testall=None))
    sched = None if idle is None else SimpleNamespace(
        one_core=one_core, device_idle=SimpleNamespace(event=idle))
    cl = SimpleNamespace(MPI=mpi, failure=None, timeout=30.0, sched_ref=lambda: sched)
    cl._device_idle = lambda: M.Cluster._device_idle(cl)
    return cl


def _polls(idle, copy_bytes: int | None, busy_s: float,
           one_core: bool = True) -> tuple[int, float]:
    """Polls of a wait whose data arrives at once but whose device is busy
    for ``busy_s`` (the test turns true only once the device is idle), and
    how long after the device went idle the wait returned."""
    polls, went_idle = [0], [0.0]

    def test() -> bool:
        polls[0] += 1
        return idle.is_set()

    def finish() -> None:
        time.sleep(busy_s)
        went_idle[0] = time.perf_counter()
        idle.set()

    t = threading.Thread(target=finish)
    t.start()
    M.Cluster.wait(_cluster(idle, one_core), [], lambda: "test", test=test,
                   copy_bytes=copy_bytes)
    done = time.perf_counter()
    t.join()
    return polls[0], done - went_idle[0]


def test_a_patient_wait_sleeps_while_the_devices_are_busy():
    patient, late = _polls(threading.Event(), 8, 0.05)
    eager, _ = _polls(threading.Event(), None, 0.05)
    # 50 ms busy: a poll per WAIT_PATIENT_NAP_S at most, and it returns as the
    # device goes idle (the event wakes it), not a nap later
    assert patient <= 0.05 / M.WAIT_PATIENT_NAP_S + 10
    assert eager > 2 * patient
    assert late < 0.5


@pytest.mark.parametrize("copy_bytes,one_core", [(M.PATIENT_MAX_BYTES + 1, True), (8, False)],
                         ids=["a large copy", "several cores"])
def test_a_large_copy_or_a_rank_with_cores_to_spare_keeps_polling(copy_bytes, one_core):
    patient, _ = _polls(threading.Event(), 8, 0.05)
    eager, _ = _polls(threading.Event(), copy_bytes, 0.05, one_core)
    assert eager > 2 * patient


def _idle_event() -> threading.Event:
    idle = threading.Event()
    idle.set()
    return idle


@pytest.mark.parametrize("idle", [_idle_event(), None], ids=["a device idle", "no event"])
def test_a_patient_wait_polls_as_usual_when_a_device_is_idle_or_none_is_tracked(idle):
    calls = [0]

    def test() -> bool:
        calls[0] += 1
        return calls[0] > 20

    M.Cluster.wait(_cluster(idle), [], lambda: "test", test=test, copy_bytes=8)
    assert calls[0] == 21
