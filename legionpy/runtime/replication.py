"""Control replication: every MPI rank runs the program; each executes its part.

Under ``mpirun -n N python prog.py`` every rank runs the same program and
the Runtime (core.py) performs the same launch-time analysis on every rank:
same op ids, same mapping, same coherence state, same copies. This module
decides, for every op the analysis produced, what *this* rank does with it:

=====================================  ==========================================
op                                     this rank
=====================================  ==========================================
task mapped to a device of rank r      r runs it; others submit a *ghost* (queue
                                       None, finishes with its dependences)
copy, both memories on rank r          r copies locally; others: ghost
copy from the host (replicated)        the destination's rank copies from its own
                                       host replica; others: ghost
copy to the host (``Region.read``)     the source's rank copies into its host and
                                       sends to every other rank; they receive
copy from rank a to rank b             a: ``Isend`` after the source is ready;
                                       b: ``Irecv`` into the instance (staged
                                       when the rect is not contiguous)
Future argument of a task on another   the producer's rank sends the pickled
rank                                   result, the consumer's rank receives it
=====================================  ==========================================

Cross-rank transfers of one directed link (and future transfers of one rank
pair) form a *per-link sequence*: each waits for the previous one, so both
ranks process them in op-id order on the link's FIFO worker. All
dependences point from lower to higher op ids, so the lowest unfinished
transfer can always proceed on both sides: no ordering deadlock, and the
MPI tag (op id modulo the tag bound) needs no negotiation.

Memories: device ``d``'s memory lives on ``d``'s rank. Host memory
``HOST = -1`` is *replicated*: ``Region.write`` runs on every rank with the
same data and leaves every rank's host copy valid; ``lp.fill`` is lazy and
materialised wherever needed; ``Region.read`` gathers the valid pieces into
every rank's host (each piece sent by its owner). A task requirement mapped
to host memory (``Mapping.memories[i] == -1``) uses its rank's own host
memory, id ``-2 - rank`` (:func:`rank_host`), a non-replicated memory.

Launch hash: every launch, fill, read and write appends a description
(task, colors, region uids and rects, privileges) to a running CRC; each
fence first compares ``(count, crc)`` across ranks (a non-blocking
allgather with the MPI timeout) and raises
:class:`~legionpy.errors.RankMismatchError` naming the first launch that
differs, before waiting for transfers that would never match.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ..errors import RankMismatchError, TaskError
from ..regions.coherence import HOST
from .mpi import Cluster
from .scheduler import Op

__all__ = ["Replicator", "rank_host"]


def rank_host(rank: int) -> int:
    """Memory id of rank ``rank``'s own (non-replicated) host memory."""
    return -2 - rank


class Replicator:
    """Per-Runtime replication state: ownership, transfers, launch hash."""

    def __init__(self, rt: Any, cl: Cluster) -> None:
        self.rt = rt
        self.cl = cl
        self.me = cl.rank
        self.chain: dict[Any, Op] = {}
        self.sent: dict[tuple[int, int], Op | None] = {}
        self.count = 0
        self.crc = 0
        self.log: list[str] = []
        self.fences = 0
        self.launched = 0  # ops below this id are registered (futures can be served)
        self.persistent: list = []  # persistent requests of recorded traces (freed at exit)
        cl.bind(rt.sched, lambda: self.launched)

    # -- ownership ---------------------------------------------------------------------
    def owner(self, mem: int) -> int | None:
        """Rank holding memory ``mem`` (None: the replicated host memory)."""
        if mem == HOST:
            return None
        if mem < HOST:
            return -2 - mem
        return self.rt.devices[mem].rank

    def owns(self, mem: int) -> bool:
        return mem == HOST or self.owner(mem) == self.me

    def memory(self, mem: int, dev: Any) -> int:
        """The memory a task on ``dev`` uses when its mapping says ``mem``."""
        return rank_host(dev.rank) if mem == HOST else mem

    def ghost(self, op: Op, rank: int) -> Op:
        op.queue = None
        op.fn = None
        op.remote = True
        op.rank = rank
        return op

    # -- copies ------------------------------------------------------------------------
    def submit_copy(self, c: Any, root: Any, field: str) -> None:
        rt, me = self.rt, self.me
        so, do = self.owner(c.src), self.owner(c.dst)
        peers: list[int] = []
        if c.dst == HOST:
            role = "send" if so == me else "recv"
            peers = [r for r in range(self.cl.size) if r != me] if so == me else [so]
        elif c.src == HOST or so == do:
            role = "local" if do == me else "ghost"
        elif so == me:
            role, peers = "send", [do]
        elif do == me:
            role, peers = "recv", [so]
        else:
            role = "ghost"
        inst = rt.instances
        if role == "local":
            def fn(op: Op) -> None:
                inst.run_copy(c, root, field)
        elif role in ("send", "recv"):
            fn = _Transfer(self, role, c, root, field, peers)
        else:
            fn = None
        op = Op(c.id, "copy", f"{root.name}.{field}", (c.src, c.dst), fn)
        op.bytes = c.volume * root.fields[field].itemsize
        op.deps = c.deps
        live = rt._live
        deps = [live[d] for d in c.deps if d in live]
        if role == "ghost":
            self.ghost(op, so if so is not None else do)
        elif role != "local":
            self._chain(op, (c.src, c.dst), deps)
        live[c.id] = op
        rt.sched.submit(op, deps)

    def _chain(self, op: Op, key: Any, deps: list) -> None:
        prev = self.chain.get(key)
        if prev is not None:
            deps.append(prev)
        self.chain[key] = op

    def _source(self, c: Any, root: Any, field: str) -> Any:
        """The data of copy ``c`` (one rect: a view; merged rects: their
        flattened parts, concatenated in ``c.rects`` order)."""
        inst = self.rt.instances
        if c.buffer is not None:
            buf, brect = inst.buffer(c.buffer)
            origin = brect.lo
        else:
            buf = inst.instance(c.src, root, field)
            origin = inst.origin(c.src, root, field)
        if not c.more:
            return buf[c.rect.to_slices(origin)]
        parts = [buf[r.to_slices(origin)] for r in c.rects]
        if type(buf) is not np.ndarray:
            from . import gpu
            parts = [gpu.to_host(a) for a in parts]
        return np.concatenate([a.ravel() for a in parts])

    def _send(self, c: Any, root: Any, field: str, peers: list[int]) -> None:
        cl = self.cl
        src = self._source(c, root, field)
        if type(src) is not np.ndarray:
            from . import gpu
            if len(peers) == 1 and not c.more and gpu.ipc_possible(self, c):
                return gpu.ipc_send(self, c, root, field, peers[0])
            src = gpu.to_host(src)
        buf = src if src.flags.c_contiguous else np.ascontiguousarray(src)
        tag = cl.tag(c.id)
        reqs = [cl.data.Isend(buf, dest=r, tag=tag) for r in peers]
        if c.dst == HOST:  # this rank's own host replica (or staging)
            if c.buffer is None:
                self.rt.instances.run_copy(c, root, field)
            else:
                self._stage(c, np.array(buf, copy=True))
        cl.wait(reqs, lambda: f"rank(s) {peers} to receive copy {c.id} of {root.name}.{field}",
                copy_bytes=buf.nbytes)
        if c.buffer is not None:
            self.rt.instances.consumed(c.buffer)

    def _stage(self, c: Any, buf: Any) -> None:
        """Received reduction data (``_source`` layout) into the staging buffers."""
        inst = self.rt.instances
        if not c.more:
            inst.stage((c.id, c.rect), buf, c.dst)  # from the staging pool
            return
        off = 0
        for r in c.rects:
            a = buf[off:off + r.volume].reshape(r.shape)
            off += r.volume
            inst.stage((c.id, r), a, c.dst)

    def _recv(self, c: Any, root: Any, field: str, peer: int) -> None:
        cl, inst = self.cl, self.rt.instances
        dtype = root.fields[field]
        if c.more:  # merged rects: one flat message, scattered
            buf = np.empty(c.volume, dtype)
            req = cl.data.Irecv(buf, source=peer, tag=cl.tag(c.id))
            cl.wait([req], lambda: f"copy {c.id} of {root.name}.{field} from rank {peer}",
                    copy_bytes=buf.nbytes)
            if c.buffer is not None:
                return self._stage(c, buf)
            off = 0
            for r in c.rects:
                part = buf[off:off + r.volume].reshape(r.shape)
                off += r.volume
                dst = inst.part(c.dst, root, field, r)
                if type(dst) is np.ndarray:
                    dst[...] = part
                else:
                    from . import gpu
                    gpu.from_host(dst, part)
            return
        dst = None if c.buffer is not None else inst.part(c.dst, root, field, c.rect)
        if dst is not None and type(dst) is not np.ndarray:
            from . import gpu
            if gpu.ipc_possible(self, c):
                return gpu.ipc_recv(self, c, root, field, dst, peer)
        direct = type(dst) is np.ndarray and dst.flags.c_contiguous
        buf = dst if direct else np.empty(c.rect.shape, dtype)
        req = cl.data.Irecv(buf, source=peer, tag=cl.tag(c.id))
        cl.wait([req], lambda: f"copy {c.id} of {root.name}.{field} {c.rect} from rank {peer}",
                copy_bytes=buf.nbytes)
        if c.buffer is not None:
            self._stage(c, buf)
        elif not direct:
            if type(dst) is np.ndarray:
                dst[...] = buf
            else:
                from . import gpu
                gpu.from_host(dst, buf)

    # -- futures -----------------------------------------------------------------------
    def future_arg(self, fop: Op, dev: Any) -> Op | None:
        """The transfer a task on ``dev`` must wait for to receive the result
        of ``fop`` (None when it runs on the producer's rank). Every rank
        takes the same op id for it, whether it takes part or not."""
        if fop.rank == dev.rank:
            return None
        key = (fop.id, dev.rank)
        if key in self.sent:
            return self.sent[key]
        rt, cl = self.rt, self.cl
        tid = rt._new_id()
        src, dst = fop.rank, dev.rank
        queue = (rank_host(src), rank_host(dst))
        op = None
        if self.me == src:
            def send(op: Op) -> None:
                req = cl.data.isend(fop.result, dest=dst, tag=cl.tag(tid))
                cl.wait([req], lambda: f"rank {dst} to receive the result of {fop.describe()}")
            op = Op(tid, "copy", f"future {fop.name}", queue, send)
            deps = [fop]
        elif self.me == dst:
            def recv(op: Op) -> None:
                fop.result = cl.recv_obj(cl.data, src, cl.tag(tid),
                                         lambda: f"the result of {fop.describe()}")
                fop.remote = False
            op = Op(tid, "copy", f"future {fop.name}", queue, recv)
            deps = []
        if op is not None:
            op.deps = (fop.id,)
            self._chain(op, queue, deps)
            rt._live[tid] = op
            rt.sched.submit(op, deps)
        self.sent[key] = op
        return op

    # -- launch hash -------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.count += 1
        self.crc = zlib.crc32(text.encode(), self.crc)
        self.log.append(text)

    def check_launches(self) -> None:
        """Compare the launches since the last fence across ranks (collective)."""
        cl = self.cl
        self.fences += 1
        mine = np.array([self.count, self.crc], dtype=np.int64)
        every = np.empty((cl.size, 2), dtype=np.int64)
        req = cl.coll.Iallgather(mine, every)
        try:
            cl.wait([req], lambda: f"the other ranks to reach fence {self.fences} "
                                   f"(after launch #{self.count})")
        except TaskError as exc:
            raise RankMismatchError(str(exc)) from None
        log, base = self.log, self.count - len(self.log)
        self.log = []
        if (every == every[0]).all():
            return
        logs = cl.coll.allgather(log)
        n = max(len(x) for x in logs)
        for i in range(n):
            texts = [x[i] if i < len(x) else "(no launch: fence)" for x in logs]
            if len(set(texts)) > 1:
                r = next(k for k, t in enumerate(texts) if t != texts[0])
                raise RankMismatchError(
                    f"MPI ranks ran different programs: launch #{base + i} (number {i + 1} "
                    f"since fence {self.fences - 1}) is {texts[0]} on rank 0 but {texts[r]} on "
                    f"rank {r}; every rank must make the same launches, fills, reads and "
                    "writes in the same order")
        raise RankMismatchError(f"MPI ranks ran different programs before fence {self.fences} "
                                f"(launch counts {every[:, 0].tolist()})")

    def reset(self) -> None:
        """At a fence: every transfer finished."""
        self.chain.clear()
        self.sent.clear()
        self.cl.new_epoch()


class _Transfer:
    """The body of a cross-rank copy: ``role`` "send" or "recv" of copy
    ``c`` with ``peers``. A trace keeps it for its replays and asks
    :meth:`persistent` for a version that reuses one persistent MPI request
    (``Send_init`` / ``Recv_init``, started by each replay) where the data
    is one contiguous slice of a host instance, which never moves: no
    request set-up per copy."""

    __slots__ = ("repl", "role", "c", "root", "field", "peers")

    def __init__(self, repl: Replicator, role: str, c: Any, root: Any, field: str,
                 peers: list[int]) -> None:
        self.repl, self.role, self.c, self.root, self.field, self.peers = (
            repl, role, c, root, field, peers)

    def __call__(self, op: Op) -> None:
        if self.role == "send":
            self.repl._send(self.c, self.root, self.field, self.peers)
        else:
            self.repl._recv(self.c, self.root, self.field, self.peers[0])

    def persistent(self) -> Any:
        """A body with a persistent request, or ``self`` where none fits."""
        c, repl = self.c, self.repl
        if c.more or c.buffer is not None or c.src == HOST or c.dst == HOST \
                or len(self.peers) != 1:
            return self
        mem = c.src if self.role == "send" else c.dst
        inst = repl.rt.instances
        arr = inst.instance(mem, self.root, self.field)
        if type(arr) is not np.ndarray:
            return self
        # the instance may cover less than the root (its tiles): slice from its origin
        view = arr[c.rect.to_slices(inst.origin(mem, self.root, self.field))]
        if not view.flags.c_contiguous:
            return self
        cl = repl.cl
        tag = cl.tag(c.id)
        if self.role == "send":
            req = cl.data.Send_init(view, dest=self.peers[0], tag=tag)
        else:
            req = cl.data.Recv_init(view, source=self.peers[0], tag=tag)
        repl.persistent.append(req)
        what = f"copy {c.id} of {self.root.name}.{self.field} ({self.role}, persistent)"

        gen = inst.generation
        nbytes = view.nbytes

        def run(op: Op, _req: Any = req, _view: Any = view) -> None:
            if inst.generation != gen:  # an instance was re-made (grown): not the bound array
                return self(op)
            _req.Start()
            cl.wait([_req], lambda: what, copy_bytes=nbytes)
        return run


def describe_args(args: tuple) -> str:
    """Stable text of the region arguments of a launch (for the launch hash)."""
    parts = []
    for a in args:
        root = getattr(a, "root", None)
        if root is None:
            continue
        rect = getattr(a, "rect", None)
        if rect is None:  # a Partition
            parts.append(f"P{root.uid}{a.parent.rect.lo}{a.parent.rect.hi}x{len(a)}")
        else:
            parts.append(f"R{root.uid}{rect.lo}{rect.hi}")
    return ",".join(parts)
