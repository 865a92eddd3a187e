"""Streams and events: how GPU work is ordered (GPU runtimes only).

Model of record: every device and every directed link is its own FIFO
(docs/taskgraph.md). On a GPU that is one CUDA stream per queue, and the
dependences between queues are CUDA events (CUDA C Programming Guide,
"Streams" and "Events"; Legion's Realm does the same with one stream per
processor and per copy channel):

- *compute stream*: each local GPU device runs its ops' kernels on one
  non-blocking stream of its own (:meth:`Streams.compute_stream`);
- *link stream*: each directed link ``(src, dst)`` with a local GPU end runs
  its copies on a stream of its own (:meth:`Streams.link_stream`), on the
  destination GPU when it is local (host-to-device, peer copies, MPI
  receives), else on the source GPU (device-to-host, MPI sends);
- *communicator stream*: each collective's communicator (``comm:0,1,...``,
  runtime/collectives.py) has a stream on each of its local GPUs
  (:meth:`Streams.comm_stream`); a collective's body runs with those current
  (its prologues, its steps' peer copies or NCCL calls, the zeroing after a
  reduce-scatter), each waiting first on the op's dependences, the rounds
  of its steps ordered by events between them (:func:`comm_barrier`), and
  its frontier is their events: no device is synchronised;
- the legacy default stream is never used: it would serialise everything.

Op lifecycle (:meth:`Streams.execute`, called by the scheduler for every op
of a GPU runtime, untraced or replayed alike):

1. at submission (:meth:`note`) an op keeps its dependences in ``op.after``:
   the unfinished ones (Ops), plus the completion *frontier* of those that
   had already finished (their kernels may still be in flight);
2. a GPU op enters its device and stream, makes the stream wait on the
   events of every dependence that ran on another stream
   (``stream.wait_event``), enqueues its kernels, and records an event on
   its stream: ``op.event`` is then the frontier ``{stream index: (seq,
   event)}``. The op *finishes* for the scheduler once its kernels are
   enqueued, so devices and links run ahead of the GPU;
3. a ghost (an op another MPI rank runs) finishes with the merged
   frontier of its dependences, like a marker: a local op after it waits
   on the local kernels the remote op waited for (the remote completion
   orders nothing on this rank's streams);
4. an op on the host (no queue, a CPU device, a host-only link) and every
   host consumer (``Region.read``, ``Future.get``, fences, shutdown)
   synchronises the events it needs (:meth:`host_wait`), never whole
   devices; an op without a queue (fill and trace markers) finishes with
   the merged frontier of its dependences, so waiting on it waits on them.

Waits are deduplicated per stream: a stream that waited on event ``seq`` of
another stream, or whose work the host saw complete, skips older events of
it. Finished ops' frontiers stay in :attr:`Streams.done` until the next
fence (bounded: the oldest are synchronised and dropped past 8192).

Buffers (:class:`BufferPool`): staging buffers of reduction copies come
from a pool per (memory, shape, dtype) and go back to it after the fold,
with an event recorded on the stream that last used them; the next user
waits on it (stream-ordered reuse, as CUDA's stream-ordered allocator).

Graph capture (runtime/graphs.py) captures a device's compute stream: use
:meth:`Streams.compute_stream` and :meth:`Streams.stream_of`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from ..errors import MachineError
from . import gpu
from .scheduler import Op

__all__ = ["Streams", "BufferPool", "active", "device_work", "comm_barrier", "comm_stream_of"]

_tls = threading.local()  # ``op``: the queue-less op whose body runs in this thread
_MISS = object()
_DONE_LIMIT = 8192
_active: Streams | None = None


def active() -> Streams | None:
    """The streams of the live GPU runtime (None on CPU)."""
    return _active


def _noop(op: Op) -> None:
    """The body of a queue-less op: its frontier is computed by execute."""


class Streams:
    """The streams, events and waits of one GPU Runtime (see the module doc)."""

    def __init__(self, rt: Any) -> None:
        self.b = gpu.backend()
        self.gpu_of: dict[int, int] = rt.instances.gpu_of  # memory id -> CUDA ordinal
        self._by_queue: dict[Any, tuple[int, Any, int] | None] = {}
        self.streams: list[Any] = []  # by index
        self.names: list[str] = []
        self.ordinals: list[int] = []
        self._seq: list[int] = []  # events recorded per stream
        self._waited: list[dict[int, int]] = []  # per stream: other stream -> seq waited
        self.host_seen: dict[int, int] = {}  # stream -> last seq the host synchronised
        self.done: dict[int, dict] = {}  # finished op id -> frontier (until the fence)
        self._lock = threading.Lock()

    def install(self) -> Streams:
        global _active
        _active = self
        return self

    def close(self) -> None:
        global _active
        if _active is self:
            _active = None

    # -- the streams -----------------------------------------------------------------------
    def _new(self, k: int, name: str) -> tuple[int, Any, int]:
        """Under the lock: a new stream on GPU ``k``."""
        s = self.b.Stream(k, name)
        self.streams.append(s)
        self.names.append(name)
        self.ordinals.append(k)
        self._seq.append(0)
        self._waited.append({})
        return k, s, len(self.streams) - 1

    def stream_of(self, queue: Any) -> tuple[int, Any, int] | None:
        """``(CUDA ordinal, stream, index)`` a queue's ops run on: a local GPU
        device's compute stream, a link's stream; None on the host."""
        got = self._by_queue.get(queue, _MISS)
        if got is not _MISS:
            return got
        with self._lock:  # made once, whichever thread asks first
            return self._make(queue)

    def _make(self, queue: Any) -> tuple[int, Any, int] | None:
        got = self._by_queue.get(queue, _MISS)
        if got is not _MISS:
            return got
        gpu_of = self.gpu_of
        got = None
        if isinstance(queue, tuple):
            src, dst = queue
            end = dst if dst in gpu_of else src if src in gpu_of else None
            if end is not None:
                got = self._new(gpu_of[end], f"link stream {_mem(src)}->{_mem(dst)} "
                                             f"(on GPU {gpu_of[end]})")
        elif queue is not None and queue in gpu_of:
            got = self._new(gpu_of[queue], f"compute stream of device {queue} "
                                           f"(GPU {gpu_of[queue]})")
        self._by_queue[queue] = got
        return got

    def compute_stream(self, device: int) -> Any:
        """The compute stream of local GPU device (= memory) ``device``."""
        got = self.stream_of(device)
        if got is None:
            raise MachineError(f"device {device} is not a GPU of this process (its GPUs: "
                               f"{sorted(self.gpu_of)}); ask for one of those")
        return got[1]

    def link_stream(self, src: int, dst: int) -> Any:
        """The stream of the directed link ``src -> dst`` (memory ids, -1 the host)."""
        got = self.stream_of((src, dst))
        if got is None:
            raise MachineError(f"link {src}->{dst} has no end on a GPU of this process (its "
                               f"GPUs: {sorted(self.gpu_of)}): it runs on the host")
        return got[1]

    # -- submission and execution (called by the scheduler) ---------------------------------
    def note(self, op: Op, deps: list) -> None:
        """At submission: ``op`` runs after ``deps`` (unfinished Ops) and
        after the finished dependences among ``op.deps`` (ids)."""
        after = deps
        ids = op.deps
        done = self.done
        if ids and done:
            have = {d.id for d in deps} if deps else ()
            extra = [f for i in ids if i not in have and (f := done.get(i))]
            if extra:
                after = [*deps, *extra]
        op.after = after
        if op.queue is None and op.fn is None:
            # a marker, or a ghost (an op another rank runs): its frontier is
            # its dependences' (_marker), so a local op after a ghost waits on
            # the local kernels the ghost waited for -- the remote op's
            # completion orders nothing on this rank's streams. (A copy into
            # an instance that a local kernel still reads, after the remote
            # producer it depends on, raced without this.)
            op.fn = _noop

    def execute(self, op: Op) -> Any:
        """Run ``op``'s body on its stream after its dependences (the module doc)."""
        after = op.after or ()
        op.after = None
        ent = self._by_queue.get(op.queue, _MISS)
        if ent is _MISS:
            ent = self.stream_of(op.queue)
        if ent is None:
            if op.queue is None:
                return self._marker(op, after)
            if op.kind == "collective":
                devices = _gpu_positions(op, self.gpu_of)
                if devices:
                    return self._collective(op, after, devices)
            for d in after:
                self.host_wait(d)
            return op.fn(op)
        k, s, i = ent
        with self.b.Device(k), s:
            for d in after:
                self._wait(i, s, d)
            try:
                return op.fn(op)
            finally:
                op.event = f = self._record(i, s)
                self._keep(op.id, f)

    # -- collectives -----------------------------------------------------------------------
    def comm_stream(self, queue: str, device: int) -> tuple[int, Any, int]:
        """The stream of communicator ``queue`` on local GPU device ``device``."""
        key = (queue, device)
        got = self._by_queue.get(key, _MISS)
        if got is _MISS:
            with self._lock:
                got = self._by_queue.get(key, _MISS)
                if got is _MISS:
                    k = self.gpu_of[device]
                    got = self._by_queue[key] = self._new(
                        k, f"{queue} stream of device {device} (GPU {k})")
        return got

    def _collective(self, op: Op, after: Any, devices: list[int]) -> Any:
        """A collective op (runtime/collectives.py) whose local positions are
        on GPUs: its body runs with one stream of its communicator per local
        GPU current on that GPU (its prologues, steps or NCCL calls, and the
        zeroing after a reduce-scatter are kernels there), each waiting first
        on the op's dependences; :func:`comm_barrier` orders them between a
        collective's rounds. Its frontier is the events of those streams, so
        successors wait on them and nothing synchronises a whole device."""
        ents = [self.comm_stream(op.queue, d) for d in devices]
        with contextlib.ExitStack() as es:
            for k, s, i in ents:
                es.enter_context(self.b.Device(k))
                es.enter_context(s)
                for d in after:
                    self._wait(i, s, d)
            prev = getattr(_tls, "comm", None)
            _tls.comm = (self, {d: e for d, e in zip(devices, ents)})
            try:
                return op.fn(op)
            finally:
                _tls.comm = prev
                f: dict = {}
                for k, s, i in ents:
                    with self.b.Device(k):
                        f.update(self._record(i, s))
                op.event = f
                self._keep(op.id, f)

    def barrier(self, ents: dict) -> None:
        """Each of the streams ``ents`` ({device: (ordinal, stream, index)})
        waits for the work enqueued so far on the others."""
        marks = []
        for k, s, i in ents.values():
            with self.b.Device(k):
                marks.append((i, self._record(i, s)))
        for k, s, i in ents.values():
            with self.b.Device(k):
                for j, f in marks:
                    if j != i:
                        self._wait(i, s, f)

    def _marker(self, op: Op, after: Any) -> Any:
        op.event = f = self._merge(after)
        if op.fn is _noop:
            self._keep(op.id, f)
            return None
        _tls.op = op  # device_work inside the body waits on, and extends, op.event
        try:
            return op.fn(op)
        finally:
            _tls.op = None
            self._keep(op.id, op.event)

    # -- events ----------------------------------------------------------------------------
    def _record(self, i: int, s: Any) -> dict:
        with self._lock:
            seq = self._seq[i] = self._seq[i] + 1
            ev = self.b.Event()
            ev.record(s)
        return {i: (seq, ev)}

    def _keep(self, op_id: int, f: dict | None) -> None:
        if not f:
            return
        done = self.done
        done[op_id] = f
        if len(done) > _DONE_LIMIT:  # the oldest half: synchronised, then forgotten
            with self._lock:
                old = list(done)[:_DONE_LIMIT // 2]
            for i in old:
                g = done.pop(i, None)
                if g:
                    self._host_frontier(g)

    @staticmethod
    def _merge(after: Any) -> dict:
        out: dict = {}
        for d in after:
            f = d.event if type(d) is Op else d
            if f:
                for j, e in f.items():
                    o = out.get(j)
                    if o is None or o[0] < e[0]:
                        out[j] = e
        return out

    def _wait(self, i: int, s: Any, d: Any) -> None:
        """Stream ``i`` waits on the frontier of ``d`` (an Op or a frontier)."""
        f = d.event if type(d) is Op else d
        if not f:
            return
        w = self._waited[i]
        hs = self.host_seen
        for j, (seq, ev) in f.items():
            if j != i and w.get(j, 0) < seq and hs.get(j, 0) < seq:
                s.wait_event(ev)
                w[j] = seq  # after the wait is enqueued: a later reader may skip it

    def wait(self, stream: Any, d: Any) -> None:
        """Make ``stream`` (one of ours) wait on op (or frontier) ``d``."""
        i = next(n for n, s in enumerate(self.streams) if s is stream)
        self._wait(i, stream, d)

    def host_wait(self, d: Any) -> None:
        """The host waits for op (or frontier) ``d``'s kernels."""
        f = d.event if type(d) is Op else d
        if f:
            self._host_frontier(f)

    def _host_frontier(self, f: dict) -> None:
        hs = self.host_seen
        for j, (seq, ev) in f.items():
            if hs.get(j, 0) < seq:
                ev.synchronize()
                if hs.get(j, 0) < seq:
                    hs[j] = seq

    def host_wait_id(self, op_id: int) -> None:
        """The host waits for the kernels of finished op ``op_id`` (if any)."""
        f = self.done.get(op_id)
        if f:
            self._host_frontier(f)

    def fence(self) -> None:
        """Every op finished: the host waits for every stream; the finished
        ops' frontiers are forgotten."""
        self.fence_streams()
        self.done.clear()

    # -- work outside ops -----------------------------------------------------------------
    @contextmanager
    def device_work(self, memory: int, blocking: bool = False) -> Iterator[None]:
        """Kernels on ``memory``'s GPU from a thread that runs no op of it: on
        its compute stream, after the queue-less op whose body runs here (a
        trace's begin marker), whose frontier then includes them. With
        ``blocking`` (instance growth on the launching thread) the host first
        waits for every stream and afterwards for this work."""
        k, s, i = self.stream_of(memory)
        op = getattr(_tls, "op", None)
        if blocking:
            self.fence_streams()
        with self.b.Device(k), s:
            if op is not None:
                self._wait(i, s, op)
            yield
            f = self._record(i, s)
        if op is not None:
            op.event = self._merge((op.event, f))
        if blocking:
            self._host_frontier(f)

    def fence_streams(self) -> None:
        """The host waits for every stream (frontiers kept)."""
        for i, s in enumerate(self.streams):
            seq = self._seq[i]
            if self.host_seen.get(i, 0) < seq:
                s.synchronize()
                self.host_seen[i] = seq


def _gpu_positions(op: Op, gpu_of: dict) -> list[int]:
    """The local GPU devices of a collective op (its positions in this
    process whose memory is a GPU's), in group order."""
    spec = getattr(op.fn, "spec", None)
    if spec is None:
        return []
    return [spec.group[p] for p in spec.local if spec.group[p] in gpu_of]


def comm_barrier() -> None:
    """Inside a collective's body on GPUs: every local position's stream
    waits for the work enqueued so far on the others (between the rounds of
    a collective's steps: a round's peer reads after the previous round's
    writes). Nothing on CPU devices or outside a collective."""
    got = getattr(_tls, "comm", None)
    if got is not None:
        got[0].barrier(got[1])


def comm_stream_of(device: int) -> Any:
    """The current collective's stream on local GPU device ``device`` (None
    outside one)."""
    got = getattr(_tls, "comm", None)
    if got is None:
        return None
    ent = got[1].get(device)
    return None if ent is None else ent[1]


def device_work(memory: int, blocking: bool = False) -> Any:
    """:meth:`Streams.device_work` of the live GPU runtime (the device made
    current without a runtime)."""
    st = _active
    if st is not None and memory in st.gpu_of:
        return st.device_work(memory, blocking)
    return nullcontext()


def _mem(m: int) -> str:
    return "host" if m == -1 else f"host{-2 - m}" if m < -1 else f"mem{m}"


class BufferPool:
    """Free buffers per (memory, shape, dtype), reused across steps.

    :meth:`give` returns a buffer after its last use, with (on a GPU) an event
    recorded on the stream that used it; :meth:`take` hands it to the next
    user, whose current stream waits on that event first, or makes a new one
    (``make()``) when none is free."""

    def __init__(self) -> None:
        self.free: dict[tuple, list] = {}
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    def take(self, memory: int, shape: tuple, dtype: Any, make: Callable[[], Any]) -> Any:
        key = (memory, tuple(shape), dtype)
        with self._lock:
            free = self.free.get(key)
            got = free.pop() if free else None
            if got is None:
                self.misses += 1
            else:
                self.hits += 1
        if got is None:
            return make()
        self._after_last_user(*got)
        return got[0]

    def take_this(self, memory: int, buf: Any) -> tuple | None:
        """Take array ``buf`` itself out of the pool if it is free there (a
        CUDA graph's own buffer, runtime/graphcap.py), as :meth:`take` would
        hand it out; its ``(buf, event)`` entry, or None when it is not free."""
        with self._lock:
            free = self.free.get((memory, tuple(buf.shape), buf.dtype))
            i = next((i for i, (b, _) in enumerate(free or ()) if b is buf), None)
            if i is None:
                return None
            got = free.pop(i)
            self.hits += 1
        self._after_last_user(*got)
        return got

    @staticmethod
    def _after_last_user(buf: Any, ev: Any) -> None:
        """The current stream waits on the event of ``buf``'s last user."""
        if ev is not None:
            b = gpu.backend()
            with b.Device(buf.device.id):
                gpu.stream_wait(b.current_stream(), ev)

    def give(self, memory: int, buf: Any) -> None:
        ev = None
        if gpu.is_gpu(buf):  # on the stream of the op that used it last (current), which
            b = gpu.backend()  # may be on another GPU: a copy's link stream
            ev = b.Event()
            ev.record(b.current_stream())
        with self._lock:
            self.free.setdefault((memory, tuple(buf.shape), buf.dtype), []).append((buf, ev))
