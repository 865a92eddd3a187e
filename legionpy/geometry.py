"""N-dimensional index geometry: points and half-open rectangles.

A :class:`Rect` is the box ``lo <= p < hi`` (half-open in every dim, like
Python slices), frozen and hashable so it can key caches and sets. Everything
in legionpy that names "a piece of a region" -- partitions, tiles of a
parallel config, the intersections that become copies -- is a Rect.

>>> r = Rect((0, 0), (4, 6))
>>> r.volume, r.shape
(24, (4, 6))
>>> r & Rect((2, 3), (8, 8))
Rect(lo=(2, 3), hi=(4, 6))
>>> [b.lo for b in r.split((2, 1))]
[(0, 0), (2, 0)]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .errors import GeometryError

__all__ = ["Rect", "Point", "union_volume", "block_bounds", "block_bound", "grid_points"]

Point = tuple[int, ...]


def _as_point(values: Iterable[int], what: str) -> Point:
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise GeometryError(f"{what} must be a sequence of integers, got {values!r}") from exc


@dataclass(frozen=True, slots=True)
class Rect:
    """Half-open n-d box ``[lo, hi)``; empty when ``hi[d] <= lo[d]`` in any dim."""

    lo: Point
    hi: Point

    def __post_init__(self) -> None:
        lo = _as_point(self.lo, "Rect.lo")
        hi = _as_point(self.hi, "Rect.hi")
        if len(lo) != len(hi):
            raise GeometryError(
                f"Rect lo has {len(lo)} dims but hi has {len(hi)}: lo={lo}, hi={hi}"
            )
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    # -- construction ------------------------------------------------------
    @classmethod
    def from_shape(cls, shape: Sequence[int]) -> Rect:
        """The rect ``[0, shape)``."""
        shape = _as_point(shape, "shape")
        return cls((0,) * len(shape), shape)

    # -- derived properties --------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.lo)

    @property
    def shape(self) -> Point:
        """Extent per dim (0 for an empty dim)."""
        return tuple(max(0, h - l) for l, h in zip(self.lo, self.hi))

    @property
    def volume(self) -> int:
        """Number of points (0 when empty)."""
        v = 1
        for l, h in zip(self.lo, self.hi):
            if h <= l:
                return 0
            v *= h - l
        return v

    @property
    def empty(self) -> bool:
        return any(h <= l for l, h in zip(self.lo, self.hi))

    # -- set operations --------------------------------------------------------
    def _check_dims(self, other: Rect) -> None:
        if other.ndim != self.ndim:
            raise GeometryError(
                f"cannot combine a {self.ndim}-d rect {self} with a {other.ndim}-d rect {other}"
            )

    def intersection(self, other: Rect) -> Rect:
        """The common box (possibly empty; its lo/hi are then clamped so hi >= lo)."""
        self._check_dims(other)
        lo = tuple(max(a, b) for a, b in zip(self.lo, other.lo))
        hi = tuple(min(a, b) for a, b in zip(self.hi, other.hi))
        hi = tuple(max(l, h) for l, h in zip(lo, hi))
        return Rect(lo, hi)

    __and__ = intersection

    def overlaps(self, other: Rect) -> bool:
        """True when the two boxes share at least one point."""
        self._check_dims(other)
        for a_lo, a_hi, b_lo, b_hi in zip(self.lo, self.hi, other.lo, other.hi):
            if max(a_lo, b_lo) >= min(a_hi, b_hi):
                return False
        return True

    def contains(self, other: Rect | Sequence[int]) -> bool:
        """True when ``other`` (a rect or a point) lies inside this rect.
        An empty rect is contained in everything of the same dims."""
        if isinstance(other, Rect):
            self._check_dims(other)
            if other.empty:
                return True
            return all(
                sl <= ol and oh <= sh
                for sl, sh, ol, oh in zip(self.lo, self.hi, other.lo, other.hi)
            )
        p = _as_point(other, "point")
        if len(p) != self.ndim:
            raise GeometryError(f"point {p} has {len(p)} dims, rect {self} has {self.ndim}")
        return all(l <= x < h for l, x, h in zip(self.lo, p, self.hi))

    __contains__ = contains

    def bounding(self, other: Rect) -> Rect:
        """Smallest rect holding both (empty rects are ignored)."""
        self._check_dims(other)
        if self.empty:
            return other
        if other.empty:
            return self
        return Rect(
            tuple(min(a, b) for a, b in zip(self.lo, other.lo)),
            tuple(max(a, b) for a, b in zip(self.hi, other.hi)),
        )

    def subtract(self, other: Rect) -> list[Rect]:
        """``self - other`` as a list of disjoint rects (at most 2*ndim)."""
        self._check_dims(other)
        if not self.overlaps(other):
            return [] if self.empty else [self]
        pieces = []
        lo, hi = list(self.lo), list(self.hi)
        for d in range(self.ndim):
            if other.lo[d] > lo[d]:
                piece_hi = list(hi)
                piece_hi[d] = other.lo[d]
                pieces.append(Rect(tuple(lo), tuple(piece_hi)))
                lo[d] = other.lo[d]
            if other.hi[d] < hi[d]:
                piece_lo = list(lo)
                piece_lo[d] = other.hi[d]
                pieces.append(Rect(tuple(piece_lo), tuple(hi)))
                hi[d] = other.hi[d]
        return pieces

    # -- transforms -----------------------------------------------------------
    def translate(self, offset: Sequence[int]) -> Rect:
        off = _as_point(offset, "offset")
        if len(off) != self.ndim:
            raise GeometryError(f"offset {off} has {len(off)} dims, rect {self} has {self.ndim}")
        return Rect(
            tuple(l + o for l, o in zip(self.lo, off)),
            tuple(h + o for h, o in zip(self.hi, off)),
        )

    def grow(self, halo: Sequence[int]) -> Rect:
        """Extend by ``halo[d]`` on both sides of every dim (not clipped)."""
        h = _as_point(halo, "halo")
        if len(h) != self.ndim:
            raise GeometryError(f"halo {h} has {len(h)} dims, rect {self} has {self.ndim}")
        return Rect(
            tuple(l - x for l, x in zip(self.lo, h)),
            tuple(hi + x for hi, x in zip(self.hi, h)),
        )

    def to_slices(self, origin: Sequence[int] | None = None) -> tuple[slice, ...]:
        """Numpy index for this rect inside an array whose element [0,..] sits at
        ``origin`` (default: the zero point)."""
        if origin is None:
            return tuple(slice(l, h) for l, h in zip(self.lo, self.hi))
        o = _as_point(origin, "origin")
        if len(o) != self.ndim:
            raise GeometryError(f"origin {o} has {len(o)} dims, rect {self} has {self.ndim}")
        return tuple(slice(l - x, h - x) for l, h, x in zip(self.lo, self.hi, o))

    def split(self, degrees: Sequence[int]) -> list[Rect]:
        """Block-split into ``prod(degrees)`` rects, row-major over the degree
        grid; uneven extents are spread like ``numpy.array_split`` (the first
        ``n % k`` blocks get one extra element)."""
        degs = _as_point(degrees, "degrees")
        if len(degs) != self.ndim:
            raise GeometryError(
                f"degrees {degs} have {len(degs)} dims but rect {self} has {self.ndim}"
            )
        for d, (k, n) in enumerate(zip(degs, self.shape)):
            if k < 1:
                raise GeometryError(f"degree {k} in dim {d} must be >= 1 (degrees={degs})")
            if k > n:
                raise GeometryError(
                    f"degree {k} in dim {d} exceeds the extent {n} (rect {self}, degrees={degs})"
                )
        bounds = [block_bounds(l, h, k) for l, h, k in zip(self.lo, self.hi, degs)]
        return [
            Rect._raw(tuple(b[0] for b in combo), tuple(b[1] for b in combo))
            for combo in itertools.product(*bounds)
        ]

    @classmethod
    def _raw(cls, lo: Point, hi: Point) -> Rect:
        """A rect from tuples of ints known valid (no conversion, no checks):
        the fast path of :meth:`split`."""
        r = object.__new__(cls)
        object.__setattr__(r, "lo", lo)
        object.__setattr__(r, "hi", hi)
        return r

    def points(self) -> Iterator[Point]:
        """Every point, row-major."""
        return itertools.product(*(range(l, h) for l, h in zip(self.lo, self.hi)))

    def __repr__(self) -> str:
        return f"Rect(lo={self.lo}, hi={self.hi})"


def block_bound(lo: int, hi: int, k: int, i: int) -> tuple[int, int]:
    """Block ``i`` of :func:`block_bounds` alone."""
    base, extra = divmod(hi - lo, k)
    start = lo + i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def block_bounds(lo: int, hi: int, k: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into ``k`` blocks the way ``numpy.array_split`` does."""
    n = hi - lo
    base, extra = divmod(n, k)
    out, start = [], lo
    for i in range(k):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def grid_points(degrees: Sequence[int]) -> list[Point]:
    """All colors of a degree grid, row-major: ``(0,0), (0,1), ...``."""
    return list(itertools.product(*(range(int(k)) for k in degrees)))


def union_volume(rects: Iterable[Rect]) -> int:
    """Number of points covered by at least one of ``rects`` (overlaps counted
    once). Exact, by coordinate compression; fine for the tens to thousands of
    rects a partition has."""
    rects = [r for r in rects if not r.empty]
    if not rects:
        return 0
    ndim = rects[0].ndim
    for r in rects:
        if r.ndim != ndim:
            raise GeometryError(f"union_volume of rects with {ndim} and {r.ndim} dims")
    if len(rects) == 1:
        return rects[0].volume
    # Sweep the first dim; recurse on the rest.
    cuts = sorted({r.lo[0] for r in rects} | {r.hi[0] for r in rects})
    total = 0
    for a, b in zip(cuts, cuts[1:]):
        active = [r for r in rects if r.lo[0] <= a and b <= r.hi[0]]
        if not active:
            continue
        if ndim == 1:
            total += b - a
        else:
            sub = [Rect(r.lo[1:], r.hi[1:]) for r in active]
            total += (b - a) * union_volume(sub)
    return total
