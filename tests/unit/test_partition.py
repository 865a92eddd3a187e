"""Partitions tile their parent: equal, restriction (halos), by_rects, nested."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legionpy.errors import PartitionError
from legionpy.geometry import Rect, grid_points, union_volume
from legionpy.regions import Partition, Region

FAST = settings(max_examples=100, deadline=None)

shapes = st.lists(st.integers(1, 12), min_size=1, max_size=3).map(tuple)


def coverage(P) -> np.ndarray:
    """How many tiles hold each point of the root."""
    count = np.zeros(P.root.shape, dtype=int)
    for r in P.rects.values():
        count[r.to_slices()] += 1
    return count


@st.composite
def equal_partitions(draw):
    shape = draw(shapes)
    degrees = tuple(draw(st.integers(1, n)) for n in shape)
    return Region(shape, {"x": np.float32}), degrees


@FAST
@given(equal_partitions())
def test_equal_is_disjoint_complete_and_sums_to_parent(case):
    R, degrees = case
    P = Partition.equal(R, degrees)
    assert P.is_disjoint and P.is_complete
    assert sum(r.volume for r in P.rects.values()) == R.volume
    assert np.array_equal(coverage(P), np.ones(R.shape, dtype=int))
    assert P.colors == grid_points(degrees) and P.color_shape == degrees
    assert len(P) == int(np.prod(degrees)) and P.root is R and P.parent is R
    # uneven sizes spread like numpy.array_split, blocks in row-major color order
    for d, k in enumerate(degrees):
        sizes = [len(c) for c in np.array_split(np.arange(R.shape[d]), k)]
        for color in P.colors:
            assert P[color].shape[d] == sizes[color[d]]
    assert [s.color for s in P] == P.colors


def test_equal_matches_the_design_example():
    R = Region((1024, 512), {"x": np.float32, "y": np.float32})
    P = Partition.equal(R, (4, 1))
    assert P[2, 0].rect == Rect((512, 0), (768, 512))
    assert P[(2, 0)] is P[2, 0]
    Q = Partition.equal(Region((10,), {"x": "f4"}), 3)  # a bare int for a 1-d region
    assert Q[0].rect == Rect((0,), (4,)) and Q[2].rect == Rect((7,), (10,))


@st.composite
def restrictions(draw):
    shape = draw(shapes)
    tile = tuple(draw(st.integers(1, n + 2)) for n in shape)
    halo = tuple(draw(st.integers(0, 3)) for _ in shape)
    return Region(shape, {"x": np.float32}), tile, halo


@FAST
@given(restrictions())
def test_restriction_tiles_cover_the_parent(case):
    R, tile, halo = case
    H = Partition.restriction(R, tile, halo=halo)
    grid = tuple(-(-n // t) for n, t in zip(R.shape, tile))
    assert H.color_shape == grid and H.colors == grid_points(grid)
    assert H.is_complete and np.all(coverage(H) >= 1)
    for color, r in H.rects.items():
        core = Rect(
            tuple(c * t for c, t in zip(color, tile)),
            tuple(min((c + 1) * t, n) for c, t, n in zip(color, tile, R.shape)),
        )
        assert r == core.grow(halo) & R.rect  # grown by the halo, clipped
    no_halo = Partition.restriction(R, tile)
    assert no_halo.is_disjoint and no_halo.is_complete
    if H.is_disjoint:
        assert sum(r.volume for r in H.rects.values()) == R.volume


def test_restriction_with_halo_is_aliased():
    R = Region((1024, 512), {"x": np.float32})
    H = Partition.restriction(R, (256, 512), halo=(1, 0))
    assert H[0, 0].rect == Rect((0, 0), (257, 512))
    assert H[1, 0].rect == Rect((255, 0), (513, 512))
    assert H[3, 0].rect == Rect((767, 0), (1024, 512))
    assert not H.is_disjoint and H.is_complete and H.kind == "restriction"


def test_by_rects_int_and_tuple_colors():
    R = Region((8, 8), {"x": np.float32})
    P = Partition.by_rects(R, {1: Rect((0, 0), (4, 8)), 0: Rect((4, 0), (8, 8))})
    assert P.colors == [(0,), (1,)] and P.color_shape == (2,)
    assert P[1].rect == Rect((0, 0), (4, 8)) and P[(1,)] is P[1] and 1 in P
    assert P.is_disjoint and P.is_complete
    Q = Partition.by_rects(R, {(0, 1): Rect((0, 0), (2, 2)), (1, 0): Rect((1, 1), (3, 3))})
    assert Q.colors == [(0, 1), (1, 0)] and Q.color_shape == (2, 2)
    assert not Q.is_disjoint and not Q.is_complete and Q[1, 0].rect.lo == (1, 1)
    assert (0, 0) not in Q
    E = Partition.by_rects(R, {})
    assert len(E) == 0 and E.is_disjoint and not E.is_complete


@FAST
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=6))
def test_by_rects_flags_match_brute_force(bounds):
    R = Region((8,), {"x": np.float32})
    rects = {k: Rect((min(a, b),), (max(a, b),)) for k, (a, b) in enumerate(bounds)}
    P = Partition.by_rects(R, rects)
    count = coverage(P)
    assert P.is_disjoint == bool(np.all(count <= 1))
    assert P.is_complete == bool(np.all(count >= 1))


@FAST
@given(equal_partitions(), st.data())
def test_nested_partitions_stay_in_root_coordinates(case, data):
    R, degrees = case
    P = Partition.equal(R, degrees)
    sub = P[data.draw(st.sampled_from(P.colors))]
    inner = tuple(data.draw(st.integers(1, n)) for n in sub.shape)
    Q = Partition.equal(sub, inner)
    assert Q.parent is sub and Q.root is R and Q[Q.colors[0]].root is R
    assert all(sub.rect.contains(r) for r in Q.rects.values())
    assert Q.is_disjoint and Q.is_complete
    assert union_volume(Q.rects.values()) == sub.volume
    H = Partition.restriction(sub, sub.shape, halo=1)  # one tile, halo clipped to sub
    assert list(H.rects.values()) == [sub.rect]


def test_nested_by_rects_outside_the_subregion_fails():
    R = Region((8,), {"x": np.float32})
    sub = Partition.equal(R, (2,))[0]
    with pytest.raises(PartitionError, match=r"Rect\(lo=\(2,\), hi=\(6,\)\).*\(4,\)"):
        Partition.by_rects(sub, {0: Rect((2,), (6,))})


# -- must fail -------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, names",
    [
        (lambda R: Partition.equal(R, (5, 1)), ["5", "dim 0", "4"]),  # degree > extent
        (lambda R: Partition.equal(R, (1, 0)), ["0", "dim 1"]),  # not positive
        (lambda R: Partition.equal(R, (-2, 1)), ["-2", "dim 0"]),
        (lambda R: Partition.equal(R, (2,)), ["(2,)", "2 dims"]),  # wrong number
        (lambda R: Partition.equal(R, (1, 1, 1)), ["(1, 1, 1)", "2 dims"]),
        (lambda R: Partition.equal(R, (1.5, 1)), ["1.5"]),
        (lambda R: Partition.equal(R, 2), ["(2,)", "2 dims"]),  # an int is one dim
        (lambda R: Partition.restriction(R, (2, 0)), ["0", "dim 1", "tile"]),
        (lambda R: Partition.restriction(R, (2, 3), halo=(0, -1)), ["-1", "dim 1", "halo"]),
        (lambda R: Partition.restriction(R, (2,)), ["(2,)", "2 dims"]),
        (lambda R: Partition.restriction(R, (2, 2), halo=(1,)), ["(1,)", "2 dims"]),
        (lambda R: Partition.by_rects(R, {0: Rect((0, 0), (5, 2))}),
         ["Rect(lo=(0, 0), hi=(5, 2))", "(4, 6)"]),
        (lambda R: Partition.by_rects(R, {0: Rect((-1, 0), (2, 2))}), ["lo=(-1, 0)"]),
        (lambda R: Partition.by_rects(R, {0: Rect((0,), (2,))}),
         ["Rect(lo=(0,), hi=(2,))", "1 dims"]),
        (lambda R: Partition.by_rects(R, {0: (0, 2)}), ["(0, 2)"]),
        (lambda R: Partition.by_rects(R, {-1: Rect((0, 0), (1, 1))}), ["-1"]),
        (lambda R: Partition.by_rects(R, {0: Rect((0, 0), (1, 1)), (1, 1): Rect((0, 0), (1, 1))}),
         ["(1, 1)"]),
        (lambda R: Partition.equal(R, (2, 1))[2, 0], ["(2, 0)", "(2, 1)"]),
        (lambda R: Partition.equal(R, (2, 1))["a"], ["'a'"]),
        (lambda R: Partition.equal("R", (2, 1)), ["'R'"]),
    ],
)
def test_bad_partitions_fail_naming_values(make, names):
    R = Region((4, 6), {"x": np.float32}, name="A")
    with pytest.raises(PartitionError) as info:
        make(R)
    for n in names:
        assert n in str(info.value), (n, str(info.value))
