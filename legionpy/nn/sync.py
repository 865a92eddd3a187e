"""Collective gradient synchronisation of a training step (``sync =
"collective"``, docs/seam.md): per bucket of parameters and replica group,
a reduce-scatter of the gradients, the optimizer on each position's chunk,
and an all-gather of the weights -- instead of update shards, copies and
folds (the ``"shards"`` mode, nn/execution.py). The layout follows ZeRO /
PyTorch FSDP's flat parameters (Rajbhandari et al., SC'20): every group
member holds a flat replica of the group's tiles, padded to ``n`` equal
chunks, and position ``p`` owns chunk ``p``.

Regions: one 1-D region per bucket, fields ``w``, ``g`` and the optimizer
state; group ``gi`` of ``n`` devices occupies ``n`` rows of ``padded``
elements each (row ``p`` lives on device ``group[p]``). The tiles of the
group are concatenated in bucket order, each row-major
(:func:`legionpy.collectives.bucket_groups`), so a point task reads its
weight tile as a contiguous slice of its device's row.

Launches per bucket ``b``, group ``gi`` (names as the simulator's task
graph and the mirror: ``RS(b<b>.<gi>)``, ``U(b<b>.<gi>)`` point ``p``,
``AG(b<b>.<gi>)``): a group of one device only updates its row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import collectives as C
from ..errors import ModelError
from ..geometry import Rect
from ..mapper import weight_tiles
from ..regions import Partition, Region
from ..runtime.collectives import Collective

__all__ = ["CollectiveSync", "Group"]


class Group:
    """One replica group of one bucket: ``b``, ``gi``, ``devices``, ``base``
    (first element of its rows), ``row`` (padded elements per row),
    ``members`` [(param name, tile rect, offset in the row)], ``elems``."""

    def __init__(self, b: int, gi: int, devices: tuple, base: int, row: int,
                 members: list, elems: int) -> None:
        self.b, self.gi, self.devices, self.base, self.row = b, gi, devices, base, row
        self.members, self.elems = members, elems
        self.name = f"b{b}.{gi}"

    def rect(self, p: int, lo: int = 0, hi: int | None = None) -> Rect:
        s = self.base + p * self.row
        return Rect((s + lo,), (s + (self.row if hi is None else hi),))


class CollectiveSync:
    """The flat regions, groups and launches of collective sync for one
    executor and strategy (see the module docstring)."""

    def __init__(self, ex: Any, strategy: Any) -> None:
        graph = ex.graph
        params = list(graph.parameters().values())
        tiles = weight_tiles(graph, strategy)
        sizes = [float(np.prod(p.shape) * np.dtype(p.dtype).itemsize) for p in reversed(params)]
        W = len(params)
        self.buckets = [[W - 1 - i for i in bk] for bk in C.buckets(sizes)]
        self.groups: list[Group] = []
        self.regions: list[Region] = []
        self.where: dict[tuple[str, Rect], tuple[Group, int, Rect]] = {}  # tile -> group, off
        self.tiles = tiles
        fields_ = ("w", "g", *ex.opt.fields)
        for b, ws in enumerate(self.buckets):
            items = []
            dts = {np.dtype(params[w].dtype) for w in ws}
            if len(dts) > 1:
                raise ModelError(f"collective sync: bucket {b} mixes parameter dtypes {dts}; "
                                 "use sync='shards' for mixed-precision parameters")
            dt = dts.pop()
            for w in ws:
                p = params[w]
                for t in tiles[p.name]:
                    items.append((t, t.users, float(t.rect.volume * dt.itemsize), p.name))
            base = 0
            for gi, (group, idx, _) in enumerate(C.bucket_groups([x[:3] for x in items])):
                off, members = 0, []
                for x in idx:
                    t, _, _, pname = items[x]
                    members.append((pname, t.rect, off))
                    off += t.rect.volume
                g = Group(b, gi, group, base, C.padded(off, len(group)), members, off)
                for pname, r, o in members:
                    self.where[(pname, r)] = (g, o, r)
                self.groups.append(g)
                base += len(group) * g.row
            self.regions.append(Region((max(base, 1),), {f: dt for f in fields_},
                                       name=f"bucket{b}"))
        self._launches(ex)

    def _launches(self, ex: Any) -> None:
        from ..regions import RW
        from ..runtime import LaunchOptions, TaskFunction

        u_fields = ("w", "g", *ex.opt.fields)
        self.steps = []  # (group, rs, (partition, task, options), ag)
        self.table: dict = {}
        node_of, choose = _chooser(ex)
        for g in self.groups:
            reg = self.regions[g.b]
            n = len(g.devices)
            chunks = C.chunk_bounds(g.elems, n)
            upart = Partition.by_rects(reg, {(p,): g.rect(p, lo, hi)
                                             for p, (lo, hi) in enumerate(chunks)})
            name = f"U({g.name})"
            task = TaskFunction(ex._cupdate, [RW(*u_fields)], name=name, kind="update")
            # one launch per point (its colour p names it U:b.g[p]), so the
            # launches follow the task graph's key order (below)
            opts = []
            for p, d in enumerate(g.devices):
                tag = (f"{g.name}[{p}]", "U", ex.model_id)
                opts.append((LaunchOptions(name, "update", tag), [(p,)]))
                self.table[tag] = (d,)
            sparse = self._sparse_segments(ex, g, chunks)
            rs = ag = None
            if n > 1:
                rows = Partition.by_rects(reg, {(p,): g.rect(p) for p in range(n)})
                parts = [rows[(p,)] for p in range(n)]
                nbytes = g.row * n * reg.fields["w"].itemsize
                rs = Collective("reduce_scatter", g.devices, parts, "g",
                                choose("reduce_scatter", g.devices, nbytes),
                                f"RS({g.name})", node_of)
                ag = Collective("all_gather", g.devices, parts, "w",
                                choose("all_gather", g.devices, nbytes), f"AG({g.name})",
                                node_of)
            self.steps.append((g, rs, (upart, task, opts, sparse), ag))
        #: the launches in the task graph's stable-id order (optimizer/
        #: collective_block.py keys: bucket, then k -- RS 0, U of position p
        #: 1 + p, AG 1 + n -- then the group): ``(what, step index, p)``
        keyed = []
        for i, (g, rs, _, ag) in enumerate(self.steps):
            n = len(g.devices)
            if rs is not None:
                keyed.append(((g.b, 0, g.gi), ("RS", i, 0)))
            keyed += [((g.b, 1 + p, g.gi), ("U", i, p)) for p in range(n)]
            if ag is not None:
                keyed.append(((g.b, 1 + n, g.gi), ("AG", i, 0)))
        self.order = [x for _, x in sorted(keyed)]

    @staticmethod
    def _sparse_segments(ex: Any, g: Group, chunks: list) -> dict:
        """``{position: [(lo, hi)]}``: the elements of each chunk that belong
        to embedding tables (updated only where their gradient is nonzero)."""
        from .execution import sparse_params

        sparse = sparse_params(ex.graph)
        out: dict = {}
        for pname, r, off in g.members:
            if pname not in sparse:
                continue
            for p, (lo, hi) in enumerate(chunks):
                a, b = max(lo, off), min(hi, off + r.volume)
                if a < b:
                    out.setdefault(p, []).append((a - lo, b - lo))
        return out

    # -- views ---------------------------------------------------------------------------
    def weight_rect(self, pname: str, wr: Rect, device: int) -> tuple[Rect, Any]:
        """The flat rect a point on ``device`` reading weight rect ``wr`` of
        ``pname`` accesses, and how to view it: ``(tile shape, slices of wr
        in the tile)`` (an empty weight rect: ``(its shape, None)``)."""
        if wr.empty:
            return Rect((0,), (0,)), (wr.shape, None)
        for t in self.tiles[pname]:
            if (t.rect & wr) == wr:
                g, off, tr = self.where[(pname, t.rect)]
                p = g.devices.index(device)
                lo = tr.lo
                sl = tuple(slice(a - o, b - o) for a, b, o in zip(wr.lo, wr.hi, lo))
                return g.rect(p, off, off + tr.volume), (tr.shape, sl)
        raise ModelError(f"collective sync: no weight tile of {pname!r} holds {wr}")

    # -- host values ------------------------------------------------------------------
    def load(self, pregions: dict, fields: tuple) -> None:
        """Write every parameter region's values into the flat regions (every
        row of every group: the replicas)."""
        for b, reg in enumerate(self.regions):
            gs = [g for g in self.groups if g.b == b]
            for f in fields:
                flat = np.zeros(reg.rect.shape, reg.fields[f])
                for g in gs:
                    row = np.zeros(g.row, reg.fields[f])
                    for pname, r, off in g.members:
                        row[off:off + r.volume] = pregions[pname].read(f)[r.to_slices()].ravel()
                    for p in range(len(g.devices)):
                        flat[g.base + p * g.row:g.base + (p + 1) * g.row] = row
                reg.write(f, flat)

    def store(self, pregions: dict, fields: tuple) -> None:
        """Write the flat regions back into the parameter regions: chunk ``p``
        of group row ``p`` is authoritative (the optimizer state lives there
        only)."""
        vals = {}
        for b, reg in enumerate(self.regions):
            gs = [g for g in self.groups if g.b == b]
            for f in fields:
                flat = reg.read(f)
                for g in gs:
                    row = np.empty(g.row, flat.dtype)
                    for p, (lo, hi) in enumerate(C.chunk_bounds(g.elems, len(g.devices))):
                        s = g.base + p * g.row
                        row[lo:hi] = flat[s + lo:s + hi]
                    for pname, r, off in g.members:
                        key = (pname, f)
                        if key not in vals:
                            vals[key] = pregions[pname].read(f)
                        vals[key][r.to_slices()] = row[off:off + r.volume].reshape(r.shape)
        for (pname, f), a in vals.items():
            pregions[pname].write(f, a)


def _chooser(ex: Any) -> tuple[Any, Any]:
    """``(node_of, choose(kind, group, bytes) -> algorithm)``: the shared
    rule on the executor's machine model (the simulator's choice, so the
    mirror compares equal algorithms); ring without one."""
    machine = getattr(ex, "machine", None)
    if machine is None:
        return None, lambda kind, group, nbytes: "ring"
    from ..optimizer.collective_block import CollectiveCosts
    from ..optimizer.costmodel import default_cost_model

    cc = CollectiveCosts(machine, ex.cost_model or default_cost_model(machine))
    nodes = [d.node for d in machine.devices]
    return (lambda d: nodes[d]), (lambda kind, group, nbytes: cc.plan(kind, group, nbytes)[0])
