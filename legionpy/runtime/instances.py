"""Physical instances: the arrays behind each (memory, root region, field).

Memory behaviour: an instance in a device memory covers the *bounding box of
the rects its tasks use* in that memory (their tiles, halos included), not
the whole root region, so a device holding one tile of a big tensor holds
that tile (FlexFlow's memory model, the simulator's ``peak_memory``). The
launch-time analysis (main thread) calls :meth:`Instances.reserve` for every
non-reduction requirement: the first makes the instance over its rect, a
later one reaching beyond it grows the instance to the bounding box. Growing
happens after the runtime has waited for every in-flight local op (they may
hold views of the old array), copies the old contents over and bumps
:attr:`Instances.generation`, which the point bodies' view cache checks
(runtime/body.py), so a replayed trace never uses a stale view. Growth
happens in the first iterations only; steady-state steps never grow. The
host memory (``HOST`` = -1, where ``Region.write`` lands and ``Region.read``
gathers) holds whole roots. Arrays are ``np.zeros`` (calloc).

A task's subregion is ``part(memory, root, field, rect)``: a view of the
instance at ``rect`` (root coordinates, shifted by the instance's origin).
Reduction instances are separate and identity-initialised: one per (memory,
root, field) and epoch (coherence.py), shared by every same-op reducer on
that memory, allocated by the first reducer that runs and grown to the
bounding box of the reducers' rects when a later one reaches beyond it
(:meth:`Instances.reduction_view`, on the device's worker: the tasks of one
device run one at a time). A reduction copied to another memory lands in a
staging buffer there and is folded by the reader's prologue.

Buffer lifetimes (docs/memory.md): the launch-time analysis counts each copy
or fold planned from a buffer (:meth:`Instances.will_consume`) and marks the
buffer dead when no coherence piece refers to it any more
(:meth:`Instances.mark_dead`); the worker that runs its last consumer
returns it to a per-(memory, shape, dtype) pool (:meth:`Instances.consumed`),
where the next buffer of that shape (usually the next step's) takes it. A
trace replay has no analysis: its begin marker re-installs the consumers and
deaths its recording counted (:meth:`Instances.expect`). A buffer partly
discarded unread by a write or fill (its reducers may still run) and any
leftover are dropped at the next fence. Staging buffers live from their
copy to the fold that consumes them.

Bytes: :attr:`Instances.nbytes` / :attr:`Instances.peak` count, per memory,
the instances, reduction buffers and staging buffers it holds now and at
most (``peak_bytes`` in ``legionpy.runtime.memory_stats()``, with the split
by :data:`KINDS` at the peak), to compare with the simulator's
``peak_memory`` of the same strategy.

GPU memories (``gpu_of``: memory id -> CUDA device ordinal, set by the
Runtime for this rank's GPU devices) hold CuPy (or emulated, emugpu.py)
arrays allocated outside CuPy's pool (so CUDA IPC handles point at the
array itself, runtime/gpu.py); copies and staging buffers move data between
backends with the helpers of gpu.py. With no GPU memory the numpy code path
is the only one taken.

Task bodies receive one :class:`RegionView` per region argument: one
attribute per field the task holds a privilege on (read-only arrays for
``R``, so a write raises), plus ``rect`` (root coordinates) and ``region``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import FieldError
from ..geometry import Rect
from ..regions.coherence import Copy, FillAction, FoldAction
from .streams import BufferPool

__all__ = ["Instances", "RegionView", "identity", "FOLD"]

#: what a memory's bytes are made of (``Instances.kind_bytes``)
KINDS = ("instances", "reduction", "staging")

FOLD = {"+": np.add, "*": np.multiply, "max": np.maximum, "min": np.minimum}


_IDENTITY: dict[tuple[str, Any], Any] = {}


def identity(redop: str, dtype: np.dtype) -> Any:
    """Identity element of ``redop`` for ``dtype`` (what reduction buffers start as)."""
    key = (redop, dtype)
    got = _IDENTITY.get(key)
    if got is None:
        got = _IDENTITY[key] = _identity(redop, dtype)
    return got


def _identity(redop: str, dtype: Any) -> Any:
    dtype = np.dtype(dtype)
    if redop == "+":
        return 0
    if redop == "*":
        return 1
    big = np.inf if dtype.kind in "fc" else (True if dtype.kind == "b" else np.iinfo(dtype).max)
    small = -np.inf if dtype.kind in "fc" else (False if dtype.kind == "b" else
                                                np.iinfo(dtype).min)
    return small if redop == "max" else big


class RegionView:
    """Fields of one region argument as arrays of its rect, in one memory."""

    def __init__(self, region: Any, rect: Rect, arrays: dict[str, Any]) -> None:
        self.region = region
        self.rect = rect
        self.__dict__.update(arrays)
        self._fields = tuple(arrays)

    def __getitem__(self, field: str) -> Any:
        if field in self._fields:
            return self.__dict__[field]
        raise FieldError(f"this task has no privilege on field {field!r} of "
                         f"{self.region.name} (it holds {self._fields}); add it to privileges=")

    def __getattr__(self, name: str) -> Any:  # only called for missing attributes
        if name.startswith("_"):
            raise AttributeError(name)
        raise FieldError(f"this task has no privilege on field {name!r} of "
                         f"{self.region.name} (it holds {self._fields}); add it to privileges=")

    def __repr__(self) -> str:
        return f"RegionView({self.region.name}, {self.rect}, fields={self._fields})"


class Instances:
    """Arrays per (memory, root uid, field), reduction and staging buffers."""

    def __init__(self) -> None:
        self.arrays: dict[tuple[int, int, str], np.ndarray] = {}
        self.rects: dict[tuple[int, int, str], Rect] = {}  # each instance's extent
        self.redbufs: dict[Any, tuple[Any, Rect]] = {}  # key -> (array, its rect)
        self.redmem: dict[Any, int] = {}  # reduction buffer key -> its memory
        self.staging: dict[tuple[int, Rect], np.ndarray] = {}  # (copy id, rect)
        #: staging buffers per (memory, shape, dtype), taken by a reduction copy
        #: and given back after its fold: reused across steps (streams.py)
        self.staging_pool = BufferPool()
        self._lock = threading.Lock()
        self.gpu_of: dict[int, int] = {}
        #: bumped whenever an instance is re-made (grown): cached views are stale
        self.generation = 0
        self.nbytes: dict[int, int] = {}  # memory -> bytes of instances and buffers now
        self.peak: dict[int, int] = {}  # memory -> the most bytes it held at once
        #: memory -> {kind: bytes now} and the same at that memory's peak, kinds
        #: "instances", "reduction" (buffers) and "staging" (received buffers)
        self.kind_bytes: dict[int, dict[str, int]] = {}
        self.peak_kinds: dict[int, dict[str, int]] = {}
        self.reserved: dict[int, int] = {}  # memory -> bytes allocated (pool included)
        #: dead reduction buffers per (memory, shape, dtype), reused by the next
        #: buffer of that shape (the next step's): allocation-free steady state
        #: (on a GPU, stream-ordered: the next user waits for the last one)
        self.pool = BufferPool()
        #: reduction buffer lifetimes: planned consumers (copies, folds) not
        #: run yet; buffers no coherence piece refers to any more (dropped when
        #: their last consumer has run); buffers partly discarded by a write
        #: or fill (their reducers may still run: dropped at the next fence)
        self.pending: dict[Any, int] = {}
        self.dead: set = set()
        self.abandoned: set = set()
        self.read_events: dict[Any, list] = {}  # GPU buffers: events of earlier consumers
        #: GPU buffers grown by a later reducer (a pipeline's next micro-batch
        #: reducing beyond the buffer): the event after the grow kernels, which
        #: every reader of the buffer waits on (it may run on another stream)
        self.grow_events: dict[Any, Any] = {}
        #: while a trace records: ``({buffer: consumers planned}, {dead buffers})``
        self.log: tuple[dict, set] | None = None

    def _account(self, memory: int, delta: int, kind: str = "instances") -> None:
        with self._lock:
            b = self.nbytes[memory] = self.nbytes.get(memory, 0) + delta
            kb = self.kind_bytes.get(memory)
            if kb is None:
                kb = self.kind_bytes[memory] = dict.fromkeys(KINDS, 0)
            kb[kind] += delta
            if b > self.peak.get(memory, 0):
                self.peak[memory] = b
                self.peak_kinds[memory] = dict(kb)

    def _reserve_bytes(self, memory: int, nbytes: int) -> None:
        with self._lock:
            self.reserved[memory] = self.reserved.get(memory, 0) + nbytes

    def reset_peak(self) -> None:
        """Start measuring peaks again from the bytes held now."""
        with self._lock:
            self.peak = dict(self.nbytes)
            self.peak_kinds = {m: dict(k) for m, k in self.kind_bytes.items()}

    def zeros(self, memory: int, shape: tuple, dtype: Any, ipc: bool = False) -> Any:
        if memory in self.gpu_of:
            from . import gpu
            return gpu.zeros(self.gpu_of[memory], shape, dtype, ipc)
        return np.zeros(shape, dtype=dtype)

    def to_memory(self, arr: Any, memory: int) -> Any:
        """A copy of ``arr`` in ``memory``'s backend (numpy or CuPy on its GPU)."""
        if not self.gpu_of and type(arr) is np.ndarray:
            return np.array(arr, copy=True)
        from . import gpu
        return gpu.copy_to(arr, self.gpu_of.get(memory))

    def _make(self, key: tuple, memory: int, rect: Rect, dtype: Any) -> Any:
        arr = self.zeros(memory, rect.shape, dtype, ipc=True)
        self.arrays[key], self.rects[key] = arr, rect
        self._account(memory, rect.volume * np.dtype(dtype).itemsize)
        self._reserve_bytes(memory, rect.volume * np.dtype(dtype).itemsize)
        return arr

    def covers(self, memory: int, root: Any, field: str, rect: Rect) -> bool:
        """``memory`` has an instance of (root, field) and it covers ``rect``
        (or has none yet: :meth:`reserve` makes it without any wait)."""
        got = self.rects.get((memory, root.uid, field))
        return got is None or got.contains(rect)

    def reserve(self, memory: int, root: Any, field: str, rect: Rect) -> None:
        """An instance of (root, field) in ``memory`` covering ``rect``: made
        over ``rect``, or grown to the bounding box (contents kept; the caller
        waited for the in-flight ops first, see :meth:`covers`). Main thread."""
        key = (memory, root.uid, field)
        got = self.rects.get(key)
        if memory < 0:
            rect = root.rect  # host memory: whole roots
        if got is None:
            with self._lock:
                if key in self.arrays:
                    return
            self._make(key, memory, rect, root.fields[field])
            return
        if got.contains(rect):
            return
        old = self.arrays[key]
        bb = got.bounding(rect)
        new = self._make(key, memory, bb, root.fields[field])
        self._account(memory, -got.volume * old.dtype.itemsize)
        self._reserve_bytes(memory, -got.volume * old.dtype.itemsize)
        from . import gpu, streams
        if gpu.is_gpu(new):  # on its compute stream, the host waiting before and after
            with streams.device_work(memory, blocking=True), gpu.on_array(new):
                new[got.to_slices(bb.lo)] = old
        else:
            new[got.to_slices(bb.lo)] = old
        self.generation += 1

    def instance(self, memory: int, root: Any, field: str) -> np.ndarray:
        """The whole instance (see :meth:`origin`); made over the whole root
        when nothing reserved it."""
        key = (memory, root.uid, field)
        arr = self.arrays.get(key)
        if arr is None:
            with self._lock:
                arr = self.arrays.get(key)
            if arr is None:
                self.reserve(memory, root, field, root.rect)
                arr = self.arrays[key]
        return arr

    def origin(self, memory: int, root: Any, field: str) -> tuple:
        """Root coordinates of the instance's first element."""
        return self.rects[(memory, root.uid, field)].lo

    def part(self, memory: int, root: Any, field: str, rect: Rect) -> Any:
        """``rect`` (root coordinates) of the instance in ``memory``: a view."""
        arr = self.instance(memory, root, field)
        return arr[rect.to_slices(self.rects[(memory, root.uid, field)].lo)]

    def _new_buffer(self, rect: Rect, redop: str, dtype: np.dtype, memory: int) -> Any:
        """An identity-filled buffer over ``rect``: from the pool, or made."""
        dtype = np.dtype(dtype)

        def make() -> Any:
            self._reserve_bytes(memory, rect.volume * dtype.itemsize)
            return self.zeros(memory, rect.shape, dtype)

        buf = self.pool.take(memory, rect.shape, dtype, make)
        if type(buf) is np.ndarray:
            buf.fill(identity(redop, dtype))
        else:
            from . import gpu
            with gpu.on_array(buf):
                buf[...] = identity(redop, dtype)
        return buf

    def reduction_view(self, key: Any, rect: Rect, redop: str, dtype: np.dtype,
                       memory: int = -1) -> Any:
        """The part ``rect`` of reduction buffer ``key`` in ``memory``: made
        (identity) on first use, grown to the bounding box when ``rect``
        reaches beyond it (contents kept). Run by the reducing task's worker."""
        got = self.redbufs.get(key)
        if got is None:
            buf, brect = self._new_buffer(rect, redop, dtype, memory), rect
            self.redbufs[key] = (buf, brect)
            self.redmem[key] = memory
            self._account(memory, buf.nbytes, "reduction")
        else:
            buf, brect = got
            if not brect.contains(rect):
                bb = brect.bounding(rect)
                grown = self._new_buffer(bb, redop, dtype, memory)
                if memory in self.gpu_of:
                    from . import gpu
                    with gpu.on_array(grown):
                        grown[brect.to_slices(bb.lo)] = buf
                        ev = gpu.backend().Event()
                        ev.record(gpu.backend().current_stream())
                    self.grow_events[key] = ev
                else:
                    grown[brect.to_slices(bb.lo)] = buf
                self._account(memory, grown.nbytes - buf.nbytes, "reduction")
                self._reserve_bytes(memory, -buf.nbytes)
                buf, brect = grown, bb
                self.redbufs[key] = (buf, brect)
        if brect == rect:
            return buf
        return buf[rect.to_slices(brect.lo)]

    def new_reduction(self, key: Any, rect: Rect, redop: str, dtype: np.dtype,
                      memory: int = -1) -> Any:
        """A fresh buffer ``key`` over ``rect`` (replacing any old one)."""
        self._drop_buffer(key)
        return self.reduction_view(key, rect, redop, dtype, memory)

    def reset_buffer(self, key: Any, redop: str) -> None:
        """Buffer ``key`` (if any) back to the identity of ``redop``, in place,
        under its own device (a trace replay's begin marker runs it)."""
        got = self.redbufs.get(key)
        if got is None:
            return
        buf = got[0]
        if type(buf) is np.ndarray:
            buf[...] = identity(redop, buf.dtype)
            return
        from . import gpu, streams
        with self._lock:  # the last replay's readers of a kept buffer (consumed())
            evs = self.read_events.pop(key, ())
        with streams.device_work(self.redmem.get(key, -1)), gpu.on_array(buf):
            s = gpu.backend().current_stream()
            for e in evs:  # its last readers' streams before it is overwritten
                gpu.stream_wait(s, e)
            buf[...] = identity(redop, buf.dtype)  # on its device's compute stream

    def reduction_part(self, key: Any, rect: Rect) -> Any:
        """``rect`` (root coordinates) of the reduction buffer ``key``."""
        buf, brect = self.buffer(key)
        return buf[rect.to_slices(brect.lo)]

    def buffer(self, key: Any) -> tuple[Any, Rect]:
        """``(array, rect)`` of reduction buffer ``key`` for a reader (a copy
        or fold, on its worker): on a GPU, its stream first waits on the
        kernels that grew the buffer, when a later reducer did (the reader's
        dependences order it after its own reducers only)."""
        got = self.redbufs[key]
        ev = self.grow_events.get(key)
        if ev is not None:
            from . import gpu
            gpu.stream_wait(gpu.backend().current_stream(), ev)
        return got

    def _drop_buffer(self, key: Any) -> None:
        """Buffer ``key`` is dead: its array goes to the pool of its memory
        (in use -> reserved), where a later buffer of that shape takes it."""
        got = self.redbufs.pop(key, None)
        self.grow_events.pop(key, None)
        if got is not None:
            mem = self.redmem.pop(key, -1)
            buf = got[0]
            self._account(mem, -buf.nbytes, "reduction")
            self.pool.give(mem, buf)  # on a GPU: after the stream that used it last

    # -- reduction buffer lifetimes (main thread plans, workers consume) ----------------
    def will_consume(self, key: Any) -> None:
        """One more copy or fold will read buffer ``key`` (launch-time analysis)."""
        with self._lock:
            self.pending[key] = self.pending.get(key, 0) + 1
        if self.log is not None:
            self.log[0][key] = self.log[0].get(key, 0) + 1

    def mark_dead(self, key: Any) -> None:
        """No coherence piece refers to buffer ``key`` any more: it goes back
        to the pool when the consumers planned so far have run (the caller
        has just planned one)."""
        if self.log is not None:
            self.log[1].add(key)
        with self._lock:  # a consumer was just planned: the last one drops it
            if key not in self.abandoned:
                self.dead.add(key)

    def abandon(self, keys: Any) -> None:
        """A write or fill discarded part of these buffers without reading
        them: their reducers may still be running, so they live to the fence."""
        with self._lock:
            self.abandoned.update(keys)
            self.dead.difference_update(keys)

    def consumed(self, key: Any) -> None:
        """A copy or fold has read buffer ``key`` (run by that op's worker, on
        its stream). On a GPU the consumers' reads may still be in flight on
        several streams: each records an event, and the last one's stream
        waits on the others' before the buffer goes back to the pool (whose
        next user waits on that stream)."""
        ev = None
        if self.redmem.get(key, -1) in self.gpu_of:
            from . import gpu
            b = gpu.backend()
            ev = b.Event()
            ev.record(b.current_stream())
        with self._lock:
            n = self.pending.get(key, 0) - 1
            if n > 0 or key not in self.dead:
                self.pending[key] = max(n, 0)
                if ev is not None:
                    self.read_events.setdefault(key, []).append(ev)
                return
            del self.pending[key]
            self.dead.discard(key)
            evs = self.read_events.pop(key, ())
        if evs:
            from . import gpu
            s = gpu.backend().current_stream()
            for e in evs:
                gpu.stream_wait(s, e)
        self._drop_buffer(key)

    def expect(self, consumers: dict, dying: set) -> None:
        """A trace replay is about to run: the consumers and deaths its
        recording planned (the begin marker, after every earlier op ran)."""
        with self._lock:
            for key, n in consumers.items():
                self.pending[key] = self.pending.get(key, 0) + n
            self.dead.update(k for k in dying if k not in self.abandoned)

    def drop_root(self, uid: int) -> None:
        # a snapshot of the keys (list(dict) runs without a thread switch):
        # workers add instances while a dropped root's are collected here
        for k in [k for k in list(self.arrays) if k[1] == uid]:
            arr = self.arrays.pop(k, None)
            if arr is None:
                continue
            self.rects.pop(k, None)
            self._account(k[0], -arr.nbytes)
            self._reserve_bytes(k[0], -arr.nbytes)

    # -- actions (run on workers) -------------------------------------------------
    def run_copy(self, c: Copy, root: Any, field: str) -> None:
        if c.buffer is None:
            part = self.part
            for r in c.rects:
                dst, src = part(c.dst, root, field, r), part(c.src, root, field, r)
                if self.gpu_of:
                    from . import gpu
                    gpu.copy_into(dst, src)
                else:
                    dst[...] = src
        else:
            buf, brect = self.buffer(c.buffer)
            for r in c.rects:
                self.stage((c.id, r), buf[r.to_slices(brect.lo)], c.dst)
            self.consumed(c.buffer)

    def stage(self, key: tuple, src: Any, memory: int) -> None:
        """A copy of ``src`` in ``memory``'s staging buffer ``key`` (copy id,
        rect), from the staging pool; the fold gives it back (counted as
        "staging" bytes in between)."""
        dst = self.staging_pool.take(memory, src.shape, src.dtype,
                                     lambda: self.zeros(memory, src.shape, src.dtype))
        if type(dst) is np.ndarray and type(src) is np.ndarray:
            dst[...] = src
        else:
            from . import gpu
            gpu.copy_into(dst, src)
        self.staging[key] = dst
        self._account(memory, dst.nbytes, "staging")

    def run_prologue(self, actions: list, root: Any, field: str) -> None:
        for a in actions:
            dst = self.part(a.memory, root, field, a.rect)
            if isinstance(a, FillAction):
                dst[...] = a.value
            elif isinstance(a, FoldAction):
                if a.staged is not None:
                    src = self.staging.pop((a.staged, a.rect))
                    FOLD[a.redop](dst, src, out=dst)
                    self._account(a.memory, -src.nbytes, "staging")
                    self.staging_pool.give(a.memory, src)
                else:
                    FOLD[a.redop](dst, self.reduction_part(a.buffer, a.rect), out=dst)
                    self.consumed(a.buffer)

    def keep_only(self, live: set) -> None:
        """Drop reduction buffers no coherence piece refers to (a fence: every
        op has run, so no consumer is pending)."""
        for k in [k for k in self.redbufs if k not in live]:
            self._drop_buffer(k)
        with self._lock:
            self.pending.clear()
            self.dead.clear()
            self.read_events.clear()
            self.abandoned &= live
