"""Collective gradient synchronisation of a training step (``sync =
"collective"``, docs/seam.md): per bucket of parameters and replica group,
a reduce-scatter of the gradients, the optimizer on each position's chunk,
and an all-gather of the weights -- instead of update shards, copies and
folds (the ``"shards"`` mode, nn/execution.py). The layout follows ZeRO /
PyTorch FSDP's flat parameters (Rajbhandari et al., SC'20): every group
member holds a flat replica of the group's tiles, padded to ``n`` equal
chunks, and position ``p`` owns chunk ``p``.

Regions: two 1-D regions per bucket. The rows (fields ``w`` and ``g``):
group ``gi`` of ``n`` devices has ``n`` rows of ``padded`` elements each
(row ``p`` lives on device ``group[p]``); the tiles of the group are
concatenated in bucket order, each row-major
(:func:`legionpy.collectives.bucket_groups`), so a point task reads its
weight tile as a contiguous slice of its device's row. The optimizer state
(``bucket<b>.state``, the optimizer's fields) holds only chunk ``p`` of
row ``p``: the state is sharded over the group (ZeRO stage 1). Both are
laid out device-major -- every row of one device, then the next device's --
so each device's instances are exactly its rows and its chunks (a
group-major layout made a device that belongs to several groups of a
bucket hold the bounding box of its rows, other devices' rows included).

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
    """One replica group of one bucket: ``b``, ``gi``, ``devices``, ``row``
    (padded elements per row, ``n`` equal chunks), ``members`` [(param name,
    tile rect, offset in the row)], ``elems``; after the layout ``bases[p]``
    (first element of row ``p`` in the bucket's rows) and ``obases[p]``
    (first element of chunk ``p`` in its optimizer state)."""

    def __init__(self, b: int, gi: int, devices: tuple, row: int, members: list,
                 elems: int) -> None:
        self.b, self.gi, self.devices, self.row = b, gi, devices, row
        self.members, self.elems = members, elems
        self.name = f"b{b}.{gi}"
        self.chunk = row // len(devices)
        self.bases = [0] * len(devices)
        self.obases = [0] * len(devices)

    def rect(self, p: int, lo: int = 0, hi: int | None = None) -> Rect:
        """Elements ``[lo, hi)`` of row ``p`` (the whole row by default)."""
        s = self.bases[p]
        return Rect((s + lo,), (s + (self.row if hi is None else hi),))

    def orect(self, p: int) -> Rect:
        """Chunk ``p``'s optimizer state."""
        s = self.obases[p]
        return Rect((s,), (s + self.chunk,))


class CollectiveSync:
    """The flat regions, groups and launches of collective sync for one
    executor and strategy (see the module docstring)."""

    def __init__(self, ex: Any, strategy: Any) -> None:
        graph = ex.graph
        params = list(graph.parameters().values())
        tiles = weight_tiles(graph, strategy)
        self.buckets = C.parameter_buckets(params)
        self.groups: list[Group] = []
        self.regions: list[Region] = []  # per bucket: the rows (w, g)
        self.states: list[Region | None] = []  # per bucket: the optimizer state's chunks
        self.where: dict[tuple[str, Rect], tuple[Group, int, Rect]] = {}  # tile -> group, off
        self.tiles = tiles
        for b, ws in enumerate(self.buckets):
            items = []
            dt = np.dtype(params[ws[0]].dtype)  # one dtype per bucket (C.buckets kinds)
            for w in ws:
                p = params[w]
                for t in tiles[p.name]:
                    items.append((t, t.users, float(t.rect.volume * dt.itemsize), p.name))
            made = []
            for gi, (group, idx, _) in enumerate(C.bucket_groups([x[:3] for x in items])):
                off, members = 0, []
                for x in idx:
                    t, _, _, pname = items[x]
                    members.append((pname, t.rect, off))
                    off += t.rect.volume
                g = Group(b, gi, group, C.padded(off, len(group)), members, off)
                for pname, r, o in members:
                    self.where[(pname, r)] = (g, o, r)
                made.append(g)
            base = obase = 0  # device-major: each device's rows, and chunks, contiguous
            for d in sorted({d for g in made for d in g.devices}):
                for g in made:
                    if d in g.devices:
                        p = g.devices.index(d)
                        g.bases[p], g.obases[p] = base, obase
                        base += g.row
                        obase += g.chunk
            self.groups += made
            self.regions.append(Region((max(base, 1),), {"w": dt, "g": dt}, name=f"bucket{b}"))
            self.states.append(Region((max(obase, 1),), {f: dt for f in ex.opt.fields},
                                      name=f"bucket{b}.state") if ex.opt.fields else None)
        self._reserve(ex)
        self._launches(ex)

    def _reserve(self, ex: Any) -> None:
        """Make each local device's instances of its rows once, at their
        final size: the whole padded row of ``w`` and ``g`` (what the
        collectives move) and its chunk of the optimizer state. Made on
        first use instead, the forward's reads would size ``w`` to the
        members' elements and the all-gather grow it to the padded row,
        holding both for a moment: a peak the simulator rightly does not
        count (docs/memory.md)."""
        rt = ex.rt
        inst = rt.instances
        local = {d.id for d in rt.local}
        for g in self.groups:
            reg, state = self.regions[g.b], self.states[g.b]
            for p, d in enumerate(g.devices):
                if d not in local:
                    continue
                for f in ("w", "g"):
                    inst.reserve(d, reg, f, g.rect(p))
                for f in ex.opt.fields:
                    inst.reserve(d, state, f, g.orect(p))

    def _launches(self, ex: Any) -> None:
        from ..regions import RW
        from ..runtime import LaunchOptions, TaskFunction

        self.steps = []  # (group, rs, (partitions, task, options, sparse), ag)
        self.table: dict = {}
        node_of, choose = _chooser(ex)
        for g in self.groups:
            reg = self.regions[g.b]
            n = len(g.devices)
            chunks = C.chunk_bounds(g.elems, n)
            uparts = [Partition.by_rects(reg, {(p,): g.rect(p, lo, hi)
                                               for p, (lo, hi) in enumerate(chunks)})]
            privs = [RW("w", "g")]
            if ex.opt.fields:  # the chunk's optimizer state
                uparts.append(Partition.by_rects(self.states[g.b], {
                    (p,): g.orect(p) for p in range(n)}))
                privs.append(RW(*ex.opt.fields))
            name = f"U({g.name})"
            task = TaskFunction(ex._cupdate, privs, name=name, kind="update")
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
            self.steps.append((g, rs, (tuple(uparts), task, opts, sparse), ag))
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
        """Write every parameter region's values into the flat regions: the
        weights into every row of every group (the replicas), the optimizer
        state into each position's chunk."""
        for b, reg in enumerate(self.regions):
            gs = [g for g in self.groups if g.b == b]
            for f in fields:
                target = reg if f in ("w", "g") else self.states[b]
                flat = np.zeros(target.rect.shape, target.fields[f])
                for g in gs:
                    row = np.zeros(g.row, target.fields[f])
                    for pname, r, off in g.members:
                        row[off:off + r.volume] = pregions[pname].read(f)[r.to_slices()].ravel()
                    c = g.chunk
                    for p in range(len(g.devices)):
                        if target is reg:
                            flat[g.bases[p]:g.bases[p] + g.row] = row
                        else:
                            flat[g.obases[p]:g.obases[p] + c] = row[p * c:(p + 1) * c]
                target.write(f, flat)

    def store(self, pregions: dict, fields: tuple) -> None:
        """Write the flat regions back into the parameter regions: chunk ``p``
        of group row ``p`` is authoritative, and so is its optimizer state."""
        vals = {}
        for b, reg in enumerate(self.regions):
            gs = [g for g in self.groups if g.b == b]
            for f in fields:
                rows = f in ("w", "g")
                flat = (reg if rows else self.states[b]).read(f)
                for g in gs:
                    row = np.empty(g.row, flat.dtype)
                    c = g.chunk
                    for p in range(len(g.devices)):
                        s = g.bases[p] + p * c if rows else g.obases[p]
                        row[p * c:(p + 1) * c] = flat[s:s + c]
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
