"""Logical regions: an n-d index space times a field space, and its pieces.

A :class:`Region` is the root of a region tree. It holds no data itself: the
runtime owns the physical instances, so :meth:`Region.read` and
:meth:`Region.write` go through the *data owner*: a callable returning the
runtime, which :mod:`legionpy.runtime` installs with :func:`set_data_owner`
when it is imported (``lp.Region`` imports it), so this module never imports
the layer above it (DESIGN.md section 1). A :class:`Subregion` is what indexing a
:class:`~legionpy.regions.partition.Partition` returns: a rect of its root (in
the root's coordinates) that can itself be partitioned again.

``Region.uid`` is a creation counter: every process that builds the same
program in the same order gets the same uids, so MPI ranks agree on names.

>>> import numpy as np
>>> R = Region((8, 4), {"x": np.float32})
>>> R.shape, R.rect, R.root is R
((8, 4), Rect(lo=(0, 0), hi=(8, 4)), True)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RegionError
from ..geometry import Point, Rect
from .fields import FieldSpace

if TYPE_CHECKING:
    from .partition import Partition

__all__ = ["Region", "Subregion", "set_data_owner"]

_uids = itertools.count()

#: returns the object that holds region data (the runtime: ``read_region``,
#: ``write_region``); installed by legionpy.runtime, None before it is imported
_data_owner: Callable[[], Any] | None = None


def set_data_owner(owner: Callable[[], Any] | None) -> None:
    """Install ``owner()``, which returns the object holding region data
    (``legionpy.runtime`` installs its ``get_runtime``; tests a fake)."""
    global _data_owner
    _data_owner = owner


def _owner(where: str) -> Any:
    if _data_owner is None:
        raise RegionError(f"{where}: region data lives in the runtime, which is not loaded; "
                          "import legionpy.runtime (lp.Region, lp.init() and lp.fill do) first")
    return _data_owner()


def _as_shape(shape: Any) -> Point:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(shape)
    except TypeError:
        raise RegionError(f"region shape must be a tuple of ints, got {shape!r}") from None
    if not out:
        raise RegionError(f"region shape must have at least one dim, got {shape!r}")
    for d, n in enumerate(out):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise RegionError(
                f"region shape {shape!r}: extent {n!r} in dim {d} must be an int >= 0"
            )
    return tuple(int(n) for n in out)


class _DataAccess:
    """``read`` / ``write`` of a field over this (sub)region's rect, through the
    runtime (which waits for pending writers and gathers valid pieces)."""

    def read(self, field: str) -> Any:
        """A numpy copy of ``field`` over ``self.rect``."""
        self.fields.resolve((field,), where=self.name)
        return _owner(f"{self.name}.read({field!r})").read_region(self, field)

    def write(self, field: str, array: Any) -> None:
        """Replace ``field`` over ``self.rect`` with ``array`` (shape ``self.shape``)."""
        self.fields.resolve((field,), where=self.name)
        _owner(f"{self.name}.write({field!r})").write_region(self, field, array)


class Region(_DataAccess):
    """Root logical region of ``shape`` with named, typed ``fields``.

    >>> import numpy as np
    >>> R = Region((1024, 512), {"x": np.float32, "y": np.float32}, name="A")
    >>> R.ndim, list(R.fields), R.volume
    (2, ['x', 'y'], 524288)
    """

    def __init__(
        self,
        shape: Any,
        fields: Mapping[str, Any] | FieldSpace,
        name: str | None = None,
    ) -> None:
        self.shape: Point = _as_shape(shape)
        self.fields: FieldSpace = fields if isinstance(fields, FieldSpace) else FieldSpace(fields)
        self.uid: int = next(_uids)
        self.name: str = name if name is not None else f"region{self.uid}"
        self.rect: Rect = Rect.from_shape(self.shape)

    # -- tree -------------------------------------------------------------------
    @property
    def root(self) -> Region:
        """The root of the region tree: the region itself."""
        return self

    @property
    def parent(self) -> None:
        """A root region has no parent partition."""
        return None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def volume(self) -> int:
        """Number of points."""
        return self.rect.volume

    def __repr__(self) -> str:
        return f"Region({self.name!r}, shape={self.shape}, fields={list(self.fields)})"


class Subregion(_DataAccess):
    """One piece of a partition: ``P[color]``.

    ``rect`` is in the root's coordinates, so a nested partition of a
    subregion yields rects that are directly comparable with any other rect of
    the same root.

    >>> import numpy as np
    >>> from legionpy.regions import Partition
    >>> R = Region((8,), {"x": np.float32}, name="v")
    >>> Partition.equal(R, (2,))[1]
    Subregion('v', color=(1,), rect=Rect(lo=(4,), hi=(8,)))
    """

    __slots__ = ("partition", "color", "rect")

    def __init__(self, partition: Partition, color: Point, rect: Rect) -> None:
        self.partition = partition
        self.color = color
        self.rect = rect

    @property
    def root(self) -> Region:
        return self.partition.root

    @property
    def parent(self) -> Partition:
        """The partition this subregion came from (Legion's naming)."""
        return self.partition

    @property
    def fields(self) -> FieldSpace:
        return self.partition.root.fields

    @property
    def shape(self) -> Point:
        return self.rect.shape

    @property
    def ndim(self) -> int:
        return self.rect.ndim

    @property
    def volume(self) -> int:
        return self.rect.volume

    @property
    def name(self) -> str:
        return f"{self.root.name}{list(self.color)}"

    def __repr__(self) -> str:
        return f"Subregion({self.root.name!r}, color={self.color}, rect={self.rect})"
