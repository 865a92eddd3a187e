"""Streams, events and a race detector for the emulated GPUs (emugpu.py).

The emulated backend runs every kernel at once, so nothing can actually
race; this module makes a missing ordering *visible* instead: it keeps the
happens-before relation CUDA would give the program, with vector clocks
(Lamport 1978; Fidge / Mattern 1988, as in ThreadSanitizer and in CUDA race
checkers such as iGUARD), and raises :class:`~legionpy.errors.DeviceError`
when two accesses to the same bytes are not ordered by it.

Clocks
------
Every :class:`Stream` has an id and counts its kernels (``seq``); its clock
``vc`` maps stream ids to the last kernel of that stream known to complete
before the stream's next kernel (its own entry is its own ``seq``).

- a kernel on stream ``s`` increments ``s.seq``;
- ``Event.record(s)`` snapshots ``s.vc``; ``s.wait_event(ev)`` merges the
  snapshot into ``s.vc`` (``cudaStreamWaitEvent``);
- host synchronisation (``Event.synchronize``, ``Stream.synchronize``,
  ``Device.synchronize``) merges into the *host* clock, and every kernel
  enqueued afterwards merges the host clock into its stream's (work the
  host saw complete is ordered before anything it enqueues later);
- a per-device *legacy* stream serves threads that made no stream current;
  here it synchronises with nothing (legionpy's streams are non-blocking),
  and the runtime never uses it (``stats()["legacy_kernels"]``).

Accesses
--------
Each allocation (a base numpy buffer, :class:`Buf`) keeps access records
``(stream, seq, write, byte span, box)``: the box, in the allocation's
index space, when each axis of the view runs along one axis of the
allocation (a tile of an instance, a transpose, a column with its axis
dropped), else the byte span (conservative). A kernel reading a view
conflicts with an unordered earlier write of an overlapping part
(read-after-write); a write with an unordered earlier read or write
(write-after-read, write-after-write). A host read (``get``, ``item``,
``float``, ``asnumpy``) is, as in CuPy, a copy on the current stream of the
array's device (its legacy stream when none was made current) followed by
a synchronisation: it conflicts with a write that neither that stream nor
the host clock is ordered after. Records the host clock covers are pruned
(they are ordered before every later kernel); a write drops the records it
covers.

What it cannot check: timing (how much overlap a schedule gets), kernels
that read memory through raw pointers, IPC peers in other processes, and
the ordering of the host's own numpy arrays (host memory is not tracked).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from ..errors import DeviceError, GraphCaptureError
from .emugraph import capturing

__all__ = ["Stream", "Event", "Buf", "current_stream", "legacy_stream", "host_clock",
           "synchronize_device", "stats_into", "reset_counts", "explicit_stream"]

_lock = threading.RLock()
_tls = threading.local()
_ids = itertools.count(1)
_host_vc: dict[int, int] = {}  # stream id -> last kernel the host saw complete
_host_ver = [0]  # bumped when the host clock grows
#: every live stream, by id (for device syncs, names in messages and stats)
_streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
_legacy: dict[int, Stream] = {}
counts = {"events": 0, "waits": 0, "event_syncs": 0, "stream_syncs": 0, "host_reads": 0}


def _current_device() -> int:
    return getattr(_tls, "dev", 0)


def _merge_host(vc: dict) -> None:
    """Under the lock: the host saw every kernel of ``vc`` complete."""
    grew = False
    for k, v in vc.items():
        if _host_vc.get(k, 0) < v:
            _host_vc[k] = v
            grew = True
    if grew:
        _host_ver[0] += 1


class Stream:
    """A non-blocking stream of emulated GPU ``k`` (``cupy.cuda.Stream(
    non_blocking=True)``): ``with stream:`` makes it the calling thread's
    current stream on its device (which must be the current device)."""

    def __init__(self, k: int, name: str = "", legacy: bool = False) -> None:
        self.device_id = int(k)
        self.id = next(_ids)
        self.name = name or f"stream {self.id} of GPU {k}"
        self.legacy = legacy
        self.seq = 0  # kernels enqueued
        self.kernels = 0  # kernels since the last reset_counts
        self.vc: dict[int, int] = {self.id: 0}
        self._host_ver = -1
        with _lock:
            _streams[self.id] = self

    # -- the current stream (per thread and device, as CuPy) --------------------------------
    def __enter__(self) -> Stream:
        if _current_device() != self.device_id:
            raise DeviceError(f"entering {self.name} (GPU {self.device_id}) while GPU "
                              f"{_current_device()} is current: a stream belongs to its "
                              f"device; enter Device({self.device_id}) first")
        cur = _tls.__dict__.setdefault("cur", {})
        _tls.__dict__.setdefault("stack", []).append(cur.get(self.device_id))
        cur[self.device_id] = self
        return self

    def __exit__(self, *exc: Any) -> None:
        prev = _tls.stack.pop()
        if prev is None:
            _tls.cur.pop(self.device_id, None)
        else:
            _tls.cur[self.device_id] = prev

    def enqueue(self, kernel: bool = True) -> int:
        """Under the lock: one more kernel on this stream (``kernel=False``: a
        copy to the host, not counted in ``kernels``); its seq."""
        if self._host_ver != _host_ver[0]:
            vc = self.vc
            for k, v in _host_vc.items():
                if vc.get(k, 0) < v:
                    vc[k] = v
            self._host_ver = _host_ver[0]
        self.seq += 1
        self.kernels += kernel
        self.vc[self.id] = self.seq
        return self.seq

    def is_capturing(self) -> bool:
        """``cupy.cuda.Stream.is_capturing``: this thread captures this stream
        (runtime/emugraph.py)."""
        cap = capturing()
        return cap is not None and cap.stream is self

    def wait_event(self, ev: Event) -> None:
        """Kernels enqueued later run after the work ``ev`` recorded. A
        capturing stream may wait only on events recorded in its own capture:
        CUDA refuses a dependency on uncaptured work
        (``cudaErrorStreamCaptureIsolation``) and invalidates the capture."""
        if ev.vc is None:
            raise DeviceError(f"{self.name} waits on an event that was never recorded: "
                              "record it on the producing stream first")
        cap = capturing()
        if cap is not None and cap.stream is self and ev.capture is not cap:
            if cap.invalid is None:
                cap.invalid = "a wait on an event recorded outside the capture"
            raise GraphCaptureError(f"{self.name} waits, while capturing, on an event recorded "
                                    "outside the capture: dependency created on uncaptured "
                                    "work in another stream (cudaErrorStreamCaptureIsolation)")
        with _lock:
            vc = self.vc
            for k, v in ev.vc.items():
                if vc.get(k, 0) < v:
                    vc[k] = v
            counts["waits"] += 1

    def record(self, ev: Event | None = None) -> Event:
        ev = ev if ev is not None else Event()
        ev.record(self)
        return ev

    def synchronize(self) -> None:
        with _lock:
            _merge_host(self.vc)
            counts["stream_syncs"] += 1

    @property
    def done(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<emulated {self.name}>"


class Event:
    """``cupy.cuda.Event``: ``record(stream)`` marks the stream's work so far;
    ``stream.wait_event`` / ``synchronize`` order later work after it."""

    def __init__(self, block: bool = False, disable_timing: bool = True,
                 interprocess: bool = False) -> None:
        self.vc: dict[int, int] | None = None
        self.stream: Stream | None = None
        self.capture: Any = None  # the capture (emugraph) it was last recorded in, if any

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else current_stream()
        cap = capturing()
        with _lock:
            self.vc = dict(s.vc)
            self.stream = s
            self.capture = cap if cap is not None and cap.stream is s else None
            counts["events"] += 1

    def synchronize(self) -> None:
        if self.vc is None:
            return  # as CUDA: an unrecorded event is complete
        with _lock:
            _merge_host(self.vc)
            counts["event_syncs"] += 1

    @property
    def done(self) -> bool:
        return True  # work completes at once here; the host clock is not advanced by a query

    @property
    def recorded(self) -> bool:
        return self.vc is not None


def legacy_stream(k: int) -> Stream:
    s = _legacy.get(k)
    if s is None:
        with _lock:
            s = _legacy.get(k)
            if s is None:
                s = _legacy[k] = Stream(k, f"the legacy default stream of GPU {k}", legacy=True)
    return s


def explicit_stream(k: int) -> Stream | None:
    """The stream this thread made current on device ``k`` (None: none)."""
    cur = getattr(_tls, "cur", None)
    return cur.get(k) if cur else None


def current_stream() -> Stream:
    """This thread's current stream on the current device (the legacy one
    when none was made current)."""
    k = _current_device()
    return explicit_stream(k) or legacy_stream(k)


def synchronize_device(k: int) -> None:
    """``cudaDeviceSynchronize``: the host waits for every stream of ``k``."""
    with _lock:
        for s in list(_streams.values()):
            if s.device_id == k:
                _merge_host(s.vc)


def host_clock() -> dict[str, int]:
    """``{stream name: last kernel the host synchronised with}``."""
    with _lock:
        return {s.name: _host_vc[s.id] for s in list(_streams.values()) if s.id in _host_vc}


def stats_into(out: dict) -> None:
    with _lock:
        out.update(counts)
        out["legacy_kernels"] = {k: s.kernels for k, s in _legacy.items() if s.kernels}
        out["stream_kernels"] = {s.name: s.kernels for s in list(_streams.values())
                                 if s.kernels and not s.legacy}


def reset_counts() -> None:
    """Counters (events, waits, syncs, kernels per stream) from zero."""
    with _lock:
        for k in counts:
            counts[k] = 0
        for s in list(_streams.values()):
            s.kernels = 0


# -- allocations and their access records ------------------------------------------------
class Buf:
    """Access records of one allocation (an owner numpy array)."""

    __slots__ = ("recs", "ptr", "strides", "ndim", "box_ok", "owner_shape", "dtype", "dev",
                 "label", "__weakref__")

    def __init__(self, owner: Any, dev: int) -> None:
        self.recs: list[tuple] = []
        self.ptr = owner.__array_interface__["data"][0]
        self.strides = owner.strides
        self.ndim = owner.ndim
        self.owner_shape = owner.shape
        self.dtype = owner.dtype
        self.dev = dev
        self.box_ok = owner.flags.c_contiguous and all(s > 0 for s in owner.strides)
        self.label = ""

    @property
    def desc(self) -> str:
        what = f"an array {self.owner_shape} {self.dtype} on emulated GPU {self.dev}"
        return f"{self.label} ({what})" if self.label else what


def extent(a: Any, b: Buf) -> tuple[int, int, tuple | None]:
    """(first byte, end byte, box or None) of view ``a`` of allocation ``b``."""
    if a.base is None and b.box_ok:  # the whole allocation
        return 0, a.nbytes, ((0,) * a.ndim, a.shape)
    off = a.__array_interface__["data"][0] - b.ptr
    if a.size == 0:
        return off, off, None
    lo = hi = off
    for n, st in zip(a.shape, a.strides):
        if st > 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    hi += a.itemsize
    return lo, hi, _box(a, b, off) if b.box_ok else None


def _box(a: Any, b: Buf, off: int) -> tuple | None:
    """View ``a`` (at byte ``off`` of C-contiguous allocation ``b``) as a box
    of ``b``'s index space: its axes each run along one axis of ``b`` (a
    slice, a transpose, an axis dropped by an integer index), else None (then
    the byte range stands for it, conservatively). Column ``t`` of a (batch,
    time) array is then disjoint from column ``t + 1``, although their byte
    ranges interleave."""
    strides = b.strides
    starts = []
    rem = off
    for st in strides:
        q, rem = divmod(rem, st)
        starts.append(q)
    if rem:
        return None
    ends = [s + 1 for s in starts]
    used = [False] * len(strides)
    for n, st in zip(a.shape, a.strides):
        if n == 1:
            continue
        for j, sj in enumerate(strides):
            if sj == st and not used[j]:
                used[j] = True
                ends[j] = starts[j] + n
                break
        else:
            return None
    return tuple(starts), tuple(ends)


def _overlap(r: tuple, lo: int, hi: int, box: tuple | None) -> bool:
    if hi <= r[3] or r[4] <= lo:
        return False
    rb = r[5]
    if box is None or rb is None:
        return True
    for a, b, c, d in zip(box[0], box[1], rb[0], rb[1]):
        if not (a < d and c < b):
            return False
    return True


def _covers(box: tuple | None, lo: int, hi: int, r: tuple) -> bool:
    rb = r[5]
    if box is not None and rb is not None:
        for a, b, c, d in zip(box[0], box[1], rb[0], rb[1]):
            if c < a or b < d:
                return False
        return True
    return box is None and rb is None and lo <= r[3] and r[4] <= hi


def _name(sid: int) -> str:
    s = _streams.get(sid)
    return s.name if s is not None else f"stream {sid}"


def access(s: Stream, seq: int, a: Any, b: Buf, write: bool, what: str) -> None:
    """Under the lock: kernel ``seq`` of ``s`` reads (or writes) the part
    ``a`` (``(first byte, end byte, box)``, see :func:`extent`) of ``b``."""
    lo, hi, box = a
    if hi <= lo:
        return
    vc = s.vc
    sid = s.id
    recs = b.recs
    same = -1  # this stream's read record of the same part (replaced by a read)
    for n, r in enumerate(recs):
        rs = r[0]
        if rs == sid:
            if not write and not r[2] and r[3] == lo and r[4] == hi and r[5] == box:
                same = n
        elif (write or r[2]) and vc.get(rs, 0) < r[1] and _overlap(r, lo, hi, box):
            raise _race(s, r, b, write, what)
    rec = (sid, seq, write, lo, hi, box)
    if write:
        if recs:
            recs[:] = [r for r in recs if not _covers(box, lo, hi, r)]
        recs.append(rec)
    elif same >= 0:
        recs[same] = rec
    else:
        recs.append(rec)
    if len(recs) > 24:  # records the host clock covers precede every later kernel
        hv = _host_vc
        recs[:] = [r for r in recs if hv.get(r[0], 0) < r[1]]


def _race(s: Stream, r: tuple, b: Buf, write: bool, what: str) -> DeviceError:
    kind = ("write-after-write" if r[2] else "write-after-read") if write else "read-after-write"
    other = _name(r[0])
    return DeviceError(
        f"emulated GPU race ({kind}) on {b.desc}: {what} on {s.name} "
        f"{'writes' if write else 'reads'} it while kernel #{r[1]} of {other} "
        f"{'wrote' if r[2] else 'read'} it, and no event orders the two: make {s.name} "
        f"wait on the event of that kernel (ev.record on {other}, then wait_event(ev)), "
        f"or synchronise the host with it first")


def host_read(s: Stream, a: tuple, b: Buf, what: str) -> None:
    """Under the lock: the host reads view ``a`` of ``b`` as CuPy does: a copy
    on ``s`` (the current stream of the array's device; the legacy one when
    none was made current), then the host waits for ``s``."""
    counts["host_reads"] += 1
    access(s, s.enqueue(kernel=False), a, b, False, f"{what} (a copy to the host)")
    _merge_host(s.vc)
