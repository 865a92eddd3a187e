"""The NCCL transport of a collective (docs/seam.md section 3): GPU groups
run ``reduce_scatter``, ``all_gather`` and ``all_reduce`` as ONE NCCL call
per position, through ``cupy.cuda.nccl`` (NVIDIA's NCCL; the calls are
ncclReduceScatter / ncclAllGather / ncclAllReduce, grouped with
ncclGroupStart/End so one process can drive several of its GPUs).

When: every local buffer of the collective is a GPU array, its length is a
whole number of equal chunks (collective sync pads every row so,
nn/sync.py), the backend has NCCL (CuPy built with it, or the emulated
backend, runtime/emunccl.py) and ``LEGIONPY_NCCL`` is not ``0``. Otherwise
the other transports run (runtime/collectives.py: peer copies along the
rule's steps in one process, mpi4py across ranks).

Communicators: one NCCL communicator per group (its positions are the
NCCL ranks, position ``p`` owning chunk ``p``), made on first use and
cached. In one process ``ncclCommInitAll`` over the group's GPUs; across
processes the lowest rank of the group makes the unique id and broadcasts
it over the group's MPI sub-communicator (the one the MPI transport uses),
then every rank initialises its local positions inside one NCCL group
(``ncclCommInitRank`` per local GPU). Every rank issues a group's
collectives in the same order (the communicator queue, runtime/core.py),
which is what NCCL requires.

In place, as NCCL allows: the reduce-scatter's receive buffer is chunk
``p`` of position ``p``'s buffer, the all-gather's send buffer is chunk
``p`` too; after a reduce-scatter the rest of the buffer is zeroed (as the
other transports leave it: the next step's gradients accumulate from zero).

Streams and faults: the calls are enqueued on the collective's own stream
per GPU (runtime/streams.py), whose events its successors wait on. Across
processes the transport also polls their completion with the MPI job's
deadline (``LEGIONPY_MPI_TIMEOUT``) and its failure flag
(``Cluster.wait_or_report``, as the MPI transport waits), so a rank that
died inside a collective aborts the communicators (``ncclCommAbort``) and
ends the job with an error naming the collective and the ranks it waited
for, never a hang.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import numpy as np

from .streams import comm_stream_of

__all__ = ["usable", "NCCLTransport", "NcclComms", "CupyNccl", "UID_BYTES"]

#: room for a pickled NCCL unique id (ncclUniqueId is 128 bytes) and its
#: length, broadcast over MPI as one fixed-size message
UID_BYTES = 1024


def enabled() -> bool:
    """``LEGIONPY_NCCL`` is not ``0`` (default on)."""
    return os.environ.get("LEGIONPY_NCCL", "1").strip() not in ("0", "off", "false")


def usable(spec: Any, bufs: dict[int, Any]) -> bool:
    """Whether ``spec`` can run on NCCL with these local buffers."""
    from .gpu import backend, is_gpu

    if not enabled() or not bufs or spec.nccl is None:
        return False
    n = len(spec.group)
    lens = {len(a) for a in bufs.values()}
    if len(lens) != 1 or lens.pop() % n or not all(is_gpu(a) for a in bufs.values()):
        return False
    return backend().nccl is not None


class NcclComms:
    """The NCCL communicators of this process, one per group (cached)."""

    def __init__(self) -> None:
        self.cache: dict[tuple, dict[int, Any] | None] = {}

    def get(self, spec: Any, devs: dict[int, int]) -> dict[int, Any] | None:
        """{position: communicator} of this process's positions of
        ``spec.group``; ``devs``: {position: CUDA ordinal}. None when two
        positions of the group share a GPU (NCCL refuses a communicator
        with a GPU twice: two devices or ranks on one GPU, as the tests run
        on one-GPU machines); the caller takes another transport."""
        from .gpu import backend

        if spec.group in self.cache:
            return self.cache[spec.group]
        nccl = backend().nccl
        n = len(spec.group)
        if spec.comm is None:  # every position in this process
            if len(set(devs.values())) < n:
                self.cache[spec.group] = None
                return None
            made = nccl.init_all([devs[p] for p in range(n)])
            comms = dict(enumerate(made))
        else:
            if _shared_gpu(spec, devs):
                self.cache[spec.group] = None
                return None
            mpi_comm, _, cl = spec.comm
            buf = np.zeros(UID_BYTES, np.uint8)
            if mpi_comm.Get_rank() == 0:
                raw = pickle.dumps(nccl.unique_id())
                buf[:4] = np.frombuffer(len(raw).to_bytes(4, "little"), np.uint8)
                buf[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
            req = mpi_comm.Ibcast(buf, root=0)
            _wait_for(spec, f"the unique id of the NCCL communicator of {spec.name}", req.Test)
            size = int.from_bytes(buf[:4].tobytes(), "little")
            uid = pickle.loads(buf[4:4 + size].tobytes())
            nccl.group_start()
            try:
                comms = {p: nccl.init_rank(n, uid, p, devs[p], mpi_comm) for p in spec.local}
            finally:
                nccl.group_end()
        self.cache[spec.group] = comms
        return comms


def _shared_gpu(spec: Any, devs: dict[int, int]) -> bool:
    """Across processes: whether two positions of the group are one GPU
    (same host, same ordinal). Every rank of the group contributes its
    positions' (host, ordinal) codes to one all-reduce, so all decide alike."""
    import socket
    import zlib

    from mpi4py import MPI

    mpi_comm = spec.comm[0]
    host = zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF
    mine = np.full(len(spec.group), -1, np.int64)
    for p, k in devs.items():
        mine[p] = host * 4096 + k
    every = np.empty_like(mine)
    req = mpi_comm.Iallreduce(mine, every, op=MPI.MAX)
    _wait_for(spec, f"the GPUs of the group of {spec.name}", req.Test)
    return len(set(every.tolist())) < len(spec.group)


def _wait_for(spec: Any, what: str, test: Any, abort: Any = None) -> None:
    """Across processes: poll ``test()`` with the job's deadline and failure
    flag; on failure an error naming the collective (after ``abort()``)."""
    spec.comm[2].wait_or_report([], lambda: what, f"collective {spec.name} ({spec.kind} over "
                                f"devices {list(spec.group)}, NCCL)", test=test, abort=abort)


class NCCLTransport:
    """One NCCL call per local position, in one NCCL group (module doc). The
    caller orders the buffers' earlier work first (their prologues) and
    zeroes what a reduce-scatter leaves outside each position's chunk;
    :meth:`run` returns None, having done nothing, when the group's GPUs
    repeat (NCCL refuses that): the caller takes another transport."""

    @staticmethod
    def run(spec: Any, bufs: dict[int, Any]) -> list[dict]:
        from .gpu import backend

        nccl = backend().nccl
        comms_of: NcclComms = spec.nccl
        n = len(spec.group)
        n_elems = len(next(iter(bufs.values())))
        c = n_elems // n
        devs = {p: a.device.id for p, a in bufs.items()}
        if spec.comm is None:
            devs = {p: devs[p] for p in range(n)}
        comms = comms_of.get(spec, devs)
        if comms is None:
            return None
        # the collective's own streams (runtime/streams.py): successors wait on
        # their events; a GPU collective runs nowhere else
        streams = {p: comm_stream_of(spec.group[p]) for p in bufs}
        if any(s is None for s in streams.values()):
            raise RuntimeError(f"NCCL collective {spec.name} outside its communicator's "
                               "streams (runtime/streams.py Streams._collective)")
        t0 = time.perf_counter()
        work = nccl.launch(spec.kind, {p: comms[p] for p in bufs}, bufs, c, streams)
        if spec.comm is not None:  # across processes: a dead peer must not hang
            others = spec.comm[2].others(spec.comm[0])
            _wait_for(spec, f"the other ranks {others} in NCCL collective {spec.name} "
                            f"({spec.kind} over devices {list(spec.group)}, "
                            f"{spec.nbytes:.0f} bytes)", work.done, abort=work.abort)
        else:
            work.done()  # enqueued on the streams (the emulation applies it here)
        return [{"src": spec.group[min(bufs)], "dst": None, "bytes": spec.nbytes, "start": t0,
                 "end": time.perf_counter(), "nccl": spec.kind}]


class _CupyWork:
    def __init__(self, events: list, comms: list) -> None:
        self.events, self.comms = events, comms

    def done(self) -> bool:
        return all(e.done for e in self.events)

    def abort(self) -> None:
        for c in self.comms:
            c.abort()


class CupyNccl:
    """The NCCL interface of the CuPy backend (``cupy.cuda.nccl``): pointers
    into the flat buffers, in place."""

    def __init__(self, cupy: Any) -> None:
        from cupy.cuda import nccl

        self.cp, self.nc = cupy, nccl
        self.types = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                      "float16": nccl.NCCL_FLOAT16, "int32": nccl.NCCL_INT32,
                      "int64": nccl.NCCL_INT64}

    def unique_id(self) -> Any:
        return self.nc.get_unique_id()

    def init_all(self, devices: list[int]) -> list:
        return self.nc.NcclCommunicator.initAll(list(devices))

    def init_rank(self, n: int, uid: Any, rank: int, k: int, bootstrap: Any = None) -> Any:
        with self.cp.cuda.Device(k):
            return self.nc.NcclCommunicator(n, uid, rank)

    def group_start(self) -> None:
        self.nc.groupStart()

    def group_end(self) -> None:
        self.nc.groupEnd()

    def launch(self, kind: str, comms: dict, bufs: dict, c: int, streams: dict) -> _CupyWork:
        nc = self.nc
        events = []
        self.group_start()
        try:
            for p, a in bufs.items():
                comm, s = comms[p], streams[p]
                dt, size = self.types[a.dtype.name], a.dtype.itemsize
                base = a.data.ptr
                with self.cp.cuda.Device(a.device.id):
                    if kind == "reduce_scatter":
                        comm.reduceScatter(base, base + p * c * size, c, dt, nc.NCCL_SUM, s.ptr)
                    elif kind == "all_gather":
                        comm.allGather(base + p * c * size, base, c, dt, s.ptr)
                    else:
                        comm.allReduce(base, base, len(a), dt, nc.NCCL_SUM, s.ptr)
        finally:
            self.group_end()
        for p, a in bufs.items():
            with self.cp.cuda.Device(a.device.id):
                ev = self.cp.cuda.Event(disable_timing=True)
                ev.record(streams[p])
                events.append(ev)
        return _CupyWork(events, list(comms.values()))


def cupy_nccl(cupy: Any) -> CupyNccl | None:
    """CuPy's NCCL, or None when CuPy was built without it."""
    try:
        from cupy.cuda import nccl

        if hasattr(nccl, "available") and not nccl.available:
            return None
        return CupyNccl(cupy)
    except (ImportError, AttributeError):
        return None
