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
Task bodies run under ``cupy.cuda.Device(ordinal)`` and get CuPy arrays
(the ``xp`` of array code is ``cupy.get_array_module(x)``); kernels go to
the legacy default stream, so work on one device is ordered, and the
runtime synchronises a device before its data leaves it.

Copies:
- one process, two GPUs: ``ndarray.copy()`` under the destination device
  (CuPy copies between devices with cudaMemcpyPeer);
- two processes on one node (same host name): CUDA IPC. The sender
  synchronises its device, then sends (over MPI, tag of the copy) the
  instance's handle (``cupy.cuda.runtime.ipcGetMemHandle``) the first time
  this instance goes to that rank, else None; the receiver opens it once
  (``ipcOpenMemHandle``, cached per (memory, region, field)), copies the
  rect device-to-device, synchronises and sends an acknowledgement, after
  which the sender's copy op completes (the source may be overwritten);
- across nodes: MPI through host buffers (``cupy.asnumpy`` / ``.set``);
  ``LEGIONPY_CUDA_AWARE=1`` is reserved for CUDA-aware MPI builds.
``LEGIONPY_CUDA_IPC=0`` turns IPC off (host staging instead).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["gpus_per_rank", "ordinal", "on_device", "zeros", "copy_to", "copy_into",
           "to_host", "from_host", "ipc_possible", "ipc_send", "ipc_recv", "visible_gpus"]

_base = 0  # local_rank * gpus per rank, set by gpus_per_rank
_visible: int | None = None
_handles_sent: set = set()
_handles_open: dict = {}


def visible_gpus() -> int:
    """Number of CUDA devices CuPy sees (0 without CuPy or a driver)."""
    global _visible
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
    if env == "0" or (not env and importlib.util.find_spec("cupy") is None):
        return 0
    vis = visible_gpus()
    if vis == 0:
        return 0
    multi = cl is not None and cl.size > 1
    n = int(env) if env else (1 if multi else vis)
    _base = (cl.local_rank * n) if multi else 0
    return n


def ordinal(dev: Any) -> int:
    """CUDA device ordinal of a local GPU Device."""
    return (_base + dev.local_index) % max(visible_gpus(), 1)


def on_device(fn: Callable, dev: Any) -> Callable:
    """``fn`` run with ``dev``'s GPU current."""
    import cupy

    k = ordinal(dev)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with cupy.cuda.Device(k):
            return fn(*args, **kwargs)

    return run


def zeros(k: int, shape: tuple, dtype: Any) -> Any:
    """A zeroed CuPy array on GPU ``k`` with its own cudaMalloc allocation."""
    import cupy

    dtype = np.dtype(dtype)
    nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
    with cupy.cuda.Device(k):
        mem = cupy.cuda.Memory(nbytes)
        arr = cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0))
        arr.fill(0)
    return arr


def _is_gpu(a: Any) -> bool:
    return type(a) is not np.ndarray


def to_host(a: Any) -> np.ndarray:
    if not _is_gpu(a):
        return a
    import cupy

    with cupy.cuda.Device(a.device.id):
        return cupy.asnumpy(a)


def from_host(dst: Any, host: np.ndarray) -> None:
    import cupy

    with cupy.cuda.Device(dst.device.id):
        dst[...] = cupy.asarray(host)


def copy_to(a: Any, k: int | None) -> Any:
    """A copy of ``a`` on GPU ``k`` (None: a numpy copy)."""
    if k is None:
        return np.array(to_host(a), copy=True)
    import cupy

    if _is_gpu(a):
        cupy.cuda.Device(a.device.id).synchronize()
    with cupy.cuda.Device(k):
        return cupy.array(a, copy=True) if _is_gpu(a) else cupy.asarray(a)


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` across numpy and CuPy arrays on any devices."""
    if not _is_gpu(dst) and not _is_gpu(src):
        dst[...] = src
    elif not _is_gpu(dst):
        dst[...] = to_host(src)
    elif not _is_gpu(src):
        from_host(dst, src)
    else:
        import cupy

        if src.device.id != dst.device.id:
            cupy.cuda.Device(src.device.id).synchronize()
        with cupy.cuda.Device(dst.device.id):
            dst[...] = src if src.device.id == dst.device.id else src.copy()


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
    import cupy

    cl = repl.cl
    inst = repl.rt.instances.instance(c.src, root, field)
    cupy.cuda.Device(inst.device.id).synchronize()  # the source is ready on the GPU
    key = (c.src, root.uid, field, peer)
    handle = None
    if key not in _handles_sent:
        handle = cupy.cuda.runtime.ipcGetMemHandle(inst.data.ptr)
        _handles_sent.add(key)
    tag = cl.tag(c.id)
    req = cl.data.isend(handle, dest=peer, tag=tag)
    cl.wait([req], lambda: f"rank {peer} to take the IPC handle of copy {c.id}")
    cl.recv_obj(cl.data, peer, tag, lambda: f"rank {peer} to finish IPC copy {c.id}")


def ipc_recv(repl: Any, c: Any, root: Any, field: str, dst: Any, peer: int) -> None:
    import cupy

    cl = repl.cl
    tag = cl.tag(c.id)
    handle = cl.recv_obj(cl.data, peer, tag, lambda: f"the IPC handle of copy {c.id}")
    key = (c.src, root.uid, field)
    k = dst.device.id
    with cupy.cuda.Device(k):
        if handle is not None:
            _handles_open[key] = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        ptr = _handles_open[key]
        dtype = np.dtype(root.fields[field])
        nbytes = int(np.prod(root.shape)) * dtype.itemsize
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, None, k)
        remote = cupy.ndarray(root.shape, dtype, cupy.cuda.MemoryPointer(mem, 0))
        dst[...] = remote[c.rect.to_slices()]
        cupy.cuda.Device(k).synchronize()
    req = cl.data.isend(True, dest=peer, tag=tag)
    cl.wait([req], lambda: f"rank {peer} to take the IPC acknowledgement of copy {c.id}")
