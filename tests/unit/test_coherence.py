"""Pure coherence transitions: (state, request) -> (plan, new state)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from legionpy.geometry import Rect
from legionpy.regions.coherence import (
    HOST,
    Copy,
    FieldState,
    FillAction,
    FoldAction,
    Piece,
    Red,
    Request,
)

R8 = Rect((0,), (8,))
LO, HI = Rect((0,), (4,)), Rect((4,), (8,))


def ids(start=100):
    return itertools.count(start).__next__


def test_fill_materialises_locally_without_copy():
    s = FieldState.filled(R8, 0)
    plan, s2 = s.access(Request(R8, "read", 0, 5), ids())
    assert plan.copies == [] and plan.deps == set()
    assert plan.prologue == [FillAction(0, R8, 0)]
    assert s2 == FieldState([Piece(R8, {0: 5}, 0)])
    assert s == FieldState.filled(R8, 0)  # pure


def test_read_of_remote_data_copies_from_the_producer():
    s = FieldState([Piece(R8, {0: 5})])
    plan, s2 = s.access(Request(HI, "read", 1, 6), ids())
    assert plan.copies == [Copy(100, HI, 0, 1, (5,))]
    assert plan.deps == {100}
    assert s2 == FieldState([Piece(LO, {0: 5}), Piece(HI, {0: 5, 1: 100})])
    # a second reader on memory 1 waits for the copy, no new copy
    plan, s3 = s2.access(Request(HI, "read", 1, 7), ids(200))
    assert plan.copies == [] and plan.deps == {100} and s3 == s2


def test_write_invalidates_other_copies_and_wd_needs_no_copy():
    s = FieldState([Piece(LO, {0: 5}), Piece(HI, {0: 5, 1: 100})])
    plan, s2 = s.access(Request(R8, "read_write", 1, 8), ids())
    assert plan.copies == [Copy(100, LO, 0, 1, (5,))]
    assert s2 == FieldState([Piece(R8, {1: 8})])
    plan, s3 = s2.access(Request(LO, "write_discard", 0, 9), ids())
    assert plan.copies == [] and plan.deps == set() and plan.prologue == []
    assert s3 == FieldState([Piece(LO, {0: 9}), Piece(HI, {1: 8})])


def test_source_choice_is_deterministic_host_last():
    s = FieldState([Piece(R8, {HOST: 1, 3: 2, 2: 4})])
    plan, _ = s.access(Request(R8, "read", 0, 5), ids())
    assert plan.copies[0].src == 2


def test_reductions_accumulate_then_fold_at_the_reader():
    s = FieldState([Piece(R8, {0: 5})])
    _, s = s.access(Request(R8, "reduce", 0, 6, "+", "b6"), ids())
    plan, s = s.access(Request(HI, "reduce", 1, 7, "+", "b7"), ids())
    assert plan.copies == [] and plan.deps == set()
    assert s == FieldState([
        Piece(LO, {0: 5}, None, "+", (Red(0, "b6", (6,)),)),
        Piece(HI, {0: 5}, None, "+", (Red(0, "b6", (6,)), Red(1, "b7", (7,)))),
    ])
    plan, s2 = s.access(Request(R8, "read", 0, 9), ids())
    # the remote buffer is copied to the reader, every buffer folded in program order
    assert plan.copies == [Copy(100, HI, 1, 0, (7,), "b7")]
    assert plan.prologue == [
        FoldAction(0, LO, "+", "b6"),
        FoldAction(0, HI, "+", "b6"),
        FoldAction(0, HI, "+", staged=100),
    ]
    assert plan.deps == {5, 6, 100}
    assert s2 == FieldState([Piece(LO, {0: 9}), Piece(HI, {0: 9})])


def test_reduce_with_another_op_folds_pending_first():
    s = FieldState([Piece(R8, {0: 5}, None, "+", (Red(1, "b6", (6,)),))])
    plan, s2 = s.access(Request(R8, "reduce", 0, 7, "max", "b7"), ids())
    assert plan.copies == [Copy(100, R8, 1, 0, (6,), "b6")]
    assert plan.prologue == [FoldAction(0, R8, "+", staged=100)]
    assert s2 == FieldState([Piece(R8, {0: 7}, None, "max", (Red(0, "b7", (7,)),))])


def test_write_discard_drops_pending_reductions_and_fills():
    s = FieldState([Piece(R8, {}, 3.0, "+", (Red(1, "b", (6,)),))])
    plan, s2 = s.access(Request(LO, "write_discard", 0, 7), ids())
    assert plan.copies == [] and plan.prologue == []
    assert s2 == FieldState([Piece(LO, {0: 7}), Piece(HI, {}, 3.0, "+", (Red(1, "b", (6,)),))])


def test_reducers_on_one_memory_share_one_buffer_until_it_is_read():
    """Same-op reducers on one memory accumulate into ONE buffer (its first
    reducer's key): a remote reader copies it once (after every contributor)
    and folds it once; the read closes the epoch, so a later reducer on that
    memory starts a new buffer."""
    s = FieldState([Piece(R8, {0: 5})])
    _, s = s.access(Request(LO, "reduce", 1, 6, "+", "b6"), ids())
    plan, s = s.access(Request(R8, "reduce", 1, 7, "+", "b7"), ids())
    assert plan.buffer == "b6"
    plan, s = s.access(Request(HI, "reduce", 1, 8, "+", "b8"), ids())
    assert plan.buffer == "b6" and s.open_buffers() == {1: ("b6", "+")}
    assert s == FieldState([Piece(LO, {0: 5}, None, "+", (Red(1, "b6", (6, 7)),)),
                            Piece(HI, {0: 5}, None, "+", (Red(1, "b6", (7, 8)),))])
    plan, s2 = s.access(Request(R8, "read", 0, 9), ids())
    assert plan.copies == [Copy(100, LO, 1, 0, (6, 7, 8), "b6", (HI,))]
    assert plan.prologue == [FoldAction(0, LO, "+", staged=100),
                             FoldAction(0, HI, "+", staged=100)]
    assert plan.deps == {5, 100}
    # a read of part of the buffer closes it too: the next reducer opens "b10"
    plan, s3 = s.access(Request(LO, "read", 0, 9), ids())
    assert s3.open_buffers() == {}
    plan, s3 = s3.access(Request(R8, "reduce", 1, 10, "+", "b10"), ids())
    assert plan.buffer == "b10"
    assert s3 == FieldState([Piece(LO, {0: 9}, None, "+", (Red(1, "b10", (10,)),)),
                             Piece(HI, {0: 5}, None, "+", (Red(1, "b6", (7, 8)),
                                                           Red(1, "b10", (10,))))])
    # another op on that memory starts its own buffer; other memories have theirs
    plan, s4 = s.access(Request(LO, "reduce", 0, 11, "+", "b11"), ids())
    assert plan.buffer == "b11" and s4.open_buffers() == {1: ("b6", "+"), 0: ("b11", "+")}
    plan, s5 = s.access(Request(HI, "reduce", 1, 12, "max", "b12"), ids())
    assert plan.buffer == "b12" and s5.open_buffers() == {1: ("b12", "max")}


def test_fill_closes_the_buffers_it_drops():
    s = FieldState([Piece(R8, {0: 5})])
    _, s = s.access(Request(R8, "reduce", 1, 6, "+", "b6"), ids())
    s = s.fill(LO, 0.0)
    assert s.open_buffers() == {}
    plan, s = s.access(Request(LO, "reduce", 1, 7, "+", "b7"), ids())
    assert plan.buffer == "b7"


def test_fill_replaces_everything_lazily():
    s = FieldState([Piece(R8, {0: 5, 1: 6})])
    s2 = s.fill(HI, 2.0)
    assert s2 == FieldState([Piece(LO, {0: 5, 1: 6}), Piece(HI, {}, 2.0)])
    plan, _ = s2.access(Request(R8, "read", 1, 9), ids())
    assert plan.copies == [] and plan.prologue == [FillAction(1, HI, 2.0)]
    assert plan.deps == {6}


def test_valid_memories_counts_points():
    s = FieldState([Piece(LO, {0: 5}), Piece(HI, {0: 5, 1: 6})])
    assert s.valid_memories(Rect((2,), (6,))) == {0: 4, 1: 2}


# -- the indexed, persistent state against a list model ----------------------------------------
def _key(p):
    return (p.rect.lo, p.rect.hi)


def _model_access(pieces, req, new_id, opened):
    """The transition on a plain list of pieces kept in rect order (the
    reference); ``opened``: ``{memory: (buffer, redop)}``, updated in place."""
    from dataclasses import replace

    from legionpy.regions.coherence import Plan, _materialise

    plan, kept, touched = Plan(), [], []
    for p in sorted(pieces, key=_key):
        if not p.rect.overlaps(req.rect):
            kept.append(p)
            continue
        inter = p.rect & req.rect
        if inter != p.rect:
            kept.extend(replace(p, rect=r) for r in p.rect.subtract(req.rect))
            p = replace(p, rect=inter)
        touched.append(p)
    mode, mem, op = req.mode, req.memory, req.op
    # a buffer folded or dropped (even in part) closes: its memory's next reducer opens one
    consumed = {r.buffer for p in touched for r in p.reds
                if mode != "reduce" or p.redop != req.redop}
    for m in [m for m, (b, _) in opened.items() if b in consumed]:
        del opened[m]
    if mode == "write_discard" or (mode == "read_write" and not touched):
        return plan, kept + [Piece(req.rect, {mem: op}, owner=mem)]
    if mode == "reduce":
        if opened.get(mem, (None, None))[1] != req.redop:
            opened[mem] = (req.buffer, req.redop)
        buf = opened[mem][0]
        plan.buffer = buf
    out = []
    for p in touched:
        if mode == "reduce":
            if p.reds and p.redop != req.redop:
                p = _materialise(p, mem, op, plan, new_id)
            mine = [r for r in p.reds if r.buffer == buf]
            reds = tuple(Red(mem, buf, r.producers + (op,)) if r.buffer == buf else r
                         for r in p.reds) if mine else p.reds + (Red(mem, buf, (op,)),)
            out.append(replace(p, redop=req.redop, reds=reds))
        else:
            out.append(_materialise(p, mem, op, plan, new_id))
    if mode == "read_write":
        return plan, kept + [Piece(req.rect, {mem: op}, owner=mem)]
    return plan, kept + out


_REQS = st.tuples(
    st.integers(0, 6), st.integers(1, 4), st.integers(0, 3), st.integers(1, 4),
    st.sampled_from(["read", "read_write", "write_discard", "reduce", "reduce_max", "fill"]),
    st.sampled_from([HOST, 0, 1]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_REQS, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_indexed_state_matches_the_list_model_and_old_versions_stay_intact(reqs, rnd):
    root = Rect((0, 0), (8, 6))
    s, model, opened = FieldState.filled(root, 0), [Piece(root, {}, 0)], {}
    history = [(s, sorted(model, key=_key))]
    for op, (x, w, y, h, mode, mem) in enumerate(reqs, start=1):
        rect = Rect((x, y), (min(x + w, 8), min(y + h, 6)))
        if mode == "fill":
            s = s.fill(rect, 1.0)
            consumed = {r.buffer for p in model if p.rect.overlaps(rect) for r in p.reds}
            opened = {m: b for m, b in opened.items() if b[0] not in consumed}
            model = [q for p in model for q in (
                [p] if not p.rect.overlaps(rect) else
                [Piece(r, p.valid, p.fill, p.redop, p.reds, p.owner)
                 for r in p.rect.subtract(rect)])]
            model.append(Piece(rect, {}, 1.0))
        else:
            redop = "max" if mode == "reduce_max" else "+" if mode == "reduce" else None
            req = Request(rect, "reduce" if redop else mode, mem, op, redop, f"b{op}")
            plan, s = s.access(req, ids())
            want, model = _model_access(model, req, ids(), opened)
            assert plan == want
        assert s.pieces == sorted(model, key=_key)
        assert s.open_buffers() == opened
        history.append((s, sorted(model, key=_key)))
        cover = sum(p.rect.volume for p in s)
        assert cover == root.volume  # still a tiling
    rnd.shuffle(history)  # visit old versions in any order: each still has its pieces
    for version, pieces in history:
        assert version.pieces == pieces


def test_access_work_does_not_grow_with_the_number_of_pieces():
    def tests_per_access(n):
        s = FieldState([Piece(Rect((4 * i, 0), (4 * i + 4, 8)), {0: 1}) for i in range(n)])
        for k in range(2 * n):  # two sweeps of tile accesses
            rect = Rect((4 * (k % n), 0), (4 * (k % n) + 4, 8))
            _, s = s.access(Request(rect, ["read", "read_write", "reduce"][k % 3], 1, k, "+", k),
                            ids())
        ix = s._own().index
        before = ix.tests
        _, s = s.access(Request(Rect((4 * (n // 2), 0), (4 * (n // 2) + 4, 8)), "read", 0, 99),
                        ids())
        return ix.tests - before

    costs = [tests_per_access(n) for n in (10, 100, 1000)]
    assert costs == [costs[0]] * 3 and costs[0] <= 4, costs


def test_pieces_from_one_source_merge_into_one_copy():
    s = FieldState([Piece(LO, {0: 5}, owner=0), Piece(HI, {0: 6}, owner=0)])
    plan, _ = s.access(Request(R8, "read", 1, 9), ids())
    assert len(plan.copies) == 1
    c = plan.copies[0]
    assert c.rects == (LO, HI) and c.volume == 8 and c.deps == (5, 6) and c.src == 0


def test_copies_come_from_the_last_writer_while_valid():
    s = FieldState([Piece(R8, {0: 5, 1: 6}, owner=1)])
    plan, _ = s.access(Request(R8, "read", 2, 9), ids())
    assert [c.src for c in plan.copies] == [1]
