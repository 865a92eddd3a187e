"""The iteration task graph (paper section 5.1; DESIGN.md section 2 with the
copy, de-duplication, reduction and sharded-update rules of
docs/taskgraph.md), stored in flat arrays so the blocks that depend on one
operator can be replaced in place for delta simulation (Algorithm 2).

It is the graph the runtime executes (invariant 3, checked by
tests/runtime/test_mirror.py): the copies are derived by running the
runtime's own coherence state machine (:class:`legionpy.regions.coherence.
FieldState`, same Rect operations, devices as memories) over the accesses of
one steady-state iteration, in the runtime's launch order.

Tasks, for operator ``o`` with config ``c`` (tile ``k`` = ``Rect.split``
point ``k`` in row-major order, on device ``c.devices[k]``):

- ``F(o,k)`` forward (an input op: the load, costing the host-to-device copy
  of the tile); ``B(o,k)`` backward, after ``F(o,k)`` (ops with a backward).
- Tensor ``T`` = output of ``p`` (block ``("tensor", p)``, depends on the
  configs of ``p`` and of ALL its consumers): field ``val`` starts as the
  tiles of ``p`` valid on their devices; the forward readers (consumers in
  op order, then ``k``, then input position) read ``op.input_rect(i, tile
  k)``: data already valid on the reader's device is not copied again (one
  copy per (reader task, source device), merging every piece from that
  source; the source is the last writer's device -- the producer tile's, a
  shard's home -- while valid there, else the lowest valid device, as the
  runtime chooses);
  field ``grad`` starts as a lazy fill, consumers' ``B`` add per-task
  reduction buffers (reverse op order, then ``k``), and ``B(p,j)`` reads its
  tile: one copy per (reducing task on another device, reader).
- Parameter ``w`` (block ``("param", w)``, depends on the configs of all its
  users): weight tiles and their update shards come from
  :func:`legionpy.placement.weight_tiles` (the runtime's rule): a tile used by
  devices ``U`` (first-use order) is split into ``min(|U|, extent)`` shards
  along its largest dim, shard ``c`` homed on ``U[c]``. Field ``w`` starts as
  the shards valid on their homes (written by the previous iteration's
  updates); forward readers copy the shards they lack (de-duplicated and
  merged like activations). Field ``g``: users' ``B`` reduce their weight
  rect into per-task buffers; ``U(w, t)`` for update point ``t`` (shard) on
  its home folds them: one copy per (reducing task on another device,
  shard).

Stable task ids. A task's key is a pure function of what the task is and
sorts exactly like the runtime's op ids (launch order: ``F`` launches in op
order, ``B`` launches in reverse op order, then ``U`` launches in parameter
first-use order; in a launch its points ``k`` ascending, then the copies
made while analysing point ``k``, by argument position and order of
creation)::

    key = (((((L * 2 + part) * 2**16 + k) * 2**7 + arg) * 2**12 + c) * 2**4 + hop

========================  =========================  ====  =====  =========  ===
task                      L (launch)                 part  k      arg        c
========================  =========================  ====  =====  =========  ===
F(o,k)                    o                          0     k      0          0
B(o,k)                    P + (P - 1 - o)            0     k      0          0
U(w,t)                    2P + w                     0     t      0          0
copy feeding F(o,k)       o                          1     k      position   n
copy feeding B(o,k)       P + (P - 1 - o)            1     k      0 (grad)   n
copy feeding U(w,t)       2P + w                     1     t      0 (g)      n
========================  =========================  ====  =====  =========  ===

(``P``: number of ops; ``w``: parameter index in first-use order;
``position``: the region argument the copy serves (1 + input index, or 1 +
inputs + weight index); ``n``: the copy's rank among the copies of that
access, in creation order; ``hop``: position on the route, the simulator
only -- the runtime copies directly.) The keys break FIFO ties in the
simulator; the ``--taskgraph`` JSON numbers tasks ``0..n-1`` in key order.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import collectives
from ..collectives import SYNC_MODES, resolve_sync
from ..errors import StrategyError
from ..geometry import Rect, block_bound, block_bounds
from ..pipeline import device_chains, device_major, in_flight, launches, micro_of, recomputes
from ..placement import param_tiles, update_points
from ..regions.coherence import FieldState, Piece, Request, choose_source
from . import simkernels as K
from .collective_block import CollectiveCosts, bucket_block
from .costmodel import MIN_DURATION
from .replica_blocks import replicated_block
from .symmetry import Asymmetric, node_classes, symmetric_blocks

__all__ = ["TaskGraph", "pack_key", "unpack_key", "KIND_NAMES", "SYNC_MODES"]

MAXT = 65536  # tiles per op (edge codes; the key's k field); a task graph holds
# at most max(1024, devices) tiles per op (``TaskGraph.maxt``)
F_, B_, COPY, UPDATE, LOAD, COLLECTIVE = 0, 1, 2, 3, 4, 5
KIND_NAMES = ("compute", "compute", "copy", "update", "compute", "collective")
#: gradient synchronisation: ``shards`` (point-to-point copies to update
#: shards, docs/taskgraph.md) or ``collective`` (reduce-scatter + all-gather
#: per bucket, docs/seam.md)
_CID = 1 << 40  # copy ids handed to FieldState (codes >= _CID)


def pack_key(L, part=0, k=0, arg=0, c=0, hop=0):
    return (((((L * 2 + part) * 65536 + k) * 128 + arg) * 4096 + c) * 16 + hop)


def unpack_key(key: int) -> tuple[int, int, int, int, int, int]:
    """``(L, part, k, arg, c, hop)`` of a key."""
    key, hop = divmod(int(key), 16)
    key, c = divmod(key, 4096)
    key, arg = divmod(key, 128)
    key, k = divmod(key, 65536)
    L, part = divmod(key, 2)
    return L, part, k, arg, c, hop


def _ext(q, role, j):
    """Edge endpoint code of F (role 0) or B (role 1) of op q tile j."""
    return -1 - ((q * 2 + role) * MAXT + j)


def _code(d, cmap):
    """Edge code of a FieldState producer: None (the previous iteration) ->
    None; a copy id -> its last hop; else the code itself."""
    if d is None:
        return None
    if d >= _CID:
        return cmap[d]
    return d


def comm_name(group) -> str:
    """``comm:<devices>`` of a communicator, runs of consecutive ids as
    ``a-b`` (``comm:0-15``, ``comm:0,4,8,12``): the same name however the
    task graph was reached (full build or a chain of deltas)."""
    runs, out = [], []
    for d in group:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    for a, b in runs:
        out.append(str(a) if a == b else f"{a}-{b}")
    return "comm:" + ",".join(out)


def _lazy_split(rect, degrees):
    """``rect.split(degrees)`` as an iterator (row-major)."""
    bounds = [block_bounds(lo, hi, k) for lo, hi, k in zip(rect.lo, rect.hi, degrees)]
    for combo in itertools.product(*bounds):
        yield Rect._raw(tuple(b[0] for b in combo), tuple(b[1] for b in combo))


def _pkey(p):
    return (p[0], p[1])


def _reduce(st, req, bufs: dict):
    """``st`` after reduction ``req``; ``bufs[buffer] = (memory, bounding
    rect)`` of the buffer it accumulates into (what the runtime allocates)."""
    plan, st = st.access(req, _no_id)
    got = bufs.get(plan.buffer)
    bufs[plan.buffer] = (req.memory, req.rect if got is None else got[1].bounding(req.rect))
    return st


def _buffer_bytes(bufs: dict, item: int, tmem: dict) -> None:
    """Add the bytes of the reduction buffers ``bufs`` to ``tmem`` per device."""
    for dev, r in bufs.values():
        tmem[dev] = tmem.get(dev, 0.0) + float(r.volume * item)


def _slack(own: dict, reads: list, tasks: list, item: int) -> dict:
    """Bytes per device by which an instance, the bounding box of the rects
    a device uses (``own`` {device: [rects]} and ``reads`` [(rect, device)]),
    exceeds what the tasks count: its own rects plus the copies it receives
    (``tasks``' copy rows, memory bytes on their destination)."""
    rects: dict = {d: list(rs) for d, rs in own.items()}
    for r, d in reads:
        rects.setdefault(d, []).append(r)
    counted = {d: float(sum(r.volume for r in rs) * item) for d, rs in own.items()}
    for t in tasks:  # the copies' rects (their bytes: a pipeline scales their memory)
        if t[3] == COPY and t[6]:
            counted[t[5]] = counted.get(t[5], 0.0) + t[4]
    out = {}
    for d, rs in rects.items():
        box = rs[0]
        for r in rs[1:]:
            box = box.bounding(r)
        extra = float(box.volume * item) - counted.get(d, 0.0)
        if extra > 0:
            out[d] = extra
    return out


def _no_id():
    raise AssertionError("internal: a reduction access made a copy")


class _Block:
    """Tasks (arrays) and edges (codes: >= 0 local index, < 0 external F/B).
    ``ends``: copies ``src * 65536 + dst`` (devices of the whole copy), else -1."""

    __slots__ = ("key", "dur", "res", "kind", "nbytes", "mdev", "mbytes", "ends", "esrc",
                 "edst", "tmem", "thold", "info")

    def __init__(self, tasks, edges, tmem=None, thold=None):
        self.info = {}  # collective tasks: key -> (kind, group, algorithm, bytes)
        cols = list(zip(*tasks)) if tasks else [()] * 8
        self.key = np.array(cols[0], np.int64)
        self.dur = np.array(cols[1], np.float64)
        self.res = np.array(cols[2], np.int64)
        self.kind = np.array(cols[3], np.int8)
        self.nbytes = np.array(cols[4], np.float64)
        self.mdev = np.array(cols[5], np.int64)
        self.mbytes = np.array(cols[6], np.float64)
        self.ends = np.array(cols[7], np.int64)
        e = np.array(edges, np.int64).reshape(-1, 2)
        self.esrc, self.edst = e[:, 0].copy(), e[:, 1].copy()
        #: {device: bytes} of the block's reduction and staging buffers that
        #: live one block at a time (``tmem``) or up to the updates (``thold``:
        #: weight gradients), see :meth:`TaskGraph.buffer_bytes`
        self.tmem, self.thold = tmem or {}, thold or {}

    @classmethod
    def from_arrays(cls, cols, edges: np.ndarray, tmem=None, thold=None) -> _Block:
        """A block from task columns (key, dur, res, kind, nbytes, mdev,
        mbytes, ends) and an (m, 2) array of edge codes."""
        b = cls.__new__(cls)
        for name, c, dt in zip(cls.__slots__[:8], cols, (np.int64, np.float64, np.int64,
                                                          np.int8, np.float64, np.int64,
                                                          np.float64, np.int64)):
            setattr(b, name, np.ascontiguousarray(c, dtype=dt))
        e = np.asarray(edges, np.int64).reshape(-1, 2)
        b.esrc, b.edst = e[:, 0].copy(), e[:, 1].copy()
        b.tmem, b.thold = tmem or {}, thold or {}
        b.info = {}
        return b


class TaskGraph:
    """The task graph of (graph, strategy, machine, cost model); see the module
    docstring. ``build(strategy)`` makes it from scratch; ``change(op, config)``
    replaces one op's config and returns the seed tasks for Algorithm 2."""

    def __init__(self, graph, machine, cost_model, optimizer_slots: int = 1,
                 sync: str | None = None) -> None:
        sync = resolve_sync(sync)
        self.graph, self.machine, self.cost = graph, machine, cost_model
        self.sync = sync
        #: optimizer state per weight element on its update home (memory only)
        self.optimizer_slots = optimizer_slots
        self.D = machine.num_devices
        self.n_res = self.D + machine.num_links
        ops = graph.ops
        self.params = list(graph.parameters().values())
        self.pindex = {id(p): w for w, p in enumerate(self.params)}
        self.users: list[list[tuple[int, str]]] = [[] for _ in self.params]
        for o in ops:
            for pname, p in o.params.items():
                self.users[self.pindex[id(p)]].append((o.index, pname))
        self.consumers: list[list[tuple[int, int]]] = [[] for _ in ops]
        for o in ops:
            for i, r in enumerate(o.inputs):
                self.consumers[r.op.index].append((o.index, i))
        #: distinct consumer ops of each op's output, in op order
        self.cons_ops = [sorted({c for c, _ in cs}) for cs in self.consumers]
        self.P = len(ops)
        #: gradient buckets (collective sync): parameter indices, reverse
        #: first-use order, packed by :func:`legionpy.collectives.parameter_buckets`
        self.buckets = collectives.parameter_buckets(self.params)
        self.bucket_of = {w: b for b, ws in enumerate(self.buckets) for w in ws}
        #: ``(op index, pname)`` of every user of every parameter of a bucket
        self.bucket_uses = [[u for w in ws for u in self.users[w]] for ws in self.buckets]
        self.ccost = CollectiveCosts(machine, cost_model)
        self.comms: dict = {}  # group -> communicator resource id
        self._comm_group: dict = {}  # its inverse
        self.coll_info: dict = {}  # key -> (kind, group, algorithm, bytes), live tasks
        #: simulate one node per class of identical nodes when a strategy
        #: allows it (collective sync only; optimizer/symmetry.py); ``sym``:
        #: ``(N, G)`` while the graph held is the representative's, else None
        self.symmetry = True
        self.sym = None
        self._classes = node_classes(machine)
        self._boxes: dict = {}  # (op, degrees, N) -> {block: bounding box}
        if len(ops) + len(self.params) >= 2**14:
            raise StrategyError(f"graph has {len(ops)} ops and {len(self.params)} parameters; "
                                f"task keys allow 16383 in all")
        self._tiles: dict = {}
        self._pairs: dict = {}
        self._blocks: dict = {}  # (block id, configs) -> _Block (cache)
        self._copy_cache: dict = {}  # (link, nbytes) -> seconds (replicated blocks)
        self._rtab = None  # route table of replicated.route_table
        self._hops: dict = {}  # (src, dst, nbytes) -> ((resource, seconds), ...) per hop
        #: replay forward reads (no fills, no reductions) with :meth:`_fast_reads`
        #: instead of FieldState; tests/unit/test_taskgraph.py checks both agree
        self.fast_reads = True
        #: build replicated-parameter and aligned-tensor blocks in arrays
        #: (:mod:`.replicated`); False: replay them like any other block
        #: (the baseline of bench/simulator_speed.py)
        self.vectorised = True
        self.maxt = max(1024, self.D)
        self.fslot = np.full((len(ops), self.maxt), -1, np.int64)
        self.bslot = np.full((len(ops), self.maxt), -1, np.int64)
        self.live_tasks: dict = {}  # block id -> slots
        #: buffers (see buffer_bytes): a row of per-device bytes per live block
        #: with any (``_brow``: block id -> row), and the sum of held buffers
        self._brow: dict = {}
        self._bmax = np.zeros((0, self.D))
        self._bheld = np.zeros(self.D)
        self._live_blk: dict = {}  # block id -> the installed _Block
        self._bfree: list = []  # free rows of _bmax
        self.live_edges: dict = {}
        self.strategy = None
        #: the pipeline of the strategy held (docs/pipeline.md), else None;
        #: ``_mfac[o]`` / ``_recomp[o]``: its activation-memory factor (the
        #: schedule's micro-batches in flight over ``m``) and whether op
        #: ``o``'s stage recomputes its forward in backward
        self.pipe = None
        #: F and B launches per step (``2P``; pipelined ``2 P m``): U of
        #: parameter ``w`` is launch ``nl + w``, bucket ``b`` ``nl + W + b``
        self.nl = 2 * self.P
        self._mfac: list = []
        self._recomp: list = []
        self._alloc(1024, 2048)

    # -- pools -------------------------------------------------------------
    def _alloc(self, nt: int, ne: int) -> None:
        self.cap_t, self.cap_e = nt, ne
        self.alive = np.zeros(nt, np.bool_)
        self.key = np.zeros(nt, np.int64)
        self.dur = np.zeros(nt)
        self.res = np.zeros(nt, np.int64)
        self.kind = np.zeros(nt, np.int8)
        self.nbytes = np.zeros(nt)
        self.mdev = np.zeros(nt, np.int64)
        self.mbytes = np.zeros(nt)
        self.ends = np.full(nt, -1, np.int64)
        self.ready, self.start, self.end = np.zeros(nt), np.zeros(nt), np.zeros(nt)
        self.dprev = np.full(nt, -1, np.int64)
        self.dnext = np.full(nt, -1, np.int64)
        self.out_head = np.full(nt, -1, np.int64)
        self.in_head = np.full(nt, -1, np.int64)
        self.dhead = np.full(max(self.n_res, 1), -1, np.int64)
        self.dtail = np.full(max(self.n_res, 1), -1, np.int64)
        self.free_t = np.arange(nt - 1, -1, -1, dtype=np.int64)
        self.nfree_t = nt
        self.esrc = np.zeros(ne, np.int64)
        self.edst = np.zeros(ne, np.int64)
        self.ealive = np.zeros(ne, np.bool_)
        self.out_next, self.out_prev = np.full(ne, -1, np.int64), np.full(ne, -1, np.int64)
        self.in_next, self.in_prev = np.full(ne, -1, np.int64), np.full(ne, -1, np.int64)
        self.free_e = np.arange(ne - 1, -1, -1, dtype=np.int64)
        self.nfree_e = ne

    _TASK_FIELDS = (("alive", False), ("key", 0), ("dur", 0), ("res", 0), ("kind", 0),
                    ("nbytes", 0), ("mdev", 0), ("mbytes", 0), ("ends", -1), ("ready", 0),
                    ("start", 0), ("end", 0), ("dprev", -1), ("dnext", -1),
                    ("out_head", -1), ("in_head", -1))
    _EDGE_FIELDS = (("esrc", 0), ("edst", 0), ("ealive", False), ("out_next", -1),
                    ("out_prev", -1), ("in_next", -1), ("in_prev", -1))

    def _grow_tasks(self, need: int) -> None:
        self._grow(need, self._TASK_FIELDS, "t")

    def _grow_edges(self, need: int) -> None:
        self._grow(need, self._EDGE_FIELDS, "e")

    def _grow(self, need: int, fields: tuple, s: str) -> None:
        """Grow every array of ``fields`` (new slots filled) and the free-slot
        stack ``free_<s>`` (new slots popped first, lowest on top) of the task
        (``s="t"``) or edge (``s="e"``) pool to hold ``need`` more."""
        old = getattr(self, "cap_" + s)
        new = max(2 * old, old + need)
        for name, fill in fields:
            a = getattr(self, name)
            b = np.full(new, fill, a.dtype)
            b[:old] = a
            setattr(self, name, b)
        nfree = getattr(self, "nfree_" + s)
        stack = np.empty(new, np.int64)
        stack[:new - old] = np.arange(new - 1, old - 1, -1)
        stack[new - old:new - old + nfree] = getattr(self, "free_" + s)[:nfree]
        setattr(self, "free_" + s, stack)
        setattr(self, "nfree_" + s, nfree + new - old)
        setattr(self, "cap_" + s, new)

    def _lists(self):
        return (self.esrc, self.edst, self.out_head, self.out_next, self.out_prev,
                self.in_head, self.in_next, self.in_prev)

    # -- geometry (cached, device independent) ----------------------------------
    def tiles(self, o: int, degrees: tuple) -> list:
        """Output tiles of op ``o`` split by ``degrees`` (row-major); under
        symmetric simulation only the first block's (node 0's)."""
        k = (o, degrees, self.sym)
        t = self._tiles.get(k)
        if t is None:
            rect = self.graph.ops[o].output_rect
            if self.sym is None:
                t = rect.split(degrees)
            else:
                n = int(np.prod(degrees))
                t = list(itertools.islice(_lazy_split(rect, degrees), n // self.sym[0]))
            self._tiles[k] = t
            if len(t) > self.maxt:
                raise StrategyError(f"op {self.graph.ops[o].name!r}: {len(t)} tiles exceed "
                                    f"the limit of {self.maxt}")
        return t

    def points(self, o: int, cfg) -> list:
        """``(output tile, r)`` of every point of op ``o`` under ``cfg`` (point
        ``m = k * cfg.reduce + r``; one point per tile without a reduce split)."""
        t = self.tiles(o, cfg.degrees)
        red = cfg.reduce
        return [(x, 0) for x in t] if red == 1 else [(x, r) for x in t for r in range(red)]

    def need(self, o: int, i: int, degrees: tuple, red: int = 1) -> list:
        """Rect (producer coordinates) input ``i`` of op ``o`` needs per point."""
        key = (o, i, degrees, red, self.sym)
        r = self._pairs.get(key)
        if r is None:
            op = self.graph.ops[o]
            ref = op.inputs[i]
            r = self._pairs[key] = [ref.to_base(op.part_input_rect(i, t, j, red))
                                    for t in self.tiles(o, degrees) for j in range(red)]
        return r

    def _needs_of(self, prod, consumers):
        """``(c, k, device, input i, rect)`` for every non-empty rect of
        ``prod``'s output that tile ``k`` of each consumer ``(c, config)``
        reads, in launch order (consumers as given, then k, then input)."""
        ops = self.graph.ops
        for c, cc in consumers:
            ins = [i for i, r in enumerate(ops[c].inputs) if r.op is prod]
            needs = [self.need(c, i, cc.degrees, cc.reduce) for i in ins]
            rc = self.rep_points(c, cc)
            for k, dev in enumerate(cc.devices[:rc]):
                for i, nd in zip(ins, needs):
                    if not nd[k].empty:
                        yield c, k, dev, i, nd[k]

    # -- symmetry (optimizer/symmetry.py) -----------------------------------------
    def rep_points(self, o: int, cfg) -> int:
        """Points of op ``o`` in the task graph: all of them, or the first
        block (node 0's) under symmetric simulation."""
        n = len(cfg.devices)
        return n if self.sym is None else n // self.sym[0]

    def _block_boxes(self, o: int, cfg, which) -> dict:
        """``{m: box}``: the bounding box of block ``m``'s tiles of op ``o``
        under ``cfg`` for ``m`` in ``which``; raises
        :class:`.symmetry.Asymmetric` when a block's tiles do not fill it."""
        N = self.sym[0]
        rect = self.graph.ops[o].output_rect
        degs = cfg.degrees
        n = int(np.prod(degs))
        b = n // N
        out = {}
        cache = self._boxes.setdefault((o, degs, N), {})
        for m in which:
            if m in cache:
                out[m] = cache[m]
                continue
            ia = np.unravel_index(m * b, degs)
            ib = np.unravel_index((m + 1) * b - 1, degs)
            box = Rect(tuple(block_bound(lo, hi, k, int(j))[0]
                             for lo, hi, k, j in zip(rect.lo, rect.hi, degs, ia)),
                       tuple(block_bound(lo, hi, k, int(j))[1]
                             for lo, hi, k, j in zip(rect.lo, rect.hi, degs, ib)))
            if box.volume * n != rect.volume * b:
                raise Asymmetric(o)
            out[m] = cache[m] = box
        return out

    def _check_local(self, p: int, cp, cons) -> None:
        """Symmetry condition 3: what block ``m`` of every consumer reads of
        ``p``'s output (``input_rect`` of the block's box: input rects grow
        with the output rect) lies in block ``m`` of ``p``; else raise
        :class:`.symmetry.Asymmetric`. Producer and consumers that split the
        same sample dims by the same degrees and nothing else are checked on
        blocks 0, 1 and N - 1 (the sample dim passes through an op: SOAP's
        definition of it); every block otherwise."""
        N = self.sym[0]
        ops = self.graph.ops
        prod = ops[p]
        if cp.reduce != 1:
            raise Asymmetric(p)
        sample = all(k == 1 or lab == "sample" for k, lab in zip(cp.degrees, prod.dims))
        for c, cc in cons:
            op = ops[c]
            if cc.reduce != 1:
                raise Asymmetric(c)
            same = (sample and cc.degrees == cp.degrees
                    and all(k == 1 or lab == "sample" for k, lab in zip(cc.degrees, op.dims)))
            which = sorted({0, 1 % N, N - 1}) if same else range(N)
            pb = self._block_boxes(p, cp, which)
            cb = self._block_boxes(c, cc, which)
            for i, r in enumerate(op.inputs):
                if r.op is not prod:
                    continue
                for m in which:
                    nd = r.to_base(op.part_input_rect(i, cb[m]))
                    if not nd.empty and (nd & pb[m]) != nd:
                        raise Asymmetric(p)

    # -- collectives -------------------------------------------------------------
    def grad_ready(self, q: int, k: int) -> list:
        """Edge codes of the tasks after which point ``k`` of op ``q`` has
        added its weight gradients (docs/seam.md section 5: the pipeline's
        hook; here its backward task)."""
        return [_ext(q, 1, k)]

    def comm_resource(self, group: tuple) -> int:
        """The communicator resource of ``group`` (one FIFO per distinct
        group, numbered after the links in order of first use)."""
        r = self.comms.get(group)
        if r is None:
            r = self.comms[group] = self.D + self.machine.num_links + len(self.comms)
            self._comm_group[r] = group
            self.n_res = r + 1
            if hasattr(self, "dhead") and len(self.dhead) < self.n_res:
                grow = max(self.n_res, 2 * len(self.dhead)) - len(self.dhead)
                self.dhead = np.concatenate([self.dhead, np.full(grow, -1, np.int64)])
                self.dtail = np.concatenate([self.dtail, np.full(grow, -1, np.int64)])
        return r

    def _bucket_block(self, b: int, cfgs) -> _Block:
        cols, e, info, held = bucket_block(self, b, cfgs, _ext, pack_key, MIN_DURATION)
        blk = _Block.from_arrays(cols, e, tmem=held)
        blk.info = info
        return blk

    # -- blocks --------------------------------------------------------------------
    def _route(self, a: int, b: int):
        return self.machine.route(a, b)

    def _hop_times(self, src_dev: int, dst_dev: int, nbytes: float) -> tuple:
        """``((resource, seconds), ...)`` of the hops of a copy (cached)."""
        hk = (src_dev, dst_dev, nbytes)
        hops = self._hops.get(hk)
        if hops is None:
            links = self.machine.links
            hops = tuple((self.D + lid, self.cost.copy_time(nbytes, links[lid]))
                         for lid in self._route(src_dev, dst_dev))
            if len(self._hops) > 1_000_000:
                self._hops.clear()
            self._hops[hk] = hops
        return hops

    def _copy_chain(self, tasks, edges, key0, src_dev, dst_dev, nbytes, mem_dev, mem_bytes,
                    pred, succ):
        """Append hops of a copy; edges pred -> hop0 -> ... -> succ (codes).
        Returns (first hop, last hop) local indices."""
        prev = pred
        hops = self._hop_times(src_dev, dst_dev, nbytes)
        first = len(tasks)
        ends = src_dev * 65536 + dst_dev
        last_h = len(hops) - 1
        append = tasks.append
        for h, (r, t) in enumerate(hops):
            if h == last_h:
                append((key0 + h, t, r, COPY, nbytes, mem_dev, mem_bytes, ends))
            else:
                append((key0 + h, t, r, COPY, nbytes, 0, 0.0, ends))
            cur = len(tasks) - 1
            if prev is not None:
                edges.append((prev, cur))
            prev = cur
        if succ is not None:
            edges.append((prev, succ))
        return first, prev

    def _fast_reads(self, pieces, reads, item, mem_factor, tasks, edges) -> None:
        """Forward reads replayed without FieldState, on a state of pieces
        ``[lo, hi, rect, valid, owner]`` (no fill, no pending reduction; valid
        values are edge codes) -- the ``read`` rule of
        :meth:`legionpy.regions.coherence.FieldState.access` (pieces in rect
        order, one merged copy per source memory chosen by ``choose_source``,
        data valid at the reader: a dependence, no copy). ``reads``: ``(rect,
        memory, op code, key0)`` in launch order. Same tasks and edges as
        :meth:`_access` on the equivalent FieldState."""
        for rect, dev, opc, key0 in reads:
            rlo, rhi = rect.lo, rect.hi
            hits = []
            for p in pieces:
                for a, b, c, d in zip(p[0], p[1], rlo, rhi):
                    if (a if a > c else c) >= (b if b < d else d):
                        break
                else:
                    hits.append(p)
            if len(hits) > 1:
                hits.sort(key=_pkey)
            deps = set()
            groups: dict = {}
            copies = []  # [src, volume, deps]
            touched = []  # (piece, copy index)
            for p in hits:
                for a, b, c, d in zip(p[0], p[1], rlo, rhi):
                    if a < c or b > d:
                        break
                else:
                    a = None  # inside
                if a is not None:  # split: the parts outside keep their state
                    q = p[2]
                    pieces.remove(p)
                    for r in q.subtract(rect):
                        pieces.append([r.lo, r.hi, r, p[3], p[4]])
                    part = q & rect
                    p = [part.lo, part.hi, part, p[3], p[4]]
                    pieces.append(p)
                valid = p[3]
                if dev in valid:
                    deps.add(valid[dev])
                    continue
                src = choose_source(valid, p[4])
                dep = valid[src]
                g = groups.get(src)
                if g is None:
                    groups[src] = g = len(copies)
                    copies.append([src, p[2].volume, [dep]])
                else:
                    c = copies[g]
                    c[1] += p[2].volume
                    if dep not in c[2]:
                        c[2].append(dep)
                touched.append((p, g))
            lasts = []
            for n, (src, vol, cdeps) in enumerate(copies):
                nb = float(vol * item)
                first, last = self._copy_chain(tasks, edges, key0 + n * 16, src, dev, nb, dev,
                                               mem_factor * nb, None, None)
                for d in cdeps:
                    if d is not None:
                        edges.append((d, first))
                lasts.append(last)
                deps.add(last)
            for p, g in touched:
                p[3] = {**p[3], dev: lasts[g]}
            for d in deps:
                if d is not None:
                    edges.append((d, opc))

    def _access(self, st, req, key0, itemsize, mem_factor, tasks, edges, cmap, tmem=None):
        """Run one access of the coherence state machine; emit its copies (key
        ``key0 + n * 16`` for the n-th) and dependence edges to ``req.op``;
        a copy of a reduction buffer adds its staging bytes to ``tmem``."""
        ids = [0]

        def new_id():
            ids[0] += 1
            return _CID + len(cmap) + ids[0] - 1

        plan, st = st.access(req, new_id)
        for n, cp in enumerate(plan.copies):
            nb = float(cp.volume * itemsize)
            first, last = self._copy_chain(tasks, edges, key0 + n * 16, cp.src, cp.dst, nb,
                                           cp.dst, mem_factor * nb, None, None)
            for d in cp.deps:
                r = _code(d, cmap)
                if r is not None:
                    edges.append((r, first))
            cmap[cp.id] = last
            if cp.buffer is not None and tmem is not None:
                tmem[cp.dst] = tmem.get(cp.dst, 0.0) + nb
        for d in plan.deps:
            r = _code(d, cmap)
            if r is not None:
                edges.append((r, req.op))
        return st

    def _op_block(self, o: int, cfg) -> _Block:
        op = self.graph.ops[o]
        tasks, edges = [], []
        red = cfg.reduce
        for k, (tile, _) in enumerate(self.points(o, cfg)[:self.rep_points(o, cfg)]):
            dev = cfg.devices[k]
            spec = self.machine.devices[dev]
            out_b = float(tile.volume * op.itemsize)
            if op.kind == "input":
                tasks.append((pack_key(self.lf(o, k), 0, k), self.cost.load_time(out_b, spec), dev,
                              LOAD,
                              out_b, dev, out_b, -1))
                continue
            f, b = self.cost.op_time(op, tile, spec)
            f, b = f / red, b / red  # one slice of the reduction dim
            mem = 2 * out_b
            if self.pipe is not None:  # docs/pipeline.md: micro-batches in flight
                mem *= self._mfac[o]
                if self._recomp[o]:
                    b += f  # the forward again, inside the backward task
            tasks.append((pack_key(self.lf(o, k), 0, k), f, dev, F_, out_b, dev, mem, -1))
            if op.has_backward:
                tasks.append((pack_key(self.lb(o, k), 0, k), b, dev, B_, out_b, dev, 0.0, -1))
                edges.append((len(tasks) - 2, len(tasks) - 1))
        return _Block(tasks, edges)

    def _tensor_block(self, p: int, cfgs) -> _Block:
        """Copies of op ``p``'s output (fields val and grad); ``cfgs``: configs
        of ``p`` and of ``self.cons_ops[p]``."""
        ops, P = self.graph.ops, self.P
        prod = ops[p]
        cp = cfgs[0]
        tasks, edges, cmap = [], [], {}
        item = prod.itemsize
        tiles = self.tiles(p, cp.degrees)
        cons = list(zip(self.cons_ops[p], cfgs[1:]))
        if self.sym is not None:  # symmetry condition 3 (optimizer/symmetry.py)
            self._check_local(p, cp, cons)
        if self.fast_reads and self.vectorised:
            blk = self._aligned_tensor_block(p, cp, cons, tiles)
            if blk is not None:
                return blk
        rp = self.rep_points(p, cp)
        reads = [(need, dev, _ext(c, 0, k), pack_key(self.lf(c, k), 1, k, 1 + i))
                 for c, k, dev, i, need in self._needs_of(prod, cons)]  # forward reads
        # received activations are kept for backward: pipelined, for the
        # micro-batches the consumers' stage holds (docs/pipeline.md)
        mf = 1.0 if self.pipe is None else max((self._mfac[c] for c, _ in cons), default=1.0)
        tmem: dict = {}  # reduction and staging buffers (docs/memory.md)
        if cp.reduce > 1:  # F(p, (k, r)) reduce into the zero-filled output
            st = FieldState.filled(prod.output_rect, 0)
            bufs: dict = {}
            for j, (t, _) in enumerate(self.points(p, cp)[:rp]):
                st = _reduce(st, Request(t, "reduce", cp.devices[j], _ext(p, 0, j), "+",
                                         (p, j, -1)), bufs)
            for r, dev, opc, key0 in reads:
                st = self._access(st, Request(r, "read", dev, opc), key0, item, mf, tasks,
                                  edges, cmap, tmem)
            _buffer_bytes(bufs, item, tmem)
        elif self.fast_reads:
            self._fast_reads([[t.lo, t.hi, t, {cp.devices[j]: _ext(p, 0, j)}, cp.devices[j]]
                              for j, t in enumerate(tiles)], reads, item, mf, tasks, edges)
        else:
            st = FieldState([Piece(t, {cp.devices[j]: _ext(p, 0, j)}, owner=cp.devices[j])
                             for j, t in enumerate(tiles)])
            for r, dev, opc, key0 in reads:
                st = self._access(st, Request(r, "read", dev, opc), key0, item, mf, tasks,
                                  edges, cmap)
        if prod.has_backward and p != P - 1:
            st = FieldState.filled(prod.output_rect, 0)
            backward = [(c, cc) for c, cc in reversed(cons) if ops[c].has_backward]
            gbufs: dict = {}
            for c, k, dev, i, need in self._needs_of(prod, backward):  # reductions
                st = _reduce(st, Request(need, "reduce", dev, _ext(c, 1, k), "+", (c, k, i)),
                             gbufs)
            gmem: dict = {}
            for j, (t, _) in enumerate(self.points(p, cp)[:rp]):  # B(p, j) reads its grad tile
                st = self._access(st, Request(t, "read", cp.devices[j], _ext(p, 1, j)),
                                  pack_key(self.lb(p, j), 1, j, 0), item, 0, tasks, edges,
                                  cmap, gmem)
            _buffer_bytes(gbufs, item, gmem)
            for d, b in gmem.items():  # forward and backward buffers are never live together
                tmem[d] = max(tmem.get(d, 0.0), b)
        if self.pipe is not None:  # buffers of one micro-batch at a time
            m = self.pipe.microbatches
            tmem = {d: b / m for d, b in tmem.items()}
        own: dict = {}
        for j, (t, _) in enumerate(self.points(p, cp)[:rp]):
            own.setdefault(cp.devices[j], []).append(t)
        thold = _slack(own, [(r, dev) for r, dev, _, _ in reads], tasks, item)
        if prod.has_backward and p != P - 1:  # the grad instance: the own tiles' box
            for d, b in _slack(own, [], [], item).items():
                thold[d] = thold.get(d, 0.0) + b
        return _Block(tasks, edges, tmem, thold)

    def _aligned_tensor_block(self, p: int, cp, cons, tiles) -> _Block | None:
        """The tensor block when every consumer tile ``k`` reads exactly the
        producer's tile ``k`` on the same device (data parallelism's usual
        edge), else None: no copies; forward edges ``F(p,k) -> F(c,k)`` per
        read, backward ``B(c,k) -> B(p,k)`` per reducing consumer (what the
        coherence replay gives: the data is valid where it is read and every
        gradient buffer is local; tests/unit/test_replica_blocks.py)."""
        ops, P = self.graph.ops, self.P
        prod = ops[p]
        fwd, bwd = [], []
        if cp.reduce != 1:
            return None
        for c, cc in cons:
            if cc.devices != cp.devices or cc.reduce != 1:
                return None
            ins = [i for i, r in enumerate(ops[c].inputs) if r.op is prod]
            for i in ins:
                if self.need(c, i, cc.degrees) != tiles:
                    return None
            fwd.append(len(ins))
            bwd.append(ops[c].has_backward)
        tmem: dict = {}
        if prod.has_backward and p != P - 1 and any(bwd):  # one local buffer per tile
            # (pipelined: those of one micro-batch at a time)
            share = 1.0 if self.pipe is None else 1.0 / self.pipe.microbatches
            for t, d in zip(tiles[:self.rep_points(p, cp)], cp.devices):
                tmem[d] = tmem.get(d, 0.0) + float(t.volume * prod.itemsize) * share
        ks = np.arange(self.rep_points(p, cp))
        e = [np.zeros((0, 2), np.int64)]
        for (c, _), m, hb in zip(cons, fwd, bwd):
            e.append(np.repeat(np.stack([_ext(p, 0, ks), _ext(c, 0, ks)], 1), m, axis=0))
            if hb and prod.has_backward and p != P - 1:
                e.append(np.stack([_ext(c, 1, ks), _ext(p, 1, ks)], 1))
        return _Block.from_arrays([()] * 8, np.concatenate(e), tmem)

    def _param_block(self, w: int, cfgs) -> _Block:
        param = self.params[w]
        ops = self.graph.ops
        uses = [(ops[q], pname, cfg) for (q, pname), cfg in zip(self.users[w], cfgs)]
        wtiles = param_tiles(param.name, uses)
        item = np.dtype(param.dtype).itemsize
        tasks, edges, cmap = [], [], {}
        shards = [Piece(r, {home: None}, owner=home) for t in wtiles for r, home in t.shards]
        groups = []  # (q, [(pname, weight arg position)], cfg), op order
        for op, pname, cfg in uses:
            pos = 1 + len(op.inputs) + list(op.params).index(pname)
            if groups and groups[-1][0] == op.index:
                groups[-1][1].append((pname, pos))
            else:
                groups.append((op.index, [(pname, pos)], cfg))
        reads = []
        for q, pn, cfg in groups:  # forward reads of w
            op = ops[q]
            for k, (tile, j) in enumerate(self.points(q, cfg)):
                dev = cfg.devices[k]
                for pname, pos in pn:
                    r = op.part_weight_rect(pname, tile, j, cfg.reduce)
                    if r.empty:
                        continue
                    reads.append((r, dev, _ext(q, 0, k), pack_key(self.lf(q, k), 1, k, pos)))
        reducers = []  # backward reductions into g, in launch order
        for q, pn, cfg in reversed(groups):
            op = ops[q]
            if not op.has_backward:
                continue
            for k, (tile, j) in enumerate(self.points(q, cfg)):
                dev = cfg.devices[k]
                for pname, _ in pn:
                    r = op.part_weight_rect(pname, tile, j, cfg.reduce)
                    if not r.empty:
                        reducers.append((r, dev, _ext(q, 1, k), (q, k, pname)))
        L = self.nl + w
        points = update_points(wtiles)
        updates = []
        for t, (r, home) in enumerate(points):
            nb = float(r.volume * item)
            updates.append((pack_key(L, 0, t), self.cost.update_time(
                param, r, self.machine.devices[home]), home, UPDATE, nb, home,
                (2 + self.optimizer_slots) * nb, -1))
        if self.fast_reads and self.vectorised and len(wtiles) == 1:
            whole = wtiles[0].rect
            los = [r.lo for r, _ in points]
            if (all(x[0] == whole for x in reads) and all(x[0] == whole for x in reducers)
                    and los == sorted(los)):
                cols, e = replicated_block(self, points, [x[1:] for x in reads],
                                           [x[1:3] for x in reducers], L, item, updates)
                # one whole-tile buffer per reducing device; each home stages
                # its shard of every other device's buffer
                devs = {x[1] for x in reducers}
                tmem: dict = {}
                for r, home in points:
                    staged = len(devs - {home}) * float(r.volume * item)
                    if staged:
                        tmem[home] = tmem.get(home, 0.0) + staged
                return _Block.from_arrays(cols, e, tmem,
                                          dict.fromkeys(devs, float(whole.volume * item)))
        if self.fast_reads:
            self._fast_reads([[s.rect.lo, s.rect.hi, s.rect, s.valid, s.owner] for s in shards],
                             reads, item, 1, tasks, edges)
        else:
            st = FieldState(shards)
            for r, dev, opc, key0 in reads:
                st = self._access(st, Request(r, "read", dev, opc), key0, item, 1, tasks,
                                  edges, cmap)
        st = FieldState(shards)
        bufs: dict = {}
        for r, dev, code, buf in reducers:
            st = _reduce(st, Request(r, "reduce", dev, code, "+", buf), bufs)
        tmem: dict = {}
        for t, (r, home) in enumerate(points):
            tasks.append(updates[t])
            u = len(tasks) - 1
            st = self._access(st, Request(r, "read_write", home, u), pack_key(L, 1, t, 0),
                              item, 0, tasks, edges, cmap, tmem)
        home: dict = {}
        for r, h in points:
            home.setdefault(h, []).append(r)
        thold = _slack(home, [(r, dev) for r, dev, _, _ in reads], tasks, item)
        _buffer_bytes(bufs, item, thold)
        return _Block(tasks, edges, tmem, thold)

    def buffer_bytes(self) -> np.ndarray:
        """Bytes per device of the reduction and staging buffers at their
        peak (docs/memory.md; a buffer lives from its first reducer to its
        last copy or fold): every weight-gradient buffer (they wait for the
        updates that end the step) plus the largest of the others, which
        one block at a time holds (activation gradients are consumed by the
        next backward task, a home's staged shards by its update)."""
        m = self._bmax
        return self._bheld + (m.max(0) if len(m) else 0.0)

    def _add_buffers(self, bid, blk: _Block) -> None:
        """Count block ``bid``'s buffers (install)."""
        for d, b in blk.thold.items():
            self._bheld[d] += b
        if blk.tmem:
            if not self._bfree:  # double the rows; the new ones are free
                n = len(self._bmax)
                self._bmax = np.vstack([self._bmax, np.zeros((max(n, 8), self.D))])
                self._bfree = list(range(len(self._bmax) - 1, n - 1, -1))
            i = self._brow[bid] = self._bfree.pop()
            for d, b in blk.tmem.items():
                self._bmax[i, d] = b

    def _drop_buffers(self, bid, blk: _Block | None) -> None:
        """Stop counting block ``bid``'s buffers (removal)."""
        if blk is None:
            return
        for d, b in blk.thold.items():
            self._bheld[d] -= b
        i = self._brow.pop(bid, None)
        if i is not None:
            self._bmax[i] = 0.0
            self._bfree.append(i)

    # -- installing blocks -------------------------------------------------------------
    def _block_ids(self, o: int) -> list:
        """Blocks that depend on op o's config, in install order: its tasks,
        the tensors it produces or reads, the parameters it uses."""
        ops = self.graph.ops
        ids = [("op", o), ("tensor", o)]
        prods = sorted({r.op.index for r in ops[o].inputs})
        ids += [("tensor", p) for p in prods]
        ws = []
        for p in ops[o].params.values():
            w = self.pindex[id(p)]
            if w not in ws:
                ws.append(w)
        if self.sync == "collective":
            ids += [("bucket", b) for b in sorted({self.bucket_of[w] for w in ws})]
        else:
            ids += [("param", w) for w in ws]
        return ids

    def _make_block(self, bid, s) -> _Block:
        ops = self.graph.ops
        if bid[0] == "op":
            cfgs = (s[ops[bid[1]].name],)
        elif bid[0] == "tensor":
            p = bid[1]
            cfgs = (s[ops[p].name],) + tuple(s[ops[c].name] for c in self.cons_ops[p])
        elif bid[0] == "bucket":
            cfgs = tuple(s[ops[q].name] for q, _ in self.bucket_uses[bid[1]])
        else:
            cfgs = tuple(s[ops[q].name] for q, _ in self.users[bid[1]])
        ck = (bid, cfgs, self.sym, self.pipe)
        blk = self._blocks.get(ck)
        if blk is None:
            if bid[0] == "op":
                blk = self._op_block(bid[1], *cfgs)
            elif bid[0] == "tensor":
                blk = self._tensor_block(bid[1], cfgs)
            elif bid[0] == "bucket":
                blk = self._bucket_block(bid[1], cfgs)
            else:
                blk = self._param_block(bid[1], cfgs)
            if len(self._blocks) > 200_000:
                self._blocks.clear()
            self._blocks[ck] = blk
        return blk

    def _install(self, bid, blk: _Block) -> np.ndarray:
        n = len(blk.key)
        if n > self.nfree_t:
            self._grow_tasks(n)
        slots = self.free_t[self.nfree_t - n:self.nfree_t][::-1].copy()
        self.nfree_t -= n
        self.alive[slots] = True
        self.key[slots] = blk.key
        self.dur[slots] = blk.dur
        self.res[slots] = blk.res
        self.kind[slots] = blk.kind
        self.nbytes[slots] = blk.nbytes
        self.mdev[slots] = blk.mdev
        self.mbytes[slots] = blk.mbytes
        self.ends[slots] = blk.ends
        if bid[0] == "op":
            o = bid[1]
            self.fslot[o, :] = -1
            self.bslot[o, :] = -1
            self._set_fb(blk.key, slots)
        self.live_tasks[bid] = slots
        self._live_blk[bid] = blk
        self._add_buffers(bid, blk)
        self.coll_info.update(blk.info)
        src, dst = self._resolve(blk.esrc, slots), self._resolve(blk.edst, slots)
        m = len(src)
        if m > self.nfree_e:
            self._grow_edges(m)
        eids = self.free_e[self.nfree_e - m:self.nfree_e][::-1].copy()
        self.nfree_e -= m
        self.esrc[eids], self.edst[eids] = src, dst
        self.ealive[eids] = True
        K.link_edges(eids, *self._lists())
        self.live_edges[bid] = eids
        return slots

    def _set_fb(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Record the slots of the F / B tasks among ``keys`` (op blocks)."""
        kk = keys // (16 * 4096 * 128)
        k, L = kk % 65536, kk // 65536 // 2
        if self.pipe is not None:  # launch index -> (role, op)
            role, o = self._lrole[L], self._lop[L]
            f = role == 0
            self.fslot[o[f], k[f]] = slots[f]
            self.bslot[o[~f], k[~f]] = slots[~f]
            return
        P = self.P
        f = L < P
        self.fslot[L[f], k[f]] = slots[f]
        self.bslot[2 * P - 1 - L[~f], k[~f]] = slots[~f]

    def _resolve(self, codes: np.ndarray, slots, base=None) -> np.ndarray:
        out = np.empty(len(codes), np.int64)
        loc = codes >= 0
        out[loc] = slots[codes[loc]] if base is None else codes[loc] + base[loc]
        ext = -1 - codes[~loc]
        qr, j = ext // MAXT, ext % MAXT
        q, role = qr // 2, qr % 2
        out[~loc] = np.where(role == 0, self.fslot[q, j], self.bslot[q, j])
        if (out < 0).any():
            raise StrategyError("internal: an edge refers to a tile its op does not have")
        return out

    def _remove(self, bid) -> tuple[np.ndarray, np.ndarray]:
        """Remove a block; returns (old resource neighbours of its tasks as
        (prev, next) rows, targets of its edges)."""
        eids = self.live_edges.pop(bid)
        slots = self.live_tasks.pop(bid)
        old = self._live_blk.pop(bid, None)
        self._drop_buffers(bid, old)
        if old is not None:
            for k in old.info:
                self.coll_info.pop(k, None)
        K.unlink_edges(eids, *self._lists())
        self.ealive[eids] = False
        self._release(eids, edges=True)
        targets = self.edst[eids]
        nbrs = K.remove_tasks(slots, self.res, self.dprev, self.dnext, self.dhead, self.dtail)
        self.alive[slots] = False
        self._release(slots, edges=False)
        return nbrs, targets

    def _release(self, ids: np.ndarray, edges: bool) -> None:
        if edges:
            self.free_e[self.nfree_e:self.nfree_e + len(ids)] = ids[::-1]
            self.nfree_e += len(ids)
        else:
            self.free_t[self.nfree_t:self.nfree_t + len(ids)] = ids[::-1]
            self.nfree_t += len(ids)

    # -- pipelines (docs/pipeline.md) -----------------------------------------------------
    def _pipe_factors(self) -> None:
        """Per op: activation memory held under the schedule (micro-batches
        in flight / m; a recomputing stage holds one micro-batch's interior
        activations and its boundary output for those in flight) and
        whether its backward recomputes the forward."""
        pipe, g = self.pipe, self.graph
        stage = pipe.stage_of(g)
        p, m = pipe.num_stages, pipe.microbatches
        self._recomp = recomputes(g, pipe)
        self._mfac = [1.0 / m if rec else in_flight(stage[op.index], p, m, pipe.schedule) / m
                      for op, rec in zip(g.ops, self._recomp)]

    def _pipe_launches(self, coarse, micro) -> None:
        """The launch index of every (role, op, micro-batch), in the order the
        runtime issues them (:func:`legionpy.pipeline.launches`), and each
        fine point's micro-batch."""
        pipe, g = self.pipe, self.graph
        m = pipe.microbatches
        self._lidx = ([[0] * m for _ in g.ops], [[0] * m for _ in g.ops])
        seq = launches(g, pipe)
        for L, (role, o, j) in enumerate(seq):
            self._lidx[role][o][j] = L
        self.nl = len(seq)
        self._lrole = np.array([role for role, _, _ in seq], np.int64)
        self._lop = np.array([o for _, o, _ in seq], np.int64)
        self._mb = []
        major = device_major(g, coarse)
        for op in g.ops:
            c, f = coarse[op.name], micro[op.name]
            self._mb.append([micro_of(op, c.degrees, f.degrees, k, f.reduce, major)
                             for k in range(len(f.devices))])

    def _chain_block(self, micro) -> _Block:
        """Edges only: every device's pipelined forward/backward points in
        the schedule's order (:func:`legionpy.pipeline.device_chains`)."""
        coarse = self.strategy
        chains = device_chains(self.graph, self.pipe, coarse, micro)
        edges = []
        for seq in chains.values():
            codes = [_ext(o, role, k) for role, o, k in seq]
            edges += list(zip(codes[:-1], codes[1:]))
        return _Block([], edges)

    # -- public ------------------------------------------------------------------------
    def build(self, strategy) -> None:
        """Make the whole task graph for ``strategy`` (validated) in fresh pools:
        all blocks are concatenated and their edges linked in one pass; only
        node 0's tasks when the strategy is node-symmetric (``self.sym``)."""
        strategy.validate(self.graph, self.machine)
        self.strategy = strategy
        self.sym = None
        self.pipe = strategy.pipeline
        self.nl = 2 * self.P
        if self.pipe is not None:  # micro-batches as tiles, chained in schedule order
            micro = strategy.micro(self.graph)
            self._pipe_factors()
            self._pipe_launches(strategy, micro)
            return self._build(micro)
        if (self.symmetry and self.sync == "collective" and self._classes is not None
                and symmetric_blocks(self.graph, strategy, *self._classes)):
            self.sym = self._classes
            try:
                return self._build(strategy)
            except Asymmetric:
                self.sym = None
        self._build(strategy)

    def _build(self, strategy) -> None:
        ops = self.graph.ops
        bids = [("op", o) for o in range(len(ops))]
        bids += [("tensor", o) for o in range(len(ops))]
        if self.sync == "collective":
            bids += [("bucket", b) for b in range(len(self.buckets))]
        else:
            bids += [("param", w) for w in range(len(self.params))]
        blks = [self._make_block(b, strategy) for b in bids]
        if self.pipe is not None:
            bids.append(("pipeline", 0))
            blks.append(self._chain_block(strategy))
        nt = np.array([len(b.key) for b in blks], np.int64)
        ne = np.array([len(b.esrc) for b in blks], np.int64)
        toff = np.concatenate([[0], np.cumsum(nt)])
        eoff = np.concatenate([[0], np.cumsum(ne)])
        N, M = int(toff[-1]), int(eoff[-1])
        self._alloc(N + N // 8 + 64, M + M // 8 + 64)  # delta grows on demand
        self.nfree_t, self.nfree_e = self.cap_t - N, self.cap_e - M
        for f in ("key", "dur", "res", "kind", "nbytes", "mdev", "mbytes", "ends"):
            getattr(self, f)[:N] = np.concatenate([getattr(b, f) for b in blks])
        self.alive[:N] = True
        self.live_tasks = {b: np.arange(toff[i], toff[i + 1]) for i, b in enumerate(bids)}
        self._live_blk = dict(zip(bids, blks))
        self.coll_info = {}
        for blk in blks:
            self.coll_info.update(blk.info)
        self._brow, self._bmax, self._bheld = {}, np.zeros((0, self.D)), np.zeros(self.D)
        self._bfree = []
        for b, blk in zip(bids, blks):
            self._add_buffers(b, blk)
        self.live_edges = {b: np.arange(eoff[i], eoff[i + 1]) for i, b in enumerate(bids)}
        n_op = int(toff[len(ops)])
        self.fslot[:] = -1
        self.bslot[:] = -1
        self._set_fb(self.key[:n_op], np.arange(n_op))
        base = np.repeat(toff[:-1], ne)
        for name, codes in (("esrc", [b.esrc for b in blks]), ("edst", [b.edst for b in blks])):
            c = np.concatenate(codes) if M else np.zeros(0, np.int64)
            getattr(self, name)[:M] = self._resolve(c, None, base)
        self.ealive[:M] = True
        K.link_edges(np.arange(M), *self._lists())

    def change(self, op_name: str, config):
        """Give op ``op_name`` a new config: replace the blocks that depend on
        it. Returns the seeds of Algorithm 2 (see simkernels.delta_sim):
        ``(new, new_hint, pend, checks)`` -- the new task slots (in no
        resource list yet, start/end -1), for each a task on its resource near
        the removed ones (or -1), the surviving tasks whose predecessor set
        changed, and the surviving tasks whose resource predecessor was
        removed."""
        op = self.graph.op(op_name)
        config.validate(op, self.machine)
        new = self.strategy.with_config(op_name, config)
        bids = self._block_ids(op.index)
        new_blks = [self._make_block(bid, new) for bid in bids]  # may add communicators
        nbrs, targets = [], []
        for bid in reversed(bids):
            nb, tg = self._remove(bid)
            nbrs.append(nb.ravel())
            targets.append(tg)
        nbrs = np.concatenate(nbrs)
        nbrs = nbrs[nbrs >= 0]
        nbrs = nbrs[self.alive[nbrs]]  # survivors only (before slots are reused)
        rhint = np.full(self.n_res, -1, np.int64)
        rhint[self.res[nbrs]] = nbrs
        self.strategy = new
        added = []
        for bid, blk in zip(bids, new_blks):
            slots = self._install(bid, blk)
            added.append(slots)
            targets.append(self.edst[self.live_edges[bid]])
        added = np.concatenate(added) if added else np.zeros(0, np.int64)
        self.start[added] = -1.0
        self.end[added] = -1.0  # marks them new below
        pend = np.unique(np.concatenate(targets))
        pend = pend[self.alive[pend] & (self.end[pend] >= 0)]
        checks = nbrs[self.end[nbrs] >= 0]
        return added, rhint[self.res[added]], pend, checks

    # -- views ---------------------------------------------------------------------
    def order(self) -> np.ndarray:
        """Alive slots in increasing key order (position = stable task id)."""
        idx = np.flatnonzero(self.alive)
        return idx[np.argsort(self.key[idx], kind="stable")]

    def edges(self) -> np.ndarray:
        """Alive edges as (src slot, dst slot) rows."""
        e = np.flatnonzero(self.ealive)
        return np.stack([self.esrc[e], self.edst[e]], 1)

    def resource_name(self, r: int) -> str:
        if r < self.D:
            return self.machine.devices[r].name
        if r < self.D + self.machine.num_links:
            return self.machine.links[r - self.D].name
        return comm_name(self._comm_group[r])

    def task_name(self, slot: int) -> str:
        """``F:op[k]``, ``B:op[k]``, ``U:param[t]``; copies
        ``X:<task it feeds>.<arg>.<n>@<src>-><dst>`` (+ ``/hop`` beyond the first);
        collective sync (docs/seam.md): ``RS:b<bucket>.<group>``,
        ``U:b<bucket>.<group>[p]``, ``AG:b<bucket>.<group>``."""
        key = int(self.key[slot])
        L, part, k, arg, c, hop = unpack_key(key)
        if L >= self.nl + len(self.params):
            b = L - self.nl - len(self.params)
            info = self.coll_info.get(key)
            if info is not None:
                return f"{'RS' if info[0] == 'reduce_scatter' else 'AG'}:b{b}.{arg}"
            return f"U:b{b}.{arg}[{k - 1}]"
        task = self.task_name_of(L, k)
        if not part:
            return task
        e = int(self.ends[slot])
        return f"X:{task}.{arg}.{c}@{e // 65536}->{e % 65536}" + (f"/{hop}" if hop else "")

    def feeds(self, slot: int) -> str:
        """Name of the task a copy feeds (a task: itself)."""
        L, _, k, *_ = unpack_key(int(self.key[slot]))
        return self.task_name_of(L, k)

    def task_name_of(self, L: int, k: int) -> str:
        ops, P = self.graph.ops, self.P
        if L >= self.nl:
            return f"U:{self.params[L - self.nl].name}[{k}]"
        if self.pipe is not None:
            return f"{'FB'[self._lrole[L]]}:{ops[self._lop[L]].name}[{k}]"
        if L < P:
            return f"F:{ops[L].name}[{k}]"
        return f"B:{ops[2 * P - 1 - L].name}[{k}]"

    # -- launch indices (the key's L: the runtime's launch order) ---------------------
    def lf(self, o: int, k: int) -> int:
        """Launch index of ``F(o, k)``: ``o``; pipelined, the position of its
        micro-batch's launch in the schedule's program order."""
        return o if self.pipe is None else self._lidx[0][o][self._mb[o][k]]

    def lb(self, o: int, k: int) -> int:
        """Launch index of ``B(o, k)``: ``2P - 1 - o``; pipelined, as :meth:`lf`."""
        return 2 * self.P - 1 - o if self.pipe is None else self._lidx[1][o][self._mb[o][k]]

    def to_json(self, include_times: bool = False) -> dict:
        """DESIGN.md's ``--taskgraph`` format; ids are positions in key order."""
        order = self.order()
        pos = np.full(self.cap_t, -1, np.int64)
        pos[order] = np.arange(len(order))
        tasks = []
        for i, s in enumerate(order):
            t = {"id": i, "name": self.task_name(s), "kind": KIND_NAMES[self.kind[s]],
                 "device": self.resource_name(int(self.res[s])),
                 "duration_s": float(self.dur[s]), "bytes": int(self.nbytes[s])
                 if self.kind[s] == COPY else 0}
            info = self.coll_info.get(int(self.key[s]))
            if info is not None:  # docs/seam.md: a collective as one unit
                t.update(collective=info[0], group=list(info[1]), algorithm=info[2],
                         bytes=int(info[3]), link_bytes=float(self.nbytes[s]))
            if include_times:
                t["start_s"], t["end_s"] = float(self.start[s]), float(self.end[s])
            tasks.append(t)
        e = self.edges()
        deps = sorted(zip(pos[e[:, 0]].tolist(), pos[e[:, 1]].tolist())) if len(e) else []
        out = {"tasks": tasks, "deps": [list(d) for d in deps]}
        if self.sym is not None:  # node 0's tasks stand for every node's
            out["symmetry"] = {"classes": self.sym[0], "devices_per_class": self.sym[1]}
        return out
