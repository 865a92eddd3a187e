"""Bucket blocks of the task graph in collective sync mode (docs/seam.md):
the data-parallel weight update as reduce-scatter of gradients + update of
each device's chunk + all-gather of weights, per bucket of parameters and
replica group, instead of per-shard point-to-point copies and folds.

The rule is :mod:`legionpy.collectives` (buckets, groups, algorithm, alpha-
beta cost), the same the runtime transports run; this module only turns it
into task-graph rows for :class:`~legionpy.optimizer.taskgraph.TaskGraph`
(it does not import it: taskgraph imports this module). Per bucket ``b``
and group ``G`` (``n`` devices, ``B`` bytes of tiles):

- ``RS(b, g)``: one task on the group's communicator resource, after every
  gradient-ready task (``TaskGraph.grad_ready``: ``B(q, k)``) of every
  point using one of the group's tiles; its duration is
  ``collective_time("reduce_scatter", G, B, alg)`` with the algorithm
  :func:`~legionpy.collectives.choose_algorithm` picks on the machine's
  links; its ``nbytes`` the bytes it moves over links;
- ``U(b, g, p)`` on ``G[p]``: the optimizer on chunk ``p``; memory: the
  device's replica of the weights and gradients (``2 B``) plus the
  optimizer state of its chunk;
- ``AG(b, g)`` after every ``U``: the all-gather of the updated weights.

A group of one device has no collective: its ``U`` follows its ``B`` tasks.
Forward reads of weights are local in this mode (every user holds the
whole tile after the previous iteration's all-gather): no weight copies.
"""

from __future__ import annotations

import numpy as np

from .. import collectives as C
from ..geometry import Rect
from ..placement import param_tiles, uniform_weight_rect

__all__ = ["bucket_block", "CollectiveCosts"]

COPY, UPDATE, COLLECTIVE = 2, 3, 5  # taskgraph's kinds (not imported, see above)


class CollectiveCosts:
    """Algorithm choice and seconds of collectives on one machine and cost
    model, cached by (kind, group, bytes).

    Routes: on a node-symmetric machine (every node the same devices and
    local switches, wired the same way to the shared ones) the route of
    ``s -> d`` is node ``t = node(s)``'s translation of ``s - tG -> d - tG``
    (mod the devices), so only node 0's ``G`` shortest-path trees are ever
    computed -- 8,192 trees at 8,192 GPUs took minutes. Else
    :meth:`Machine.route`."""

    def __init__(self, machine, cost_model) -> None:
        self.machine, self.cost = machine, cost_model
        self._node = [d.node for d in machine.devices]
        self._cache: dict = {}
        self._lt: dict = {}
        self._tr = _Translation.of(machine)
        self._plans: dict = {}  # (kind, group) -> {algorithm: collectives.cost_plan}
        self._hshape: dict = {}

    def node_of(self, d: int) -> int:
        return self._node[d]

    def route(self, s: int, d: int) -> tuple:
        tr = self._tr
        if tr is None:
            return self.machine.route(s, d)
        t = s // tr.G
        if t == 0:
            return self.machine.route(s, d)
        r0 = self.machine.route(s - t * tr.G, (d - t * tr.G) % tr.D)
        return tuple(tr.link(lk, t) for lk in r0)

    def _link_time(self, lid: int, nb: float) -> float:
        k = (lid, nb)
        t = self._lt.get(k)
        if t is None:
            t = self._lt[k] = self.cost.copy_time(nb, self.machine.links[lid])
        return t

    def _link_key(self, lid: int):
        ln = self.machine.links[lid]
        return (ln.latency, ln.bandwidth)

    def plan(self, kind: str, group: tuple, nbytes: float) -> tuple[str, float, float]:
        """``(algorithm, seconds, bytes over links)`` (cached; the routes
        of a (kind, group) are analysed once for every bucket size)."""
        key = (kind, group, nbytes)
        got = self._cache.get(key)
        if got is None:
            plans = self._plans.setdefault((kind, group), {})
            alg, t = C.choose_algorithm(kind, group, nbytes, self.route, self._link_time,
                                        self.node_of, self._link_key, plans)
            moved = C.plan_bytes(plans[alg], nbytes) if alg in plans else 0.0
            got = self._cache[key] = (alg, t, float(moved))
        return got


class _Translation:
    """Node shifts of a node-symmetric machine's links (see
    :class:`CollectiveCosts`): endpoint ``e`` of node ``m`` maps to the
    same endpoint of node ``(m + t) mod N``; shared switches stay."""

    def __init__(self, D, G, N, local, where, pair, ends):
        self.D, self.G, self.N = D, G, N
        self.local, self.where, self.pair, self.ends = local, where, pair, ends

    @classmethod
    def of(cls, machine):
        from .symmetry import node_classes

        nc = node_classes(machine)
        if nc is None:
            return None
        N, G = nc
        D = machine.num_devices
        idx = {d.name: d.id for d in machine.devices}
        for j, sw in enumerate(machine.switches):
            idx[sw] = D + j
        ends = [(idx[ln.src], idx[ln.dst]) for ln in machine.links]
        nodes_of: dict = {}
        for a, b in ends:
            for x, y in ((a, b), (b, a)):
                if x >= D:
                    nodes_of.setdefault(x, set())
                    if y < D:
                        nodes_of[x].add(machine.devices[y].node)
        local: dict = {}  # (node, k) -> switch endpoint
        where: dict = {}  # switch endpoint -> (node, k)
        for x in sorted(nodes_of):
            ns = nodes_of[x]
            if len(ns) == 1:
                m = next(iter(ns))
                k = sum(1 for (mm, _) in local if mm == m)
                local[(m, k)] = x
                where[x] = (m, k)
        per = [sum(1 for (mm, _) in local if mm == m) for m in range(N)]
        if any(c != per[0] for c in per):
            return None
        pair = {e: i for i, e in enumerate(ends)}
        tr = cls(D, G, N, local, where, pair, ends)
        try:  # every link must have its translation
            for lk in range(len(ends)):
                tr.link(lk, 1)
        except KeyError:
            return None
        return tr

    def _end(self, e: int, t: int) -> int:
        if e < self.D:
            return (e + t * self.G) % self.D
        w = self.where.get(e)
        if w is None:
            return e  # shared
        return self.local[((w[0] + t) % self.N, w[1])]

    def link(self, lk: int, t: int) -> int:
        a, b = self.ends[lk]
        return self.pair[(self._end(a, t), self._end(b, t))]


def bucket_block(tg, b: int, cfgs, ext, pack_key, min_duration: float):
    """Task columns, edge codes and collective info of bucket ``b``
    (``cfgs``: the configs of ``tg.bucket_uses[b]``, in order). Returns
    ``(cols, edges, info, held)``; ``info``: ``{key: (kind, group, algorithm,
    bytes)}`` of its collective tasks (``--taskgraph``, the mirror);
    ``held``: ``{device: bytes}`` of the weight-gradient reduction buffers
    its backward tasks fill before the reduce-scatter folds them into the
    flat gradient row: the bucket's collectives fold them as the backward
    pass goes, so one bucket's are counted at a time (the block's ``tmem``,
    docs/memory.md)."""
    ops = tg.graph.ops
    tiles = []  # (tile, users, bytes, param, contributors)
    i = 0
    for w in tg.buckets[b]:
        param = tg.params[w]
        n_use = len(tg.users[w])
        uses = [(ops[q], pname, cfg) for (q, pname), cfg in zip(tg.users[w],
                                                                 cfgs[i:i + n_use])]
        i += n_use
        item = np.dtype(param.dtype).itemsize
        for t in param_tiles(param.name, uses):
            contrib = []
            for op, pname, cfg in uses:
                if not op.has_backward:
                    continue
                red = cfg.reduce
                wr = uniform_weight_rect(op, pname, cfg)
                if wr is not None:  # every point reads wr
                    if not wr.empty and (wr & t.rect).volume:
                        for k in range(tg.rep_points(op.index, cfg)):
                            contrib.extend(tg.grad_ready(op.index, k))
                    continue
                for k, (tile, j) in enumerate(tg.points(op.index, cfg)):
                    if k >= tg.rep_points(op.index, cfg):
                        break
                    wr = op.part_weight_rect(pname, tile, j, red)
                    if not wr.empty and (wr & t.rect).volume:
                        contrib.extend(tg.grad_ready(op.index, k))
            tiles.append((t, t.users, float(t.rect.volume * item), param, contrib,
                          t.rect.volume))
    L = tg.nl + len(tg.params) + b
    rows, edges, info, held = [], [], {}, {}
    slots = tg.optimizer_slots
    machine = tg.machine
    for gi, (group, idx, nbytes) in enumerate(C.bucket_groups([x[:3] for x in tiles])):
        n = len(group)
        param = tiles[idx[0]][3]
        contrib = list(dict.fromkeys(c for x in idx for c in tiles[x][4]))
        elems = sum(tiles[x][5] for x in idx)
        item = nbytes / max(1, elems)
        if contrib:  # each member's gradients of the group's tiles, before the fold
            for dev in group:
                if tg.sym is None or dev < tg.sym[1]:
                    held[dev] = held.get(dev, 0.0) + nbytes
        if n == 1:  # no collective: a no-op
            dev = group[0]
            if tg.sym is not None and dev >= tg.sym[1]:
                continue  # another node's (symmetric simulation: node 0 only)
            u = len(rows)
            rows.append((pack_key(L, 0, 1, gi), tg.cost.update_time(
                param, Rect((0,), (max(1, elems),)), machine.devices[dev]), dev, UPDATE,
                nbytes, dev, (2 + slots) * nbytes, -1))
            edges.extend((c, u) for c in contrib)
            continue
        res = tg.comm_resource(group)
        nbytes = C.padded(elems, n) * item  # the flat buffer, equal chunks
        alg, t_rs, mv_rs = tg.ccost.plan("reduce_scatter", group, nbytes)
        alg_ag, t_ag, mv_ag = tg.ccost.plan("all_gather", group, nbytes)
        rs = len(rows)
        key = pack_key(L, 0, 0, gi)
        rows.append((key, max(min_duration, t_rs), res, COLLECTIVE, mv_rs, group[0], 0.0, -1))
        info[key] = ("reduce_scatter", group, alg, nbytes)
        edges.extend((c, rs) for c in contrib)
        us = []
        for p, (lo, hi) in enumerate(C.chunk_bounds(elems, n)):
            dev = group[p]
            if tg.sym is not None and dev >= tg.sym[1]:
                continue
            cb = float((hi - lo) * item)
            us.append(len(rows))
            rows.append((pack_key(L, 0, 1 + p, gi), tg.cost.update_time(
                param, Rect((0,), (max(1, hi - lo),)), machine.devices[dev]), dev, UPDATE,
                cb, dev, 2 * nbytes + slots * cb, -1))
            edges.append((rs, us[-1]))
        ag = len(rows)
        key = pack_key(L, 0, 1 + n, gi)
        rows.append((key, max(min_duration, t_ag), res, COLLECTIVE, mv_ag, group[0], 0.0, -1))
        info[key] = ("all_gather", group, alg_ag, nbytes)
        edges.extend((u, ag) for u in us)
    cols = list(zip(*rows)) if rows else [()] * 8
    return cols, np.array(edges, np.int64).reshape(-1, 2), info, held
