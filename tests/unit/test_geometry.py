"""Rect laws, checked against numpy boolean masks over a small bounding box."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legionpy.errors import GeometryError
from legionpy.geometry import Rect, block_bounds, grid_points, union_volume

LO, HI = -4, 9  # every generated coordinate lies in [LO, HI]
FAST = settings(max_examples=100, deadline=None)


@st.composite
def rects(draw, ndim=None, allow_empty=True):
    n = draw(st.integers(1, 3)) if ndim is None else ndim
    lo, hi = [], []
    for _ in range(n):
        a = draw(st.integers(LO, HI))
        b = draw(st.integers(LO, HI))
        if not allow_empty and a == b:
            b = a + 1
        lo.append(min(a, b) if not allow_empty else a)
        hi.append(max(a, b) if not allow_empty else b)
    return Rect(tuple(lo), tuple(hi))


@st.composite
def rect_pairs(draw):
    n = draw(st.integers(1, 3))
    return draw(rects(ndim=n)), draw(rects(ndim=n))


def mask(r: Rect, ndim: int) -> np.ndarray:
    """Boolean mask of ``r`` over the box [LO, HI + 2)^ndim."""
    m = np.zeros((HI + 2 - LO,) * ndim, dtype=bool)
    if not r.empty:
        m[r.to_slices(origin=(LO,) * ndim)] = True
    return m


@FAST
@given(rect_pairs())
def test_intersection_is_commutative_and_matches_masks(pair):
    a, b = pair
    assert (a & b).volume == (b & a).volume
    assert (a & b).empty or a & b == b & a
    assert np.array_equal(mask(a & b, a.ndim), mask(a, a.ndim) & mask(b, a.ndim))
    assert a.overlaps(b) == b.overlaps(a) == bool((mask(a, a.ndim) & mask(b, a.ndim)).any())


@FAST
@given(rect_pairs())
def test_subtract_and_intersection_partition_the_rect(pair):
    a, b = pair
    pieces = a.subtract(b)
    assert len(pieces) <= 2 * a.ndim
    total = np.zeros_like(mask(a, a.ndim), dtype=int)
    for p in pieces + [a & b]:
        assert a.contains(p)
        total += mask(p, a.ndim)
    assert np.array_equal(total, mask(a, a.ndim).astype(int))  # each point exactly once
    assert not any(p.overlaps(b) for p in pieces)


@FAST
@given(rect_pairs())
def test_contains_matches_masks(pair):
    a, b = pair
    ma, mb = mask(a, a.ndim), mask(b, a.ndim)
    assert a.contains(b) == bool(not (mb & ~ma).any())


@FAST
@given(rects(allow_empty=False), st.data())
def test_split_covers_the_rect_disjointly(r, data):
    degrees = tuple(data.draw(st.integers(1, n)) for n in r.shape)
    blocks = r.split(degrees)
    assert len(blocks) == int(np.prod(degrees))
    total = sum(mask(b, r.ndim).astype(int) for b in blocks)
    assert np.array_equal(total, mask(r, r.ndim).astype(int))
    # uneven extents spread like numpy.array_split
    for d, k in enumerate(degrees):
        expected = [len(c) for c in np.array_split(np.arange(r.shape[d]), k)]
        assert [h - lo for lo, h in block_bounds(r.lo[d], r.hi[d], k)] == expected


@FAST
@given(st.integers(1, 3).flatmap(lambda n: st.lists(rects(ndim=n), min_size=0, max_size=6)))
def test_union_volume_matches_brute_force(rs):
    if not rs:
        assert union_volume(rs) == 0
        return
    m = np.zeros_like(mask(rs[0], rs[0].ndim))
    for r in rs:
        m |= mask(r, r.ndim)
    assert union_volume(rs) == int(m.sum())


def test_grid_points_row_major():
    assert grid_points((2, 3)) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_grow_translate_and_slices():
    r = Rect((1, 2), (3, 5))
    assert r.grow((1, 0)) == Rect((0, 2), (4, 5))
    assert r.translate((-1, -2)) == Rect((0, 0), (2, 3))
    assert r.to_slices() == (slice(1, 3), slice(2, 5))
    a = np.arange(20).reshape(4, 5)
    assert a[r.to_slices()].shape == r.shape


@pytest.mark.parametrize(
    "make, names",
    [
        (lambda: Rect((0, 0), (1,)), ["(0, 0)", "(1,)"]),
        (lambda: Rect((0,), (4,)) & Rect((0, 0), (1, 1)), ["1-d", "2-d"]),
        (lambda: Rect((0,), (4,)).split((5,)), ["5", "4"]),
        (lambda: Rect((0,), (4,)).split((0,)), ["0"]),
        (lambda: Rect((0,), (4,)).split((1, 1)), ["(1, 1)"]),
        (lambda: Rect(("a",), (1,)), ["'a'"]),
    ],
)
def test_bad_geometry_fails_naming_values(make, names):
    with pytest.raises(GeometryError) as info:
        make()
    for n in names:
        assert n in str(info.value)
