"""Privileges: how a task may touch the fields of a region argument.

As in Legion, a privilege is a mode plus the fields it covers:

==============  ===========================================================
``R``           read only
``RW``          read and write (sees the previous contents)
``WD``          write-discard: overwrites everything, previous contents dead
``Reduce(op)``  fold values in with ``op`` in ``+ * max min``; reductions with
                the same op commute, so they need no order among themselves
==============  ===========================================================

``R``, ``RW`` and ``WD`` are privileges on *all* fields of the argument and
can be called to name fields: ``RW("x")``, ``R("x", "y")``. ``p1 + p2`` makes a
:class:`PrivilegeSet`: several privileges on disjoint fields of one argument.

>>> RW("x").mode, RW("x").fields, RW("x").writes
('read_write', ('x',), True)
>>> Reduce("+", "g").redop, (R("y") + RW("x")).fields
('+', ('y', 'x'))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PrivilegeError

if TYPE_CHECKING:
    from .requirement import RegionArg, RegionRequirement

__all__ = ["Privilege", "PrivilegeSet", "R", "RW", "WD", "Reduce", "MODES", "REDOPS"]

MODES = ("read", "read_write", "write_discard", "reduce")
REDOPS = ("+", "*", "max", "min")
_SHORT = {"read": "R", "read_write": "RW", "write_discard": "WD", "reduce": "Reduce"}


def _fields(fields: Any) -> tuple[str, ...]:
    if isinstance(fields, str):
        fields = (fields,)
    out: list[str] = []
    for f in fields:
        if not isinstance(f, str) or not f:
            raise PrivilegeError(f"privilege fields must be field names (str), got {f!r}")
        if f not in out:
            out.append(f)
    return tuple(out)


@dataclass(frozen=True)
class Privilege:
    """One privilege: ``mode`` in :data:`MODES`, ``fields`` (empty = all
    fields of the region), ``redop`` (None unless ``mode == "reduce"``).

    Calling a privilege with field names gives the same mode on those fields:

    >>> R("x")
    R('x')
    """

    mode: str
    fields: tuple[str, ...] = ()
    redop: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PrivilegeError(f"privilege mode {self.mode!r} is not one of {MODES}")
        if self.mode == "reduce":
            if self.redop not in REDOPS:
                raise PrivilegeError(
                    f"reduction op {self.redop!r} is not one of {REDOPS}"
                )
        elif self.redop is not None:
            raise PrivilegeError(f"mode {self.mode!r} takes no reduction op, got {self.redop!r}")
        object.__setattr__(self, "fields", _fields(self.fields))

    def __call__(self, *fields: str) -> Privilege:
        if self.fields:
            raise PrivilegeError(
                f"{self!r} already names fields {self.fields}; cannot add {fields}"
            )
        return Privilege(self.mode, fields, self.redop)

    @property
    def reads(self) -> bool:
        """True when the task sees the region's previous contents."""
        return self.mode in ("read", "read_write")

    @property
    def writes(self) -> bool:
        """True when the task may change the region (write, discard or reduce)."""
        return self.mode != "read"

    @property
    def is_read_only(self) -> bool:
        return self.mode == "read"

    @property
    def privileges(self) -> tuple[Privilege, ...]:
        """``(self,)``, so a Privilege and a PrivilegeSet iterate alike."""
        return (self,)

    def __iter__(self) -> Iterator[Privilege]:
        return iter((self,))

    def __add__(self, other: Privilege | PrivilegeSet) -> PrivilegeSet:
        return PrivilegeSet((self,)) + other

    def requirements(self, region: RegionArg) -> list[RegionRequirement]:
        """``[RegionRequirement(region, self)]``."""
        from .requirement import RegionRequirement

        return [RegionRequirement(region, self)]

    def __repr__(self) -> str:
        args = ([repr(self.redop)] if self.redop else []) + [repr(f) for f in self.fields]
        return f"{_SHORT[self.mode]}({', '.join(args)})"


class PrivilegeSet:
    """Several privileges on pairwise disjoint fields of one region argument.

    >>> ps = R("y") + RW("x")
    >>> [p.mode for p in ps], ps.fields
    (['read', 'read_write'], ('y', 'x'))
    >>> R("x") + RW("x")
    Traceback (most recent call last):
    ...
    legionpy.errors.PrivilegeError: field 'x' appears in both R('x') and RW('x'); ...
    """

    __slots__ = ("privileges",)

    def __init__(self, privileges: tuple[Privilege, ...] | list[Privilege]) -> None:
        privs: list[Privilege] = []
        for p in privileges:
            if not isinstance(p, Privilege):
                raise PrivilegeError(f"a PrivilegeSet holds Privileges, got {p!r}")
            for q in privs:
                _check_disjoint(q, p)
            privs.append(p)
        self.privileges: tuple[Privilege, ...] = tuple(privs)

    def __add__(self, other: Privilege | PrivilegeSet) -> PrivilegeSet:
        if isinstance(other, (Privilege, PrivilegeSet)):
            return PrivilegeSet(self.privileges + other.privileges)
        return NotImplemented

    def __iter__(self) -> Iterator[Privilege]:
        return iter(self.privileges)

    def __len__(self) -> int:
        return len(self.privileges)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PrivilegeSet):
            return self.privileges == other.privileges
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.privileges)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for p in self.privileges for f in p.fields)

    @property
    def reads(self) -> bool:
        return any(p.reads for p in self.privileges)

    @property
    def writes(self) -> bool:
        return any(p.writes for p in self.privileges)

    @property
    def is_read_only(self) -> bool:
        return all(p.is_read_only for p in self.privileges)

    def requirements(self, region: RegionArg) -> list[RegionRequirement]:
        """One RegionRequirement per privilege."""
        from .requirement import RegionRequirement

        return [RegionRequirement(region, p) for p in self.privileges]

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.privileges)


def _check_disjoint(a: Privilege, b: Privilege) -> None:
    if not a.fields or not b.fields:
        which = a if not a.fields else b
        raise PrivilegeError(
            f"cannot combine {a!r} and {b!r}: {which!r} covers all fields, so the field "
            "sets overlap; name the fields of each privilege"
        )
    common = [f for f in a.fields if f in b.fields]
    if common:
        raise PrivilegeError(
            f"field {common[0]!r} appears in both {a!r} and {b!r}; the privileges of one "
            "region argument must cover disjoint fields"
        )


R = Privilege("read")
RW = Privilege("read_write")
WD = Privilege("write_discard")


def Reduce(op: str, *fields: str) -> Privilege:  # noqa: N802 - Legion's name
    """Reduction privilege with ``op`` in ``+ * max min`` on ``fields`` (none = all).

    >>> Reduce("max", "m")
    Reduce('max', 'm')
    """
    if op not in REDOPS:
        raise PrivilegeError(f"reduction op {op!r} is not one of {REDOPS}")
    return Privilege("reduce", fields, op)
