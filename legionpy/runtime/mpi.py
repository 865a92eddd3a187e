"""The MPI layer of control replication: the job, waits that end, the error
channel and the service thread.

Nothing here is imported in a one-process run: :func:`launched_under_mpi`
looks only at environment variables (``LEGIONPY_MPI=1|0`` forces; else any
of ``PMI_RANK``, ``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``, ``MPI_LOCALRANKID``,
``PMIX_RANK`` set by mpirun/mpiexec/srun), and mpi4py is imported by
:func:`cluster` only then.

Communicators (all ``Dup`` of COMM_WORLD, so legionpy traffic never matches a
user's messages): ``data`` carries copies and future transfers (tag = op id
modulo the tag upper bound; copies on one link run in op-id order on both
ranks, so MPI's non-overtaking rule keeps even wrapped tags apart); ``svc``
carries future requests and replies; ``err`` the error channel; ``coll``
the fence's launch-hash allgather.

Never a hang: every wait polls (:meth:`Cluster.wait`) with a deadline of
``LEGIONPY_MPI_TIMEOUT`` seconds (default 60) and raises a
:class:`~legionpy.errors.TaskError` saying what it waited for; it also
raises as soon as the watchdog learned that another rank failed.

Failure protocol: a rank whose task fails (:meth:`Cluster.report_failure`)
prints the message, sends it to every other rank on the error channel and
arms an abort timer: after ``LEGIONPY_MPI_GRACE`` seconds (default 2), or at
interpreter exit if sooner, it calls ``MPI_Abort(1)``, so ``mpirun`` exits
non-zero. The watchdog thread of every other rank polls the channel, prints
the same message, sets the scheduler's ``interrupt`` (every wait raises the
TaskError) and arms its own timer. A rank killed by a signal is handled by
the launcher (MPICH's hydra kills the job when one process dies).
"""

from __future__ import annotations

import atexit
import math
import os
import pickle
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import affinity
from ..errors import TaskError
from .scheduler import FAILED

__all__ = ["launched_under_mpi", "cluster", "Cluster", "MPI_ENV_VARS", "bcast_root", "allgather",
           "on_rank0_alone", "share_among_ranks"]

MPI_ENV_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID", "PMIX_RANK")
ERR_TAG, REQ_TAG = 1, 2
#: how :meth:`Cluster.wait` waits: a short spin, then naps growing from
#: 10 us to at most ``WAIT_NAP_MAX_S``. MPICH moves a nonblocking
#: collective's data only inside an MPI call, so a peer that arrives late
#: waits for the early rank's next poll: with naps growing to 1 ms after a
#: 0.5 ms spin, a 250 KB reduce-scatter took ~320 us (alexnet data,
#: ``mpirun -n 2``), and a long spin took the core a bound rank's worker
#: needs. 0.1 ms and 50 us were the fastest and steadiest of the settings
#: measured (lenet data 3.6-3.9 vs 3.9-4.7 ms; issue 26); a waiting thread's
#: polls then cost a few percent of its core.
WAIT_SPIN_S = 1e-4
WAIT_NAP_MAX_S = 5e-5
#: a patient wait (a small copy's, on a rank whose threads share one core:
#: :meth:`Cluster.wait`'s ``copy_bytes``)
#: sleeps up to this long at a time while every device worker of the rank is
#: busy, woken at once when one runs out of work: its data is not needed
#: before then, and each poll took the busy worker's core
#: (runtime/scheduler.py ``DeviceIdle``). Not a collective's: the other
#: ranks' parts of it complete only at this rank's polls (patient
#: collectives made data-parallel steps 4-10% slower, 27 Nov)
WAIT_PATIENT_NAP_S = 1e-3
#: the largest message a wait is patient for: MPICH moves a larger one in
#: pieces, each at a poll of the receiver, so it keeps being polled for
PATIENT_MAX_BYTES = 1 << 16
#: the longest nap of a wait at a step boundary (``fit``'s Ctrl-C agreement):
#: a rank with nothing to run (a strategy on another rank's device) waits
#: there a whole step, and napping at most 50 us cost its core ~2 ms a step
#: (alexnet single, ``mpirun -n 2``), a core it may share with a rank that
#: computes; the launches run a step ahead, so a late wake-up costs nothing
WAIT_BOUNDARY_NAP_S = 1e-3
#: the watchdog thread's pause between polls for errors and future requests
WATCH_NAP_S = 2e-3
REPLY_BASE = 1000


def launched_under_mpi() -> bool:
    """True when this process was started by an MPI launcher (or LEGIONPY_MPI=1)."""
    force = os.environ.get("LEGIONPY_MPI", "").strip()
    if force in ("0", "1"):
        return force == "1"
    return any(v in os.environ for v in MPI_ENV_VARS)


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


_cluster: Cluster | None = None


def bcast_root(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (``value`` itself outside MPI).
    Collective: every rank calls it at the same point of the program. The
    one way legionpy makes a measured or searched result the same on every
    rank (rank 0 measures, the others take its figures)."""
    if not launched_under_mpi():
        return value
    return cluster().coll.bcast(value, root=0)


def on_rank0_alone(fn: Callable[[], Any], nap_s: float = 2e-3) -> Any:
    """``fn()`` on rank 0 while the other ranks sleep (naps of ``nap_s``
    between tests of a nonblocking barrier, not MPICH's busy poll of a
    blocking one), then rank 0's result on every rank (``fn()`` itself
    outside MPI). For a measurement of the node's cores that the other
    ranks' polling would load: a kernel's hold on the interpreter lock
    (optimizer/lockshare.py). Collective."""
    if not launched_under_mpi():
        return fn()
    cl = cluster()
    out = fn() if cl.rank == 0 else None
    # no time limit: rank 0's measurement takes as long as the model's tiles
    _napping_barrier(cl, "rank 0's measurement", nap_s)
    return cl.coll.bcast(out, root=0)


def _napping_barrier(cl: Cluster, what: str, nap_s: float) -> None:
    """Every rank's arrival, waited for in naps of at most ``nap_s`` (a
    nonblocking barrier tested between sleeps, not MPICH's busy poll: a rank
    that arrives early leaves its core to the ranks still working), with no
    time limit."""
    cl.wait([cl.coll.Ibarrier()], lambda: what, timeout=math.inf, nap_max=nap_s)


def _outcome(op: Any) -> tuple[bool, Any]:
    """What a rank sends of a finished op it ran: (True, result), or
    (False, its error's text)."""
    return (False, str(op.error)) if op.state == FAILED else (True, op.result)


def _receive(op: Any, outcome: tuple[bool, Any]) -> None:
    """Take a ghost op's :func:`_outcome` from the rank that ran it: its
    result (the ghost is then local), or raise its error."""
    ok, value = outcome
    if not ok:
        raise TaskError(value)
    op.result = value
    op.remote = False


def allgather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (``[value]`` outside MPI).
    Collective, like :func:`bcast_root`."""
    if not launched_under_mpi():
        return [value]
    return cluster().coll.allgather(value)


def share_among_ranks(fn: Callable[[int, int], Any], nap_s: float = 2e-3) -> list[Any]:
    """Work split among the ranks: ``fn(rank, size)`` on every rank (its
    part of the work), then every rank's result in rank order
    (``[fn(0, 1)]`` outside MPI). A rank done early naps until the others are
    (:func:`_napping_barrier`): ranks sharing a core (``mpirun -n 4`` on two)
    then leave it to the ones still working. Collective."""
    if not launched_under_mpi():
        return [fn(0, 1)]
    cl = cluster()
    out = fn(cl.rank, cl.size)
    if cl.size == 1:
        return [out]
    _napping_barrier(cl, "the other ranks' parts of the work", nap_s)
    return cl.coll.allgather(out)



def cluster() -> Cluster:
    """The process's :class:`Cluster` (imports mpi4py; collective on first call)."""
    global _cluster
    if _cluster is None:
        _cluster = Cluster()
    return _cluster


def mpirun_path() -> str | None:
    """The ``mpirun`` to launch jobs with: the one installed beside this
    interpreter (the ``mpich`` wheel puts it in the virtual environment's
    ``bin``, which need not be on PATH), else the first on PATH, else None."""
    import shutil

    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else shutil.which("mpirun")


class Cluster:
    """This MPI job: ``rank``, ``size``, ``hosts`` (name per rank),
    ``local_rank`` (index among the ranks of this host), communicators,
    ``timeout`` (s) and the watchdog/service thread."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        world = MPI.COMM_WORLD
        self.world = world
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.data, self.svc, self.err, self.coll, self.futs = (world.Dup() for _ in range(5))
        self.tag_ub = int(world.Get_attr(MPI.TAG_UB) or 32767)
        self.timeout = _env_float("LEGIONPY_MPI_TIMEOUT", 60.0)
        self.grace = _env_float("LEGIONPY_MPI_GRACE", 2.0)
        self.host = MPI.Get_processor_name() or socket.gethostname()
        self.hosts: list[str] = world.allgather(self.host)
        same = [r for r, h in enumerate(self.hosts) if h == self.host]
        self.local_rank, self.local_size = same.index(self.rank), len(same)
        # each rank of the node on its own cores, before this process starts
        # its threads (legionpy/affinity.py; LEGIONPY_BIND=0: not)
        self.cores = affinity.bind_rank(self.local_rank, self.local_size)
        self.failure: str | None = None
        self.sched_ref: Callable[[], Any] = lambda: None
        self.next_id: Callable[[], int] = lambda: 0
        self.generation = 0  # runtimes bound so far: the same count on every rank
        self.owned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.epochs: list[dict[int, Any]] = [{}, {}]
        self._requests: list[tuple[int, int, int, list[int]]] = []
        self._reply = 0
        self._abort_at: float | None = None
        self._stop = False
        self._svc_lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="legionpy-mpi")
        self._thread.start()
        atexit.register(self._at_exit)
        self._hook = sys.excepthook
        sys.excepthook = self._excepthook

    def _excepthook(self, kind: type, exc: BaseException, tb: Any) -> None:
        """An uncaught exception on one rank ends the job (after the grace)."""
        self._hook(kind, exc, tb)
        text = str(exc) if isinstance(exc, TaskError) else (
            f"uncaught {kind.__name__} on rank {self.rank}: {exc}")
        self.report_failure(text)

    # -- binding to the current runtime ------------------------------------------------
    def bind(self, sched: Any, next_id: Callable[[], int]) -> None:
        """Serve future requests from, and interrupt the waits of, ``sched``;
        ``next_id()`` is the runtime's next op id (ops below it were launched)."""
        self.sched_ref = weakref.ref(sched)
        self.next_id = next_id
        self.generation += 1
        self.owned = weakref.WeakValueDictionary()
        self.epochs = [{}, {}]
        sched.fetch = self.fetch
        sched.exchange = self.exchange

    def keep(self, op: Any) -> None:
        """Serve ``op``'s result to other ranks: kept strongly until two fences
        later (a rank may ask after this one dropped its Future), then weakly
        (while this rank's program still holds the Future)."""
        self.owned[op.id] = op
        self.epochs[1][op.id] = op

    def new_epoch(self) -> None:
        """At a fence: requests sent before it can still be answered."""
        self.epochs = [self.epochs[1], {}]

    def _lookup(self, i: int) -> Any:
        e = self.epochs
        return e[1].get(i) or e[0].get(i) or self.owned.get(i)

    def tag(self, op_id: int) -> int:
        return op_id % self.tag_ub

    # -- waits that end ----------------------------------------------------------------
    def check(self) -> None:
        """Raise if another rank (or this one) reported a failure."""
        if self.failure is not None:
            raise TaskError(self.failure)

    def wait(self, reqs: list, what: Callable[[], str], timeout: float | None = None,
             test: Callable[[], bool] | None = None, nap_max: float = WAIT_NAP_MAX_S,
             copy_bytes: int | None = None) -> None:
        """Complete every request in ``reqs`` (or, given ``test``, until
        ``test()`` is true: work that is not an MPI request, e.g. NCCL's);
        spin :data:`WAIT_SPIN_S`, then sleep with a growing interval, at most
        ``nap_max``; TaskError after ``timeout``
        (LEGIONPY_MPI_TIMEOUT) s or when another rank failed. A copy's wait
        (``copy_bytes``, the message's size) of at most
        :data:`PATIENT_MAX_BYTES` is patient on a rank whose threads share one
        core (the bound scheduler's ``one_core``): while every device worker is
        busy, no spin, and sleep until one is idle (its ``device_idle``, at
        most :data:`WAIT_PATIENT_NAP_S` at a time)."""
        testall = self.MPI.Request.Testall
        done = test or (lambda: testall(reqs))
        if done():
            return
        idle = self._device_idle() if copy_bytes is not None \
            and copy_bytes <= PATIENT_MAX_BYTES else None
        t0 = time.perf_counter()
        if idle is None or idle.is_set():
            while time.perf_counter() - t0 < WAIT_SPIN_S:  # spin, yielding the GIL
                if done():
                    return
                time.sleep(0)
        limit = self.timeout if timeout is None else timeout
        nap = 1e-5
        while not done():
            if self.failure is not None:
                raise TaskError(self.failure)
            if time.perf_counter() - t0 > limit:
                for r in reqs:
                    try:
                        r.Cancel()
                    except Exception:  # noqa: BLE001 - collectives cannot be cancelled
                        pass
                raise TaskError(f"rank {self.rank} waited {limit:g} s for {what()}; the ranks "
                                "probably run different programs (different launches or "
                                "fences), or a rank is stuck (LEGIONPY_MPI_TIMEOUT sets the "
                                "limit)")
            if idle is not None and not idle.is_set():
                idle.wait(WAIT_PATIENT_NAP_S)  # until a device runs out of work
                nap = 1e-5
                continue
            time.sleep(nap)
            nap = min(nap * 2, nap_max)

    def _device_idle(self) -> threading.Event | None:
        """The bound scheduler's device-idle event where its threads share one
        core (runtime/scheduler.py ``DeviceIdle``), else None."""
        sched = self.sched_ref()
        return sched.device_idle.event if sched is not None and sched.one_core else None

    def others(self, comm: Any) -> list[int]:
        """The world ranks of ``comm``'s members other than this one."""
        ranks = comm.Get_group().Translate_ranks(list(range(comm.Get_size())),
                                                 self.world.Get_group())
        return [r for r in ranks if r != self.rank]

    def wait_or_report(self, reqs: list, what: Callable[[], str], failure: str,
                       test: Callable[[], bool] | None = None,
                       abort: Callable[[], None] | None = None) -> None:
        """:meth:`wait`; when it fails, ``abort()`` (e.g. an NCCL
        communicator), then report ``"<failure>: <why>"`` to every rank (the
        job ends after the grace) and raise it: a collective's wait."""
        try:
            self.wait(reqs, what, test=test)
        except TaskError as exc:
            if abort is not None:
                abort()
            text = f"{failure} on rank {self.rank}: {exc}"
            self.report_failure(text)
            raise TaskError(text) from exc

    def recv_obj(self, comm: Any, source: int, tag: int, what: Callable[[], str]) -> Any:
        """A pickled message, polled (Iprobe) so it times out instead of hanging."""
        t0 = time.perf_counter()
        nap = 1e-5
        while not comm.Iprobe(source=source, tag=tag):
            if self.failure is not None:
                raise TaskError(self.failure)
            if time.perf_counter() - t0 > self.timeout:
                raise TaskError(f"rank {self.rank} waited {self.timeout:g} s for {what()}; the "
                                "ranks probably run different programs, or a rank is stuck")
            time.sleep(nap)
            nap = min(nap * 2, 1e-3)
        return comm.recv(source=source, tag=tag)

    # -- futures -------------------------------------------------------------------------
    def fetch(self, ops: list, timeout: float | None = None) -> None:
        """Get the results of ghost ``ops`` from their owning ranks (one request
        per rank); store them in ``op.result`` and clear ``op.remote``."""
        by_rank: dict[int, list] = {}
        for op in ops:
            if op.remote:
                by_rank.setdefault(op.rank, []).append(op)
        pending = []
        for r, group in sorted(by_rank.items()):
            with self._svc_lock:
                self._reply = (self._reply + 1) % (self.tag_ub - REPLY_BASE)
                tag = REPLY_BASE + self._reply
            self.svc.send((tag, self.generation, [o.id for o in group]), dest=r, tag=REQ_TAG)
            pending.append((r, tag, group))
        for r, tag, group in pending:
            answers = self.recv_obj(self.svc, r, tag, lambda r=r, g=group: (
                f"the results of {len(g)} task(s) from rank {r} (first: {g[0].describe()})"))
            for op, answer in zip(group, answers):
                _receive(op, answer)

    def exchange(self, local: list, ghosts: list, what: str,
                 timeout: float | None = None) -> None:
        """Results of one FutureMap, as a collective: every rank calls it at
        the same point of its program, sends the results of ``local`` (its
        own finished ops) and receives those of ``ghosts`` from the ranks
        that ran them (:meth:`FutureMap.gather`). No request waits for an
        owner's watchdog, which polls every 2 ms: under ``mpirun`` every
        step of ``fit`` waited for it (a floor of 2.2-2.5 ms per step, issue
        26). ``what``: the call site, for the timeout's message."""
        mine = {op.id: _outcome(op) for op in local}
        try:
            blob = pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            blob = pickle.dumps({i: (False, f"could not send the result of op {i} from rank "
                                           f"{self.rank}: {exc}") for i in mine})
        MPI = self.MPI
        size = np.array([len(blob)], np.int64)
        sizes = np.zeros(self.size, np.int64)
        why = lambda: (f"the other ranks at {what} (a collective: every rank calls it "  # noqa: E731
                       "at the same point of the program)")
        self.wait([self.futs.Iallgather(size, sizes)], why, timeout)
        counts = [int(n) for n in sizes]
        displs = [sum(counts[:r]) for r in range(self.size)]
        out = np.empty(max(sum(counts), 1), np.uint8)
        send = np.frombuffer(blob, np.uint8)
        self.wait([self.futs.Iallgatherv(send, [out, counts, displs, MPI.BYTE])], why, timeout)
        got: dict[int, tuple[bool, Any]] = {}
        for r in range(self.size):
            if r != self.rank and counts[r]:
                got.update(pickle.loads(out[displs[r]:displs[r] + counts[r]].tobytes()))
        for op in ghosts:
            if op.remote and op.id in got:
                _receive(op, got[op.id])

    def _serve(self) -> None:
        """Answer future requests whose ops finished (watchdog thread)."""
        svc, MPI = self.svc, self.MPI
        st = MPI.Status()
        while svc.Iprobe(source=MPI.ANY_SOURCE, tag=REQ_TAG, status=st):
            src = st.Get_source()
            self._requests.append((src, *svc.recv(source=src, tag=REQ_TAG)))
        keep = []
        upto, gen = self.next_id(), self.generation
        for src, tag, g, ids in self._requests:
            ops = [self._lookup(i) if g == gen else None for i in ids]
            if g > gen or any(o.state < 2 if o is not None else i >= upto and g == gen
                              for o, i in zip(ops, ids)):
                keep.append((src, tag, g, ids))  # not launched here yet
                continue
            out = []
            for i, o in zip(ids, ops):
                if g != gen:
                    out.append((False, f"rank {self.rank} was asked for op {i} of an earlier "
                                       f"runtime (generation {g}, now {gen}: "
                                       "legionpy.runtime.init): ranks diverged"))
                elif o is None:
                    out.append((False, f"rank {self.rank} has no task op {i} to send to rank "
                                       f"{src}: the ranks run different programs, or the "
                                       "Future was dropped on the rank that ran it"))
                else:
                    out.append(_outcome(o))
            try:
                svc.send(out, dest=src, tag=tag)
            except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
                svc.send([(False, f"could not send results to rank {src}: {exc}")] * len(ids),
                         dest=src, tag=tag)
        self._requests = keep

    # -- failures ------------------------------------------------------------------------
    def report_failure(self, text: str) -> None:
        """This rank's task failed: print, tell every rank, abort after the grace."""
        if self.failure is not None:
            return
        self.failure = text
        print(f"[legionpy rank {self.rank}] error: {text}", file=sys.stderr, flush=True)
        for r in range(self.size):
            if r != self.rank:
                self.err.isend(text, dest=r, tag=ERR_TAG)
        self._arm()

    def _arm(self) -> None:
        if self._abort_at is None:
            self._abort_at = time.monotonic() + self.grace
        sched = self.sched_ref()
        if sched is not None:
            sched.interrupt = TaskError(self.failure)
            with sched.lock:
                sched.cond.notify_all()

    def _watch(self) -> None:
        err, MPI = self.err, self.MPI
        while not self._stop:
            try:
                if self.failure is None and err.Iprobe(source=MPI.ANY_SOURCE, tag=ERR_TAG):
                    text = err.recv(source=MPI.ANY_SOURCE, tag=ERR_TAG)
                    # print before publishing: once ``failure`` is set the main
                    # thread may raise, exit and abort the job at once
                    print(f"[legionpy rank {self.rank}] error: {text}", file=sys.stderr,
                          flush=True)
                    self.failure = text
                    self._arm()
                if self._requests or self.svc.Iprobe(source=MPI.ANY_SOURCE, tag=REQ_TAG):
                    self._serve()
            except Exception as exc:  # noqa: BLE001 - the watchdog must not die silently
                print(f"[legionpy rank {self.rank}] watchdog: {exc!r}", file=sys.stderr)
            if self._abort_at is not None and time.monotonic() >= self._abort_at:
                self._abort()
            time.sleep(5e-4 if self._requests else WATCH_NAP_S)

    def _abort(self) -> None:
        sys.stderr.flush()
        sys.stdout.flush()
        self.world.Abort(1)

    def _at_exit(self) -> None:
        if self.failure is not None:
            if self._abort_at is None:  # the watchdog has not armed the abort yet
                self._abort_at = time.monotonic() + self.grace
            left = self._abort_at - time.monotonic()
            if left > 0:
                time.sleep(min(left, 0.5))
            self._abort()
        self._stop = True
        # MPI_Finalize (mpi4py's, after the interpreter's exit handlers) must
        # not run while the watchdog is inside an Iprobe or a reply (the
        # aborts at exit seen in CI had another cause: a runtime made during
        # shutdown, runtime/collectives.py _stand_in)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(1.0, 4 * WATCH_NAP_S))

