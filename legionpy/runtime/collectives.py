"""Collective operations in the runtime: ``reduce_scatter``, ``all_gather``
and ``all_reduce`` over a device group, run as ONE op (docs/seam.md).

The steps are the shared rule's (:mod:`legionpy.collectives`: ring,
hierarchical or tree, Patarasuk and Yuan 2009; Thakur, Rabenseifner and
Gropp 2005); this module runs them. A collective is launched like a single
task (so it is analysed, traced and replayed like one, runtime/tracing.py)
with one region argument per group position: the position's flat buffer
(a 1-D subregion), mapped to the position's device memory. The runtime
(core.py) gives it kind ``"collective"`` and the queue ``comm:<group>``:
one FIFO communicator per distinct group, as an NCCL communicator runs its
collectives one after another on its stream (collectives of one group are
also chained in launch order, so every rank issues them in the same order).

Transports, one interface (:func:`run_collective`):

- **in one process** (:class:`InProcess`): the rule's steps, chunk by chunk,
  between the positions' arrays (numpy on CPU devices; GPU arrays through
  runtime/gpu.py peer copies, the same code path on CuPy and on the emulated
  backend); each step is timed and returned as a link event ``{"src",
  "dst", "bytes", "start", "end"}`` that the trace keeps with the op;
- **under mpirun** (:class:`MPITransport`): mpi4py non-blocking collectives
  (``Ireduce_scatter`` with the ranks' chunk counts, ``Iallgatherv``,
  ``Iallreduce``) on a sub-communicator cached per set of ranks (made on
  the launching thread, where every rank makes it in the same order); a
  rank's local positions are first summed (reduce-scatter) or filled
  (all-gather) in process, so the rank-local devices of a group map onto
  one communicator rank. Waits poll with ``LEGIONPY_MPI_TIMEOUT`` and end
  at once when another rank failed (runtime/mpi.py): a rank that died
  inside a collective ends the job with an error naming the collective and
  the ranks it waited for, never a hang.

- **on GPUs** (:class:`~legionpy.runtime.nccl.NCCLTransport`, runtime/nccl.py):
  NCCL through ``cupy.cuda.nccl`` (emulated in CI, runtime/emunccl.py), one
  communicator per group, its unique id broadcast over MPI across
  processes; ``LEGIONPY_NCCL=0`` falls back to the two transports above.

A group of one device is a no-op.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import collectives as C
from ..errors import LaunchError
from .body import PointBody
from .nccl import NcclComms, NCCLTransport, usable
from .streams import comm_barrier

__all__ = ["Collective", "CollectiveSpec", "CollectiveBody", "InProcess", "MPITransport",
           "run_collective", "comm_queue", "launch_point"]


def comm_queue(group: tuple[int, ...]) -> str:
    """The scheduler queue (and trace device) of a group's communicator."""
    return "comm:" + ",".join(map(str, group))


class CollectiveSpec:
    """What one collective launch runs: ``kind`` over ``group`` (device ids,
    position ``p`` owns chunk ``p``), ``algorithm``, ``nbytes`` (the whole
    flat buffer), ``node_of`` (hierarchical), ``local`` (positions whose
    memory this process holds), ``comm`` (the MPI sub-communicator and this
    rank's chunk range, or None in one process)."""

    __slots__ = ("kind", "group", "algorithm", "nbytes", "node_of", "local", "comm", "name",
                 "nccl")

    def __init__(self, kind: str, group: tuple, algorithm: str, nbytes: float, name: str,
                 node_of: Any = None) -> None:
        C.steps(kind, group, 0, algorithm, node_of)  # validates kind, group, algorithm
        self.kind, self.group, self.algorithm = kind, tuple(group), algorithm
        self.nbytes, self.name, self.node_of = float(nbytes), name, node_of
        self.local: tuple[int, ...] = tuple(range(len(group)))
        self.comm: Any = None
        self.nccl: Any = None  # this process's NCCL communicators (runtime/nccl.py)

    def info(self) -> tuple:
        """``(collective, group, algorithm, bytes)``: the trace's and the
        mirror's description of the op."""
        return (self.kind, self.group, self.algorithm, self.nbytes)


class CollectiveBody(PointBody):
    """A collective's body: the prologues (folds of the gradients' reduction
    buffers, fills) and views of the local positions only, each on its own
    device, then the transport. Returns the per-step link events."""

    __slots__ = ("spec",)

    def rebind(self, args: tuple, kwargs: dict) -> CollectiveBody:
        b = super().rebind(args, kwargs)
        b.spec = self.spec
        return b

    def _run(self) -> Any:
        spec, inst = self.spec, self.inst
        mems = {spec.group[p] for p in spec.local}
        for root, f, acts in self.prologues or ():
            mine = [a for a in acts if a.memory in mems]
            if mine:
                with _device_of(inst, mine[0].memory):
                    inst.run_prologue(mine, root, f)
        bufs: dict[int, Any] = {}
        views = {pos: (region, specs) for pos, region, specs in self.views or ()}
        from .body import build_view

        for p in spec.local:
            region, specs = views[p]
            with _device_of(inst, spec.group[p]):
                bufs[p] = build_view(inst, region, specs)[specs[0][0]].reshape(-1)
        t0 = time.perf_counter()
        out = run_collective(spec, bufs)  # GPUs: successors wait on its streams' events
        _stand_in(spec.name, t0)
        return out


def _stand_in(name: str, t0: float) -> None:
    """A stand-in run (optimizer/mirror.py install_standins): the collective
    lasts at least its simulated time."""
    from . import current_runtime

    # not get_runtime(): at exit the runtime is closed while it fences, and a
    # collective still in flight then made a new runtime on its worker thread
    # (a world allgather racing MPI_Finalize: "corrupted double-linked list"
    # or a segfault at the end of 10-20% of a 2-rank job's runs)
    rt = current_runtime()
    table = rt.collective_standin if rt is not None else None
    if table:
        time.sleep(max(0.0, table.get(name, 0.0) - (time.perf_counter() - t0)))


def _device_of(inst: Any, mem: int) -> Any:
    import contextlib

    k = inst.gpu_of.get(mem) if inst.gpu_of else None
    if k is None:
        return contextlib.nullcontext()
    from .gpu import backend

    return backend().Device(k)


def run_collective(spec: CollectiveSpec, bufs: dict[int, Any]) -> list[dict]:
    """Run ``spec`` on the local positions' flat buffers ``bufs`` ({position:
    1-D array}); the transport is MPI when ``spec.comm`` is set."""
    if len(spec.group) < 2:
        return []
    if usable(spec, bufs):  # each GPU's call on the stream its prologue ran on: ordered
        events = NCCLTransport.run(spec, bufs)
        if events is not None:
            _finish(spec, bufs, C.chunk_bounds(len(next(iter(bufs.values()))), len(spec.group)))
            return events
    if spec.comm is not None:
        return MPITransport.run(spec, bufs)
    return InProcess.run(spec, bufs)


class InProcess:
    """Every position in this process: the rule's steps between the arrays."""

    @staticmethod
    def run(spec: CollectiveSpec, bufs: dict[int, Any]) -> list[dict]:
        from .gpu import copy_to, is_gpu, on_array

        group = spec.group
        n_elems = len(next(iter(bufs.values())))
        steps = C.steps(spec.kind, group, spec.nbytes, spec.algorithm, spec.node_of)
        nch = 1 if spec.algorithm == "tree" else len(group)
        bounds = [(0, n_elems)] if nch == 1 else C.chunk_bounds(n_elems, nch)
        pos = {d: p for p, d in enumerate(group)}
        events: list[dict] = []
        gpu = any(is_gpu(a) for a in bufs.values())
        if gpu:  # the prologues' folds (each position's stream) before any peer reads
            comm_barrier()
        for rnd in C.rounds(steps):  # a round's messages are read before any is applied
            msgs = []
            for s in rnd:
                src, dst = bufs[pos[s.src]], bufs[pos[s.dst]]
                t0 = time.perf_counter()
                k = dst.device.id if is_gpu(dst) else None
                with on_array(src):
                    pieces = [(bounds[c], src[bounds[c][0]:bounds[c][1]]) for c in s.chunks]
                parts = [(b, copy_to(a, k)) for b, a in pieces]
                msgs.append((s, dst, parts, t0))
            for s, dst, parts, t0 in msgs:
                with on_array(dst):
                    for (lo, hi), data in parts:
                        if s.op == "reduce":
                            dst[lo:hi] += data
                        else:
                            dst[lo:hi] = data
                events.append({"src": s.src, "dst": s.dst, "bytes": s.nbytes,
                               "start": t0, "end": time.perf_counter()})
            if gpu:  # a round's results before the next round's peer copies read them
                comm_barrier()
        _finish(spec, bufs, bounds)
        return events


def _finish(spec: CollectiveSpec, bufs: dict[int, Any], bounds: list) -> None:
    """After a reduce-scatter a position keeps only its chunk (the sum): the
    rest of its gradient buffer is zeroed, so the next step's gradients
    accumulate from zero (the update zeroes the chunk it used)."""
    if spec.kind != "reduce_scatter":
        return
    from .gpu import on_array

    for p, a in bufs.items():
        lo, hi = bounds[p]
        with on_array(a):
            a[:lo] = 0
            a[hi:] = 0


class MPITransport:
    """Positions over several ranks: local positions combined in process,
    then one mpi4py non-blocking collective per rank on the group's cached
    sub-communicator. ``spec.comm``: ``(communicator, [lo, hi) chunk range
    of each communicator rank], cluster)``."""

    @staticmethod
    def run(spec: CollectiveSpec, bufs: dict[int, Any]) -> list[dict]:
        from .gpu import from_host, is_gpu, to_host

        comm, ranges, cl = spec.comm
        n = len(spec.group)
        n_elems = len(next(iter(bufs.values())))
        bounds = C.chunk_bounds(n_elems, n)  # equal chunks of the padded buffer
        c = bounds[0][1] - bounds[0][0]
        me = comm.Get_rank()
        lo, hi = ranges[me]
        if len(bufs) == 1 and n_elems == c * n and type(first := bufs[lo]) is np.ndarray \
                and first.flags.c_contiguous and spec.kind != "all_reduce":
            return MPITransport._direct(spec, first, lo, c, counts_of(ranges, c), comm, cl)
        host = {}
        for p, a in bufs.items():  # padded host copies (the pool's, when on the host)
            h = np.zeros(c * n, a.dtype)
            h[:n_elems] = to_host(a)
            host[p] = h
        dt = host[spec.local[0]].dtype
        MPI = cl.MPI
        counts, displs = counts_of(ranges, c)
        t0 = time.perf_counter()
        if spec.kind == "reduce_scatter":
            send = np.zeros(c * n, dt)
            for a in host.values():
                send += a
            recv = np.empty(counts[me], dt)
            _wait(cl, comm.Ireduce_scatter(send, recv, counts, op=MPI.SUM), spec, comm)
            for p, a in host.items():
                a[...] = 0
                a[p * c:(p + 1) * c] = recv[(p - lo) * c:(p - lo + 1) * c]
        elif spec.kind == "all_gather":
            mine = np.empty(counts[me], dt)
            for p, a in host.items():
                mine[(p - lo) * c:(p - lo + 1) * c] = a[p * c:(p + 1) * c]
            full = np.empty(c * n, dt)
            _wait(cl, comm.Iallgatherv(mine, [full, counts, displs, MPI._typedict[dt.char]]),
                  spec, comm)
            for a in host.values():
                a[...] = full
        else:
            send = np.zeros(c * n, dt)
            for a in host.values():
                send += a
            full = np.empty(c * n, dt)
            _wait(cl, comm.Iallreduce(send, full, op=MPI.SUM), spec, comm)
            for a in host.values():
                a[...] = full
        for p, a in bufs.items():
            if is_gpu(a):
                from_host(a, host[p][:n_elems])
            else:
                a[...] = host[p][:n_elems]
        return [{"src": spec.group[lo], "dst": None, "bytes": spec.nbytes, "start": t0,
                 "end": time.perf_counter(), "mpi": spec.kind}]


    @staticmethod
    def _direct(spec: CollectiveSpec, buf: np.ndarray, p: int, c: int, cd: tuple, comm: Any,
                cl: Any) -> list[dict]:
        """One local position, a host buffer of whole chunks (the flat
        gradient and weight rows of collective sync): MPI reads and writes
        the instance itself (the all-gather in place), no staging copies."""
        counts, displs = cd
        t0 = time.perf_counter()
        if spec.kind == "reduce_scatter":
            recv = np.empty(c, buf.dtype)
            _wait(cl, comm.Ireduce_scatter(buf, recv, counts, op=cl.MPI.SUM), spec, comm)
            buf[...] = 0
            buf[p * c:(p + 1) * c] = recv
        else:
            _wait(cl, comm.Iallgatherv(cl.MPI.IN_PLACE, [buf, counts, displs,
                                                          cl.MPI._typedict[buf.dtype.char]]),
                  spec, comm)
        return [{"src": spec.group[p], "dst": None, "bytes": spec.nbytes, "start": t0,
                 "end": time.perf_counter(), "mpi": spec.kind}]


def counts_of(ranges: list, c: int) -> tuple[list[int], list[int]]:
    """Element counts and displacements of each communicator rank's chunks."""
    return [(h - lw) * c for lw, h in ranges], [lw * c for lw, _ in ranges]


def _wait(cl: Any, req: Any, spec: CollectiveSpec, comm: Any) -> None:
    others = cl.others(comm)
    cl.wait_or_report([req], lambda: f"the other ranks {others} in collective {spec.name} "
                                      f"({spec.kind} over devices {list(spec.group)}, "
                                      f"{spec.algorithm}, {spec.nbytes:.0f} bytes)",
                      f"collective {spec.name} ({spec.kind} over devices {list(spec.group)})")


class Communicators:
    """Sub-communicators of the MPI job, one per set of world ranks, made on
    the launching thread (every rank launches the same collectives in the
    same order, so every rank of the set makes it at the same point). The
    whole job's is a non-blocking ``Idup`` awaited with the cluster's
    deadline, so a rank that died before its first collective ends the job
    with an error instead of a hang; a proper subset of the ranks takes
    ``Create_group`` (blocking: MPI has no non-blocking form)."""

    def __init__(self, cl: Any) -> None:
        self.cl = cl
        self.cache: dict[tuple[int, ...], Any] = {}

    def get(self, ranks: tuple[int, ...], spec: CollectiveSpec) -> Any:
        comm = self.cache.get(ranks)
        if comm is None:
            cl = self.cl
            if cl.rank not in ranks:
                return None
            if len(ranks) == cl.size:
                comm, req = cl.world.Idup()
                cl.wait_or_report([req], lambda: f"ranks {[r for r in ranks if r != cl.rank]} "
                                                 f"to make the communicator of collective "
                                                 f"{spec.name} (devices {list(spec.group)})",
                                  f"collective {spec.name} ({spec.kind} over devices "
                                  f"{list(spec.group)})")
            else:
                grp = cl.world.Get_group().Incl(list(ranks))
                comm = cl.world.Create_group(grp, tag=hash(ranks) % 30000)
            self.cache[ranks] = comm
        return comm


def check_group(group: tuple, devices: list) -> None:
    for d in group:
        if not 0 <= d < len(devices):
            raise LaunchError(f"collective over devices {list(group)}: device {d} is not one of "
                              f"the runtime's {len(devices)} devices")


def launch_point(rt: Any, task: Any, op_id: int, args: tuple, kwargs: dict, rargs: list,
                 reqs: list, options: Any) -> Any:
    """The runtime side of a collective launch (core.py ``_point`` for kind
    ``"collective"``): requirement ``p`` (one per group position, the
    position's flat buffer) is analysed on device ``group[p]``'s memory;
    the op runs on the communicator queue, on every rank holding a position
    (the others keep a ghost), after the group's previous collective."""
    from .futures import Future
    from .scheduler import Op

    spec: CollectiveSpec = options.tag[1]
    group = spec.group
    check_group(group, rt.devices)
    if len(reqs) != len(group):
        raise LaunchError(f"collective {spec.name}: {len(reqs)} region requirements for a "
                          f"group of {len(group)} devices; pass one buffer per position")
    _bind(rt, spec)
    dev = rt.devices[group[0]]
    dep_ops: list = []
    views, prologues, ids = rt._analyze(op_id, reqs, rargs, dev, list(group), dep_ops, task,
                                        spread=True)
    body = CollectiveBody(task.fn, spec.name, None, args, kwargs, rargs, prologues, views, None,
                          rt.instances)
    body.spec = spec
    queue = comm_queue(group)
    op = Op(op_id, "collective", spec.name, queue, body, None, None, options.tag)
    op.bytes = int(spec.nbytes)
    op.rank = dev.rank
    repl = rt.repl
    if not spec.local:
        repl.ghost(op, dev.rank)
    elif repl is not None:
        repl.cl.keep(op)
    rt._live[op_id] = op
    if repl is not None:
        repl.launched = op_id + 1
    op.deps = tuple(sorted(ids))
    chain = rt.__dict__.setdefault("_comm_last", {})
    prev = chain.get(queue)
    if prev is not None and prev.state < 2:  # the group's order, not a dependence
        dep_ops.append(prev)
    chain[queue] = op
    rt.sched.submit(op, dep_ops)
    rt.sched.executor.drain()
    return Future(op, rt.sched)


def _bind(rt: Any, spec: CollectiveSpec) -> None:
    """This process's positions of ``spec`` and, under MPI, the group's
    sub-communicator and each communicator rank's chunk range."""
    group = spec.group
    comms = rt.__dict__.get("_nccl")
    if comms is None:
        comms = rt._nccl = NcclComms()
    spec.nccl = comms
    if rt.repl is None:
        spec.local = tuple(range(len(group)))
        return
    cl = rt.repl.cl
    ranks_of = [rt.devices[d].rank for d in group]
    spec.local = tuple(p for p, r in enumerate(ranks_of) if r == cl.rank)
    ranks = tuple(dict.fromkeys(ranks_of))
    if len(ranks) == 1:
        spec.comm = None  # every position on one rank: in process
        return
    if any(ranks_of[i] != ranks_of[i - 1] and ranks_of[i] in ranks_of[:i]
           for i in range(1, len(ranks_of))):
        raise LaunchError(f"collective {spec.name}: the devices {list(group)} of a group must "
                          "be rank-major (each rank's devices contiguous)")
    comms = rt.__dict__.get("_comms")
    if comms is None:
        comms = rt._comms = Communicators(cl)
    comm = comms.get(ranks, spec)
    if comm is None:
        spec.comm = None
        return
    ranges = []
    for r in ranks:
        ps = [p for p, x in enumerate(ranks_of) if x == r]
        ranges.append((ps[0], ps[-1] + 1))
    spec.comm = (comm, ranges, cl)


def _never(*_: Any) -> None:  # a collective's body is its transport, not a task function
    raise AssertionError("a collective runs through CollectiveBody")


class Collective:
    """A reusable collective launch (the same options object every call, so
    a traced step replays it): ``kind`` over ``group`` on ``parts[p]`` (the
    1-D flat buffer of position ``p``, a Region or Subregion, equal lengths,
    one field ``field``), ``algorithm`` of :data:`legionpy.collectives.ALGORITHMS`,
    ``name`` (trace and mirror name, e.g. ``"RS(b0.0)"``).

    >>> ar = Collective("all_reduce", (0, 1), [P[0], P[1]], "x")   # doctest: +SKIP
    >>> ar()                     # one op on comm:0,1; returns its Future  # doctest: +SKIP
    """

    def __init__(self, kind: str, group: tuple, parts: list, field: str,
                 algorithm: str = "ring", name: str | None = None, node_of: Any = None) -> None:
        from ..regions import RW
        from .launch import LaunchOptions, TaskFunction

        group = tuple(int(d) for d in group)
        if len(parts) != len(group):
            raise LaunchError(f"collective over devices {list(group)} needs one buffer per "
                              f"device, got {len(parts)}")
        sizes = {p.rect.volume for p in parts}
        if len(sizes) != 1 or any(len(p.rect.shape) != 1 for p in parts):
            raise LaunchError(f"collective over devices {list(group)}: the buffers must be 1-D "
                              f"and of one length, got shapes {[p.rect.shape for p in parts]}")
        root = parts[0].root
        nbytes = sizes.pop() * root.fields[field].itemsize
        name = name or f"{kind}({','.join(map(str, group))})"
        self.spec = CollectiveSpec(kind, group, algorithm, nbytes, name, node_of)
        self.parts, self.field = tuple(parts), field
        self.task = TaskFunction(_never, [RW(field)] * len(group), name=name, kind="collective")
        self.options = LaunchOptions(name, "collective", ("collective", self.spec))

    def __call__(self) -> Any:
        from . import get_runtime

        if len(self.spec.group) < 2:
            return None  # a group of one device: a no-op
        return get_runtime().launch(self.task, self.parts, {}, self.options)
