"""Privileges, privilege sets, region requirements and the interference test."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legionpy.errors import FieldError, PrivilegeError, RegionError
from legionpy.geometry import Rect
from legionpy.regions import (
    RW,
    WD,
    Partition,
    Privilege,
    PrivilegeSet,
    R,
    Reduce,
    Region,
    RegionRequirement,
    interferes,
    requirements,
)

FAST = settings(max_examples=100, deadline=None)


def test_privilege_attributes():
    table = {
        R("x"): ("read", True, False, True),
        RW("x"): ("read_write", True, True, False),
        WD("x"): ("write_discard", False, True, False),
        Reduce("+", "x"): ("reduce", False, True, False),
    }
    for p, (mode, reads, writes, ro) in table.items():
        assert isinstance(p, Privilege)
        assert (p.mode, p.reads, p.writes, p.is_read_only) == (mode, reads, writes, ro)
        assert p.fields == ("x",)
    assert Reduce("max", "x").redop == "max" and RW("x").redop is None
    assert R.fields == () and R("a", "b").fields == ("a", "b")  # no fields = all
    assert Reduce("min").fields == ()
    assert R("x") == R("x") and hash(RW("y")) == hash(RW("y")) and R("x") != RW("x")
    assert repr(Reduce("*", "g")) == "Reduce('*', 'g')"


def test_privilege_set():
    ps = R("y") + RW("x") + Reduce("+", "g")
    assert isinstance(ps, PrivilegeSet) and len(ps) == 3
    assert [p.mode for p in ps] == ["read", "read_write", "reduce"]
    assert ps.fields == ("y", "x", "g") and ps.writes and ps.reads and not ps.is_read_only
    assert (R("a") + (R("b") + R("c"))).is_read_only
    A = Region((4,), {"x": "f4", "y": "f4", "g": "f4"}, name="A")
    reqs = ps.requirements(A)
    assert [r.fields for r in reqs] == [("y",), ("x",), ("g",)]
    assert requirements(A, ps) == reqs and requirements(A, RW)[0].fields == ("x", "y", "g")


@pytest.mark.parametrize(
    "make, names",
    [
        (lambda: R("x") + RW("x"), ["'x'", "R('x')", "RW('x')"]),
        (lambda: R("a", "x") + (WD("b") + Reduce("+", "x")), ["'x'"]),
        (lambda: R + RW("x"), ["all fields"]),
        (lambda: Reduce("avg", "x"), ["'avg'"]),
        (lambda: Privilege("write", ("x",)), ["'write'"]),
        (lambda: RW("x")("y"), ["'y'", "'x'"]),
        (lambda: R(3), ["3"]),
        (lambda: Privilege("read", ("x",), "+"), ["'+'"]),
    ],
)
def test_bad_privileges_fail_naming_values(make, names):
    with pytest.raises(PrivilegeError) as info:
        make()
    for n in names:
        assert n in str(info.value), (n, str(info.value))


def test_region_requirement():
    A = Region((8, 4), {"x": "f4", "y": "f8"}, name="A")
    P = Partition.equal(A, (2, 1))
    req = RegionRequirement(P[1, 0], RW("y"))
    assert req.root is A and req.rect == Rect((4, 0), (8, 4)) and req.fields == ("y",)
    assert req.privilege == RW("y") and req.region is P[1, 0]
    assert RegionRequirement(A, WD).fields == ("x", "y")
    assert req == RegionRequirement(P[1, 0], RW("y")) and "A" in repr(req)


def test_bad_requirements_fail_naming_values():
    A = Region((8,), {"x": "f4"}, name="A")
    with pytest.raises(FieldError, match=r"'z'.*'A'.*\['x'\]"):
        RegionRequirement(A, R("z"))
    with pytest.raises(FieldError, match=r"'z'"):
        (R("x") + RW("z")).requirements(A)
    with pytest.raises(PrivilegeError, match="PrivilegeSet|set"):
        RegionRequirement(A, R("x") + RW("w"))
    with pytest.raises(PrivilegeError, match="'rw'"):
        RegionRequirement(A, "rw")
    with pytest.raises(RegionError, match="'A'"):
        RegionRequirement("A", R)


def test_interference_rules():
    A = Region((8,), {"x": "f4", "y": "f4"})
    B = Region((8,), {"x": "f4"})
    P = Partition.equal(A, (2,))
    H = Partition.restriction(A, (4,), halo=1)
    q = RegionRequirement
    assert not interferes(q(A, RW("x")), q(B, RW("x")))  # different roots
    assert not interferes(q(A, RW("x")), q(A, RW("y")))  # disjoint fields
    assert not interferes(q(P[0], RW), q(P[1], RW))  # disjoint rects
    assert not interferes(q(A, R), q(A, R))  # both read-only
    assert not interferes(q(A, Reduce("+")), q(P[0], Reduce("+")))  # same reduction
    assert interferes(q(A, Reduce("+")), q(A, Reduce("max")))
    assert interferes(q(A, Reduce("+")), q(A, R("x")))
    assert interferes(q(H[1], R("x")), q(P[0], WD("x")))  # halo overlaps neighbour
    assert interferes(q(P[0], WD("x")), q(P[0], WD("x")))


# -- symmetric, and equal to a brute-force point/field definition ---------------------
_ROOTS = [Region((6, 6), {"a": "f4", "b": "f4", "c": "i4"}, name=f"T{i}") for i in range(2)]
privileges = st.one_of(
    st.sampled_from([R, RW, WD]), st.sampled_from(["+", "*", "max", "min"]).map(Reduce)
)


@st.composite
def requirements_(draw):
    root = draw(st.sampled_from(_ROOTS))
    lo = [draw(st.integers(0, 6)) for _ in range(2)]
    hi = [draw(st.integers(l, 6)) for l in lo]
    sub = Partition.by_rects(root, {0: Rect(tuple(lo), tuple(hi))})[0]
    fields = draw(st.lists(st.sampled_from("abc"), unique=True, max_size=3))
    return RegionRequirement(sub, draw(privileges)(*fields))


def brute_force(a: RegionRequirement, b: RegionRequirement) -> bool:
    if a.root is not b.root or not set(a.fields) & set(b.fields):
        return False
    ma, mb = np.zeros((6, 6), bool), np.zeros((6, 6), bool)
    ma[a.rect.to_slices()] = True
    mb[b.rect.to_slices()] = True
    if not (ma & mb).any():
        return False
    pa, pb = a.privilege, b.privilege
    if pa.mode == pb.mode == "read":
        return False
    return not (pa.mode == pb.mode == "reduce" and pa.redop == pb.redop)


@FAST
@given(requirements_(), requirements_())
def test_interference_is_symmetric_and_matches_brute_force(a, b):
    assert interferes(a, b) == interferes(b, a) == brute_force(a, b)
