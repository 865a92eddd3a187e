"""A trace of what ran: every task, copy and fill with its queue, bytes,
times and dependences. The record the simulator is compared against.

A record (``Trace.records()``) is a dict::

    {"id": 12, "name": "axpy", "kind": "compute",     # compute|update|copy|fill
     "device": 1, "link": None,                        # a device id, or link (src, dst)
     "bytes": 0,                                       # copies: volume x itemsize
     "start": 0.0132, "end": 0.0135,                   # s, perf_counter - runtime start
     "deps": [3, 7],                                   # ids of ops it waited for
     "point": (1, 0), "launch": 9, "tag": None, "rank": 0}

``deps`` lists every op the runtime made it wait for: logical dependences
(including anti and output ones, possibly transitively implied) and the
copies feeding it. Memory -1 is host memory (``Region.read``/``write``).
Fills (``lp.fill``) are lazy: a ``fill`` record has ``device`` None and zero
duration; the data is materialised inside the prologue of its first reader.

``to_chrome()`` gives Chrome trace / Perfetto JSON: one complete event
("ph": "X", microseconds) per record, ``pid`` = rank, one ``tid`` per device
and link (named by metadata events), the record itself under ``args``.
``LEGIONPY_TRACE=file.json`` traces from start and writes the file at exit.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..atomic import atomic_write_json
from .devices import queue_name
from .scheduler import FAILED, Op

__all__ = ["Trace"]


class Trace:
    """Collects finished ops while enabled. ``start()``, ``stop()``,
    ``clear()``, ``records()``, ``to_chrome()``, ``save(path)``.

    ``taps``: other Traces that receive every op this one is handed, whether
    or not this one records (the AdaptiveMapper reads its own tap and never
    starts, clears or reads the user's trace)."""

    def __init__(self, t0: float, rank: int = 0) -> None:
        self.t0 = t0
        self.rank = rank
        self.recording = False
        self.taps: list[Trace] = []
        self._ops: list[Op] = []
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """True while this trace records or a tap listens."""
        return self.recording or bool(self.taps)

    def start(self, clear: bool = True) -> None:
        if clear:
            self.clear()
        self.recording = True

    def stop(self) -> list[dict]:
        """Stop recording and return the records so far."""
        self.recording = False
        return self.records()

    def clear(self) -> None:
        with self._lock:
            self._ops = []

    def add(self, op: Op) -> None:
        if self.recording:
            self._ops.append(op)  # list.append is atomic under the GIL
        for tap in self.taps:
            tap.add(op)

    def __len__(self) -> int:
        return len(self._ops)

    @contextlib.contextmanager
    def tap(self) -> Iterator[Trace]:
        """``with rt.trace.tap() as t:`` a fresh Trace that records every op
        finished inside the block, without starting, stopping or clearing
        this one (measurements inside a run traced by ``LEGIONPY_TRACE`` leave
        the user's trace whole); ``t.records()`` after the block."""
        t = Trace(self.t0, self.rank)
        t.recording = True
        self.taps.append(t)
        try:
            yield t
        finally:
            self.taps.remove(t)
            t.recording = False

    def records(self) -> list[dict]:
        """Every recorded op, sorted by id."""
        with self._lock:
            ops = sorted(self._ops, key=lambda o: o.id)
        return [self._record(o) for o in ops]

    def _record(self, op: Op) -> dict[str, Any]:
        link = op.queue if isinstance(op.queue, tuple) else None
        if op.kind == "collective":  # one op; its steps' link events (collectives.py)
            kind, group, alg, nbytes = op.tag[1].info()
            events = op.result if isinstance(op.result, list) else ()
            return {"id": op.id, "name": op.name, "kind": "collective", "collective": kind,
                    "group": list(group), "algorithm": alg, "bytes": nbytes,
                    "transport": _transport(events),
                    "device": op.queue, "link": None, "start": op.start - self.t0,
                    "end": op.end - self.t0, "deps": list(op.deps), "point": None,
                    "launch": None, "tag": op.name, "rank": self.rank,
                    "failed": op.state == FAILED, "remote": op.remote,
                    "steps": [dict(e, start=e["start"] - self.t0, end=e["end"] - self.t0)
                              for e in events]}
        return {
            "id": op.id, "name": op.name, "kind": op.kind,
            "device": None if link is not None else op.queue,
            "link": link, "bytes": op.bytes,
            "start": op.start - self.t0, "end": op.end - self.t0,
            "deps": list(op.deps), "point": op.point, "launch": op.launch,
            "tag": op.tag if isinstance(op.tag, (str, int, float, type(None))) else repr(op.tag),
            "rank": self.rank, "failed": op.state == FAILED,
        }

    def to_chrome(self) -> dict[str, Any]:
        recs = self.records()
        tids: dict[Any, int] = {}
        events: list[dict[str, Any]] = []
        for r in recs:
            q = tuple(r["link"]) if r["link"] is not None else r["device"]
            if q not in tids:
                tids[q] = len(tids)
            events.append({
                "name": r["name"], "cat": r["kind"], "ph": "X",
                "ts": r["start"] * 1e6, "dur": max(r["end"] - r["start"], 0.0) * 1e6,
                "pid": self.rank, "tid": tids[q],
                "args": {k: v for k, v in r.items() if k not in ("name", "start", "end")},
            })
        for q, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                           "args": {"name": queue_name(q)}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike) -> None:
        """Write Chrome trace JSON atomically (temp file + rename)."""
        atomic_write_json(path, self.to_chrome(), default=_jsonable)


def write_merged(path: str | os.PathLike, parts: list[list[dict]],
                 starts: list[float] | None = None) -> None:
    """One Chrome trace of every rank's events (``parts[rank]``), each rank a
    process named ``rank N`` (an ``mpirun`` job's ``LEGIONPY_TRACE``).
    ``starts[rank]``: the wall clock (seconds) at which that rank's
    timestamps are 0; every rank's events are moved onto rank 0's clock.
    Without it a rank that started 2.8 ms after rank 0 showed each copy
    it received ending before it was sent (alexnet model, ``mpirun -n 2``)."""
    shift = [0.0] * len(parts) if starts is None else [(t - starts[0]) * 1e6 for t in starts]
    events = [_shifted(e, dt) if dt else e for part, dt in zip(parts, shift) for e in part]
    events += [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}}
               for r in range(len(parts))]
    atomic_write_json(path, {"traceEvents": events, "displayTimeUnit": "ms"}, default=_jsonable)


def _shifted(event: dict, dt_us: float) -> dict:
    """``event`` ``dt_us`` later: its timestamp and, for a collective, its
    steps' (seconds, under ``args``)."""
    if "ts" not in event:
        return event
    out = dict(event, ts=event["ts"] + dt_us)
    steps = (event.get("args") or {}).get("steps")
    if steps:
        dt = dt_us * 1e-6
        out["args"] = dict(event["args"], steps=[dict(st, start=st["start"] + dt,
                                                     end=st["end"] + dt) for st in steps])
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return repr(v)


def _transport(events: Any) -> str | None:
    """Which transport ran a collective (runtime/collectives.py), from its
    link events: ``nccl``, ``mpi``, ``in-process`` (the rule's steps), or
    None (not run here: a group of one, or a ghost on another rank)."""
    for e in events:
        if "nccl" in e:
            return "nccl"
        if "mpi" in e:
            return "mpi"
    return "in-process" if events else None
