"""What a point task runs: prologue, argument views, Future values, the body.

A :class:`PointBody` is the callable the scheduler runs for one point task.
It holds everything the launch-time analysis decided (the prologue of fills
and folds, one view builder per region argument) apart from the launch's
plain arguments, so a trace replay (tracing.py) can run the recorded
analysis with the arguments of a new launch: :meth:`PointBody.rebind`.

Views: a region argument's :class:`RegionView` is built on the worker when
the task starts (its instances may be made by an earlier task of the same
device). Views are built once per body and kept, so replays reuse them
("argument views bound once"); a view into reduction buffers is rebuilt
when one of its buffers was replaced (buffers go back to the pool after
their last consumer, are dropped at fences and grown to new rects).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PrivilegeError
from .instances import Instances, RegionView

__all__ = ["PointBody", "build_view"]


class PointBody:
    """Run one point: ``body(op)`` returns the task's result."""

    __slots__ = ("fn", "name", "point", "args", "kwargs", "rargs", "prologues", "views",
                 "fut_pos", "inst", "cache", "color", "projected", "device")

    def __init__(self, fn: Any, name: str, point: tuple | None, args: tuple, kwargs: dict,
                 rargs: list | None, prologues: list | None, views: list | None,
                 fut_pos: list | None, inst: Instances) -> None:
        self.fn = fn
        self.name = name
        self.point = point
        self.args = args
        self.kwargs = kwargs
        self.rargs = rargs
        self.prologues = prologues
        self.views = views
        self.fut_pos = fut_pos
        self.inst = inst
        #: ``[views]``, shared by every rebind: ``[instance generation, [[pos,
        #: view, reduction buffer keys, their buffer entries when built, region,
        #: fieldspecs]]]``; rebuilt when an instance was grown since
        self.cache: list = [None]
        self.color: tuple | None = None  # index launches: the point's color (replay projection)
        self.projected: tuple = ()  # positions of FutureMap arguments projected by color
        #: GPU tasks: ``(Device class, ordinal)``: the whole body (prologue
        #: fills and folds, views, reduction buffers, the task) runs with that
        #: device current (gpu.py); None on CPU devices
        self.device: tuple | None = None

    def rebind(self, args: tuple, kwargs: dict) -> PointBody:
        """This body with the plain arguments of a new launch of the same
        task over the same regions (``args`` unprojected: FutureMaps are
        projected by this point's color; region arguments keep the recorded
        subregions)."""
        b = type(self).__new__(type(self))
        b.fn, b.name, b.point, b.rargs = self.fn, self.name, self.point, self.rargs
        b.prologues, b.views = self.prologues, self.views
        b.fut_pos, b.inst = self.fut_pos, self.inst
        b.color, b.projected = self.color, self.projected
        b.device = self.device
        a = list(args)
        if self.rargs:
            old = self.args
            for pos, _, _ in self.rargs:
                a[pos] = old[pos]
        for pos in self.projected:
            a[pos] = a[pos][self.color]
        b.args = tuple(a)
        b.kwargs = kwargs
        b.cache = self.cache
        return b

    def _views(self) -> list:
        """``[(pos, view)]``, built once and reused: a view into reduction
        buffers is rebuilt only when one of its buffers was replaced (dropped
        at a fence, or grown)."""
        cached = self.cache[0]
        inst = self.inst
        if cached is not None and cached[0] != inst.generation:
            cached = None  # an instance was grown since: views of the old arrays are stale
        if cached is None:
            cached = []
            for pos, region, fieldspecs in self.views:
                keys = tuple(buf[0] for _, _, _, buf in fieldspecs if buf is not None)
                view = build_view(inst, region, fieldspecs)
                cached.append([pos, view, keys, [inst.redbufs.get(k) for k in keys],
                               region, fieldspecs])
            self.cache[0] = [inst.generation, cached]
            _regrown(inst, cached)
            return [(c[0], c[1]) for c in cached]
        red = inst.redbufs
        rebuilt = False
        for c in cached[1]:
            keys = c[2]
            if keys:
                entries = [red.get(k) for k in keys]
                if any(e is None or e is not old for e, old in zip(entries, c[3])):
                    c[1] = build_view(inst, c[4], c[5])
                    c[3] = [red.get(k) for k in keys]
                    rebuilt = True
        if rebuilt:
            _regrown(inst, cached[1])
        return [(c[0], c[1]) for c in cached[1]]

    def __call__(self, op: Any) -> Any:
        if self.device is not None:
            cls, k = self.device
            with cls(k):
                return self._run()
        return self._run()

    def _run(self) -> Any:
        a = list(self.args)
        kw = self.kwargs
        if self.prologues:
            run = self.inst.run_prologue
            for root, f, acts in self.prologues:
                run(acts, root, f)
        if self.views:
            for pos, view in self._views():
                a[pos] = view
        if self.fut_pos:
            kw = dict(kw)
            for p in self.fut_pos:
                if isinstance(p, int):
                    a[p] = a[p]._op.result
                else:
                    kw[p] = kw[p]._op.result
        try:
            return self.fn(*a, **kw)
        except ValueError as exc:
            if "read-only" in str(exc):
                raise PrivilegeError(
                    f"task {self.name!r}{'' if self.point is None else f' point {self.point}'} "
                    f"wrote to a read-only array ({exc}); it holds {_privs_text(self.rargs)}; "
                    "declare RW or WD for fields it writes") from exc
            raise


def _regrown(inst: Instances, cached: list) -> None:
    """Rebuild the views cut from a reduction buffer that a LATER argument
    of the same task grew (two reductions into one region, e.g. the flat
    gradient buffer of collective sync): growing replaces the array."""
    red = inst.redbufs
    for c in cached:
        if c[2] and any(red.get(k) is not old for k, old in zip(c[2], c[3])):
            c[1] = build_view(inst, c[4], c[5])
            c[3] = [red.get(k) for k in c[2]]


def build_view(inst: Instances, region: Any, fieldspecs: list) -> RegionView:
    """The RegionView a point task body receives for one region argument
    (run on the worker, when the task starts). ``fieldspecs``: ``(field,
    memory, mode, buffer)``, buffer ``(key, redop)`` for reductions."""
    root, rect = region.root, region.rect
    arrays = {}
    part = inst.part
    for f, mem, mode, buf in fieldspecs:
        if buf is not None:  # (buffer key, redop): accumulate into mem's buffer
            arrays[f] = inst.reduction_view(buf[0], rect, buf[1], root.fields[f], mem)
            continue
        a = part(mem, root, f, rect)
        if mode == "read" and type(a) is np.ndarray:
            a = a.view()
            a.flags.writeable = False
        arrays[f] = a
    return RegionView(region, rect, arrays)


def _privs_text(rargs: Any) -> str:
    return ", ".join(f"{ps!r} on {r.name}" for _, r, ps in rargs or ())
