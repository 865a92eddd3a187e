"""Launch-time checks of index launches: points that interfere.

The points of an index launch run in parallel, so no two of them may
interfere (legion's rule: same root and field, overlapping rects, not both
read-only and not the same reduction op). The check is skipped cheaply for
the common cases (a disjoint partition projected by color, read-only or
same-op reductions) and otherwise compares every pair of points that touch
the same (root, field).
"""

from __future__ import annotations

from typing import Any

from ..errors import LaunchError
from ..regions import Partition
from ..regions.requirement import conflicts

__all__ = ["check_index_interference"]

_SHORT = {"read": "R", "read_write": "RW", "write_discard": "WD", "reduce": "Reduce"}


def check_index_interference(name: str, domain: list, args: tuple, rpos: list,
                             psets: list) -> None:
    groups: dict[tuple[int, str], list[tuple[int, Any, str, str | None]]] = {}
    for i, ps in zip(rpos, psets):
        a = args[i]
        for p in ps.privileges:
            for f in a.fields.resolve(p.fields, where=a.name if hasattr(a, "name") else ""):
                groups.setdefault((a.root.uid, f), []).append((i, a, p.mode, p.redop))
    for (_, field), uses in groups.items():
        modes = {(m, r) for _, _, m, r in uses}
        if all(m == "read" for m, _ in modes):
            continue
        if len(modes) == 1 and next(iter(modes))[0] == "reduce":
            continue
        if (len(uses) == 1 and isinstance(uses[0][1], Partition)
                and uses[0][1].is_disjoint):
            continue
        if len(domain) < 2:
            continue
        _pairwise(name, domain, uses, field)


def _pairwise(name: str, domain: list, uses: list, field: str) -> None:
    entries = []  # (color, rect, mode, redop, region)
    for c in domain:
        for _, a, mode, redop in uses:
            sub = a[c] if isinstance(a, Partition) else a
            entries.append((c, sub.rect, mode, redop, sub))
    for x in range(len(entries)):
        c1, r1, m1, o1, s1 = entries[x]
        for y in range(x + 1, len(entries)):
            c2, r2, m2, o2, s2 = entries[y]
            if c1 == c2 or not conflicts(m1, o1, m2, o2) or not r1.overlaps(r2):
                continue
            raise LaunchError(
                f"index launch of task {name!r}: points {c1} and {c2} interfere on region "
                f"{s1.root.name!r} field {field!r}: {_SHORT[m1]} on {r1} and {_SHORT[m2]} on {r2} "
                "overlap; use a disjoint partition for written fields, or R / Reduce "
                "privileges for the overlapping part")
