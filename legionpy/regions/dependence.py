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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..geometry import Rect
from .requirement import RegionRequirement, conflicts, interferes

__all__ = ["DependenceAnalyzer", "ops_conflict", "conflicting_pairs", "check_dependences"]

# A user whose uncovered remainder fragments into more pieces than this keeps
# its previous (larger) remainder: less pruning, never a wrong answer.
_MAX_PIECES = 64

Program = Sequence[tuple[int, Sequence[RegionRequirement]]]


@dataclass(slots=True)
class _User:
    op: int
    mode: str
    redop: str | None
    rect: Rect
    left: list[Rect]


class DependenceAnalyzer:
    """Incremental logical dependence analysis. Pure: no threads, no data.

    Call :meth:`analyze` once per operation, in program order, with strictly
    increasing op ids.
    """

    def __init__(self) -> None:
        self._users: dict[tuple[int, str], list[_User]] = {}

    def analyze(self, op_id: int, requirements: Iterable[RegionRequirement]) -> list[int]:
        """Register op ``op_id`` and return the sorted earlier op ids it must
        wait for (true, anti and output dependences, minus ones implied
        transitively through pruned users)."""
        reqs = list(requirements)
        deps: set[int] = set()
        for req in reqs:
            rect, mode, redop = req.rect, req.privilege.mode, req.privilege.redop
            if rect.empty:
                continue
            for f in req.fields:
                for u in self._users.get((req.root.uid, f), ()):
                    if (
                        u.op != op_id
                        and u.op not in deps
                        and conflicts(u.mode, u.redop, mode, redop)
                        and u.rect.overlaps(rect)
                    ):
                        deps.add(u.op)
        for req in reqs:
            rect, mode = req.rect, req.privilege.mode
            if rect.empty:
                continue
            for f in req.fields:
                users = self._users.setdefault((req.root.uid, f), [])
                if mode in ("read_write", "write_discard"):
                    users[:] = [u for u in users if _uncover(u, rect)]
                users.append(_User(op_id, mode, req.privilege.redop, rect, [rect]))
        return sorted(deps)

    def retire(self, op_ids: Iterable[int]) -> int:
        """Forget operations that have *finished running*: nothing later needs
        to wait for them. Returns how many user entries were dropped."""
        done = set(op_ids)
        dropped = 0
        for key, users in list(self._users.items()):
            kept = [u for u in users if u.op not in done]
            dropped += len(users) - len(kept)
            if kept:
                self._users[key] = kept
            else:
                del self._users[key]
        return dropped

    def users(self, root_uid: int, field: str) -> list[tuple[int, str, Rect]]:
        """Current users of one (root region uid, field): ``(op, mode, rect)``."""
        return [(u.op, u.mode, u.rect) for u in self._users.get((root_uid, field), ())]

    @property
    def num_users(self) -> int:
        """Total current users over every (region, field): the analysis state size."""
        return sum(len(v) for v in self._users.values())

    def max_users(self) -> int:
        """Largest current-user list of any (region, field)."""
        return max((len(v) for v in self._users.values()), default=0)


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
