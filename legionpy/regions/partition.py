"""Partitions: a region (or subregion) cut into colored subregions.

Three constructors, as in Legion/Pygion:

- :meth:`Partition.equal` -- block partition over any combination of dims;
  uneven extents spread like ``numpy.array_split``; disjoint and complete.
- :meth:`Partition.restriction` -- tiles of a fixed extent, each grown by a
  halo on both sides and clipped to the parent; aliased when ``halo > 0``.
- :meth:`Partition.by_rects` -- arbitrary rects per color.

Colors are always tuples (``(2, 0)``); ``P[2, 0]``, ``P[(2, 0)]`` and, for a
1-d color grid, ``P[2]`` all name the same subregion. ``by_rects`` accepts int
colors and stores them as 1-tuples. ``.rects`` are in the *root* region's
coordinates, also for nested partitions of subregions.

>>> import numpy as np
>>> from legionpy.regions import Region
>>> R = Region((1024, 512), {"x": np.float32})
>>> P = Partition.equal(R, (4, 1))
>>> P[2, 0].rect, P.is_disjoint, P.is_complete
(Rect(lo=(512, 0), hi=(768, 512)), True, True)
>>> H = Partition.restriction(R, (256, 512), halo=(1, 0))
>>> H[1, 0].rect, H.is_disjoint
(Rect(lo=(255, 0), hi=(513, 512)), False)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, Union

import numpy as np

from ..errors import PartitionError
from ..geometry import Point, Rect, block_bounds, grid_points, union_volume
from .fields import FieldSpace
from .region import Region, Subregion

__all__ = ["Partition"]

Parent = Union[Region, Subregion]  # noqa: UP007 - runtime alias on py3.10


def _ints(values: Any, what: str, ndim: int, parent: Parent, broadcast: bool = False) -> Point:
    """``values`` as a tuple of ``ndim`` ints; a bare int means ``(int,)``, or
    the same value for every dim when ``broadcast``."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        values = (values,) * (ndim if broadcast else 1)
    try:
        out = tuple(values)
    except TypeError:
        raise PartitionError(f"{what} must be a tuple of ints, got {values!r}") from None
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in out):
        raise PartitionError(f"{what} must be a tuple of ints, got {values!r}")
    if len(out) != ndim:
        raise PartitionError(
            f"{what} {tuple(out)} has {len(out)} entries but {_name(parent)} has {ndim} dims "
            f"(shape {parent.shape}); give one per dim"
        )
    return tuple(int(v) for v in out)


def _name(parent: Parent) -> str:
    return f"region {parent.name!r}" if isinstance(parent, Region) else f"subregion {parent.name}"


def _check_parent(parent: Any) -> None:
    if not isinstance(parent, (Region, Subregion)):
        raise PartitionError(f"can only partition a Region or Subregion, got {parent!r}")


class Partition:
    """Colored subregions of ``parent``. Build with :meth:`equal`,
    :meth:`restriction` or :meth:`by_rects`.

    Attributes: ``parent``, ``root``, ``kind`` (``"equal"``,
    ``"restriction"``, ``"by_rects"``), ``colors`` (row-major list of
    tuples), ``color_shape``, ``rects`` (color -> Rect, root coordinates),
    ``is_disjoint``, ``is_complete`` (computed once).
    """

    def __init__(
        self,
        parent: Parent,
        rects: Mapping[Point, Rect],
        color_shape: Point,
        kind: str = "by_rects",
    ) -> None:
        _check_parent(parent)
        self.parent = parent
        self.kind = kind
        self.color_shape: Point = tuple(color_shape)
        self.colors: list[Point] = sorted(rects)
        self.rects: dict[Point, Rect] = {c: rects[c] for c in self.colors}
        self._subregions: dict[Point, Subregion] = {}
        for c, r in self.rects.items():
            if r.ndim != parent.ndim:
                raise PartitionError(
                    f"rect {r} for color {c} has {r.ndim} dims but {_name(parent)} has "
                    f"{parent.ndim} (shape {parent.shape})"
                )
            if not parent.rect.contains(r):
                raise PartitionError(
                    f"rect {r} for color {c} lies outside {_name(parent)} whose rect is "
                    f"{parent.rect}; every tile must stay inside its parent"
                )

    # -- constructors -----------------------------------------------------------
    @classmethod
    def equal(cls, region: Parent, degrees: Any) -> Partition:
        """Block partition with ``degrees[d]`` pieces along dim ``d``.

        >>> import numpy as np
        >>> from legionpy.regions import Region
        >>> [r.hi for r in Partition.equal(Region((5,), {"x": "f4"}), (2,)).rects.values()]
        [(3,), (5,)]
        """
        _check_parent(region)
        degs = _ints(degrees, "degrees", region.ndim, region)
        for d, (k, n) in enumerate(zip(degs, region.shape)):
            if k < 1:
                raise PartitionError(
                    f"degree {k} in dim {d} of degrees {degs} must be >= 1 "
                    f"({_name(region)}, shape {region.shape})"
                )
            if k > max(n, 1):
                raise PartitionError(
                    f"degree {k} in dim {d} of degrees {degs} exceeds the extent {n} of "
                    f"{_name(region)} (shape {region.shape}); use at most {max(n, 1)}"
                )
        base = region.rect
        bounds = [block_bounds(lo, hi, k) for lo, hi, k in zip(base.lo, base.hi, degs)]
        rects = {
            color: Rect(tuple(b[0] for b in combo), tuple(b[1] for b in combo))
            for color, combo in zip(grid_points(degs), itertools.product(*bounds))
        }
        return cls(region, rects, degs, kind="equal")

    @classmethod
    def restriction(cls, region: Parent, tile: Any, halo: Any = 0) -> Partition:
        """Tiles of extent ``tile`` (the last one in a dim may be short), grid
        ``ceil(shape / tile)``, each grown by ``halo[d]`` on both sides of dim
        ``d`` and clipped to the parent. ``halo`` may be an int for every dim.

        >>> import numpy as np
        >>> from legionpy.regions import Region
        >>> H = Partition.restriction(Region((10,), {"x": "f4"}), (4,), halo=1)
        >>> [(r.lo[0], r.hi[0]) for r in H.rects.values()]
        [(0, 5), (3, 9), (7, 10)]
        """
        _check_parent(region)
        tiles = _ints(tile, "tile", region.ndim, region)
        halos = _ints(halo, "halo", region.ndim, region, broadcast=True)
        for d, t in enumerate(tiles):
            if t < 1:
                raise PartitionError(
                    f"tile extent {t} in dim {d} of tile {tiles} must be >= 1 ({_name(region)})"
                )
        for d, h in enumerate(halos):
            if h < 0:
                raise PartitionError(
                    f"halo {h} in dim {d} of halo {halos} must be >= 0 ({_name(region)})"
                )
        base = region.rect
        grid = tuple(-(-n // t) for n, t in zip(region.shape, tiles))
        rects = {}
        for color in grid_points(grid):
            lo = tuple(b + c * t for b, c, t in zip(base.lo, color, tiles))
            hi = tuple(min(x + t, h) for x, t, h in zip(lo, tiles, base.hi))
            rects[color] = Rect(lo, hi).grow(halos).intersection(base)
        return cls(region, rects, grid, kind="restriction")

    @classmethod
    def by_rects(cls, region: Parent, rects: Mapping[Any, Rect]) -> Partition:
        """One subregion per ``{color: Rect}`` entry (root coordinates). Int
        colors become 1-tuples; colors must be non-negative and all of one length.

        >>> import numpy as np
        >>> from legionpy.geometry import Rect
        >>> from legionpy.regions import Region
        >>> A = Region((8,), {"x": "f4"})
        >>> P = Partition.by_rects(A, {0: Rect((0,), (5,)), 1: Rect((3,), (8,))})
        >>> P.colors, P[1].rect, P.is_disjoint, P.is_complete
        ([(0,), (1,)], Rect(lo=(3,), hi=(8,)), False, True)
        """
        _check_parent(region)
        if not isinstance(rects, Mapping):
            raise PartitionError(f"by_rects wants a mapping color -> Rect, got {rects!r}")
        out: dict[Point, Rect] = {}
        for key, rect in rects.items():
            color = _color(key)
            if color is None or any(c < 0 for c in color):
                raise PartitionError(
                    f"color {key!r} must be a non-negative int or a tuple of them"
                )
            if not isinstance(rect, Rect):
                raise PartitionError(f"value for color {key!r} must be a Rect, got {rect!r}")
            if color in out:
                raise PartitionError(f"color {key!r} appears twice (as {color})")
            out[color] = rect
        lengths = {len(c) for c in out}
        if len(lengths) > 1:
            raise PartitionError(
                f"colors must all have the same number of dims, got {sorted(out)}"
            )
        n = lengths.pop() if lengths else 1
        shape = tuple(max((c[d] for c in out), default=-1) + 1 for d in range(n))
        return cls(region, out, shape, kind="by_rects")

    # -- tree -------------------------------------------------------------------
    @property
    def root(self) -> Region:
        return self.parent.root

    @property
    def fields(self) -> FieldSpace:
        return self.root.fields

    @property
    def ndim(self) -> int:
        """Dims of the index space (not of the color grid)."""
        return self.parent.ndim

    # -- subregions ---------------------------------------------------------------
    def __getitem__(self, key: Any) -> Subregion:
        color = _color(key)
        if color is None or color not in self.rects:
            raise PartitionError(
                f"no color {key!r} in partition of {_name(self.parent)}; colors span "
                f"{self.color_shape} ({len(self.colors)} colors)"
            )
        sub = self._subregions.get(color)
        if sub is None:
            sub = self._subregions[color] = Subregion(self, color, self.rects[color])
        return sub

    def __contains__(self, key: Any) -> bool:
        return _color(key) in self.rects

    def __len__(self) -> int:
        return len(self.colors)

    def __iter__(self) -> Iterator[Subregion]:
        return (self[c] for c in self.colors)

    # -- computed properties ----------------------------------------------------------
    @functools.cached_property
    def is_disjoint(self) -> bool:
        """No point belongs to two subregions."""
        rects = list(self.rects.values())
        return sum(r.volume for r in rects) == union_volume(rects)

    @functools.cached_property
    def is_complete(self) -> bool:
        """Every point of the parent belongs to some subregion."""
        return union_volume(self.rects.values()) == self.parent.rect.volume

    def __repr__(self) -> str:
        return (
            f"Partition({self.kind}, parent={_name(self.parent)}, "
            f"color_shape={self.color_shape}, colors={len(self.colors)})"
        )


def _color(key: Any) -> Point | None:
    """Normalise a color key to a tuple of ints (None if it is not one)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return (int(key),)
    if isinstance(key, tuple) and all(
        isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in key
    ):
        return tuple(int(c) for c in key)
    return None
