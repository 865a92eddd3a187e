"""Scheduling core: operations, dependences, per-queue FIFO execution.

Policy
------
Everything that runs is an :class:`Op` (a point task, a copy, a fill marker)
bound to a *queue*: a device id, a directed link ``(src, dst)``, or None for
ops that do no work (lazy fills) and complete as soon as they are ready.
Analysis (dependence, mapping, coherence) happens before an op reaches the
scheduler, on the launching thread, in program order; the scheduler only
counts finished dependences. An op becomes *ready* when its last dependence
finishes; each queue runs its ready ops FIFO in order of readiness, and ops
that become ready together (released by one completion, or submitted ready)
enter their queues sorted by op id. So every device and link processes its
ops in a deterministic order whenever readiness order is.

Control replication (runtime/replication.py) adds *ghosts*: ops another
MPI rank executes, submitted here with queue None (``remote=True``), so
they finish as soon as their dependences do and keep this rank's
dependence structure identical to the executing rank's. ``interrupt`` is
set by the MPI watchdog when another rank failed: every wait raises it.

Failure: an op whose body raises is *failed*; every op that depends on it
fails as soon as it becomes ready, without running, with a TaskError naming
both. Every wait ends: ops either finish or fail, worker threads catch every
exception, and waits poll with a timeout.

State (under ``lock``): per op ``state`` (PENDING, READY, DONE, FAILED),
``npending`` (unfinished deps), ``succ`` (ops waiting on it). The executor
decides where ready ops run:

- :class:`ThreadExecutor`: one daemon worker thread per queue, each
  popping its ``queue.SimpleQueue`` in order.
- :class:`SerialExecutor`: one global FIFO of ready ops, drained in the
  caller's thread after every launch and in every wait. Same core, same
  order semantics, one thread: bugs reproduce under a debugger.

GPU runtimes (runtime/streams.py, installed by :meth:`Scheduler.use_streams`)
run every op's body on its device's or link's CUDA stream after the events
of its dependences, and record an event for it: an op *finishes* here once
its kernels are enqueued. CPU runtimes keep the plain methods (no per-op
cost).

A process whose threads share one core (a rank bound to its core under
``mpirun``, legionpy/affinity.py: ``one_core``) yields that core from its
launching thread (``os.sched_yield``, which also lets the interpreter lock go)
once per :data:`YIELD_EVERY_S` of submitting, while copies between devices or
collectives are pending (``talking``). A trace replay is pure Python, 1.3-1.7
ms a step for rnntc, and a link thread woken by a finished task to start its
cross-rank send did not run until the replay ended (measured 27 Nov: the send
of rnntc owt's ``classifier.grad`` started 1.6-3.1 ms after its producer in a
third of the steps, and the other rank's backward waited for it). Under
``mpirun -n 2``, yielding every 100 us took that row from 9.3-10.4 to 7.4-7.6
ms a step (predicted 7.2); every 400 us did nothing (9.3-9.8). Every 25 us (28
Nov, three rounds alternating with 100 us, ``mpirun -n 2``): lenet data
3.73-3.79 against 3.85-3.98 ms, rnntc owt 7.02-7.35 against 7.19-7.81, alexnet
owt 10.93-10.94 against 10.86-11.50, rnnlm model and rnntc on one device
unchanged within noise. Yielding whenever a link thread exists made one-device
steps slower (rnnlm on one device 7.1-7.3 -> 7.5-8.1 ms: the worker then runs
ahead of the replay of the next step, which then starts late); with pending
communication as the condition, owt and data rows gain 6-12% and one-device
rows are unchanged. The host's input staging is not communication: counted, it
kept a one-device rank of ``mpirun -n 4`` on 2 cores yielding through every
replay, 8-22% slower.

On such a process the device workers also say when one of them has nothing
to run (:class:`DeviceIdle`): a small message from another rank is only
worth polling for then (runtime/mpi.py ``Cluster.wait``, ``copy_bytes``).
While every device is busy, a link thread waiting for one sleeps until a
device is idle instead of waking every 50-125 us to poll, and each poll
took the busy worker's core. Under ``mpirun -n 2`` (27 Nov, six rounds of
twelve rows alternating with the code before, one calibration, medians of
the rounds' ratios) model-parallel steps got 2-8% faster (alexnet 0.93x,
rnntc 0.94x, lenet 0.96x, rnnlm 0.98x), owt ones 0-3%, data-parallel ones
unchanged.

Example: ops 1 (dev 0), 2 (dev 1, after 1), 3 (dev 0): the launch submits 1
and 3 ready, in id order, to device 0; 2 waits. When 1 finishes, 2 enters
device 1's queue, and device 0 continues with 3.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from queue import SimpleQueue
from typing import Any

from ..errors import TaskError

__all__ = ["Op", "Scheduler", "ThreadExecutor", "SerialExecutor", "PENDING", "READY", "DONE",
           "FAILED", "YIELD_EVERY_S", "DeviceIdle"]

#: the longest the launching thread submits before it yields its core (module doc)
YIELD_EVERY_S = 2.5e-5

_sched_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))

PENDING, READY, DONE, FAILED = 0, 1, 2, 3


class Op:
    """One schedulable operation; also the trace record of what ran."""

    __slots__ = ("id", "kind", "name", "queue", "fn", "state", "npending", "succ", "deps",
                 "result", "error", "start", "end", "bytes", "point", "launch", "tag", "src",
                 "dst", "waited", "rank", "remote", "event", "after", "__weakref__")

    def __init__(self, id: int, kind: str, name: str, queue: Any, fn: Callable[[Op], Any] | None,
                 point: tuple | None = None, launch: int | None = None, tag: Any = None) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.queue = queue
        self.fn = fn
        self.state = PENDING
        self.npending = 0
        self.succ: list[Op] = []
        self.deps: tuple[int, ...] = ()
        self.result: Any = None
        self.error: BaseException | None = None
        self.start = self.end = 0.0
        self.bytes = 0
        self.point = point
        self.launch = launch
        self.tag = tag
        self.waited = False
        self.rank = 0  # MPI rank that executes it
        self.remote = False  # a ghost of an op another rank executes (queue None)
        #: GPU runtimes (streams.py): the events its kernels recorded, and the
        #: dependences it waits on until it runs
        self.event: dict | None = None
        self.after: list | None = None

    show_rank = False  # set under MPI: descriptions name the executing rank

    def describe(self) -> str:
        where = f" point {self.point}" if self.point is not None else ""
        if Op.show_rank:
            where += f" rank {self.rank}"
        return f"{self.kind} {self.name!r} (op {self.id}{where})"

    def __repr__(self) -> str:
        return f"<Op {self.id} {self.kind} {self.name} on {self.queue} state={self.state}>"


class DeviceIdle:
    """Whether some device worker of a process has nothing to run:
    ``event`` is set while at least one is idle (module doc). The workers of
    a :class:`ThreadExecutor` on a one-core process call :meth:`enter`
    before they block on an empty queue and :meth:`leave` when an op
    arrives; a process with no device worker yet counts as busy.

    >>> idle = DeviceIdle()
    >>> idle.enter(); idle.enter(); idle.leave(); idle.event.is_set()
    True
    >>> idle.leave(); idle.event.is_set()
    False
    """

    __slots__ = ("event", "_lock", "_idle")

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._idle = 0

    def enter(self) -> None:
        with self._lock:
            self._idle += 1
            self.event.set()

    def leave(self) -> None:
        with self._lock:
            self._idle -= 1
            if not self._idle:
                self.event.clear()


class Scheduler:
    """Dependence counting and completion; executors plug in ``dispatch``."""

    def __init__(self, on_done: Callable[[Op], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiters = 0
        self.outstanding = 0  # submitted, not finished
        self.on_done = on_done  # trace / debug hook, called after each op
        self.interrupt: BaseException | None = None  # set by the MPI watchdog: waits raise it
        self.fetch: Callable[[list[Op], float | None], None] | None = None  # remote results
        #: results of a FutureMap as a collective (MPI: Cluster.exchange), or None
        self.exchange: Callable[..., None] | None = None
        #: set while a trace is recorded (runtime/tracing.py): ``recorder(op, deps)``
        #: sees every submitted op with the ops it was made to wait for
        self.recorder: Callable[[Op, list], None] | None = None
        self.executor: Executor = SerialExecutor(self)
        self._yielded = time.perf_counter()  # when the launching thread last yielded
        #: the process's threads share one core (set by the runtime, affinity.one_core)
        self.one_core = False
        #: queue key -> CPU seconds its ops' bodies used, while
        #: :meth:`count_span_cpu` is on (two thread-clock reads per op, ~1 us)
        self.span_cpu: dict[Any, float] | None = None
        #: submitted, unfinished copies between devices and collectives
        #: (:func:`_talks`): while there are any, the launching thread yields
        self.talking = 0
        #: whether a device worker is idle (kept by the worker threads of a
        #: one-core process: :class:`DeviceIdle`, runtime/mpi.py ``Cluster.wait``)
        self.device_idle = DeviceIdle()
        #: GPU runtimes: the streams and events of runtime/streams.py
        self.streams: Any = None

    def use_streams(self, streams: Any) -> None:
        """Run every op through ``streams`` (a GPU runtime): its body on its
        device's or link's stream after the events of its dependences. The
        CPU path keeps the plain methods (no per-op cost)."""
        self.streams = streams
        note = streams.note
        submit, submit_many = self.submit, self.submit_many

        def submit_on_streams(op: Op, deps: Iterable[Op]) -> None:
            deps = list(deps)
            note(op, deps)
            submit(op, deps)

        def submit_many_on_streams(batch: list[tuple[Op, list[Op]]]) -> None:
            for op, deps in batch:
                note(op, deps)
            submit_many(batch)

        self.submit = submit_on_streams  # type: ignore[method-assign]
        self.submit_many = submit_many_on_streams  # type: ignore[method-assign]
        self.run = self.run_on_streams  # type: ignore[method-assign]

    # -- submission (launching thread) ------------------------------------------
    def submit(self, op: Op, deps: Iterable[Op]) -> None:
        """Register ``op`` after ``deps`` (ops not yet finished, or failed)."""
        if self.recorder is not None:
            deps = list(deps)
            self.recorder(op, deps)
        with self.lock:
            self.outstanding += 1
            if _talks(op):
                self.talking += 1
            waiting = self._wait_for(op, deps)
        if not waiting:
            self._release([op])
        self._yield_core()

    def submit_many(self, batch: list[tuple[Op, list[Op]]]) -> None:
        """``submit`` for each ``(op, deps)`` in order, under one lock (a
        trace replay's ops; no recorder is active then)."""
        with self.lock:
            self.outstanding += len(batch)
            self.talking += sum(1 for op, _ in batch if _talks(op))
            ready = [op for op, deps in batch if not self._wait_for(op, deps)]
        if ready:
            self._release(ready)
        self._yield_core()

    def _yield_core(self) -> None:
        """Yield the core (and the interpreter lock) when the submitting
        thread has run :data:`YIELD_EVERY_S` since it last did, in a process
        whose threads share one core, while communication is pending
        (module doc)."""
        if not (self.one_core and self.talking):
            return
        now = time.perf_counter()
        if now - self._yielded > YIELD_EVERY_S:
            _sched_yield()
            self._yielded = time.perf_counter()

    @staticmethod
    def _wait_for(op: Op, deps: Iterable[Op]) -> int:
        """Under the lock: make ``op`` wait for the unfinished ``deps`` (a
        failed one fails it); READY when none. Returns how many it waits for."""
        failed = None
        n = 0
        for d in deps:
            st = d.state
            if st < DONE:
                d.succ.append(op)
                n += 1
            elif st == FAILED:
                failed = d
        op.npending = n
        if failed is not None and op.error is None:
            op.error = failed
        if not n:
            op.state = READY
        return n

    def _release(self, ready: list[Op]) -> None:
        """Hand newly ready ops to the executor; skip failed and untimed ones.
        An op with no queue but a body (a trace replay's begin marker, which
        resets reduction buffers) runs inline, in the releasing thread. On a
        process whose threads share one core, a release that makes
        communication ready (a cross-rank send, a collective) yields the core
        at once, so its link thread starts it now, not when the releasing
        worker's next kernels are done: under ``mpirun -n 2`` lenet owt's
        send of ``flat.grad`` started a median 150 us after its producer
        ended (p90 1.36 ms, behind four conv backward tasks), and the other
        rank's backward waited for it; with the yield 25 us (p90 62 us)."""
        talked = False
        watch = self.one_core  # only a one-core process yields for communication
        while ready:
            later: list[Op] = []
            for op in ready:
                if op.queue is None and op.fn is not None and op.error is None:
                    self.run(op)
                elif op.error is not None or op.queue is None:
                    later.extend(self._finish(op, None, op.error))
                else:
                    self.executor.dispatch(op)
                    if watch and not talked:
                        talked = _talks(op)
            ready = later
        if talked:
            _sched_yield()
            self._yielded = time.perf_counter()

    # -- execution (worker threads or caller) ---------------------------------------
    def run(self, op: Op) -> None:
        self._execute(op, op.fn)

    def run_on_streams(self, op: Op) -> None:
        """``run`` on a GPU runtime: the body through ``streams.execute``."""
        self._execute(op, self.streams.execute)

    def _execute(self, op: Op, body: Callable[[Op], Any]) -> None:
        """Run ``body(op)`` (the op's own function, or its enqueueing on a
        stream), stamp it, count its CPU seconds while :meth:`count_span_cpu`
        is on, and finish it."""
        spans = self.span_cpu
        c0 = time.thread_time() if spans is not None else 0.0
        op.start = time.perf_counter()
        err = None
        try:
            op.result = body(op)
        except BaseException as exc:  # noqa: BLE001 - propagated through futures
            err = exc
        op.end = time.perf_counter()
        if spans is not None:
            spans[op.queue] = spans.get(op.queue, 0.0) + time.thread_time() - c0
        op.fn = None
        self._release(self._finish(op, op.result, err))

    def count_span_cpu(self, on: bool) -> None:
        """Start (from zero) or stop adding up each queue's op bodies' CPU
        seconds in :attr:`span_cpu`."""
        self.span_cpu = {} if on else None

    def _finish(self, op: Op, result: Any, err: BaseException | None) -> list[Op]:
        if err is not None and not isinstance(err, TaskError):
            if isinstance(err, Op):  # a dependence failed: fail fast without running
                cause = err.error
                err = TaskError(f"{op.describe()} did not run because {err.describe()} "
                                f"failed: {cause}")
                err.__cause__ = cause
            else:
                wrapped = TaskError(f"{op.describe()} raised {type(err).__name__}: {err}")
                wrapped.__cause__ = err
                err = wrapped
        if op.start == 0.0:
            op.start = op.end = time.perf_counter()
        ready: list[Op] = []
        with self.lock:
            op.error = err
            op.state = FAILED if err is not None else DONE
            self.outstanding -= 1
            if _talks(op):
                self.talking -= 1
            for s in op.succ:
                s.npending -= 1
                if err is not None and s.error is None:
                    s.error = op
                if s.npending == 0:
                    s.state = READY
                    ready.append(s)
            op.succ = []
            if self.waiters and (not self.outstanding or op.waited):
                self.cond.notify_all()
        if self.on_done is not None:
            self.on_done(op)
        if len(ready) > 1:
            ready.sort(key=_op_id)
        return ready

    # -- waiting ----------------------------------------------------------------
    def wait(self, op: Op | None, timeout: float | None = None) -> None:
        """Block until ``op`` finished or failed, or with ``op=None`` until every
        submitted op did (TimeoutError after ``timeout`` s)."""
        if op is not None and op.state >= DONE:
            return
        self.executor.drain()
        if op is None:
            op = _ALL
        elif op.state >= DONE:
            return
        op.waited = True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self.waiters += 1
            try:
                while (self.outstanding if op is _ALL else op.state < DONE):
                    if self.interrupt is not None:
                        raise self.interrupt
                    left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                    if left <= 0:
                        what = "the submitted ops" if op is _ALL else op.describe()
                        raise TimeoutError(f"{what} did not finish in {timeout} s")
                    self.cond.wait(left)
            finally:
                self.waiters -= 1


def _op_id(op: Op) -> int:
    return op.id


def _talks(op: Op) -> bool:
    """Whether ``op`` is communication another device waits for: a copy on a
    link between two devices' memories, or a collective on a communicator
    (a device's queue is its id, a link ``(src, dst)`` of memories, the
    host's -1; a copy from the host stages a step's inputs, which nothing
    waits for before the step starts, and an op of no queue does no work)."""
    q = op.queue
    if q is None or type(q) is int:
        return False
    if type(q) is tuple:
        return q[0] >= 0 and q[1] >= 0
    return True


_ALL = Op(-1, "fence", "all ops", None, None)


class Executor:
    def dispatch(self, op: Op) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def drain(self) -> None:
        """Run whatever the caller's thread must run (serial executor)."""

    def close(self) -> None:
        """Stop workers (after a fence)."""

    def cpu_seconds(self) -> dict[Any, float]:
        """Queue key -> CPU seconds its worker thread has used (none here: the
        caller's thread runs every op)."""
        return {}


class SerialExecutor(Executor):
    """Everything in the caller's thread, one global FIFO of ready ops."""

    name = "serial"

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.ready: deque[Op] = deque()
        self.running = False

    def dispatch(self, op: Op) -> None:
        self.ready.append(op)

    def drain(self) -> None:
        if self.running:  # a task body launching tasks: its caller drains
            return
        self.running = True
        try:
            ready, run = self.ready, self.sched.run
            while ready:
                run(ready.popleft())
        finally:
            self.running = False


class ThreadExecutor(Executor):
    """One daemon worker thread per queue (device or link), created lazily."""

    name = "threads"

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.queues: dict[Any, SimpleQueue] = {}
        self.threads: list[threading.Thread] = []
        #: queue key -> its worker thread's CPU clock (time.pthread_getcpuclockid)
        self.clocks: dict[Any, int] = {}
        self._lock = threading.Lock()

    def dispatch(self, op: Op) -> None:
        q = self.queues.get(op.queue)
        if q is None:
            q = self._start(op.queue)
        q.put(op)

    def _start(self, key: Any) -> SimpleQueue:
        with self._lock:
            q = self.queues.get(key)
            if q is None:
                q = SimpleQueue()
                # a device's worker (its queue key is the device id) on a
                # one-core process says when it has nothing to run
                idle = self.sched.device_idle if self.sched.one_core and type(key) is int \
                    else None
                t = threading.Thread(target=self._loop, args=(q, idle), daemon=True,
                                     name=f"legionpy-{key}")
                t.start()
                self.threads.append(t)
                self.queues[key] = q
                try:
                    self.clocks[key] = time.pthread_getcpuclockid(t.ident)
                except (AttributeError, OSError):  # no per-thread CPU clocks here
                    pass
            return q

    def cpu_seconds(self) -> dict[Any, float]:
        """Queue key -> the CPU seconds its worker thread has used so far
        (time it ran, not time it waited for a core or the interpreter lock)."""
        out = {}
        for key, clock in list(self.clocks.items()):
            try:
                out[key] = time.clock_gettime(clock)
            except OSError:  # the thread has ended
                continue
        return out

    def _loop(self, q: SimpleQueue, idle: DeviceIdle | None = None) -> None:
        run = self.sched.run
        while True:
            if idle is not None and q.empty():
                idle.enter()
                op = q.get()
                idle.leave()
            else:
                op = q.get()
            if op is None:
                return
            run(op)

    def close(self) -> None:
        for q in self.queues.values():
            q.put(None)
        for t in self.threads:
            t.join(timeout=5.0)
        self.queues.clear()
        self.threads.clear()
        self.clocks.clear()
