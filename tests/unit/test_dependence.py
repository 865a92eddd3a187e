"""Dependence analysis: orders every conflicting pair, only conflicting pairs,
and keeps its state bounded over a long loop."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from legionpy.geometry import Rect
from legionpy.regions import (
    RW,
    WD,
    DependenceAnalyzer,
    Partition,
    R,
    Reduce,
    Region,
    check_dependences,
    conflicting_pairs,
)
from legionpy.regions import RegionRequirement as Req

FAST = settings(max_examples=100, deadline=None)


def run(program):
    d = DependenceAnalyzer()
    return d, {op: d.analyze(op, reqs) for op, reqs in program}


def test_true_anti_and_output_dependences():
    A = Region((8,), {"x": "f4", "y": "f4"})
    P = Partition.equal(A, (2,))
    program = [
        (0, [Req(P[0], WD("x"))]),
        (1, [Req(P[1], WD("x"))]),
        (2, [Req(A, R("x")), Req(A, WD("y"))]),  # true on 0 and 1
        (3, [Req(P[1], R("y"))]),  # true on 2
        (4, [Req(P[1], RW("x"))]),  # anti on 2, output on 1
        (5, [Req(P[0], R("x"))]),  # true on 0 only
        (6, [Req(A, WD("y"))]),  # anti on 3, output on 2
    ]
    d, deps = run(program)
    assert deps == {0: [], 1: [], 2: [0, 1], 3: [2], 4: [1, 2], 5: [0], 6: [2, 3]}
    assert check_dependences(program, deps) == []


def test_reductions_accumulate_without_order():
    A = Region((4,), {"g": "f4"})
    program = [(0, [Req(A, WD)])]
    program += [(k, [Req(A, Reduce("+"))]) for k in range(1, 5)]
    program += [(5, [Req(A, Reduce("max"))]), (6, [Req(A, R)])]
    _, deps = run(program)
    assert all(deps[k] == [0] for k in range(1, 5))  # same op: no order among them
    assert deps[5] == [0, 1, 2, 3, 4]  # another op waits for all of them
    assert deps[6] == [0, 1, 2, 3, 4, 5]
    assert check_dependences(program, deps) == []


def test_pruning_by_a_union_of_writers():
    A = Region((8,), {"x": "f4"})
    P = Partition.equal(A, (2,))
    H = Partition.restriction(A, (4,), halo=1)
    d = DependenceAnalyzer()
    d.analyze(0, [Req(H[0], R("x"))])  # [0, 5) spans both tiles
    d.analyze(1, [Req(P[0], WD("x"))])
    assert [u[0] for u in d.users(A.uid, "x")] == [0, 1]
    d.analyze(2, [Req(P[1], WD("x"))])  # together 1 and 2 cover op 0's rect
    assert [u[0] for u in d.users(A.uid, "x")] == [1, 2]


def test_retire_drops_finished_ops():
    A = Region((4,), {"x": "f4"})
    d = DependenceAnalyzer()
    for k in range(10):
        d.analyze(k, [Req(A, R)])
    assert d.num_users == 10
    assert d.retire(range(8)) == 8
    assert d.analyze(10, [Req(A, WD)]) == [8, 9]


def test_checker_catches_missing_and_spurious_edges():
    A = Region((4,), {"x": "f4", "y": "f4"})
    program = [(0, [Req(A, WD("x"))]), (1, [Req(A, WD("y"))]), (2, [Req(A, R("x"))])]
    assert check_dependences(program, {0: [], 1: [], 2: [0]}) == []
    assert "not ordered" in check_dependences(program, {0: [], 1: [], 2: []})[0]
    assert "do not conflict" in check_dependences(program, {0: [], 1: [0], 2: [0]})[0]
    assert "not an earlier op" in check_dependences(program, {0: [2], 1: [], 2: [0]})[0]
    assert conflicting_pairs(program) == {(0, 2)}


# -- random programs ---------------------------------------------------------------------
_A = Region((8,), {"a": "f4", "b": "f4"}, name="A")
_B = Region((4, 4), {"a": "f4", "b": "f4"}, name="B")
_PRIVS = [R, RW, WD, Reduce("+"), Reduce("max")]


@st.composite
def requirement(draw):
    root = draw(st.sampled_from([_A, _B]))
    lo = tuple(draw(st.integers(0, n)) for n in root.shape)
    hi = tuple(draw(st.integers(l, n)) for l, n in zip(lo, root.shape))
    sub = Partition.by_rects(root, {0: Rect(lo, hi)})[0]
    region = draw(st.sampled_from([root, sub, sub]))
    fields = draw(st.lists(st.sampled_from("ab"), unique=True, max_size=2))
    return Req(region, draw(st.sampled_from(_PRIVS))(*fields))


programs = st.lists(st.lists(requirement(), min_size=1, max_size=3), min_size=1, max_size=14)


@FAST
@given(programs)
def test_random_programs_are_ordered_exactly(ops):
    program = list(enumerate(ops))
    _, deps = run(program)
    assert check_dependences(program, deps) == []


@FAST
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.sampled_from(_PRIVS)),
                min_size=1, max_size=30))
def test_random_1d_programs_with_heavy_pruning(items):
    program = []
    for k, (a, b, priv) in enumerate(items):
        sub = Partition.by_rects(_A, {0: Rect((min(a, b),), (max(a, b),))})[0]
        program.append((k, [Req(sub, priv("a"))]))
    _, deps = run(program)
    assert check_dependences(program, deps) == []


# -- state stays bounded over a long loop ---------------------------------------------------
def test_user_lists_stay_bounded_over_5000_iterations():
    n, k = 64, 4
    X = Region((n,), {"x": np.float32, "dx": np.float32}, name="X")
    Y = Region((n,), {"y": np.float32, "dy": np.float32}, name="Y")
    W = Region((8,), {"w": np.float32, "dw": np.float32}, name="W")
    PX, PY = Partition.equal(X, (k,)), Partition.equal(Y, (k,))
    HX = Partition.restriction(X, (n // k,), halo=2)
    iteration = []  # one training step: load, forward with halos, backward, update
    iteration += [[Req(PX[c], WD("x"))] for c in range(k)]
    iteration += [[Req(HX[c], R("x")), Req(W, R("w")), Req(PY[c], WD("y"))] for c in range(k)]
    iteration += [[Req(PY[c], WD("dy"))] for c in range(k)]
    iteration += [
        [Req(PY[c], R("dy")), Req(HX[c], R("x")), Req(HX[c], Reduce("+", "dx")),
         Req(W, Reduce("+", "dw"))]
        for c in range(k)
    ]
    iteration += [[Req(W, RW("w")), Req(W, R("dw"))], [Req(W, WD("dw"))],
                  [Req(X, WD("dx"))]]
    d = DependenceAnalyzer()
    op, sizes = 0, []
    program = []
    for it in range(5000):
        for reqs in iteration:
            deps = d.analyze(op, reqs)
            if it < 3:
                program.append((op, reqs))
                if it == 2:
                    assert deps  # every op of a steady-state step waits for something
            op += 1
        if it == 2:
            _, deps3 = run(program)
            assert check_dependences(program, deps3) == []
        sizes.append(d.max_users())
    assert max(sizes) <= 3 * k
    assert sizes[-1] == sizes[10]  # steady state: no growth with program length


# -- the index: same answers as a full scan, bounded work per tile ----------------------------
class _ScanAnalyzer:
    """The analysis as one scan over every current user (the reference)."""

    def __init__(self):
        self.users = {}

    def analyze(self, op_id, reqs):
        from legionpy.regions.requirement import conflicts

        deps = set()
        for req in reqs:
            if req.rect.empty:
                continue
            m, o = req.privilege.mode, req.privilege.redop
            for f in req.fields:
                for op, um, uo, rect, _ in self.users.get((req.root.uid, f), ()):
                    if conflicts(um, uo, m, o) and rect.overlaps(req.rect):
                        deps.add(op)
        for req in reqs:
            if req.rect.empty:
                continue
            for f in req.fields:
                us = self.users.setdefault((req.root.uid, f), [])
                if req.privilege.mode in ("read_write", "write_discard"):
                    kept = []
                    for u in us:
                        if u[3].overlaps(req.rect):
                            left = [r for piece in u[4] for r in piece.subtract(req.rect)]
                            if len(left) <= 64:
                                u[4][:] = left
                        if u[4]:
                            kept.append(u)
                    us[:] = kept
                us.append((op_id, req.privilege.mode, req.privilege.redop, req.rect, [req.rect]))
        deps.discard(op_id)
        return sorted(deps)


@FAST
@given(programs)
def test_indexed_analysis_equals_the_full_scan(ops):
    d, ref = DependenceAnalyzer(), _ScanAnalyzer()
    for k, reqs in enumerate(ops):
        assert d.analyze(k, reqs) == ref.analyze(k, reqs)
    for key, us in ref.users.items():
        assert d.users(*key) == [(u[0], u[1], u[3]) for u in us]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(-9, 9), st.integers(-9, 9),
                          st.integers(0, 12), st.integers(0, 5)), max_size=40),
       st.integers(-12, 12), st.integers(-12, 12), st.integers(0, 20), st.integers(0, 20))
def test_rect_index_finds_exactly_the_overlapping_items(steps, qx, qy, qw, qh):
    from types import SimpleNamespace

    from legionpy.regions.dependence import RectIndex

    ix, live = RectIndex(), {}
    for k, (remove, x, y, w, h) in enumerate(steps):
        if remove and live:
            key = sorted(live)[x % len(live)]
            ix.remove(key)
            del live[key]
        else:
            live[k] = SimpleNamespace(rect=Rect((x, y), (x + w, y + h)))
            ix.add(live[k].rect, k, live[k])
        q = Rect((qx, qy), (qx + qw, qy + qh))
        want = {k for k, it in live.items() if it.rect.overlaps(q)}
        assert {k for k, _ in ix.query(q)} == want
        assert len(ix) == len(live) and {k for k, _ in ix.items()} == set(live)


def _tile_point_cost(tiles, parts):
    """Rect tests of one more point after two index launches over ``tiles`` tiles."""
    A = Region((4 * tiles, 6 * tiles), {f: np.float32 for f in "xyzw"})
    P = parts(A, tiles)
    d = DependenceAnalyzer()
    op = 0

    def point(c):
        s = P[c]
        return [Req(s, R("x")), Req(s, RW("y")), Req(s, WD("z")), Req(s, Reduce("+", "w"))]

    for _ in range(2):
        for c in P.colors:
            d.analyze(op, point(c))
            op += 1
    c = P.colors[len(P.colors) // 2]
    before = d.comparisons
    deps = d.analyze(op, point(c))
    assert deps  # it does wait for the previous launch's point on its tile
    return d.comparisons - before


def test_rect_tests_per_point_do_not_grow_with_the_partition():
    rows = lambda A, n: Partition.equal(A, (n, 1))  # noqa: E731
    grid = lambda A, n: Partition.equal(A, (n, n))  # noqa: E731
    halo = lambda A, n: Partition.restriction(A, (4, 6 * n), halo=(1, 0))  # noqa: E731
    for parts in (rows, grid, halo):
        costs = [_tile_point_cost(n, parts) for n in (4, 16, 64)]
        assert max(costs) <= 24, costs
        assert costs[-1] <= costs[0] + 4, costs  # flat, not O(tiles)
