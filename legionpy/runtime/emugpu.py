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
  host/device conversions: ``np.asarray(a)`` raises here too); ``a.copy()``
  of an array on another device is a peer copy onto the current one (as
  ``cupy.ndarray.copy``);
- every kernel runs on the thread's current stream of the current device
  (``with Stream(k, name):``, emurace.py; the device's legacy stream when
  none was made current), and the race detector of emurace.py raises when
  two kernels on different streams, or a kernel and a host read, touch the
  same bytes without an event ordering them;
- allocations are counted per device (bytes now and peak, and how many:
  ``stats()["allocs"]``, so a test can show a replayed step allocates
  nothing), as are kernels per stream, events, waits and synchronisations,
  and IPC handles opened and closed.

Every emulated kernel goes through one function, :func:`_kernel` (the
choke point: device check done by the caller, stream choice, race check,
result on the current device). Stream capture (runtime/emugraph.py) hooks
there through :data:`hook`.

Kernels get :data:`xp` from ``array_module`` (ops/kernels/common.py): the
numpy namespace whose functions check devices and make their results on the
current device, as ``cupy.*`` does. What it does *not* emulate: timing
(every kernel completes at once: the detector reports a missing ordering
whether or not a real GPU would have lost the race), and kernels CuPy lacks
(it runs every numpy function).

IPC: under MPI, instances are allocated in ``/dev/shm`` files, so a handle
(the file name) opened by another process on the node maps the same bytes,
which is what ``cudaIpcOpenMemHandle`` gives on a real GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..ops.kernels.activation import erfc as host_erfc
from . import emurace
from .emugraph import host_sync as _sync
from .emurace import Buf, Event, Stream, current_stream

__all__ = ["EmuArray", "Device", "current", "xp", "stats", "reset_stats", "Stream", "Event",
           "current_stream", "label", "hook"]

_tls = emurace._tls  # the current device and streams, per thread
_lock = emurace._lock

#: stream capture (runtime/emugraph.py): when set, every kernel calls
#: ``hook(stream, what, fn, reads, writes)`` after the race check and before
#: running; a return value other than None replaces ``fn`` (the capture's
#: recording wrapper). ``reads`` / ``writes``: the EmuArrays it touches.
hook: Callable[..., Any] | None = None


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
        """The host waits for every stream of this device (counted: the
        runtime synchronises events, never whole devices)."""
        _sync(f"synchronize of emulated GPU {self.id}")
        emurace.synchronize_device(self.id)
        with _lock:
            _stats["syncs"][self.id] = _stats["syncs"].get(self.id, 0) + 1

    def __repr__(self) -> str:
        return f"<emulated GPU {self.id}>"


# -- statistics (tests read them) --------------------------------------------------------
def _fresh() -> dict:
    return {"bytes": {}, "peak": {}, "allocs": {}, "syncs": {}, "pool_hits": 0,
            "pool_misses": 0, "ipc_opened": 0, "ipc_closed": 0, "ipc_exported": 0}


_stats = _fresh()


def stats() -> dict:
    """A copy of the counters: ``bytes``/``peak``/``allocs`` per device,
    ``syncs`` (whole-device synchronisations) per device, IPC handles, and
    from the race detector ``events``, ``waits``, ``event_syncs``,
    ``stream_syncs``, ``host_reads``, ``legacy_kernels`` (per device) and
    ``stream_kernels`` (per stream name)."""
    with _lock:
        out = {k: dict(v) if isinstance(v, dict) else v for k, v in _stats.items()}
        emurace.stats_into(out)
        return out


def reset_stats() -> None:
    global _stats
    with _lock:
        live = dict(_stats["bytes"])
        _stats = _fresh()
        _stats["bytes"] = live
        _stats["peak"] = dict(live)
        emurace.reset_counts()


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


def _un(x: Any, what: str, dev: int, arrs: list, host_ok: bool = False) -> Any:
    """``x`` with device arrays replaced by their numpy data (checked); the
    device arrays go to ``arrs``."""
    if type(x) is EmuArray:
        if x.device.id != dev:
            raise _wrong(what, x.device.id)
        arrs.append(x)
        return x._a
    if type(x) is np.ndarray:
        if x.ndim and not host_ok:
            raise _host(what)
        return x
    t = type(x)
    if t is tuple or t is list:
        out = [_un(v, what, dev, arrs, host_ok) for v in x]
        return out if t is list else tuple(out)
    return x


def _wrap(r: Any, dev: int) -> Any:
    if isinstance(r, np.ndarray):
        return EmuArray(r, dev)
    if isinstance(r, np.generic) and not isinstance(r, np.dtype):
        return EmuArray(np.asarray(r), dev)
    if type(r) in (list, tuple):
        return type(r)(_wrap(v, dev) for v in r)
    return r


# allocation (owner numpy array) -> its access records, found from any view
_bufs: dict[int, tuple[Any, Buf]] = {}


def _forget(key: int, ref: Any) -> None:
    got = _bufs.get(key)
    if got is not None and got[0] is ref:
        del _bufs[key]


def _buf_of(a: np.ndarray, dev: int) -> Buf:
    o = a
    base = o.base
    while isinstance(base, np.ndarray):
        o, base = base, base.base
    key = id(o)
    got = _bufs.get(key)
    if got is not None and got[0]() is o:
        return got[1]
    b = Buf(o, dev)
    ref = weakref.ref(o, lambda r, key=key: _forget(key, r))
    _bufs[key] = (ref, b)
    return b


def label(a: Any, text: str) -> None:
    """Name ``a``'s allocation in race messages (e.g. "R3.x in memory 1")."""
    if type(a) is EmuArray:
        a.buf().label = text


def _kernel(what: str, fn: Callable[[], Any], reads: list, writes: list, dev: int) -> Any:
    """Run ``fn()`` as one kernel on GPU ``dev`` (the current device): on the
    thread's current stream there (the legacy one when none is current),
    after checking its accesses against the race detector: it reads the
    EmuArrays ``reads`` and writes ``writes`` (a view's part only); the
    arrays it returns are new allocations that kernel wrote. Every emulated
    kernel goes through here; stream capture hooks here (:data:`hook`)."""
    s = emurace.explicit_stream(dev) or emurace.legacy_stream(dev)
    access = emurace.access
    with _lock:
        seq = s.enqueue()
        for a in reads:
            access(s, seq, a.part(), a.buf(), False, what)
        for a in writes:
            access(s, seq, a.part(), a.buf(), True, what)
    if hook is not None:
        fn = hook(s, what, fn, reads, writes) or fn
    r = _wrap(fn(), dev)
    fresh = [r] if type(r) is EmuArray else [x for x in r if type(x) is EmuArray] \
        if type(r) in (list, tuple) else ()
    if fresh:
        mine = {id(a.buf()) for a in reads} | {id(a.buf()) for a in writes}
        with _lock:
            for x in fresh:
                b = x.buf()
                if id(b) not in mine:
                    access(s, seq, x.part(), b, True, what)
    return r


def _call(fn: Any, args: tuple, kwargs: dict, what: str, mutates: bool = False) -> Any:
    """``fn(*args, **kwargs)`` as a kernel: array arguments are read, ``out=``
    is written, and so is the first argument when ``mutates``."""
    dev = current()
    if getattr(fn, "__name__", None) in _DATA_SIZED:
        _sync(f"{what} (its result size is data-dependent)")
    reads: list = []
    writes: list = []
    a = _un(args, what, dev, reads)
    kw = kwargs
    if kwargs:
        kw = {k: _un(v, what, dev, writes if k == "out" else reads) for k, v in kwargs.items()}
    if mutates and args and type(args[0]) is EmuArray:
        writes.append(args[0])
    return _kernel(what, lambda: fn(*a, **kw), reads, writes, dev)


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
#: numpy functions and methods that write their first argument (or the array)
_MUTATING = frozenset({"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis",
                       "fill", "sort", "partition", "itemset", "resize", "setfield"})
#: numpy functions and methods whose result size depends on the data: CuPy
#: reads a count back to the host to allocate the result (``cupy.nonzero``,
#: ``cupy.unique``, ...), a synchronisation that a stream capture refuses
_DATA_SIZED = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "unique_values",
                         "unique_counts", "unique_inverse", "unique_all", "compress",
                         "extract", "trim_zeros"})


class EmuArray:
    """A numpy array on emulated GPU ``device.id`` (see the module doc)."""

    __slots__ = ("_a", "device", "_b", "_x", "__weakref__")
    __array_priority__ = 1000

    def __array_namespace__(self, api_version: Any = None) -> Any:
        """The array module of these arrays (the Array API's spelling), so
        kernels find it (ops.kernels.common.array_module) without importing
        the runtime."""
        return xp

    def __init__(self, a: np.ndarray, dev: int) -> None:
        self._a = a
        self._b: Buf | None = None
        self._x: tuple | None = None  # the part of the allocation it views (race detector)
        d = _DEVS.get(dev)
        if d is None:
            d = _DEVS.setdefault(dev, _DeviceRef(dev))
        self.device = d

    def buf(self) -> Buf:
        """The access records of this array's allocation (race detector)."""
        b = self._b
        if b is None:
            b = self._b = _buf_of(self._a, self.device.id)
        return b

    def part(self) -> tuple:
        """``(first byte, end byte, box)`` of the allocation this array views."""
        x = self._x
        if x is None:
            x = self._x = emurace.extent(self._a, self.buf())
        return x

    def _view(self, a: np.ndarray) -> EmuArray:
        v = EmuArray(a, self.device.id)
        v._b = self._b
        return v

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
        return self._view(self._a.T)

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"EmuArray(gpu{self.device.id}, {self._a!r})"

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise _host("np.asarray / implicit conversion of an emulated GPU array")

    # -- host reads: synchronous copies to the host ------------------------------------------
    def _to_host(self, what: str) -> np.ndarray:
        """Check a read by the host: as CuPy, the copy runs on the current
        stream of the array's device (the legacy one when none was made
        current, which is ordered after what the host synchronised with
        and nothing else) and the host waits for it."""
        _sync(f"{what} (a device-to-host copy)")
        dev = self.device.id
        s = emurace.explicit_stream(dev) or emurace.legacy_stream(dev)
        with _lock:
            emurace.host_read(s, self.part(), self.buf(), what)
        return self._a

    def get(self) -> np.ndarray:
        """A host copy (``cupy.ndarray.get``)."""
        return np.array(self._to_host("ndarray.get"), copy=True)

    def item(self) -> Any:
        return self._to_host("ndarray.item").item()

    def tolist(self) -> Any:
        return self._to_host("ndarray.tolist").tolist()

    def __float__(self) -> float:
        return float(self._to_host("float()"))

    def __int__(self) -> int:
        return int(self._to_host("int()"))

    def __bool__(self) -> bool:
        return bool(self._to_host("bool()"))

    def __iter__(self) -> Iterator[EmuArray]:
        for i in range(len(self._a)):
            yield self[i]

    # -- kernels -----------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        dev = self.device.id
        if _basic(key):  # a view needs no kernel (as CuPy)
            return self._view(self._a[key])
        if dev != current():
            raise _wrong("indexing an array", dev)
        reads = [self]
        k = _un(key, "an index", dev, reads, host_ok=True)
        if getattr(k, "dtype", None) == np.bool_:
            _sync("boolean-mask indexing (its size is data-dependent)")
        return _kernel("indexing (gather)", lambda: self._a[k], reads, [], dev)

    def __setitem__(self, key: Any, value: Any) -> None:
        dev = self.device.id
        if dev != current():
            raise _wrong("writing into an array", dev)
        reads: list = []
        k = _un(key, "an index", dev, reads, host_ok=True)
        v = _un(value, "an assignment", dev, reads)
        target = self._view(self._a[k]) if _basic(key) else self
        a = self._a

        def run() -> None:
            a[k] = v
        _kernel("an assignment (setitem)", run, reads, [target], dev)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # __array_interface__ and the like: no implicit host view
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if callable(attr):
            dev = self.device.id
            what = f"ndarray.{name}"
            writes = [self] if name in _MUTATING else []

            def method(*args: Any, **kwargs: Any) -> Any:
                cur = current()
                if name in _DATA_SIZED:
                    _sync(f"{what} (its result size is data-dependent)")
                if dev != cur and name != "copy":  # copy: a peer copy onto the current GPU
                    raise _wrong(what, dev)
                reads = [self]
                a = _un(args, what, cur, reads)
                kw = {k: _un(v, what, cur, writes if k == "out" else reads)
                      for k, v in kwargs.items()} if kwargs else kwargs
                return _kernel(what, lambda: attr(*a, **kw), reads, writes, cur)
            return method
        v = _wrap(attr, self.device.id)
        if type(v) is EmuArray:
            v._b = self._b if v._a.base is not None else None
        return v

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        what = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        dev = current()
        reads: list = []
        writes: list = []
        ins = _un(inputs, what, dev, reads)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = _un(out, what, dev, writes)
        if method == "at" and inputs and type(inputs[0]) is EmuArray:
            writes.append(inputs[0])
        fn = getattr(ufunc, method)
        r = _kernel(what, lambda: fn(*ins, **kwargs), reads, writes, dev)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return r

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        what = f"numpy.{func.__name__}"
        out = kwargs.get("out")
        r = _call(func, args, kwargs, what, func.__name__ in _MUTATING)
        return out if out is not None else r


_INPLACE = {f"__i{n}__" for n in "add sub mul truediv pow and or xor".split()}


def _binop(name: str) -> Any:
    npop = getattr(np.ndarray, name)
    inplace = name in _INPLACE
    what = f"operator {name}"

    def op(self: EmuArray, *other: Any) -> Any:
        dev = self.device.id
        if dev != current():
            raise _wrong(what, dev)
        reads = [self]
        o = _un(other, what, dev, reads)
        a = self._a
        r = _kernel(what, lambda: npop(a, *o), reads, [self] if inplace else [], dev)
        if r is NotImplemented:
            return r
        return self if inplace else r
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
    v = _wrap(as_strided(_un(a, "as_strided", dev, []), shape=shape, strides=strides, **kw), dev)
    return v  # a view: no kernel


def _asarray(a: Any, dtype: Any = None, **kw: Any) -> EmuArray:
    """``cupy.asarray``: a host array (or list) copied to the current device
    (a kernel on the current stream); a device array is checked, returned as
    is (or cast)."""
    dev = current()
    if type(a) is EmuArray:
        if a.device.id != dev:
            raise _wrong("asarray", a.device.id)
        if dtype is None or a.dtype == dtype:
            return a
        return _kernel("asarray (cast)", lambda: a._a.astype(dtype), [a], [], dev)
    _sync("a host-to-device copy (cupy.asarray of host data)")
    host = _un(a, "asarray", dev, [], host_ok=True)
    return _kernel("asarray (host to device)", lambda: np.array(host, dtype=dtype), [], [], dev)


def _array(a: Any, dtype: Any = None, copy: bool = True, **kw: Any) -> EmuArray:
    if type(a) is EmuArray:
        dev = current()
        if a.device.id != dev:
            raise _wrong("array", a.device.id)
        return _kernel("array (copy)", lambda: np.array(a._a, dtype=dtype, copy=True), [a], [],
                       dev)
    return _asarray(a, dtype)


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
        return lambda *a, **k: _call(fn, a, k, f"xp.{self.__name__}.{method}", method == "at")


class _Xp:
    """numpy with device checks; results land on the current device."""

    __name__ = "legionpy.runtime.emugpu"
    asarray = staticmethod(_asarray)
    array = staticmethod(_array)
    ascontiguousarray = staticmethod(lambda a, dtype=None: _call(
        np.ascontiguousarray, (_asarray(a), dtype), {}, "ascontiguousarray"))
    asnumpy = staticmethod(_asnumpy)
    as_strided = staticmethod(_as_strided)
    get_array_module = staticmethod(lambda *a: xp)
    #: ``cupyx.scipy.special.erfc`` (numpy has none: numba's on the host copy)
    erfc = staticmethod(lambda a: _call(host_erfc, (a,), {}, "xp.erfc"))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc):
            setattr(self, name, _UFunc(attr))
            return getattr(self, name)
        if callable(attr) and not isinstance(attr, type):  # functions, not dtypes
            mutates = name in _MUTATING

            def fn(*args: Any, **kwargs: Any) -> Any:
                return _call(attr, args, kwargs, f"xp.{name}", mutates)
            fn.__name__ = name
            setattr(self, name, fn)
            return fn
        return attr


xp = _Xp()


# -- allocation, IPC ------------------------------------------------
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
