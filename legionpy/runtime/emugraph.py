"""Emulated CUDA stream capture and graph launch for runtime/emugpu.py.

CUDA (``cudaStreamBeginCapture`` / ``cudaStreamEndCapture`` /
``cudaGraphLaunch``; CuPy's ``Stream.begin_capture``, ``Stream.end_capture``
and ``cupy.cuda.Graph.launch``): while a stream captures, the work pushed to
it is *recorded, not executed*; the graph that ``end_capture`` returns
re-runs the recorded kernels on the same device addresses every time it is
launched. Synchronous host work during capture (a device-to-host copy, a
host-to-device copy from pageable memory, ``synchronize``) is illegal: it
fails with ``cudaErrorStreamCaptureUnsupported`` and invalidates the
capture, whose ``end_capture`` then fails too
(``cudaErrorStreamCaptureInvalidated``).

The emulation keeps those semantics on numpy arrays:

- :func:`begin_capture` starts a capture in the calling thread (CuPy
  captures the thread's current stream; the emulation binds the capture to
  the thread that began it, which is the device worker that runs the
  captured tasks);
- every emulated kernel the thread runs meanwhile (a numpy function, ufunc,
  method, arithmetic operator, advanced indexing, assignment: emugpu.py's
  one kernel choke point calls the capture hook) runs at once, so the Python code
  around it sees results with the right shapes, and is recorded as a
  replayable step over the *same* arrays: its inputs are read when the
  graph is launched, and its result is written in place into the buffer the
  capture produced (views of fixed buffers need no step: they stay valid);
- the arrays that existed before the capture are snapshotted on first use
  (the part a kernel uses, not the whole buffer: copies on other threads may
  write the rest meanwhile) and restored, in reverse order, by
  :func:`end_capture` (and :func:`abort`), so, as on a GPU, a capture has no
  effect on memory until the graph is launched;
- buffers allocated during the capture (temporaries, results) are held by
  the graph for its whole life: a launch writes the addresses it captured,
  exactly as a CUDA graph does (with CuPy the runtime keeps them alive with
  a capture-time allocator, runtime/graphs.py);
- a host transfer or synchronisation while capturing raises
  :class:`~legionpy.errors.GraphCaptureError` (unsupported) and marks the
  capture invalid; :func:`end_capture` of an invalid capture raises
  ``GraphCaptureError`` (invalidated), as CUDA does.

Then a captured-and-launched sequence computes exactly what the same
sequence computes when it runs live, which tests/runtime/test_gpu_graphs.py
checks on whole training runs.

Counters (:func:`stats`): captures begun, ended, invalidated; graph launches
and the recorded steps they ran. The race detector (runtime/emurace.py)
counts a launch as one kernel on its stream (``stream_kernels`` of
``emugpu.stats()``), so the kernels the host issues per step are comparable
with and without graphs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import GraphCaptureError

__all__ = ["begin_capture", "end_capture", "abort", "capturing", "host_sync", "probe",
           "Graph", "stats", "reset_stats"]

_tls = threading.local()
_lock = threading.Lock()
_active = 0  # captures open in any thread: emugpu's fast path checks it
_stats = {"captures": 0, "ended": 0, "invalidated": 0, "launches": 0, "steps": 0}


def stats() -> dict:
    with _lock:
        return dict(_stats)


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = 0


def _bump(key: str, n: int = 1) -> None:
    with _lock:
        _stats[key] += n


class _Capture:
    __slots__ = ("stream", "device", "steps", "snaps", "fresh", "keep", "invalid", "access")

    def __init__(self, stream: Any, device: int) -> None:
        self.stream, self.device = stream, device
        self.steps: list[tuple] = []  # (kernel closure, result buffer or None)
        self.access: list[tuple] = []  # (part, emurace.Buf, write?, what): for launches
        #: (id of its buffer, address, shape, strides) -> (array, its contents)
        self.snaps: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.fresh: set[int] = set()  # ids of buffers made during the capture
        self.keep: list[Any] = []  # what the graph holds alive
        self.invalid: str | None = None


def capturing() -> _Capture | None:
    """The capture open in this thread, if any."""
    return getattr(_tls, "cap", None) if _active else None


def begin_capture(stream: Any, device: int) -> None:
    """Start capturing ``stream`` (of emulated GPU ``device``) in this thread."""
    global _active
    if getattr(_tls, "cap", None) is not None:
        raise GraphCaptureError(f"begin_capture on {_name(stream)}: this thread already "
                                "captures; end_capture first (captures do not nest)")
    from . import emugpu

    emugpu.hook = _hook
    _tls.cap = _Capture(stream, device)
    with _lock:
        _active += 1
        _stats["captures"] += 1


def _close() -> _Capture:
    global _active
    cap = getattr(_tls, "cap", None)
    if cap is None:
        raise GraphCaptureError("end_capture without begin_capture in this thread")
    _tls.cap = None
    with _lock:
        _active -= 1
    for a, saved in reversed(cap.snaps.values()):  # a capture changes no memory
        a[...] = saved
    cap.snaps.clear()
    return cap


def end_capture(stream: Any) -> Graph:
    """End the capture of ``stream``: the :class:`Graph` of what it recorded.
    Raises GraphCaptureError when the capture was invalidated."""
    cap = _close()
    if cap.stream is not stream:
        raise GraphCaptureError(f"end_capture on {_name(stream)}, but the capture began on "
                                f"{_name(cap.stream)}")
    if cap.invalid is not None:
        _bump("invalidated")
        raise GraphCaptureError(f"the capture on {_name(stream)} was invalidated by "
                                f"{cap.invalid} (cudaErrorStreamCaptureInvalidated)")
    _bump("ended")
    return Graph(cap.steps, cap.keep, cap.device, cap.access)


def abort() -> None:
    """Drop this thread's capture (if any), restoring the memory it used."""
    if getattr(_tls, "cap", None) is not None:
        _close()
        _bump("invalidated")


def probe(run: Callable[[], Any]) -> str | None:
    """Run ``run()`` normally (nothing is captured) and return the first host
    synchronisation it made that a capture would refuse, or None: what the
    runtime asks before capturing a body for the first time."""
    prev = getattr(_tls, "probe", None)
    _tls.probe = []
    try:
        run()
        return _tls.probe[0] if _tls.probe else None
    finally:
        _tls.probe = prev


def host_sync(what: str) -> None:
    """Called by emugpu before a host transfer or synchronisation: illegal
    while this thread captures (noted while it probes)."""
    seen = getattr(_tls, "probe", None)
    if seen is not None:
        seen.append(what)
    cap = capturing()
    if cap is not None:
        if cap.invalid is None:
            cap.invalid = what
        raise GraphCaptureError(f"{what} during stream capture on {_name(cap.stream)}: "
                                "host synchronisation cannot be captured "
                                "(cudaErrorStreamCaptureUnsupported); run the task live")


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _touch(cap: _Capture, x: Any, roots: set[int]) -> None:
    """Snapshot the array ``x`` (and arrays inside lists) on first use."""
    if isinstance(x, np.ndarray):
        r = _root(x)
        roots.add(id(r))
        if id(r) in cap.fresh:
            return
        key = (id(r), x.__array_interface__["data"][0], x.shape, x.strides)
        if key not in cap.snaps:
            cap.snaps[key] = (x, x.copy())
    elif type(x) in (list, tuple):
        for v in x:
            _touch(cap, v, roots)


def _hook(stream: Any, what: str, fn: Callable[[], Any], reads: list, writes: list) -> Any:
    """emugpu's capture hook: None (run ``fn`` as is) unless this thread
    captures; then the wrapper that runs ``fn`` and records it."""
    cap = capturing()
    if cap is None:
        return None
    if cap.invalid is not None:
        raise GraphCaptureError(f"{what} on {_name(stream)} after the capture was "
                                f"invalidated by {cap.invalid}")
    roots: set[int] = set()
    for a in reads:
        _touch(cap, a._a, roots)
    for a in writes:
        _touch(cap, a._a, roots)
    cap.access.extend((a.part(), a.buf(), False, what) for a in reads)
    cap.access.extend((a.part(), a.buf(), True, what) for a in writes)

    def run() -> Any:
        r = _arrays(fn())
        _fresh(cap, r, roots)
        cap.steps.append((fn, r))
        return r
    return run


def _arrays(r: Any) -> Any:
    """Scalar results become 0-d arrays: the buffer a launch writes them to."""
    if isinstance(r, np.generic):
        return np.asarray(r)
    if type(r) in (list, tuple):
        return type(r)(_arrays(v) for v in r)
    return r


def _fresh(cap: _Capture, r: Any, roots: set[int]) -> None:
    """Note the buffers a kernel made (not views of its operands)."""
    if isinstance(r, np.ndarray):
        i = id(_root(r))
        if i not in roots:
            cap.fresh.add(i)
            cap.keep.append(r)
    elif type(r) in (list, tuple):
        for v in r:
            _fresh(cap, v, roots)


def _store(buf: Any, new: Any) -> None:
    """Write a launch's result ``new`` into the captured result ``buf``."""
    if isinstance(buf, np.ndarray):
        if new is buf or not isinstance(new, np.ndarray) and buf.ndim:
            return
        if isinstance(new, np.ndarray) and np.may_share_memory(new, buf):
            return  # a view of the same (fixed) memory: already up to date
        if isinstance(new, np.ndarray) and new.shape != buf.shape:
            # a GPU graph writes the size it captured: a kernel whose result
            # size depends on the data must be refused at capture (host_sync)
            raise GraphCaptureError(
                f"a captured kernel produced shape {new.shape} at launch but {buf.shape} when "
                "it was captured: its result size depends on the data, which a CUDA graph "
                "cannot replay (emugpu must treat it as a host synchronisation)")
        buf[...] = new
    elif type(buf) in (list, tuple) and type(new) in (list, tuple):
        for b, n in zip(buf, new):
            _store(b, n)


class Graph:
    """A captured sequence of emulated kernels (``cupy.cuda.Graph``)."""

    def __init__(self, steps: list[tuple], keep: list, device: int, access: list) -> None:
        self.steps, self.keep, self.device = steps, keep, device
        self.access = access
        self.launches = 0

    def __len__(self) -> int:
        return len(self.steps)

    def launch(self, stream: Any = None) -> None:
        """Run every recorded kernel in capture order, on the same buffers:
        one unit of work on ``stream`` (the current one by default) for the
        race detector, which checks the graph's reads and writes there."""
        from . import emurace

        if capturing() is not None:
            host_sync("Graph.launch inside a capture")
        s = stream if stream is not None else emurace.current_stream()
        with emurace._lock:
            seq = s.enqueue()
            for a, b, write, what in self.access:
                emurace.access(s, seq, a, b, write, f"{what} (in a graph)")
        for fn, buf in self.steps:
            _store(buf, fn())
        self.launches += 1
        with _lock:
            _stats["launches"] += 1
            _stats["steps"] += len(self.steps)

    def __repr__(self) -> str:
        return f"<emulated CUDA graph on GPU {self.device}: {len(self.steps)} kernels>"


def _name(stream: Any) -> str:
    return getattr(stream, "name", None) or repr(stream)
