"""GPU devices through CuPy: allocation, task context, copies, CUDA IPC.

Imported only when a GPU device exists or is probed (``gpus_per_rank``);
``cupy`` is imported lazily, so a CPU-only install never needs it.

Devices: with CuPy importable and ``cupy.cuda.runtime.getDeviceCount() > 0``
a rank's devices are GPUs: ``LEGIONPY_GPUS=n`` per rank (0 disables), by
default every visible GPU in one process and one per rank under MPI. The
CUDA ordinal of a device is ``(local_rank * n + local_index) % visible``,
so the ranks of a node share its GPUs round robin (two ranks on one GPU
work: that is how the CUDA IPC path is tested on a one-GPU machine).

Memory: instances are allocated with ``cupy.cuda.Memory`` (cudaMalloc, not
the pool), so an IPC handle of the instance points at its first byte.
Point bodies (prologue, views, task; runtime/body.py) run under
``cupy.cuda.Device(ordinal)`` and tasks get CuPy arrays
(the ``xp`` of array code is ``cupy.get_array_module(x)``).

Streams (runtime/streams.py): never the legacy default stream. Each GPU
device runs its kernels on a non-blocking compute stream of its own and
each directed link with a GPU end its copies on another; an op's stream
waits on the CUDA events of its dependences on other streams, the op
records an event when its kernels are enqueued, and host consumers
(``Region.read``, ``Future.get``, fences, MPI sends) synchronise the events
they need, never a whole device.

Copies:
- one process, two GPUs: ``ndarray.copy()`` under the destination device,
  on the link's stream (CuPy copies between devices with cudaMemcpyPeer);
- two processes on one node (same host name): CUDA IPC. The sender
  synchronises its link stream (which waited on the source's events), then
  sends (over MPI, tag of the copy) the
  instance's handle (``cupy.cuda.runtime.ipcGetMemHandle``) the first time
  this instance goes to that rank, else None; the receiver opens it once
  (``ipcOpenMemHandle``, cached per (memory, region, field)), copies the
  rect device-to-device, synchronises and sends an acknowledgement, after
  which the sender's copy op completes (the source may be overwritten);
- across nodes: MPI through host buffers (``cupy.asnumpy`` / ``.set``);
  ``LEGIONPY_CUDA_AWARE=1`` is reserved for CUDA-aware MPI builds.
``LEGIONPY_CUDA_IPC=0`` turns IPC off (host staging instead). A handle goes
with the instance's origin and shape (instances cover their tiles, not the
root); it is opened once per peer instance (again only when that instance
was grown, closing the old mapping) and closed at shutdown
(:func:`close_all`, called by ``Runtime.shutdown``).

Backends: every CuPy call goes through :func:`backend`, a small interface
(``Device``, ``alloc``, ``asnumpy``, ``asarray``, ``ipc_handle``,
``ipc_open``, ``ipc_close``; ``Stream(k, name)``: a non-blocking stream on
device ``k``, ``with stream:`` makes it the thread's current one;
``Event()`` with ``record(stream)``, ``synchronize()``, ``done``;
``stream.wait_event(ev)``, ``stream.synchronize()``; ``current_stream()``)
served by CuPy (``cupy.cuda.Stream(non_blocking=True)``,
``cupy.cuda.Event(disable_timing=True)``) or, with
``LEGIONPY_GPU_BACKEND=emulated``, by runtime/emugpu.py (numpy arrays tagged
with their device, raising on wrong-device use, and a race detector over
streams and events, runtime/emurace.py), so CI runs this whole path on 2-4
emulated GPUs (``LEGIONPY_GPUS=n``, default 2 there).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import MachineError

__all__ = ["gpus_per_rank", "ordinal", "zeros", "copy_to", "copy_into",
           "to_host", "from_host", "ipc_possible", "ipc_send", "ipc_recv", "visible_gpus",
           "backend", "on_array", "close_all", "is_gpu", "label", "stream_wait",
           "deferring_waits"]

_base = 0  # local_rank * gpus per rank, set by gpus_per_rank
_visible: int | None = None
_handles_sent: set = set()
_handles_open: dict = {}
_backend: Any = None
#: IPC handles this process exported, opened and closed (either backend)
ipc_counts = {"exported": 0, "opened": 0, "closed": 0}


def backend_name() -> str:
    """``emulated`` or ``cupy`` (``LEGIONPY_GPU_BACKEND``, default cupy)."""
    name = os.environ.get("LEGIONPY_GPU_BACKEND", "cupy").strip().lower() or "cupy"
    if name not in ("cupy", "emulated"):
        raise MachineError(f"LEGIONPY_GPU_BACKEND must be 'cupy' or 'emulated', got {name!r}")
    return name


class _Cupy:
    """The backend interface served by CuPy."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        self.Device = cupy.cuda.Device
        self.asnumpy = cupy.asnumpy
        self.asarray = cupy.asarray
        self.array_type = cupy.ndarray
        self._ptrs: dict[int, int] = {}
        self._zeroing: dict[int, Any] = {}  # per device: the stream that zeroes allocations
        self._nccl: Any = False

    @property
    def nccl(self) -> Any:
        """``cupy.cuda.nccl`` behind runtime/nccl.py's interface, or None."""
        if self._nccl is False:
            from .nccl import cupy_nccl

            self._nccl = cupy_nccl(self.cp)
        return self._nccl

    def Stream(self, k: int, name: str = "") -> Any:  # noqa: N802 - CuPy's name
        """A non-blocking stream on device ``k`` (never the legacy one)."""
        with self.cp.cuda.Device(k):
            return self.cp.cuda.Stream(non_blocking=True)

    def Event(self) -> Any:  # noqa: N802 - CuPy's name
        return self.cp.cuda.Event(disable_timing=True)

    def current_stream(self) -> Any:
        return self.cp.cuda.get_current_stream()

    def alloc(self, k: int, shape: tuple, dtype: Any, ipc: bool = False) -> Any:
        cp = self.cp
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
        with cp.cuda.Device(k):
            mem = cp.cuda.Memory(nbytes)  # not the pool: an IPC handle points at the array
            ptr = cp.cuda.MemoryPointer(mem, 0)
            s = self._zeroing.get(k)
            if s is None:
                s = self._zeroing[k] = cp.cuda.Stream(non_blocking=True)
            ptr.memset_async(0, nbytes, s)
            s.synchronize()  # zeroed before any stream uses it
            arr = cp.ndarray(shape, dtype, ptr)
        return arr

    def ipc_handle(self, a: Any) -> Any:
        return self.cp.cuda.runtime.ipcGetMemHandle(a.data.ptr)

    def ipc_open(self, handle: Any, k: int, nbytes: int) -> Any:
        cp = self.cp
        with cp.cuda.Device(k):
            ptr = cp.cuda.runtime.ipcOpenMemHandle(handle)
            mem = cp.cuda.UnownedMemory(ptr, nbytes, None, k)
            raw = cp.ndarray((nbytes,), np.uint8, cp.cuda.MemoryPointer(mem, 0))
        self._ptrs[id(raw)] = ptr
        return raw

    def ipc_close(self, raw: Any) -> None:
        ptr = self._ptrs.pop(id(raw), None)
        if ptr is not None:
            with self.cp.cuda.Device(raw.device.id):
                self.cp.cuda.runtime.ipcCloseMemHandle(ptr)


class _Emulated:
    """The backend interface served by runtime/emugpu.py."""

    name = "emulated"

    def __init__(self) -> None:
        from . import emugpu

        self.emu = emugpu
        self.Device = emugpu.Device
        self.asnumpy = emugpu.xp.asnumpy
        self.asarray = emugpu.xp.asarray
        self.array_type = emugpu.EmuArray
        self.alloc = emugpu.alloc
        self.Stream = emugpu.Stream
        self.Event = emugpu.Event
        self.current_stream = emugpu.current_stream
        self.ipc_handle = emugpu.ipc_handle
        self.ipc_open = emugpu.ipc_open
        self.ipc_close = emugpu.ipc_close
        from .emunccl import EmuNccl

        self.nccl = EmuNccl()


def backend() -> Any:
    """The GPU array backend (CuPy, or the emulated one)."""
    global _backend
    if _backend is None or _backend.name != backend_name():
        _backend = _Emulated() if backend_name() == "emulated" else _Cupy()
    return _backend


_waits = threading.local()  # .deferred: the waits of the capture this thread runs


@contextlib.contextmanager
def deferring_waits() -> Iterator[list]:
    """While a CUDA graph is captured in this thread (runtime/graphs.py):
    :func:`stream_wait` collects its events into the list yielded instead
    of enqueuing the waits. A capturing stream may not wait on an event
    recorded outside the capture: CUDA refuses it
    (``cudaErrorStreamCaptureIsolation``, found on an H100; the emulated
    GPUs refuse it too). The capture's launch waits on them instead."""
    prev = getattr(_waits, "deferred", None)
    _waits.deferred = got = []
    try:
        yield got
    finally:
        _waits.deferred = prev


def stream_wait(stream: Any, ev: Any) -> None:
    """``stream.wait_event(ev)``, or, while this thread captures a graph,
    note ``ev`` for the graph's launch (:func:`deferring_waits`)."""
    deferred = getattr(_waits, "deferred", None)
    if deferred is None:
        stream.wait_event(ev)
    else:
        deferred.append(ev)


def visible_gpus() -> int:
    """Number of CUDA devices CuPy sees (0 without CuPy or a driver); with the
    emulated backend, ``LEGIONPY_EMU_VISIBLE`` (the GPUs of an emulated node,
    shared round robin by its ranks), else ``LEGIONPY_GPUS`` (default 2)."""
    global _visible
    if backend_name() == "emulated":
        env = os.environ.get("LEGIONPY_EMU_VISIBLE", "").strip() or \
            os.environ.get("LEGIONPY_GPUS", "").strip()
        return int(env) if env.isdigit() else 2
    if _visible is None:
        _visible = 0
        if importlib.util.find_spec("cupy") is not None:
            try:
                import cupy

                _visible = int(cupy.cuda.runtime.getDeviceCount())
            except Exception:  # noqa: BLE001 - no driver, no device: CPU only
                _visible = 0
    return _visible


def gpus_per_rank(cl: Any = None) -> int:
    """GPU devices this rank contributes (0: use CPU devices)."""
    global _base
    env = os.environ.get("LEGIONPY_GPUS", "").strip()
    emulated = backend_name() == "emulated"
    if env == "0" or (not env and not emulated and importlib.util.find_spec("cupy") is None):
        return 0
    if env and not env.isdigit():
        raise MachineError(f"LEGIONPY_GPUS must be a non-negative integer, got {env!r}")
    vis = visible_gpus()
    if vis == 0:
        return 0
    multi = cl is not None and cl.size > 1
    n = int(env) if env else (1 if multi and not emulated else vis)
    _base = (cl.local_rank * n) if multi else 0
    if emulated:
        backend().emu.shared = multi
    return n


def ordinal(dev: Any) -> int:
    """CUDA device ordinal of a local GPU Device."""
    return (_base + dev.local_index) % max(visible_gpus(), 1)


def zeros(k: int, shape: tuple, dtype: Any, ipc: bool = False) -> Any:
    """A zeroed array on GPU ``k`` with its own allocation (not the pool)."""
    return backend().alloc(k, shape, dtype, ipc)


def label(a: Any, text: str) -> None:
    """Name ``a``'s allocation in the emulated race detector's messages."""
    b = backend()
    if b.name == "emulated":
        b.emu.label(a, text)


def is_gpu(a: Any) -> bool:
    return type(a) is not np.ndarray and not isinstance(a, np.generic)


_is_gpu = is_gpu


def on_array(a: Any) -> Any:
    """A context making ``a``'s device current (nothing for a numpy array)."""
    if not is_gpu(a):
        return contextlib.nullcontext()
    return backend().Device(a.device.id)


def to_host(a: Any) -> np.ndarray:
    if not _is_gpu(a):
        return a
    b = backend()
    with b.Device(a.device.id):
        return b.asnumpy(a)


def from_host(dst: Any, host: np.ndarray) -> None:
    b = backend()
    with b.Device(dst.device.id):
        dst[...] = b.asarray(host)


def copy_to(a: Any, k: int | None) -> Any:
    """A copy of ``a`` on GPU ``k`` (None: a numpy copy), on ``k``'s current
    stream (another GPU's array: a peer copy, as ``cupy.ndarray.copy``)."""
    if k is None:
        return np.array(to_host(a), copy=True)
    b = backend()
    with b.Device(k):
        return a.copy() if _is_gpu(a) else b.asarray(a)


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` across numpy and GPU arrays on any devices."""
    if not _is_gpu(dst) and not _is_gpu(src):
        dst[...] = src
    elif not _is_gpu(dst):
        dst[...] = to_host(src)
    elif not _is_gpu(src):
        from_host(dst, src)
    else:
        b = backend()
        with b.Device(dst.device.id):
            if src.device.id != dst.device.id:
                src = src.copy()  # a peer copy on the current stream (the link's)
            dst[...] = src


def close_all() -> None:
    """Close every IPC handle this process opened (at shutdown)."""
    if _handles_open:
        b = backend()
        for raw, _, _ in _handles_open.values():
            b.ipc_close(raw)
            ipc_counts["closed"] += 1
    _handles_open.clear()
    _handles_sent.clear()


# -- CUDA IPC between the processes of one node -----------------------------------------
def ipc_possible(repl: Any, c: Any) -> bool:
    """Both memories are GPUs of ranks on the same host (same answer on both)."""
    if c.buffer is not None or os.environ.get("LEGIONPY_CUDA_IPC", "1") == "0":
        return False
    devs, hosts = repl.rt.devices, repl.cl.hosts
    if c.src < 0 or c.dst < 0:
        return False
    a, b = devs[c.src], devs[c.dst]
    return a.kind == b.kind == "gpu" and hosts[a.rank] == hosts[b.rank]


def ipc_send(repl: Any, c: Any, root: Any, field: str, peer: int) -> None:
    b = backend()
    cl = repl.cl
    inst = repl.rt.instances.instance(c.src, root, field)
    with b.Device(inst.device.id):  # the link's stream waited for the source's events
        b.current_stream().synchronize()
    key = (c.src, root.uid, field, peer, id(inst))  # a grown instance is a new allocation
    handle = None
    if key not in _handles_sent:
        rect = repl.rt.instances.rects[(c.src, root.uid, field)]
        handle = (b.ipc_handle(inst), rect.lo, rect.shape)
        _handles_sent.add(key)
        ipc_counts["exported"] += 1
    tag = cl.tag(c.id)
    req = cl.data.isend(handle, dest=peer, tag=tag)
    cl.wait([req], lambda: f"rank {peer} to take the IPC handle of copy {c.id}")
    cl.recv_obj(cl.data, peer, tag, lambda: f"rank {peer} to finish IPC copy {c.id}")


def ipc_recv(repl: Any, c: Any, root: Any, field: str, dst: Any, peer: int) -> None:
    b = backend()
    cl = repl.cl
    tag = cl.tag(c.id)
    handle = cl.recv_obj(cl.data, peer, tag, lambda: f"the IPC handle of copy {c.id}")
    key = (c.src, root.uid, field)
    k = dst.device.id
    dtype = np.dtype(root.fields[field])
    with b.Device(k):
        if handle is not None:  # (handle, origin, shape) of the peer's instance
            old = _handles_open.pop(key, None)
            if old is not None:
                b.ipc_close(old[0])
                ipc_counts["closed"] += 1
            h, lo, shape = handle
            nbytes = int(np.prod(shape)) * dtype.itemsize
            _handles_open[key] = (b.ipc_open(h, k, nbytes), lo, shape)
            ipc_counts["opened"] += 1
        raw, lo, shape = _handles_open[key]
        remote = raw.view(dtype).reshape(shape)
        dst[...] = remote[c.rect.to_slices(lo)]
        b.current_stream().synchronize()  # the copy is done before the peer may overwrite
    req = cl.data.isend(True, dest=peer, tag=tag)
    cl.wait([req], lambda: f"rank {peer} to take the IPC acknowledgement of copy {c.id}")
