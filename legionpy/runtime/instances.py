"""Physical instances: the arrays behind each (memory, root region, field).

Memory behaviour: an instance covers the *whole root region* and is
allocated on first use in that memory with ``np.zeros`` (calloc: pages
untouched by any task cost nothing on Linux), so a task's subregion is a
numpy view ``instance[rect]`` and instances never move or grow. A device
that only ever touches one tile of a big region therefore reserves the whole
region's address space but only commits the pages of the tiles it touches.
Reduction instances are separate and identity-initialised: one per (memory,
root, field) and epoch (coherence.py), shared by every same-op reducer on
that memory, allocated by the first reducer that runs and grown to the
bounding box of the reducers' rects when a later one reaches beyond it
(:meth:`Instances.reduction_view`, on the device's worker: the tasks of one
device run one at a time). A reduction copied to another memory lands in a
staging buffer there and is folded by the reader's prologue. Buffers no
coherence piece refers to are dropped at the next fence.

GPU memories (``gpu_of``: memory id -> CUDA device ordinal, set by the
Runtime for this rank's GPU devices) hold CuPy arrays allocated outside
CuPy's pool (so CUDA IPC handles point at the array itself, runtime/gpu.py);
copies and staging buffers move data between backends with the helpers of
gpu.py. With no GPU memory the numpy code path is the only one taken.

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
from .coherence import Copy, FillAction, FoldAction

__all__ = ["Instances", "RegionView", "identity", "FOLD"]

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
        self.redbufs: dict[Any, tuple[Any, Rect]] = {}  # key -> (array, its rect)
        self.staging: dict[tuple[int, Rect], np.ndarray] = {}  # (copy id, rect)
        self._lock = threading.Lock()
        self.gpu_of: dict[int, int] = {}

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

    def instance(self, memory: int, root: Any, field: str) -> np.ndarray:
        key = (memory, root.uid, field)
        arr = self.arrays.get(key)
        if arr is None:
            with self._lock:
                arr = self.arrays.get(key)
                if arr is None:
                    arr = self.zeros(memory, root.shape, root.fields[field], ipc=True)
                    self.arrays[key] = arr
        return arr

    def _new_buffer(self, rect: Rect, redop: str, dtype: np.dtype, memory: int) -> Any:
        if memory in self.gpu_of:
            from . import gpu
            buf = self.zeros(memory, rect.shape, dtype)
            with gpu.on_array(buf):
                buf[...] = identity(redop, dtype)
        else:
            buf = np.empty(rect.shape, dtype=dtype)
            buf.fill(identity(redop, dtype))
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
        else:
            buf, brect = got
            if not brect.contains(rect):
                bb = brect.bounding(rect)
                grown = self._new_buffer(bb, redop, dtype, memory)
                if memory in self.gpu_of:
                    from . import gpu
                    with gpu.on_array(grown):
                        grown[brect.to_slices(bb.lo)] = buf
                else:
                    grown[brect.to_slices(bb.lo)] = buf
                buf, brect = grown, bb
                self.redbufs[key] = (buf, brect)
        if brect == rect:
            return buf
        return buf[rect.to_slices(brect.lo)]

    def new_reduction(self, key: Any, rect: Rect, redop: str, dtype: np.dtype,
                      memory: int = -1) -> Any:
        """A fresh buffer ``key`` over ``rect`` (replacing any old one)."""
        self.redbufs.pop(key, None)
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
        from . import gpu
        with gpu.on_array(buf):
            buf[...] = identity(redop, buf.dtype)

    def reduction_part(self, key: Any, rect: Rect) -> Any:
        """``rect`` (root coordinates) of the reduction buffer ``key``."""
        buf, brect = self.redbufs[key]
        return buf[rect.to_slices(brect.lo)]

    def drop_root(self, uid: int) -> None:
        for k in [k for k in self.arrays if k[1] == uid]:
            del self.arrays[k]

    # -- actions (run on workers) -------------------------------------------------
    def run_copy(self, c: Copy, root: Any, field: str) -> None:
        if c.buffer is None:
            dst, src = self.instance(c.dst, root, field), self.instance(c.src, root, field)
            for r in c.rects:
                sl = r.to_slices()
                if self.gpu_of:
                    from . import gpu
                    gpu.copy_into(dst[sl], src[sl])
                else:
                    dst[sl] = src[sl]
        else:
            buf, brect = self.redbufs[c.buffer]
            for r in c.rects:
                self.staging[(c.id, r)] = self.to_memory(buf[r.to_slices(brect.lo)], c.dst)

    def run_prologue(self, actions: list, root: Any, field: str) -> None:
        for a in actions:
            dst = self.instance(a.memory, root, field)[a.rect.to_slices()]
            if isinstance(a, FillAction):
                dst[...] = a.value
            elif isinstance(a, FoldAction):
                if a.staged is not None:
                    src = self.staging.pop((a.staged, a.rect))
                else:
                    src = self.reduction_part(a.buffer, a.rect)
                FOLD[a.redop](dst, src, out=dst)

    def keep_only(self, live: set) -> None:
        """Drop reduction buffers no coherence piece refers to."""
        for k in [k for k in self.redbufs if k not in live]:
            del self.redbufs[k]
