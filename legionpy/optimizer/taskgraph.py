"""The iteration task graph (paper section 5.1; DESIGN.md section 2, built
exactly), stored in flat arrays so one operator's tasks can be replaced in
place for delta simulation (Algorithm 2).

Tasks, for operator ``o`` with config ``c`` (tile ``k`` = ``Rect.split`` point
``k`` in row-major order, on device ``c.devices[k]``):

- ``F(o,k)`` forward (for an input op: the load, costing the host-to-device
  copy of the tile); ``B(o,k)`` backward, after ``F(o,k)`` (input ops have none).
- For input ``i`` of ``o`` produced by ``p`` and each producer tile ``j`` that
  intersects ``need = op.input_rect(i, tile k)``: same device -> edges
  ``F(p,j) -> F(o,k)`` and ``B(o,k) -> B(p,j)``; different devices -> a copy
  of ``volume(tile_j & need) * itemsize`` bytes on every link of the route,
  hop after hop: ``F(p,j) -> X -> F(o,k)``, and the gradient copy back
  ``B(o,k) -> Y -> B(p,j)``.
- Weights: each distinct ``(parameter, weight_rect)`` is a weight tile,
  numbered in first-use order over (op order, k); its home is the device of
  that first use. Each other device using it gets a copy home -> device (no
  predecessor: it follows the previous iteration's update) before its ``F``
  tasks; each such device sends one gradient copy back after all its ``B``
  tasks using the tile; ``U(param, tile)`` on the home follows the home's
  ``B`` tasks and every gradient copy.

Stable task ids. Each task has a 58-bit key, a pure function of what the task
is, never of build order: ``((((owner*256 + role)*65536 + a)*65536 + b)*16 +
hop)`` with

========================  ======  ==============  ===================  =======
task                      owner   role            a                    b
========================  ======  ==============  ===================  =======
F(o,k) / B(o,k)           o       0 / 1           k                    0
forward copy, input i     o       2 + 2i          consumer tile k      producer tile j
gradient copy, input i    o       3 + 2i          k                    j
weight copy               P + w   0               weight tile          dst device
weight-gradient copy      P + w   1               weight tile          src device
update U                  P + w   2               weight tile          0
========================  ======  ==============  ===================  =======

(``o``: op index in graph order; ``P``: number of ops; ``w``: parameter index
in first-use order; ``hop``: position on the route.) The keys break FIFO ties
in the simulator; the ``--taskgraph`` JSON (and the runtime's trace) number
tasks ``0..n-1`` in increasing key order.
"""

from __future__ import annotations

import numpy as np

from ..errors import StrategyError
from . import simkernels as K

__all__ = ["TaskGraph", "pack_key", "KIND_NAMES"]

MAXT = 1024  # tiles per op
F_, B_, COPY, UPDATE, LOAD = 0, 1, 2, 3, 4
KIND_NAMES = ("compute", "compute", "copy", "update", "compute")


def pack_key(owner, role, a=0, b=0, hop=0):
    return ((((owner * 256 + role) * 65536 + a) * 65536 + b) * 16 + hop)


def _ext(q, role, j):
    """Edge endpoint code of F (role 0) or B (role 1) of op q tile j."""
    return -1 - ((q * 2 + role) * MAXT + j)


class _Block:
    """Tasks (arrays) and edges (codes: >= 0 local index, < 0 external F/B)."""

    __slots__ = ("key", "dur", "res", "kind", "nbytes", "mdev", "mbytes", "esrc", "edst")

    def __init__(self, tasks, edges):
        cols = list(zip(*tasks)) if tasks else [()] * 7
        self.key = np.array(cols[0], np.int64)
        self.dur = np.array(cols[1], np.float64)
        self.res = np.array(cols[2], np.int64)
        self.kind = np.array(cols[3], np.int8)
        self.nbytes = np.array(cols[4], np.float64)
        self.mdev = np.array(cols[5], np.int64)
        self.mbytes = np.array(cols[6], np.float64)
        e = np.array(edges, np.int64).reshape(-1, 2)
        self.esrc, self.edst = e[:, 0].copy(), e[:, 1].copy()


class TaskGraph:
    """The task graph of (graph, strategy, machine, cost model); see the module
    docstring. ``build(strategy)`` makes it from scratch; ``change(op, config)``
    replaces one op's config and returns the seed tasks for Algorithm 2."""

    def __init__(self, graph, machine, cost_model) -> None:
        self.graph, self.machine, self.cost = graph, machine, cost_model
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
        if len(ops) + len(self.params) >= 2**14:
            raise StrategyError(f"graph has {len(ops)} ops and {len(self.params)} parameters; "
                                f"task keys allow 16383 in all")
        self._tiles: dict = {}
        self._pairs: dict = {}
        self._blocks: dict = {}  # (block id, configs) -> _Block (cache)
        self.fslot = np.full((len(ops), MAXT), -1, np.int64)
        self.bslot = np.full((len(ops), MAXT), -1, np.int64)
        self.live_tasks: dict = {}  # block id -> slots
        self.live_edges: dict = {}
        self.strategy = None
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
        self.ready, self.start, self.end = np.zeros(nt), np.zeros(nt), np.zeros(nt)
        self.dprev = np.full(nt, -1, np.int64)
        self.dnext = np.full(nt, -1, np.int64)
        self.out_head = np.full(nt, -1, np.int64)
        self.in_head = np.full(nt, -1, np.int64)
        self.dhead = np.full(self.n_res, -1, np.int64)
        self.dtail = np.full(self.n_res, -1, np.int64)
        self.free_t = np.arange(nt - 1, -1, -1, dtype=np.int64)
        self.nfree_t = nt
        self.esrc = np.zeros(ne, np.int64)
        self.edst = np.zeros(ne, np.int64)
        self.ealive = np.zeros(ne, np.bool_)
        self.out_next, self.out_prev = np.full(ne, -1, np.int64), np.full(ne, -1, np.int64)
        self.in_next, self.in_prev = np.full(ne, -1, np.int64), np.full(ne, -1, np.int64)
        self.free_e = np.arange(ne - 1, -1, -1, dtype=np.int64)
        self.nfree_e = ne

    def _grow_tasks(self, need: int) -> None:
        old = self.cap_t
        new = max(2 * old, old + need)
        for name, fill in (("alive", False), ("key", 0), ("dur", 0), ("res", 0), ("kind", 0),
                           ("nbytes", 0), ("mdev", 0), ("mbytes", 0), ("ready", 0),
                           ("start", 0), ("end", 0), ("dprev", -1), ("dnext", -1),
                           ("out_head", -1), ("in_head", -1)):
            a = getattr(self, name)
            b = np.full(new, fill, a.dtype)
            b[:old] = a
            setattr(self, name, b)
        stack = np.empty(new, np.int64)
        stack[:new - old] = np.arange(new - 1, old - 1, -1)
        stack[new - old:new - old + self.nfree_t] = self.free_t[:self.nfree_t]
        self.free_t = stack
        self.nfree_t += new - old
        self.cap_t = new

    def _grow_edges(self, need: int) -> None:
        old = self.cap_e
        new = max(2 * old, old + need)
        for name, fill in (("esrc", 0), ("edst", 0), ("ealive", False), ("out_next", -1),
                           ("out_prev", -1), ("in_next", -1), ("in_prev", -1)):
            a = getattr(self, name)
            b = np.full(new, fill, a.dtype)
            b[:old] = a
            setattr(self, name, b)
        stack = np.empty(new, np.int64)
        stack[:new - old] = np.arange(new - 1, old - 1, -1)
        stack[new - old:new - old + self.nfree_e] = self.free_e[:self.nfree_e]
        self.free_e = stack
        self.nfree_e += new - old
        self.cap_e = new

    def _lists(self):
        return (self.esrc, self.edst, self.out_head, self.out_next, self.out_prev,
                self.in_head, self.in_next, self.in_prev)

    # -- geometry (cached, device independent) ----------------------------------
    def tiles(self, o: int, degrees: tuple) -> list:
        k = (o, degrees)
        t = self._tiles.get(k)
        if t is None:
            t = self._tiles[k] = self.graph.ops[o].output_rect.split(degrees)
            if len(t) > MAXT:
                raise StrategyError(f"op {self.graph.ops[o].name!r}: {len(t)} tiles exceed "
                                    f"the limit of {MAXT}")
        return t

    def pairs(self, o: int, i: int, dp: tuple, do: tuple) -> list:
        """``(j, k, volume)`` of producer tiles j meeting consumer tile k's need."""
        k_ = (o, i, dp, do)
        r = self._pairs.get(k_)
        if r is None:
            op = self.graph.ops[o]
            ref = op.inputs[i]
            tp, to = self.tiles(ref.op.index, dp), self.tiles(o, do)
            r = []
            for k, tk in enumerate(to):
                need = op.input_rect(i, tk)
                if need.empty:
                    continue
                need = ref.to_base(need)
                for j, tj in enumerate(tp):
                    v = (tj & need).volume
                    if v:
                        r.append((j, k, v))
            self._pairs[k_] = r
        return r

    # -- blocks --------------------------------------------------------------------
    def _route(self, a: int, b: int):
        return self.machine.route(a, b)

    def _copy_chain(self, tasks, edges, key0, src_dev, dst_dev, nbytes, mem_dev, mem_bytes,
                    pred, succ):
        """Append hops of a copy; edges pred -> hop0 -> ... -> succ (codes)."""
        prev = pred
        route = self._route(src_dev, dst_dev)
        for h, lid in enumerate(route):
            ln = self.machine.links[lid]
            last = h == len(route) - 1
            tasks.append((key0 + h, self.cost.copy_time(nbytes, ln), self.D + lid, COPY,
                          nbytes, mem_dev if last else 0, mem_bytes if last else 0.0))
            cur = len(tasks) - 1
            if prev is not None:
                edges.append((prev, cur))
            prev = cur
        if succ is not None:
            edges.append((prev, succ))
        return prev

    def _op_block(self, o: int, cfg) -> _Block:
        op = self.graph.ops[o]
        tasks, edges = [], []
        for k, tile in enumerate(self.tiles(o, cfg.degrees)):
            dev = cfg.devices[k]
            spec = self.machine.devices[dev]
            out_b = float(tile.volume * op.itemsize)
            if op.kind == "input":
                tasks.append((pack_key(o, 0, k), self.cost.load_time(out_b, spec), dev, LOAD,
                              out_b, dev, out_b))
                continue
            f, b = self.cost.op_time(op, tile, spec)
            tasks.append((pack_key(o, 0, k), f, dev, F_, out_b, dev, 2 * out_b))
            tasks.append((pack_key(o, 1, k), b, dev, B_, out_b, dev, 0.0))
            edges.append((len(tasks) - 2, len(tasks) - 1))
        return _Block(tasks, edges)

    def _edge_block(self, o: int, i: int, cp, co) -> _Block:
        op = self.graph.ops[o]
        p = op.inputs[i].op
        back = p.has_backward and op.has_backward
        tasks, edges = [], []
        for j, k, vol in self.pairs(o, i, cp.degrees, co.degrees):
            a, b = cp.devices[j], co.devices[k]
            if a == b:
                edges.append((_ext(p.index, 0, j), _ext(o, 0, k)))
                if back:
                    edges.append((_ext(o, 1, k), _ext(p.index, 1, j)))
                continue
            nb = float(vol * p.itemsize)
            self._copy_chain(tasks, edges, pack_key(o, 2 + 2 * i, k, j), a, b, nb, b, 2 * nb,
                             _ext(p.index, 0, j), _ext(o, 0, k))
            if back:
                self._copy_chain(tasks, edges, pack_key(o, 3 + 2 * i, k, j), b, a, nb, a, 0.0,
                                 _ext(o, 1, k), _ext(p.index, 1, j))
        return _Block(tasks, edges)

    def _param_block(self, w: int, cfgs) -> _Block:
        param = self.params[w]
        owner = len(self.graph.ops) + w
        tiles: dict = {}  # rect -> (tile index, home)
        uses: dict = {}   # (tile index, device) -> [(q, k)]
        for (q, pname), cfg in zip(self.users[w], cfgs):
            op = self.graph.ops[q]
            for k, tile in enumerate(self.tiles(q, cfg.degrees)):
                r = op.weight_rect(pname, tile)
                dev = cfg.devices[k]
                t = tiles.setdefault(r, (len(tiles), dev))[0]
                uses.setdefault((t, dev), []).append((q, k))
        tasks, edges = [], []
        item = np.dtype(param.dtype).itemsize
        for r, (t, home) in tiles.items():
            nb = float(r.volume * item)
            tasks.append((pack_key(owner, 2, t), self.cost.update_time(
                param, r, self.machine.devices[home]), home, UPDATE, nb, home, 2 * nb))
            u = len(tasks) - 1
            for (t2, dev), qk in uses.items():
                if t2 != t:
                    continue
                if dev == home:
                    edges.extend((_ext(q, 1, k), u) for q, k in qk)
                    continue
                last = self._copy_chain(tasks, edges, pack_key(owner, 0, t, dev), home, dev,
                                        nb, dev, 2 * nb, None, None)
                edges.extend((last, _ext(q, 0, k)) for q, k in qk)
                first = len(tasks)
                self._copy_chain(tasks, edges, pack_key(owner, 1, t, dev), dev, home, nb,
                                 home, 0.0, None, u)
                edges.extend((_ext(q, 1, k), first) for q, k in qk)
        return _Block(tasks, edges)

    # -- installing blocks -------------------------------------------------------------
    def _block_ids(self, o: int) -> list:
        """Blocks that depend on op o's config, in install order."""
        ids = [("op", o)]
        ids += [("edge", o, i) for i in range(len(self.graph.ops[o].inputs))]
        ids += [("edge", c, i) for c, i in self.consumers[o]]
        ids += [("param", self.pindex[id(p)]) for p in self.graph.ops[o].params.values()]
        return ids

    def _make_block(self, bid, s) -> _Block:
        ops = self.graph.ops
        if bid[0] == "op":
            cfgs = (s[ops[bid[1]].name],)
        elif bid[0] == "edge":
            o, i = bid[1], bid[2]
            cfgs = (s[ops[o].inputs[i].op.name], s[ops[o].name])
        else:
            cfgs = tuple(s[ops[q].name] for q, _ in self.users[bid[1]])
        ck = (bid, cfgs)
        blk = self._blocks.get(ck)
        if blk is None:
            if bid[0] == "op":
                blk = self._op_block(bid[1], *cfgs)
            elif bid[0] == "edge":
                blk = self._edge_block(bid[1], bid[2], *cfgs)
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
        if bid[0] == "op":
            o = bid[1]
            self.fslot[o, :] = -1
            self.bslot[o, :] = -1
            tk = (blk.key // 16 // 65536 // 65536).astype(np.int64)
            role, k = tk % 256, (blk.key // 16 // 65536) % 65536
            self.fslot[o, k[role == 0]] = slots[role == 0]
            self.bslot[o, k[role == 1]] = slots[role == 1]
        self.live_tasks[bid] = slots
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

    # -- public ------------------------------------------------------------------------
    def build(self, strategy) -> None:
        """Make the whole task graph for ``strategy`` (validated) in fresh pools:
        all blocks are concatenated and their edges linked in one pass."""
        strategy.validate(self.graph, self.machine)
        self.strategy = strategy
        ops = self.graph.ops
        bids = [("op", o) for o in range(len(ops))]
        bids += [("edge", o, i) for o in range(len(ops)) for i in range(len(ops[o].inputs))]
        bids += [("param", w) for w in range(len(self.params))]
        blks = [self._make_block(b, strategy) for b in bids]
        nt = np.array([len(b.key) for b in blks], np.int64)
        ne = np.array([len(b.esrc) for b in blks], np.int64)
        toff = np.concatenate([[0], np.cumsum(nt)])
        eoff = np.concatenate([[0], np.cumsum(ne)])
        N, M = int(toff[-1]), int(eoff[-1])
        self._alloc(max(self.cap_t, 2 * N + 64), max(self.cap_e, 2 * M + 64))
        self.nfree_t, self.nfree_e = self.cap_t - N, self.cap_e - M
        for f in ("key", "dur", "res", "kind", "nbytes", "mdev", "mbytes"):
            getattr(self, f)[:N] = np.concatenate([getattr(b, f) for b in blks])
        self.alive[:N] = True
        self.live_tasks = {b: np.arange(toff[i], toff[i + 1]) for i, b in enumerate(bids)}
        self.live_edges = {b: np.arange(eoff[i], eoff[i + 1]) for i, b in enumerate(bids)}
        n_op = int(toff[len(ops)])
        key = self.key[:n_op]
        kk = key // 16 // 65536
        k, role, o = kk % 65536, (kk // 65536) % 256, kk // 65536 // 256
        self.fslot[:] = -1
        self.bslot[:] = -1
        slots = np.arange(n_op)
        self.fslot[o[role == 0], k[role == 0]] = slots[role == 0]
        self.bslot[o[role == 1], k[role == 1]] = slots[role == 1]
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
        for bid in bids:
            slots = self._install(bid, self._make_block(bid, new))
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
        return self.machine.links[r - self.D].name

    def task_name(self, slot: int) -> str:
        key = int(self.key[slot])
        hop, key = key % 16, key // 16
        b, key = key % 65536, key // 65536
        a, key = key % 65536, key // 65536
        role, owner = key % 256, key // 256
        ops = self.graph.ops
        if owner >= len(ops):
            p = self.params[owner - len(ops)].name
            what = ("wcopy", "gcopy", "update")[role]
            return f"{what}:{p}[{a}]" + (f"@{b}.{hop}" if role < 2 else "")
        name = ops[owner].name
        if role < 2:
            return f"{'FB'[role]}:{name}[{a}]"
        i = (role - 2) // 2
        return f"{'xf' if role % 2 == 0 else 'xb'}:{name}.in{i}[{a}<-{b}].{hop}"

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
            if include_times:
                t["start_s"], t["end_s"] = float(self.start[s]), float(self.end[s])
            tasks.append(t)
        e = self.edges()
        deps = sorted(zip(pos[e[:, 0]].tolist(), pos[e[:, 1]].tolist())) if len(e) else []
        return {"tasks": tasks, "deps": [list(d) for d in deps]}
