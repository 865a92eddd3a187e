"""NCCL on the emulated GPU backend (runtime/emugpu.py), so CI runs the NCCL
transport (runtime/nccl.py) without a GPU: the same communicator cache,
unique-id broadcast, in-place chunk layout, grouped calls, completion
polling and abort as on CuPy; only the wire differs.

A call's data movement is an emulated kernel on the position's NCCL stream
(the race detector sees its reads at launch and its writes at completion).
In one process the positions' arrays are combined directly. Across
processes each process combines its local positions, then the bytes move
with one ``Iallreduce`` (sum) over the MPI communicator that broadcast the
communicator's unique id (an all-gather is a sum of disjoint chunks), and
the work completes when that request does: a dead peer is seen by the
transport's deadline, as with real NCCL.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import emugpu

__all__ = ["EmuNccl", "EmuComm"]


class EmuComm:
    """One member (NCCL rank ``rank`` of ``n``) of communicator ``uid`` on
    emulated GPU ``k``; ``wire``: the MPI communicator across processes
    (None when every member is in this process)."""

    __slots__ = ("n", "uid", "rank", "k", "wire", "aborted")

    def __init__(self, n: int, uid: bytes, rank: int, k: int, wire: Any = None) -> None:
        self.n, self.uid, self.rank, self.k, self.wire = n, uid, rank, k, wire
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def _combine(kind: str, arrays: dict[int, np.ndarray], c: int, n: int) -> np.ndarray:
    """This process's contribution: the sum of its positions' buffers
    (reduce-scatter, all-reduce) or its positions' own chunks (all-gather)."""
    first = next(iter(arrays.values()))
    out = np.zeros(n * c, first.dtype)
    for p, a in arrays.items():
        if kind == "all_gather":
            out[p * c:(p + 1) * c] = a[p * c:(p + 1) * c]
        else:
            out += a
    return out


class _Work:
    def __init__(self, kind: str, bufs: dict, c: int, streams: dict, total: Any,
                 req: Any, comms: list) -> None:
        self.kind, self.bufs, self.c, self.streams = kind, bufs, c, streams
        self.total, self.req, self.comms = total, req, comms
        self.finished = False

    def done(self) -> bool:
        if self.finished:
            return True
        if self.req is not None and not self.req.Test():
            return False
        self._apply()
        self.finished = True
        return True

    def _apply(self) -> None:
        total, c = self.total, self.c
        for p, a in self.bufs.items():
            k = a.device.id

            def write(a: Any = a, p: int = p) -> None:
                if self.kind == "reduce_scatter":
                    a._a[p * c:(p + 1) * c] = total[p * c:(p + 1) * c]
                else:
                    a._a[...] = total

            with emugpu.Device(k), self.streams[p]:
                emugpu._kernel(f"nccl {self.kind}", write, [], [a], k)

    def abort(self) -> None:
        for comm in self.comms:
            comm.abort()


class EmuNccl:
    """The backend's NCCL interface (runtime/nccl.py CupyNccl's methods)."""

    def unique_id(self) -> bytes:
        return os.urandom(16)

    def init_all(self, devices: list[int]) -> list[EmuComm]:
        if len(set(devices)) < len(devices):  # as ncclCommInitAll
            raise RuntimeError(f"NCCL error: invalid usage (duplicate GPU in {devices})")
        uid = self.unique_id()
        return [EmuComm(len(devices), uid, r, k) for r, k in enumerate(devices)]

    def init_rank(self, n: int, uid: bytes, rank: int, k: int, bootstrap: Any = None) -> EmuComm:
        return EmuComm(n, uid, rank, k, bootstrap)

    def group_start(self) -> None:
        pass

    def group_end(self) -> None:
        pass

    def launch(self, kind: str, comms: dict, bufs: dict, c: int, streams: dict) -> _Work:
        members = list(comms.values())
        n = members[0].n
        if any(m.aborted for m in members):
            raise RuntimeError("NCCL communicator was aborted")
        for p, a in bufs.items():  # the reads, on each position's stream
            k = a.device.id
            with emugpu.Device(k), streams[p]:
                emugpu._kernel(f"nccl {kind}", lambda: None, [a], [], k)
        total = _combine(kind, {p: a._a for p, a in bufs.items()}, c, n)
        wire = members[0].wire
        req = None
        if wire is not None and len(bufs) < n:
            from mpi4py import MPI

            out = np.empty_like(total)
            req = wire.Iallreduce(total, out, op=MPI.SUM)
            total = out
        return _Work(kind, bufs, c, streams, total, req, members)
