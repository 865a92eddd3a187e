"""The additive cost model (DeePa section 4, OptCNN): the cost of a strategy
is a sum of per-op and per-edge terms, which is what makes dynamic
programming over the graph possible.

For op ``o`` with config ``c`` and edge ``(p -> o)`` with configs ``(cp, co)``:

- ``node(o, c) = compute(o, c) + sync(o, c)``.
  ``compute``: the slowest tile's forward + backward seconds under the cost
  model (tiles run in parallel on distinct devices); input ops cost their
  host-to-device load. ``sync``: parameter-server gradient synchronisation as
  the task graph does it: every replica of a weight tile sends its gradient
  to the tile's home and gets the updated weight back (two copies), copies
  into one home serialise, different homes overlap (max over homes), plus
  the update task.
- ``edge(p, o, cp, co)``: the forward activation copies plus the backward
  gradient copies (the same bytes reversed), each ``latency + bytes x
  seconds-per-byte`` summed over the hops of its route; copies into one
  device serialise, different devices overlap (max over destinations), times
  two for backward.

These are estimates: every method's final strategy is re-simulated by the
full simulator, so methods are compared on one cost.

A parameter shared by ``n`` ops (the cells of an unrolled LSTM layer) is
synchronised once per iteration (the task graph merges its uses), so each
user is charged ``1/n`` of its sync. Every table is cached by the op's
*structural signature* (kind, shapes, attributes, input views, parameter
shapes), not its identity: the 256 identical steps of an unrolled RNN cost
one computation (issue 18).

:class:`AdditiveCosts` also gives the per-device busy seconds and the
minimum tile time a config implies, which the exhaustive search's lower
bound uses.
"""

from __future__ import annotations

import numpy as np

from ...geometry import Rect
from ...placement import update_shards
from ..costmodel import CostModel, default_cost_model

__all__ = ["AdditiveCosts"]


class AdditiveCosts:
    """Node and edge costs (seconds) of ``graph`` on ``machine``."""

    def __init__(self, graph, machine, cost_model: CostModel | None = None) -> None:
        self.graph, self.machine = graph, machine
        self.cost = cost_model or default_cost_model(machine)
        D = machine.num_devices
        self.lat = np.zeros((D, D))
        self.spb = np.zeros((D, D))
        for a in range(D):
            for b in range(D):
                if a == b:
                    continue
                for lid in machine.route(a, b):
                    ln = machine.links[lid]
                    self.lat[a, b] += ln.latency
                    self.spb[a, b] += 1.0 / ln.bandwidth
        self._tiles: dict = {}
        self._compute: dict = {}
        self._inter: dict = {}
        self._need: dict = {}
        self._bounds: dict = {}
        self._sync: dict = {}
        self._edges: dict = {}
        self._sig: dict = {}
        self.users: dict[int, int] = {}
        for op in graph.ops:
            for p in op.params.values():
                self.users[id(p)] = self.users.get(id(p), 0) + 1

    def signature(self, op, views: bool = True) -> tuple:
        """What the op's costs depend on: equal signatures, equal tables.
        Node costs do not depend on where an input view sits in its producer
        (``views=False``); edge costs do."""
        k = (op.index, views)
        s = self._sig.get(k)
        if s is None:
            s = self._sig[k] = (
                op.kind, op.output_shape, op.dims, op.dtype,
                tuple(sorted((k, repr(v)) for k, v in op.attrs.items())),
                tuple((r.shape, r.op.dims, r.op.dtype) + ((r.op.output_shape, repr(r.view))
                                                          if views else ())
                      for r in op.inputs),
                tuple((k, p.shape, str(p.dtype), self.users[id(p)])
                      for k, p in op.params.items()))
        return s

    # -- tiles -----------------------------------------------------------------
    def tiles(self, op, degrees, red: int = 1) -> list[Rect]:
        """The output tile of every point (``red`` points per tile under a
        reduction split, ParallelConfig.reduce)."""
        k = (op.output_shape, degrees, red)
        t = self._tiles.get(k)
        if t is None:
            t = self._tiles[k] = [x for x in op.output_rect.split(degrees) for _ in range(red)]
        return t

    def copy_seconds(self, nbytes: float, src: int, dst: int) -> float:
        if src == dst or nbytes <= 0:
            return 0.0
        return float(self.lat[src, dst] + nbytes * self.spb[src, dst])

    # -- node costs --------------------------------------------------------------
    def tile_times(self, op, cfg) -> np.ndarray:
        """Forward + backward seconds of each tile of ``op`` under ``cfg``."""
        k = (self.signature(op, False), cfg.degrees, cfg.reduce,
             tuple(self.machine.devices[d].kind for d in cfg.devices))
        r = self._compute.get(k)
        if r is None:
            ts = []
            for tile, dev in zip(self.tiles(op, cfg.degrees, cfg.reduce), cfg.devices):
                spec = self.machine.devices[dev]
                if op.kind == "input":
                    ts.append(self.cost.load_time(float(tile.volume * op.itemsize), spec))
                else:
                    f, b = self.cost.op_time(op, tile, spec)
                    ts.append((f + b) / cfg.reduce)  # one slice of the reduction dim
            r = self._compute[k] = np.asarray(ts)
        return r

    def compute(self, op, cfg) -> float:
        return float(self.tile_times(op, cfg).max())

    def device_loads(self, op, cfg) -> list[tuple[int, float]]:
        """``(device, busy seconds)`` this op puts on each device it uses."""
        return list(zip(cfg.devices, self.tile_times(op, cfg).tolist()))

    def sync(self, op, cfg) -> float:
        """Gradient-sync + update seconds of ``op``'s parameters under ``cfg``."""
        if not op.params:
            return 0.0
        k = (self.signature(op, False), cfg)
        r = self._sync.get(k)
        if r is not None:
            return r
        red = cfg.reduce
        tiles = self.tiles(op, cfg.degrees, red)
        per_home: dict[int, float] = {}
        for pname, p in op.params.items():
            item = np.dtype(p.dtype).itemsize
            groups: dict[Rect, list[int]] = {}
            for m, (tile, dev) in enumerate(zip(tiles, cfg.devices)):
                wr = op.part_weight_rect(pname, tile, m % red, red)
                if not wr.empty:
                    groups.setdefault(wr, []).append(dev)
            for rect, devs in groups.items():
                users = tuple(dict.fromkeys(devs))
                for srect, home in update_shards(rect, users, item):  # as the task graph
                    nb = float(srect.volume * item)
                    t = self.cost.update_time(p, srect, self.machine.devices[home])
                    for d in users:
                        t += self.copy_seconds(nb, d, home) + self.copy_seconds(nb, home, d)
                    per_home[home] = per_home.get(home, 0.0) + t / self.users[id(p)]
        r = self._sync[k] = max(per_home.values()) if per_home else 0.0
        return r

    def node(self, op, cfg) -> float:
        return self.compute(op, cfg) + self.sync(op, cfg)

    # -- edge costs --------------------------------------------------------------
    def _needs(self, op, i: int, dc) -> tuple[np.ndarray, np.ndarray]:
        """lo, hi (n_consumer_tiles, ndim) of what each tile reads of input ``i``
        in the producer's coordinates (empty needs: lo == hi)."""
        k = (self.signature(op), i, dc)
        r = self._need.get(k)
        if r is None:
            ref = op.inputs[i]
            nd = len(ref.op.output_shape)
            lo, hi = [], []
            dg, red = dc
            for m, t in enumerate(self.tiles(op, dg, red)):
                q = op.part_input_rect(i, t, m % red, red)
                if q.empty:
                    lo.append((0,) * nd)
                    hi.append((0,) * nd)
                else:
                    q = ref.to_base(q)
                    lo.append(q.lo)
                    hi.append(q.hi)
            r = self._need[k] = (np.array(lo), np.array(hi))
        return r

    def _volumes(self, op, i: int, dp, dc) -> np.ndarray:
        """Bytes (n_producer_tiles, n_consumer_tiles) of input ``i`` of ``op``."""
        k = (self.signature(op), i, dp, dc)
        v = self._inter.get(k)
        if v is None:
            prod = op.inputs[i].op
            kp = (prod.output_shape, dp)
            b = self._bounds.get(kp)
            if b is None:
                tp = self.tiles(prod, *dp)
                b = self._bounds[kp] = (np.array([t.lo for t in tp])[:, None, :],
                                        np.array([t.hi for t in tp])[:, None, :])
            nlo, nhi = self._needs(op, i, dc)
            ext = np.minimum(b[1], nhi[None]) - np.maximum(b[0], nlo[None])
            v = np.prod(np.clip(ext, 0, None), axis=2).astype(float) * prod.itemsize
            self._inter[k] = v
        return v

    def edge(self, op, i: int, cp, cc) -> float:
        """Transfer seconds of input ``i`` of ``op`` (forward + backward)."""
        v = self._volumes(op, i, (cp.degrees, cp.reduce), (cc.degrees, cc.reduce))
        sp = np.asarray(cp.devices)
        sc = np.asarray(cc.devices)
        lat = self.lat[sp[:, None], sc[None, :]]
        t = np.where(v > 0, lat + v * self.spb[sp[:, None], sc[None, :]], 0.0)
        if not t.any():
            return 0.0
        per_dst = np.bincount(np.broadcast_to(sc, t.shape).ravel(), t.ravel())
        return 2.0 * float(per_dst.max())

    def edge_matrix(self, op, i: int, cps, ccs) -> np.ndarray:
        """``edge`` for every pair of producer configs ``cps`` x consumer ``ccs``."""
        k = (self.signature(op), i, tuple(cps), tuple(ccs))
        out = self._edges.get(k)
        if out is not None:
            return out
        # every producer tile of every producer config, stacked (vectorised ``edge``)
        prod = op.inputs[i].op
        lo, hi, which, pdev = [], [], [], []
        for a, cp in enumerate(cps):
            for t, d in zip(self.tiles(prod, cp.degrees, cp.reduce), cp.devices):
                lo.append(t.lo)
                hi.append(t.hi)
                which.append(a)
                pdev.append(d)
        plo, phi = np.array(lo)[:, None, :], np.array(hi)[:, None, :]
        which, pdev = np.array(which), np.array(pdev)
        D = self.machine.num_devices
        out = np.empty((len(cps), len(ccs)))
        for b, cc in enumerate(ccs):
            nlo, nhi = self._needs(op, i, (cc.degrees, cc.reduce))
            ext = np.minimum(phi, nhi[None]) - np.maximum(plo, nlo[None])
            v = np.prod(np.clip(ext, 0, None), axis=2).astype(float) * prod.itemsize
            sc = np.asarray(cc.devices)
            lat = self.lat[pdev[:, None], sc[None, :]]
            t = np.where(v > 0, lat + v * self.spb[pdev[:, None], sc[None, :]], 0.0)
            key = (which[:, None] * D + sc[None, :]).ravel()
            per = np.bincount(key, t.ravel(), minlength=len(cps) * D).reshape(len(cps), D)
            out[:, b] = 2.0 * per.max(axis=1)
        self._edges[k] = out
        return out

    def total(self, strategy) -> float:
        """Additive cost of a whole strategy (seconds)."""
        t = 0.0
        for op in self.graph.ops:
            c = strategy[op.name]
            t += self.node(op, c)
            for i, ref in enumerate(op.inputs):
                t += self.edge(op, i, strategy[ref.op.name], c)
        return t
