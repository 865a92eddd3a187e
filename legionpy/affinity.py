"""Each rank of a node on its own cores (issue 26).

``mpirun`` from the ``mpich`` wheel binds nothing: every rank's threads (its
control thread, one worker per device and link, the MPI service thread) may
run on any core of the node. On a 2-core machine running ``mpirun -n 2``
the operating system then moves threads between the ranks' cores, and a
rank whose collective waits (runtime/mpi.py ``Cluster.wait`` spins before it
naps) takes the core the other rank's kernel needs: the same strategy
measured 3.8-6.5 ms (lenet data) and 16-26 ms (rnntc model) from run to run.
With each rank bound to its own cores (what Open MPI's ``--bind-to core``,
Slurm's ``--cpu-bind`` and Legion's Realm, which pins its processor threads,
do) the same runs measured 3.8-5.1 ms and 14-15 ms: faster, and steady
enough to predict.

:func:`bind_rank` splits the cores this process may use (its affinity when
it starts) into ``local_size`` equal blocks, one per rank of the node, in
local-rank order (more ranks than cores: rank ``r`` gets core ``r mod
cores``, so two ranks share one) and binds every thread of the process to
its block. It leaves a process alone when the launcher or the batch system
bound it already (its affinity is a strict subset of the cores its
container may use), when ``LEGIONPY_BIND=0``, and where the platform has no thread
affinity (macOS, Windows). :func:`core_blocks` is the rule, so the local
machine model (legionpy/optimizer/fidelity.py) shares the cores the same
way: each rank's threads share its block, not the whole node.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["core_blocks", "bind_rank", "binding", "node_cores", "one_core", "unbound",
           "cpu_clock", "own_background", "fine_timers"]

#: the cores this process could use before :func:`bind_rank` (None: not bound)
_original: frozenset[int] | None = None
_block: frozenset[int] | None = None


def core_blocks(cores: Sequence[int], local_size: int) -> list[tuple[int, ...]]:
    """The cores of each of ``local_size`` ranks (module doc): equal
    contiguous blocks of ``cores`` (sorted), the remainder left unused; with
    more ranks than cores, rank ``r`` gets core ``r mod len(cores)``.

    >>> core_blocks([0, 1, 2, 3], 2)
    [(0, 1), (2, 3)]
    >>> core_blocks([0, 1], 4)
    [(0,), (1,), (0,), (1,)]
    >>> core_blocks([0, 1, 2], 2)
    [(0,), (1,)]
    """
    cs = sorted(cores)
    n = max(1, local_size)
    if not cs:
        return [()] * n
    if n > len(cs):
        return [(cs[r % len(cs)],) for r in range(n)]
    per = len(cs) // n
    return [tuple(cs[r * per:(r + 1) * per]) for r in range(n)]


def _enabled() -> bool:
    return os.environ.get("LEGIONPY_BIND", "1").strip().lower() not in ("0", "off", "no", "false")


def _cpu_list(path: str) -> set[int] | None:
    """A kernel CPU list file (``0-3,8``) as a set; None if unreadable."""
    try:
        with open(path) as f:
            out: set[int] = set()
            for part in f.read().strip().split(","):
                if part:
                    a, _, b = part.partition("-")
                    out.update(range(int(a), int(b or a) + 1))
            return out or None
    except (OSError, ValueError):
        return None


def _allowed() -> set[int]:
    """The cores a process of this node may be given: its container's
    (cgroup v2 ``cpuset.cpus.effective``), else the online ones."""
    return (_cpu_list("/sys/fs/cgroup/cpuset.cpus.effective")
            or _cpu_list("/sys/devices/system/cpu/online")
            or set(range(os.cpu_count() or 1)))


def _threads() -> list[int]:
    """Native ids of this process's threads (Linux: ``/proc/self/task``)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set_all(cores: frozenset[int]) -> None:
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # a thread that ended meanwhile
            pass


def bind_rank(local_rank: int, local_size: int) -> frozenset[int] | None:
    """Bind this process (every thread, and those it starts later) to
    local rank ``local_rank``'s block of :func:`core_blocks` (module doc).
    Returns the block, or None when it leaves the process alone."""
    global _original, _block
    if _block is not None:
        return _block
    if not _enabled() or not hasattr(os, "sched_setaffinity"):
        return None
    mine = frozenset(os.sched_getaffinity(0))
    if mine < _allowed():  # bound already (mpirun --bind-to, Slurm, taskset): keep it
        return None
    block = frozenset(core_blocks(sorted(mine), local_size)[local_rank])
    if not block or block == mine:
        return None
    _original, _block = mine, block
    _set_all(block)
    return block


def binding() -> frozenset[int] | None:
    """The cores :func:`bind_rank` bound this process to (None: not bound)."""
    return _block


#: the timer slack :func:`fine_timers` gives this process's threads, ns
TIMER_SLACK_NS = 1000


def fine_timers() -> bool:
    """Give the calling thread, and every thread it starts afterwards, a
    timer slack of :data:`TIMER_SLACK_NS` (Linux ``prctl(PR_SET_TIMERSLACK)``;
    a new thread inherits its creator's). Linux lets a sleeping thread
    oversleep by its slack, 50 us by default, so that wake-ups coalesce: on
    this 2-core VM ``time.sleep(0)`` took 74 us and ``time.sleep(1e-5)`` 95
    us, so a wait between ranks that naps 10-50 us at a time
    (runtime/mpi.py ``Cluster.wait``) noticed a message 60-140 us late, at
    every hop of a chain of copies. With a 1 us slack: 15 and 27 us. Under
    ``mpirun -n 2`` (runs alternating with the slack off): lenet data
    4.0-4.2 ms against 4.0-5.1 (five each), alexnet owt 10.4-11.0 against
    11.3-11.4 (two each); a later three rounds of both this and the
    worker's yield (runtime/scheduler.py) against neither showed lenet data
    unchanged (3.8-4.3 ms both) and alexnet owt 10.9-11.0 against
    12.0-12.2. Returns whether it was set (not on macOS or Windows)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(29, TIMER_SLACK_NS, 0, 0, 0) == 0  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):  # no libc prctl (not Linux)
        return False


def one_core() -> bool:
    """Whether this process's threads share one core (bound to it by
    :func:`bind_rank`, the launcher or the batch system): its launching
    thread then yields the core now and then (runtime/scheduler.py)."""
    try:
        return len(os.sched_getaffinity(0)) == 1
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return False


def node_cores() -> int:
    """Cores the job may use on this node: the process's own before
    :func:`bind_rank` split them among the ranks, else its affinity."""
    if _original is not None:
        return len(_original)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@contextmanager
def unbound() -> Iterator[None]:
    """Every thread on the cores the process had before binding, for a
    measurement of the machine itself (two threads of one process on two
    cores: :func:`legionpy.probe.overhead.measure_lock_hold`); bound again
    after."""
    if _block is None or _original is None:
        yield
        return
    _set_all(_original)
    try:
        yield
    finally:
        _set_all(_block)


# -- how busy the node's cores are ----------------------------------------------------------

def cpu_clock() -> tuple[float, float, float] | None:
    """``(wall s, CPU-seconds the whole machine has been busy, CPU-seconds of
    this process)`` now, from ``/proc/stat`` (busy = all but idle and iowait,
    steal included; 10 ms ticks: a figure over less than ~0.5 s is rough)
    and ``getrusage``; None where ``/proc/stat`` is missing."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    # this process's in microseconds (os.times counts 10 ms ticks, as
    # /proc/stat does: over a 50 ms window the two ticks alone were +-0.4 cores)
    own = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), (sum(v) - v[3] - v[4]) / tick, own.ru_utime + own.ru_stime


def own_background(start: tuple | None, end: tuple | None) -> float | None:
    """Cores other programs kept busy between two :func:`cpu_clock`
    readings: the machine's busy CPU-seconds less this process's, over the
    wall seconds (one process; under MPI
    :func:`legionpy.probe.overhead.background_cores` sums the ranks')."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))
