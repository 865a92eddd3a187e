"""Futures: the value a task returns, available once it ran.

``Future.get()`` waits for the producing task (draining the serial executor
or blocking on the worker threads) and returns its result, or raises the
:class:`~legionpy.errors.TaskError` that names the task and point. Under
MPI, the result of a task another rank ran is fetched from that rank on the
first ``get()`` (one request per owning rank for a whole FutureMap) and
kept; a Future passed to a task on another rank is sent there by a
transfer op the launch inserts (runtime/replication.py). A Future
passed as an argument to a later task makes that task wait for the
producer, and the body receives the value. A :class:`FutureMap` holds one
Future per point of an index launch; passed to another index launch it
projects by color (point p receives ``fm[p]``).

>>> import legionpy as lp
>>> @lp.task
... def one():
...     return 1
>>> one().get()
1
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import TaskError
from .scheduler import FAILED, Op, Scheduler

__all__ = ["Future", "FutureMap", "gather_maps"]


class Future:
    """Result of one task (or a ready value)."""

    __slots__ = ("_op", "_sched")

    def __init__(self, op: Op, sched: Scheduler) -> None:
        self._op = op
        self._sched = sched

    @property
    def op_id(self) -> int:
        return self._op.id

    def done(self) -> bool:
        return self._op.state >= 2

    def wait(self, timeout: float | None = None) -> None:
        self._sched.wait(self._op, timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The task's return value; raises TaskError if it (or a dependence) failed."""
        op = self._op
        if op.state < 2:
            self._sched.wait(op, timeout)
        if op.state == FAILED:
            op.error.legionpy_reported = True  # the exit check leaves it to the caller
            raise op.error
        if op.remote:
            self._sched.fetch([op], timeout)
        elif op.event and self._sched.streams is not None:
            self._sched.streams.host_wait(op)  # a GPU result: its kernels have run
        return op.result

    def __repr__(self) -> str:
        return f"Future({self._op.name}, op {self._op.id}, done={self.done()})"


class FutureMap:
    """One Future per color of an index launch, in launch order."""

    __slots__ = ("colors", "_futures")

    def __init__(self, colors: list[tuple], futures: list[Future]) -> None:
        self.colors = colors
        self._futures = dict(zip(colors, futures))

    def __getitem__(self, color: Any) -> Future:
        try:
            return self._futures[color]
        except KeyError:
            key = color if isinstance(color, tuple) else (color,)
            if key in self._futures:
                return self._futures[key]
            raise KeyError(f"color {color!r} is not in this FutureMap "
                           f"(colors {self.colors[:4]}...)") from None

    def __contains__(self, color: Any) -> bool:
        return color in self._futures

    def __len__(self) -> int:
        return len(self.colors)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.colors)

    def items(self) -> Iterator[tuple[tuple, Future]]:
        return iter(self._futures.items())

    def wait(self, timeout: float | None = None) -> None:
        for f in self._futures.values():
            f.wait(timeout)

    def get(self, timeout: float | None = None) -> list[Any]:
        """Every point's result, in color order (raises the first TaskError)."""
        ghosts = [f._op for f in self._futures.values() if f._op.remote]
        if ghosts:
            self.wait(timeout)
            next(iter(self._futures.values()))._sched.fetch(ghosts, timeout)
        return [f.get(timeout) for f in self._futures.values()]

    def gather(self, timeout: float | None = None) -> list[Any]:
        """:meth:`get` as a collective under MPI: every rank calls it for
        this FutureMap at the same point of its program, and each sends the
        results of the points it ran to the others at once, instead of each
        rank asking the owners and waiting for their watchdog
        (``Cluster.exchange``). Without MPI, :meth:`get`. A rank that does
        not call it leaves the others waiting until ``LEGIONPY_MPI_TIMEOUT``,
        which then names the call. :func:`gather_maps` gathers several
        FutureMaps in one exchange."""
        return gather_maps([self], timeout)[0]

    @property
    def collective(self) -> bool:
        """True when :meth:`gather` is a collective (under MPI): every rank
        must call it at the same point of its program, and each call costs
        an exchange between the ranks, so callers batch them
        (:func:`gather_maps`)."""
        f = next(iter(self._futures.values()), None)
        return f is not None and getattr(f._sched, "exchange", None) is not None

    def __repr__(self) -> str:
        return f"FutureMap({len(self.colors)} points)"


def gather_maps(maps: list[FutureMap], timeout: float | None = None) -> list[list[Any]]:
    """:meth:`FutureMap.gather` of each of ``maps`` (in order), as one
    collective under MPI: every rank waits for the points it holds, ghosts
    included, then sends the results of those it ran and receives the rest
    in one exchange (two small all-gathers), whatever the number of maps.
    ``fit`` under ``mpirun`` gathers its steps' results this way in batches:
    one exchange per step kept the ranks' control threads polling beside
    their workers on a bound core (lenet data, ``mpirun -n 2``: 4.2-4.5 ms
    a step against 3.4-3.5 without the per-step exchange; issue 26), and a
    per-step all-gather over every rank of a large job is a cost that grows
    with the ranks. Without MPI, each map's :meth:`FutureMap.get`."""
    futures = [f for fm in maps for f in fm._futures.values()]
    exchange = getattr(futures[0]._sched, "exchange", None) if futures else None
    if exchange is None:
        return [fm.get(timeout) for fm in maps]
    # every point finished here first, ghosts included, as in get(): on a
    # GPU runtime a ghost finishes by running a stream marker, whose None
    # would overwrite a result that arrived before it ran (CI lost a loss)
    for fm in maps:
        fm.wait(timeout)
    mine = [f for f in futures if not f._op.remote]
    for f in mine:
        try:
            f.get(timeout)  # finished, and a GPU result on the host
        except TaskError:
            pass  # sent to the others as failed; raised below
    first = next(iter(maps[0]._futures.values()))._op.name
    what = (f"FutureMap.gather of {len(futures)} points (first: {first})" if len(maps) == 1
            else f"the gather of {len(maps)} FutureMaps' {len(futures)} points (first: {first})")
    exchange([f._op for f in mine], [f._op for f in futures if f._op.remote], what, timeout)
    return [[f.get(timeout) for f in fm._futures.values()] for fm in maps]
