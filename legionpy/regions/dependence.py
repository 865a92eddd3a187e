"""Logical dependence analysis: which earlier operations must each one wait for.

This is Legion's *logical* analysis (Bauer et al., "Legion: Expressing
Locality and Independence with Logical Regions", SC 2012; M. Bauer's thesis,
Stanford 2014, ch. 4 "Logical Dependence Analysis"), specialised to rects:
operations arrive in program order, each with a list of
:class:`~legionpy.regions.requirement.RegionRequirement`. Under Legion's
default *exclusive* coherence the result must equal running the operations one
by one, so an operation B must wait for an earlier A whenever a requirement of
B interferes with one of A (same root, overlapping rects, a shared field, not
both read-only, not the same reduction op):

- true (read after write), anti (write after read) and output (write after
  write) dependences are all interference;
- reads after reads never order; reductions with the same op commute and
  accumulate without order among themselves, and the first reader or writer
  after them waits for all of them.

Legion walks the region tree and uses partition disjointness to skip sibling
subtrees; because every legionpy subregion carries its rect in root
coordinates we test rect intersection directly, which is exact for aliased
partitions (halos) as well. Only exclusive coherence is modelled (no atomic,
simultaneous or relaxed coherence).

State, per (root region uid, field): the *current users*, each
``(op, mode, redop, rect, left)`` where ``left`` is the part of ``rect`` not
yet overwritten by a later RW/WD user.

Pruning dominated users (Legion's epoch lists, generalised to partial
overwrites). When a later op W writes (RW or WD) a field over rect ``w``, it
already waited for every earlier user u it overlaps (a writer conflicts with
everything). Subtract ``w`` from ``u.left``; once ``u.left`` is empty, u is
dropped. This is safe: a later op X that conflicts with u overlaps
``u.rect``, which is covered by the rects of the writers W1..Wk that emptied
``u.left``, so X overlaps some Wi; Wi is a writer, so X conflicts with Wi (or,
if Wi was dropped too, by induction with the writer that covered it) and is
ordered after Wi, which is ordered after u. So X is still ordered after u,
transitively, and the dependence lists keep only edges between conflicting
pairs. Readers and reductions never prune: a later reduction with the same op
does not conflict with a reduction, and a reader orders nothing after readers.

Cost: each user is appended once and removed once, so a loop that rewrites
its data every iteration keeps the per-(region, field) list bounded no matter
how many iterations run. A field that is only ever read keeps all its readers
(a later writer must wait for each); :meth:`DependenceAnalyzer.retire` drops
operations that have finished, as Legion filters completed users.

Indexing. Scanning every current user of a (region, field) makes one point of
an index launch over an n-tile partition O(n), so the launch O(n^2). The users
of each (root, field) are therefore split by privilege class (readers,
writers, reductions per op) so that a query only visits classes it can
conflict with, and each class is kept in a :class:`RectIndex` (a multi-level
grid, see there) that returns only the users whose rect overlaps the query.
A tile's query then inspects a bounded number of candidates whatever the
partition size; :attr:`DependenceAnalyzer.comparisons` counts the rect tests.

>>> import numpy as np
>>> from legionpy.regions import Region, Partition, R, RW, WD, RegionRequirement as Req
>>> A = Region((8,), {"x": np.float32})
>>> P = Partition.equal(A, (2,))
>>> d = DependenceAnalyzer()
>>> d.analyze(0, [Req(P[0], WD("x"))]), d.analyze(1, [Req(P[1], WD("x"))])
([], [])
>>> d.analyze(2, [Req(A, R("x"))])        # true dependences on both writers
[0, 1]
>>> d.analyze(3, [Req(P[0], RW("x"))])    # output on 0, anti on 2
[0, 2]
>>> d.analyze(4, [Req(A, WD("x"))])       # 0 was pruned: covered by 3's write
[1, 2, 3]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from ..geometry import Rect
from .requirement import RegionRequirement, interferes

__all__ = [
    "DependenceAnalyzer", "RectIndex", "ops_conflict", "conflicting_pairs", "check_dependences",
]

# A user whose uncovered remainder fragments into more pieces than this keeps
# its previous (larger) remainder: less pruning, never a wrong answer.
_MAX_PIECES = 64

Program = Sequence[tuple[int, Sequence[RegionRequirement]]]


# -- spatial index --------------------------------------------------------------------
class _Level:
    """The rects of one size class: per dim ``d`` an extent of at most
    ``1 << shifts[d]``, bucketed by the grid cell ``lo[d] >> shifts[d]`` of
    their low corner (so each spans at most two cells per dim)."""

    __slots__ = ("shifts", "cells", "n", "cmin", "cmax", "ext")

    def __init__(self, shifts: tuple[int, ...]) -> None:
        self.shifts = shifts
        self.cells: dict[tuple[int, ...], dict[Any, Any]] = {}
        self.n = 0
        nd = len(shifts)
        self.cmin = [0] * nd  # bounds of the occupied cells and largest extent per dim,
        self.cmax = [0] * nd  # grown on add and never shrunk (a conservative query window)
        self.ext = [0] * nd


class RectIndex:
    """Items that each carry a rect, found by rect overlap without a full scan.

    A multi-level grid (a "loose" hierarchical grid): an item whose rect has
    extent ``e[d]`` in dim ``d`` goes to the level with cell size
    ``2**ceil(log2 e[d])`` per dim, in the bucket of the cell of its low
    corner. A query visits, per occupied level, only the cells that can hold
    an overlapping item (or every occupied bucket of that level, when there
    are fewer of them), then tests each candidate's rect exactly. Equal tiles
    of a partition all share one level, and a tile's query there looks at the
    few cells around it, so the work per query does not grow with the number
    of tiles. Items are keyed (any hashable, unique per index) so that they
    can be removed, and each must carry the rect it was added with as
    ``item.rect``. Empty rects are kept aside: they overlap nothing.
    ``tests`` counts the exact rect tests done by queries (a cost measure).
    """

    __slots__ = ("_levels", "_where", "_empty", "size", "tests")

    def __init__(self) -> None:
        self._levels: dict[tuple[int, ...], _Level] = {}
        self._where: dict[Any, tuple[_Level, tuple[int, ...]]] = {}
        self._empty: dict[Any, Any] = {}
        self.size = 0
        self.tests = 0

    def __len__(self) -> int:
        return self.size

    def add(self, rect: Rect, key: Any, item: Any) -> None:
        """Insert ``item`` (whose rect is ``rect``) under a new ``key``."""
        self.size += 1
        shifts = []
        for l, h in zip(rect.lo, rect.hi):
            if h <= l:
                self._empty[key] = item
                return
            shifts.append((h - l - 1).bit_length())
        tshifts = tuple(shifts)
        lo = rect.lo
        cell = tuple([x >> s for x, s in zip(lo, shifts)])
        lev = self._levels.get(tshifts)
        if lev is None:
            lev = self._levels[tshifts] = _Level(tshifts)
            lev.cmin[:] = cell
            lev.cmax[:] = cell
        lev.n += 1
        cmin, cmax, ext = lev.cmin, lev.cmax, lev.ext
        for d, (c, l, h) in enumerate(zip(cell, lo, rect.hi)):
            if c < cmin[d]:
                cmin[d] = c
            elif c > cmax[d]:
                cmax[d] = c
            if h - l > ext[d]:
                ext[d] = h - l
        b = lev.cells.get(cell)
        if b is None:
            lev.cells[cell] = {key: item}
        else:
            b[key] = item
        self._where[key] = (lev, cell)

    def remove(self, key: Any) -> None:
        """Remove the item stored under ``key`` (KeyError if absent)."""
        where = self._where.pop(key, None)
        if where is None:
            del self._empty[key]
        else:
            lev, cell = where
            b = lev.cells[cell]
            del b[key]
            if not b:
                del lev.cells[cell]
            lev.n -= 1
            if not lev.n:
                del self._levels[lev.shifts]
        self.size -= 1

    def query(self, rect: Rect) -> list[tuple[Any, Any]]:
        """``(key, item)`` of every item whose rect overlaps ``rect``."""
        out: list[tuple[Any, Any]] = []
        qlo, qhi = rect.lo, rect.hi
        for a, b in zip(qlo, qhi):
            if b <= a:
                return out  # an empty rect overlaps nothing
        tests = 0
        for lev in self._levels.values():
            ranges = []
            ncells = 1
            for s, a, b, c0min, c1max, e in zip(lev.shifts, qlo, qhi, lev.cmin, lev.cmax,
                                                lev.ext):
                c0 = (a - e + 1) >> s
                if c0 < c0min:
                    c0 = c0min
                c1 = (b - 1) >> s
                if c1 > c1max:
                    c1 = c1max
                if c1 < c0:
                    ncells = 0
                    break
                ranges.append(range(c0, c1 + 1))
                ncells *= c1 - c0 + 1
            if not ncells:
                continue
            cells = lev.cells
            if ncells >= len(cells):
                buckets: Iterable = cells.values()
            elif len(ranges) == 1:
                get = cells.get
                buckets = [get((c,)) for c in ranges[0]]
            else:
                get = cells.get
                buckets = [get(c) for c in product(*ranges)]
            for bucket in buckets:
                if not bucket:
                    continue
                tests += len(bucket)
                for key, item in bucket.items():
                    r = item.rect
                    for lo, hi, a, b in zip(r.lo, r.hi, qlo, qhi):
                        if lo >= b or a >= hi:
                            break
                    else:
                        out.append((key, item))
        self.tests += tests
        return out

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, item)``, empty rects included (no particular order)."""
        for lev in self._levels.values():
            for bucket in lev.cells.values():
                yield from bucket.items()
        yield from self._empty.items()


# -- the analyzer -----------------------------------------------------------------------
@dataclass(slots=True)
class _User:
    op: int
    mode: str
    redop: str | None
    rect: Rect
    left: list[Rect]
    seq: int = 0  # insertion order (the key in its RectIndex)


class DependenceAnalyzer:
    """Incremental logical dependence analysis. Pure: no threads, no data.

    Call :meth:`analyze` once per operation, in program order, with strictly
    increasing op ids.
    """

    def __init__(self) -> None:
        # (root uid, field) -> privilege class -> RectIndex of _User
        self._users: dict[tuple[int, str], dict[Any, RectIndex]] = {}
        #: (root uid, field) -> (op id, rect): a sole read-write user not yet
        #: put in ``_users`` (see :meth:`summarize`)
        self._sole: dict[tuple[int, str], tuple[int, Rect]] = {}
        self._seq = 0
        self._tests = 0  # rect tests done by indexes that were dropped since

    @property
    def comparisons(self) -> int:
        """Rect overlap tests done so far (a debug counter of the analysis cost)."""
        return self._tests + sum(ix.tests for cl in self._users.values() for ix in cl.values())

    def analyze(self, op_id: int, requirements: Iterable[RegionRequirement]) -> list[int]:
        """Register op ``op_id`` and return the sorted earlier op ids it must
        wait for (true, anti and output dependences, minus ones implied
        transitively through pruned users)."""
        items = []
        for req in requirements:
            rect = req.rect
            for l, h in zip(rect.lo, rect.hi):
                if h <= l:
                    break
            else:
                priv = req.privilege
                items.append((rect, priv.mode, priv.redop, req.root.uid, req.fields))
        deps: set[int] = set()
        users = self._users
        sole = self._sole
        if sole:
            for _, _, _, uid, fields in items:
                for f in fields:
                    got = sole.pop((uid, f), None)
                    if got is not None:
                        self._install_sole(uid, f, *got)
        # a writer's pass-1 hits are exactly what its pruning needs, as long as
        # no earlier requirement of this op changed that (root, field) meanwhile
        hits_of: dict[tuple[int, Any], list] = {}
        for i, (rect, mode, redop, uid, fields) in enumerate(items):
            # the one class this user cannot conflict with (readers; same-op reductions)
            same = "r" if mode == "read" else ("reduce", redop) if mode == "reduce" else None
            for f in fields:
                classes = users.get((uid, f))
                if not classes:
                    continue
                found = []
                for k, ix in classes.items():
                    if k == same:
                        continue
                    hits = ix.query(rect)
                    for _, u in hits:
                        deps.add(u.op)
                    found.append((k, ix, hits))
                if same is None:
                    hits_of[i, f] = found
        deps.discard(op_id)
        changed: set[tuple[int, str]] = set()
        for i, (rect, mode, redop, uid, fields) in enumerate(items):
            writes = mode == "read_write" or mode == "write_discard"
            klass = "r" if mode == "read" else "w" if writes else ("reduce", redop)
            for f in fields:
                key = (uid, f)
                classes = users.get(key)
                if classes is None:
                    classes = users[key] = {}
                elif writes:
                    found = hits_of.get((i, f)) if key not in changed else None
                    if found is None:
                        found = [(k, ix, ix.query(rect)) for k, ix in classes.items()]
                    self._prune(classes, rect, found)
                changed.add(key)
                ix = classes.get(klass)
                if ix is None:
                    ix = classes[klass] = RectIndex()
                self._seq = seq = self._seq + 1
                ix.add(rect, seq, _User(op_id, mode, redop, rect, [rect], seq))
        return sorted(deps)

    def summarize(self, op_id: int, fields: Iterable[tuple[int, str, Rect]]) -> None:
        """Make op ``op_id`` the only user of each ``(root uid, field, root
        rect)``, as a read-write user of the whole root: what a replayed
        trace leaves (its end marker waits for every op before it, so later
        operations need wait for it alone). No dependences are returned."""
        sole = self._sole
        for uid, f, rect in fields:
            sole[uid, f] = (op_id, rect)  # made a RectIndex when an operation meets it

    def _install_sole(self, uid: int, f: str, op_id: int, rect: Rect) -> None:
        ix = RectIndex()
        self._seq = seq = self._seq + 1
        ix.add(rect, seq, _User(op_id, "read_write", None, rect, [rect], seq))
        self._users[uid, f] = {"w": ix}

    def _prune(self, classes: dict[Any, RectIndex], written: Rect, found: list) -> None:
        """Subtract ``written`` from the remainders of the users it overlaps
        (``found``: ``(class, index, hits)``); drop those with nothing left
        (see the module docstring)."""
        wlo, whi = written.lo, written.hi
        for k, ix, hits in found:
            for key, u in hits:
                left = u.left
                if len(left) == 1:  # common case: a whole remainder overwritten
                    r = left[0]
                    for a, b, c, d in zip(wlo, whi, r.lo, r.hi):
                        if a > c or b < d:
                            break
                    else:
                        ix.remove(key)
                        continue
                if not _uncover(u, written):
                    ix.remove(key)
            if not ix.size:
                self._tests += ix.tests
                del classes[k]

    def retire(self, op_ids: Iterable[int]) -> int:
        """Forget operations that have *finished running*: nothing later needs
        to wait for them. Returns how many user entries were dropped."""
        done = set(op_ids)
        gone_sole = [k for k, (op, _) in self._sole.items() if op in done]
        for k in gone_sole:
            del self._sole[k]
        dropped = len(gone_sole)
        for key, classes in list(self._users.items()):
            for k, ix in list(classes.items()):
                gone = [(kk, u) for kk, u in ix.items() if u.op in done]
                for kk, _u in gone:
                    ix.remove(kk)
                dropped += len(gone)
                if not ix.size:
                    self._tests += ix.tests
                    del classes[k]
            if not classes:
                del self._users[key]
        return dropped

    def users(self, root_uid: int, field: str) -> list[tuple[int, str, Rect]]:
        """Current users of one (root region uid, field): ``(op, mode, rect)``,
        in the order they were registered."""
        got = self._sole.pop((root_uid, field), None)
        if got is not None:
            self._install_sole(root_uid, field, *got)
        classes = self._users.get((root_uid, field), {})
        us = sorted((u for ix in classes.values() for _, u in ix.items()), key=lambda u: u.seq)
        return [(u.op, u.mode, u.rect) for u in us]

    @property
    def num_users(self) -> int:
        """Total current users over every (region, field): the analysis state size."""
        return len(self._sole) + sum(ix.size for cl in self._users.values()
                                     for ix in cl.values())

    def max_users(self) -> int:
        """Largest current-user list of any (region, field)."""
        return max((sum(ix.size for ix in cl.values()) for cl in self._users.values()),
                   default=1 if self._sole else 0)


def _uncover(u: _User, written: Rect) -> bool:
    """Subtract ``written`` from ``u.left``; False when nothing is left."""
    if not u.rect.overlaps(written):
        return True
    left: list[Rect] = []
    for piece in u.left:
        left.extend(piece.subtract(written))
    if len(left) > _MAX_PIECES:
        return True
    u.left = left
    return bool(left)


# -- reference checks (for tests) ---------------------------------------------------
def ops_conflict(a: Iterable[RegionRequirement], b: Iterable[RegionRequirement]) -> bool:
    """True when some requirement of ``a`` interferes with one of ``b``."""
    b = list(b)
    return any(interferes(x, y) for x in a for y in b)


def conflicting_pairs(program: Program) -> set[tuple[int, int]]:
    """Every ``(earlier op id, later op id)`` pair that conflicts, by brute force."""
    out = set()
    for j, (oj, rj) in enumerate(program):
        for oi, ri in program[:j]:
            if ops_conflict(ri, rj):
                out.add((oi, oj))
    return out


def check_dependences(program: Program, deps: Mapping[int, Iterable[int]]) -> list[str]:
    """Problems with ``deps`` (op id -> earlier op ids it waits for) for
    ``program`` (``[(op id, requirements)]`` in program order); empty when
    correct. Correct means: every edge goes to an earlier op that conflicts
    with it, and every conflicting pair ``i < j`` is ordered (``i`` reachable
    from ``j`` through the edges)."""
    problems = []
    index = {op: k for k, (op, _) in enumerate(program)}
    reqs = {op: r for op, r in program}
    pairs = conflicting_pairs(program)
    ancestors: dict[int, int] = {}  # op -> bitset of program positions before it
    for k, (op, _) in enumerate(program):
        bits = 0
        for d in deps.get(op, ()):
            if d not in index or index[d] >= k:
                problems.append(f"op {op} waits for {d}, which is not an earlier op")
                continue
            if (d, op) not in pairs:
                problems.append(f"op {op} waits for {d} but they do not conflict: "
                                f"{list(reqs[d])} vs {list(reqs[op])}")
            bits |= ancestors[d] | (1 << index[d])
        ancestors[op] = bits
    for i, j in sorted(pairs):
        if not (ancestors[j] >> index[i]) & 1:
            problems.append(f"ops {i} and {j} conflict but {j} is not ordered after {i}")
    return problems
