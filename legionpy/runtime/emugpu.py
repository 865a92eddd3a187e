"""An emulated GPU array backend: numpy underneath, every array on a device.

``LEGIONPY_GPU_BACKEND=emulated`` (with ``LEGIONPY_GPUS=n``) makes the
runtime's devices GPUs served by this module instead of CuPy, so the whole
GPU code path (instances, copies, fills, folds, reduction buffers, staging,
IPC bookkeeping, streams and events, the layer API's training step) runs in
CI on a machine without a GPU. It checks what a real GPU run would trip on
and that plain numpy code never notices:

- every :class:`EmuArray` lives on one device (``a.device.id``, as CuPy);
- the current device is per thread (``Device(k)`` as a context manager, as
  ``cupy.cuda.Device``); an operation (ufunc, numpy function, method,
  indexing, assignment, arithmetic) raises :class:`~legionpy.errors.DeviceError`
  when one of its device arrays is not on the current device, or when it
  mixes a device array with a host numpy array (CuPy refuses implicit
  host/device conversions: ``np.asarray(a)`` raises here too);
- allocations are counted per device (bytes now and peak), pool buffers are
  kept per (device, shape, dtype) for reuse, streams and events record the
  order the runtime asks for, IPC handles are counted open and closed.

Kernels get :data:`xp` from ``array_module`` (ops/kernels/common.py): the
numpy namespace whose functions check devices and make their results on the
current device, as ``cupy.*`` does. What it does *not* emulate: timing,
asynchrony (every operation completes at once, so a missing event wait
cannot race), and kernels CuPy lacks (it runs every numpy function).

IPC: under MPI, instances are allocated in ``/dev/shm`` files, so a handle
(the file name) opened by another process on the node maps the same bytes,
which is what ``cudaIpcOpenMemHandle`` gives on a real GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import DeviceError
from .emugraph import host_sync as _sync
from .emugraph import kernel as _kernel

__all__ = ["EmuArray", "Device", "current", "xp", "stats", "reset_stats", "Stream", "Event"]

_tls = threading.local()
_lock = threading.Lock()


def current() -> int:
    """The calling thread's current device (0 until set, as CUDA)."""
    return getattr(_tls, "dev", 0)


class Device:
    """``with Device(k):`` makes emulated GPU ``k`` current in this thread."""

    def __init__(self, k: int | None = None) -> None:
        self.id = current() if k is None else int(k)
        self._prev: list[int] = []

    def __enter__(self) -> Device:
        self._prev.append(current())
        _tls.dev = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _tls.dev = self._prev.pop()

    def synchronize(self) -> None:
        _sync(f"synchronize of emulated GPU {self.id}")
        with _lock:
            _stats["syncs"][self.id] = _stats["syncs"].get(self.id, 0) + 1

    def __repr__(self) -> str:
        return f"<emulated GPU {self.id}>"


# -- statistics (tests read them) --------------------------------------------------------
def _fresh() -> dict:
    return {"bytes": {}, "peak": {}, "allocs": {}, "syncs": {}, "pool_hits": 0,
            "pool_misses": 0, "ipc_opened": 0, "ipc_closed": 0, "ipc_exported": 0,
            "events": 0, "waits": 0}


_stats = _fresh()


def stats() -> dict:
    """A copy of the counters: ``bytes``/``peak``/``allocs`` per device,
    ``syncs`` per device, pool hits and misses, IPC handles, events."""
    with _lock:
        return {k: dict(v) if isinstance(v, dict) else v for k, v in _stats.items()}


def reset_stats() -> None:
    global _stats
    with _lock:
        live = dict(_stats["bytes"])
        _stats = _fresh()
        _stats["bytes"] = live
        _stats["peak"] = dict(live)


def _count(k: int, nbytes: int) -> None:
    with _lock:
        b = _stats["bytes"][k] = _stats["bytes"].get(k, 0) + nbytes
        if nbytes > 0:
            _stats["allocs"][k] = _stats["allocs"].get(k, 0) + 1
            if b > _stats["peak"].get(k, 0):
                _stats["peak"][k] = b


# -- arrays ----------------------------------------------------------------------------
def _wrong(what: str, dev: int) -> DeviceError:
    return DeviceError(f"{what} on emulated GPU {dev} while GPU {current()} is current: a "
                       "CUDA kernel runs on the current device only; run it under "
                       f"Device({dev}) (the task's device) or copy the array there first")


def _host(what: str) -> DeviceError:
    return DeviceError(f"{what} mixes a host numpy array with an emulated GPU array; CuPy "
                       "refuses implicit host/device transfers: copy it with "
                       "gpu.to_host / gpu.copy_to first")


def _un(x: Any, what: str, dev: int, host_ok: bool = False) -> Any:
    """``x`` with device arrays replaced by their numpy data (checked)."""
    if type(x) is EmuArray:
        if x.device.id != dev:
            raise _wrong(what, x.device.id)
        return x._a
    if type(x) is np.ndarray:
        if x.ndim and not host_ok:
            raise _host(what)
        return x
    if type(x) in (list, tuple):
        return type(x)(_un(v, what, dev, host_ok) for v in x)
    return x


def _wrap(r: Any, dev: int) -> Any:
    if isinstance(r, np.ndarray):
        return EmuArray(r, dev)
    if isinstance(r, np.generic) and not isinstance(r, np.dtype):
        return EmuArray(np.asarray(r), dev)
    if type(r) in (list, tuple):
        return type(r)(_wrap(v, dev) for v in r)
    return r


def _call(fn: Any, args: tuple, kwargs: dict, what: str) -> Any:
    dev = current()
    a = _un(args, what, dev)
    kw = {k: _un(v, what, dev) for k, v in kwargs.items()} if kwargs else kwargs
    return _wrap(_kernel(fn, a, kw), dev)


def _basic(key: Any) -> bool:
    """A basic index (ints, slices, ``...``, None): a view, no kernel."""
    if type(key) is tuple:
        return all(k is None or k is Ellipsis or type(k) in (int, slice) for k in key)
    return key is None or key is Ellipsis or type(key) in (int, slice)


class _DeviceRef:
    __slots__ = ("id",)

    def __init__(self, k: int) -> None:
        self.id = k

    def __repr__(self) -> str:
        return f"<emulated GPU {self.id}>"


_DEVS: dict[int, _DeviceRef] = {}


class EmuArray:
    """A numpy array on emulated GPU ``device.id`` (see the module doc)."""

    __slots__ = ("_a", "device", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, a: np.ndarray, dev: int) -> None:
        self._a = a
        d = _DEVS.get(dev)
        if d is None:
            d = _DEVS.setdefault(dev, _DeviceRef(dev))
        self.device = d

    # metadata: no kernel, no check (as CuPy)
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)

    @property
    def T(self) -> EmuArray:  # noqa: N802 - numpy's name
        return EmuArray(self._a.T, self.device.id)

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"EmuArray(gpu{self.device.id}, {self._a!r})"

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise _host("np.asarray / implicit conversion of an emulated GPU array")

    def get(self) -> np.ndarray:
        """A host copy (``cupy.ndarray.get``)."""
        _sync("a device-to-host copy (ndarray.get)")
        return np.array(self._a, copy=True)

    def item(self) -> Any:
        _sync("ndarray.item (a device-to-host copy)")
        return self._a.item()

    def tolist(self) -> Any:
        _sync("ndarray.tolist (a device-to-host copy)")
        return self._a.tolist()

    def __float__(self) -> float:
        _sync("float() of a device array")
        return float(self._a)

    def __int__(self) -> int:
        _sync("int() of a device array")
        return int(self._a)

    def __bool__(self) -> bool:
        _sync("bool() of a device array")
        return bool(self._a)

    def __iter__(self) -> Iterator[EmuArray]:
        for i in range(len(self._a)):
            yield self[i]

    def __getitem__(self, key: Any) -> Any:
        dev = self.device.id
        if dev != current() and not _basic(key):  # a view needs no kernel (as CuPy)
            raise _wrong("indexing an array", dev)
        k = _un(key, "an index", dev, host_ok=True)
        if _basic(key):
            return _wrap(self._a[k], dev)  # a view: no kernel
        if getattr(k, "dtype", None) == np.bool_:
            _sync("boolean-mask indexing (its size is data-dependent)")
        return _wrap(_kernel(_getitem, (self._a, k), {}), dev)

    def __setitem__(self, key: Any, value: Any) -> None:
        dev = self.device.id
        if dev != current():
            raise _wrong("writing into an array", dev)
        _kernel(_setitem, (self._a, _un(key, "an index", dev, host_ok=True),
                           _un(value, "an assignment", dev)), {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # __array_interface__ and the like: no implicit host view
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if callable(attr):
            dev = self.device.id

            def method(*args: Any, **kwargs: Any) -> Any:
                if dev != current():
                    raise _wrong(f"ndarray.{name}", dev)
                return _call(attr, args, kwargs, f"ndarray.{name}")
            return method
        return _wrap(attr, self.device.id)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        what = f"numpy.{ufunc.__name__}"
        dev = current()
        ins = _un(inputs, what, dev)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = _un(out, what, dev)
        r = _kernel(getattr(ufunc, method), ins, kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(r, dev)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        what = f"numpy.{func.__name__}"
        out = kwargs.get("out")
        r = _call(func, args, kwargs, what)
        return out if out is not None else r


_INPLACE = {f"__i{n}__" for n in "add sub mul truediv pow and or xor".split()}


def _binop(name: str) -> Any:
    npop = getattr(np.ndarray, name)
    inplace = name in _INPLACE

    def op(self: EmuArray, *other: Any) -> Any:
        dev = self.device.id
        if dev != current():
            raise _wrong(f"operator {name}", dev)
        r = _kernel(npop, (self._a, *_un(other, f"operator {name}", dev)), {})
        if r is NotImplemented:
            return r
        if inplace:
            return self
        return _wrap(r, dev)
    op.__name__ = name
    return op


for _name in ("add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow "
              "rpow matmul rmatmul neg pos abs invert and rand or ror xor rxor lt le gt ge eq "
              "ne iadd isub imul itruediv ipow iand ior ixor lshift rshift").split():
    setattr(EmuArray, f"__{_name}__", _binop(f"__{_name}__"))


# -- the array module (``xp``) ------------------------------------------------------------
def _as_strided(a: Any, shape: Any = None, strides: Any = None, **kw: Any) -> Any:
    from numpy.lib.stride_tricks import as_strided

    dev = current()
    return _wrap(as_strided(_un(a, "as_strided", dev), shape=shape, strides=strides, **kw), dev)


def _asarray(a: Any, dtype: Any = None, **kw: Any) -> EmuArray:
    """``cupy.asarray``: a host array (or list) copied to the current device;
    a device array is checked, returned as is (or cast)."""
    dev = current()
    if type(a) is EmuArray:
        if a.device.id != dev:
            raise _wrong("asarray", a.device.id)
        if dtype is None or a.dtype == dtype:
            return a
        return EmuArray(_kernel(a._a.astype, (dtype,), {}), dev)
    _sync("a host-to-device copy (cupy.asarray of host data)")
    return EmuArray(np.array(_un(a, "asarray", dev, host_ok=True), dtype=dtype), dev)


def _getitem(a: np.ndarray, key: Any) -> Any:
    return a[key]


def _setitem(a: np.ndarray, key: Any, value: Any) -> None:
    a[key] = value


def _asnumpy(a: Any) -> np.ndarray:
    return a.get() if type(a) is EmuArray else np.asarray(a)


class _UFunc:
    """A numpy ufunc with device checks (``xp.add(...)``, ``xp.add.at(...)``)."""

    def __init__(self, uf: np.ufunc) -> None:
        self.uf, self.__name__ = uf, uf.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self.uf, args, kwargs, f"xp.{self.__name__}")

    def __getattr__(self, method: str) -> Any:  # at, reduce, accumulate, outer
        fn = getattr(self.uf, method)
        return lambda *a, **k: _call(fn, a, k, f"xp.{self.__name__}.{method}")


class _Xp:
    """numpy with device checks; results land on the current device."""

    __name__ = "legionpy.runtime.emugpu"
    asarray = staticmethod(_asarray)
    array = staticmethod(lambda a, dtype=None, copy=True, **kw: EmuArray(
        _kernel(np.array, (_asarray(a, dtype)._a,), {"copy": True}), current()))
    ascontiguousarray = staticmethod(lambda a, dtype=None: _call(
        np.ascontiguousarray, (_asarray(a), dtype), {}, "ascontiguousarray"))
    asnumpy = staticmethod(_asnumpy)
    as_strided = staticmethod(_as_strided)
    get_array_module = staticmethod(lambda *a: xp)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc):
            setattr(self, name, _UFunc(attr))
            return getattr(self, name)
        if callable(attr) and not isinstance(attr, type):  # functions, not dtypes
            def fn(*args: Any, **kwargs: Any) -> Any:
                return _call(attr, args, kwargs, f"xp.{name}")
            fn.__name__ = name
            setattr(self, name, fn)
            return fn
        return attr


xp = _Xp()


# -- allocation, pool, streams, events, IPC ------------------------------------------------
_shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
_shm_seq = itertools.count()
shared = False  # set under MPI: instances go to /dev/shm so IPC can map them


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def alloc(k: int, shape: tuple, dtype: Any, ipc: bool = False) -> EmuArray:
    """A zeroed array on GPU ``k`` with its own allocation (counted)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if ipc and shared and _shm_dir is not None and nbytes:
        path = os.path.join(_shm_dir, f"legionpy-emu-{os.getpid()}-{next(_shm_seq)}")
        a = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
        weakref.finalize(a, _unlink, path)
        handles[id(a)] = path
    else:
        a = np.zeros(shape, dtype)
    _count(k, nbytes)
    weakref.finalize(a, _count, k, -nbytes)
    return EmuArray(a, k)


handles: dict[int, str] = {}


def ipc_handle(a: EmuArray) -> str:
    """The handle (a /dev/shm file) of an instance allocated with ``ipc=True``."""
    _sync("cudaIpcGetMemHandle")
    base = a._a if a._a.base is None or isinstance(a._a, np.memmap) else a._a.base
    path = handles.get(id(a._a)) or handles.get(id(base))
    if path is None:
        raise DeviceError("this emulated GPU array was not allocated for IPC (shared=False: "
                          "instances go to /dev/shm only under MPI)")
    with _lock:
        _stats["ipc_exported"] += 1
    return path


def ipc_open(handle: str, k: int, nbytes: int) -> EmuArray:
    """The peer's allocation mapped into this process on GPU ``k`` (bytes)."""
    _sync("cudaIpcOpenMemHandle")
    a = np.memmap(handle, dtype=np.uint8, mode="r+", shape=(nbytes,))
    with _lock:
        _stats["ipc_opened"] += 1
    return EmuArray(a, k)


def ipc_close(a: EmuArray) -> None:
    mm = a._a
    with _lock:
        _stats["ipc_closed"] += 1
    if isinstance(mm, np.memmap) and mm._mmap is not None:
        mm._mmap.close()


class Stream:
    """A non-default stream of device ``k`` (work runs at once; the order of
    records and waits is kept for the tests)."""

    def __init__(self, k: int, name: str) -> None:
        self.device_id, self.name = k, name
        self.waited: list[Event] = []

    def __enter__(self) -> Stream:
        if current() != self.device_id:
            raise _wrong(f"using {self.name}", self.device_id)
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def wait_event(self, ev: Event) -> None:
        if not ev.recorded:
            raise DeviceError(f"{self.name} waits on an event that was never recorded")
        self.waited.append(ev)
        with _lock:
            _stats["waits"] += 1

    def synchronize(self) -> None:
        _sync(f"synchronize of {getattr(self, 'name', 'an event')}")


class Event:
    def __init__(self) -> None:
        self.recorded = False
        self.stream: Stream | None = None

    def record(self, stream: Stream) -> None:
        self.recorded, self.stream = True, stream
        with _lock:
            _stats["events"] += 1

    def synchronize(self) -> None:
        _sync(f"synchronize of {getattr(self, 'name', 'an event')}")
