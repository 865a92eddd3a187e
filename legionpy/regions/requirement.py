"""Region requirements and Legion's interference test.

A :class:`RegionRequirement` is one (region or subregion, privilege) pair of
a launch, with its fields resolved against the region's field space. Two
requirements *interfere* -- the later one must wait for the earlier -- unless
Legion's non-interference rules say otherwise:

1. different region trees (roots),
2. disjoint field sets,
3. disjoint rects (points),
4. both read-only, or
5. both reductions with the same op (they commute).

>>> import numpy as np
>>> from legionpy.regions import Region, Partition, R, RW, Reduce
>>> A = Region((8,), {"x": np.float32, "y": np.float32})
>>> P = Partition.equal(A, (2,))
>>> interferes(RegionRequirement(P[0], RW("x")), RegionRequirement(P[1], RW("x")))
False
>>> interferes(RegionRequirement(A, R("x")), RegionRequirement(P[1], RW("x")))
True
>>> interferes(RegionRequirement(A, Reduce("+")), RegionRequirement(A, Reduce("+")))
False
"""

from __future__ import annotations

from typing import Union

from ..errors import PrivilegeError, RegionError
from ..geometry import Rect
from .privileges import Privilege, PrivilegeSet
from .region import Region, Subregion

__all__ = ["RegionRequirement", "interferes", "requirements", "RegionArg"]

RegionArg = Union[Region, Subregion]  # noqa: UP007 - runtime alias on py3.10


class RegionRequirement:
    """``privilege`` on ``region`` (a Region or a Subregion).

    Attributes: ``region``, ``root``, ``rect`` (root coordinates),
    ``fields`` (resolved tuple of names; the privilege's, or every field of
    the region when it names none), ``privilege``.
    Unknown fields raise :class:`~legionpy.errors.FieldError`.

    >>> import numpy as np
    >>> from legionpy.regions import Region, RW
    >>> RegionRequirement(Region((4,), {"x": "f4", "y": "f8"}), RW).fields
    ('x', 'y')
    """

    __slots__ = ("region", "privilege", "fields")

    def __init__(self, region: RegionArg, privilege: Privilege) -> None:
        if not isinstance(region, (Region, Subregion)):
            raise RegionError(f"a region requirement needs a Region or Subregion, got {region!r}")
        if isinstance(privilege, PrivilegeSet):
            raise PrivilegeError(
                f"RegionRequirement takes one Privilege, got the set {privilege!r}; "
                "use requirements(region, privileges) for one requirement per privilege"
            )
        if not isinstance(privilege, Privilege):
            raise PrivilegeError(
                f"RegionRequirement on {region.name} needs a Privilege "
                f"(R, RW, WD, Reduce), got {privilege!r}"
            )
        self.region = region
        self.privilege = privilege
        self.fields: tuple[str, ...] = region.fields.resolve(
            privilege.fields, where=f"region {region.name!r} (privilege {privilege!r})"
        )

    @property
    def root(self) -> Region:
        return self.region.root

    @property
    def rect(self) -> Rect:
        return self.region.rect

    @property
    def mode(self) -> str:
        return self.privilege.mode

    @property
    def redop(self) -> str | None:
        return self.privilege.redop

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RegionRequirement):
            return (
                self.region is other.region
                and self.privilege == other.privilege
                and self.fields == other.fields
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self.region), self.privilege, self.fields))

    def __repr__(self) -> str:
        return (
            f"RegionRequirement({self.region.name}, {self.rect}, "
            f"{self.privilege.mode}{'(' + self.redop + ')' if self.redop else ''}, "
            f"fields={self.fields})"
        )


def requirements(
    region: RegionArg, privileges: Privilege | PrivilegeSet
) -> list[RegionRequirement]:
    """One requirement per privilege of ``privileges`` on ``region``."""
    if not isinstance(privileges, (Privilege, PrivilegeSet)):
        raise PrivilegeError(f"expected a Privilege or PrivilegeSet, got {privileges!r}")
    return [RegionRequirement(region, p) for p in privileges.privileges]


def conflicts(
    a_mode: str, a_redop: str | None, b_mode: str, b_redop: str | None
) -> bool:
    """Privilege part of the interference test (rects and fields aside)."""
    if a_mode == "read" and b_mode == "read":
        return False
    if a_mode == "reduce" and b_mode == "reduce" and a_redop == b_redop:
        return False
    return True


def interferes(a: RegionRequirement, b: RegionRequirement) -> bool:
    """True when ``a`` and ``b`` must run in program order (symmetric)."""
    if a.root is not b.root:
        return False
    if a.privilege.mode == "read" and b.privilege.mode == "read":
        return False
    if not conflicts(a.privilege.mode, a.privilege.redop, b.privilege.mode, b.privilege.redop):
        return False
    if not a.rect.overlaps(b.rect):
        return False
    return not set(a.fields).isdisjoint(b.fields)
