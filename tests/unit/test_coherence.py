"""Pure coherence transitions: (state, request) -> (plan, new state)."""

from __future__ import annotations

import itertools

from legionpy.geometry import Rect
from legionpy.runtime.coherence import (
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
        Piece(LO, {0: 5}, None, "+", (Red(0, "b6", R8, 6),)),
        Piece(HI, {0: 5}, None, "+", (Red(0, "b6", R8, 6), Red(1, "b7", HI, 7))),
    ])
    plan, s2 = s.access(Request(R8, "read", 0, 9), ids())
    # the remote buffer is copied to the reader, every buffer folded in program order
    assert plan.copies == [Copy(100, HI, 1, 0, (7,), "b7", HI)]
    assert plan.prologue == [
        FoldAction(0, LO, "+", "b6", R8),
        FoldAction(0, HI, "+", "b6", R8),
        FoldAction(0, HI, "+", staged=100),
    ]
    assert plan.deps == {5, 6, 100}
    assert s2 == FieldState([Piece(LO, {0: 9}), Piece(HI, {0: 9})])


def test_reduce_with_another_op_folds_pending_first():
    s = FieldState([Piece(R8, {0: 5}, None, "+", (Red(1, "b6", R8, 6),))])
    plan, s2 = s.access(Request(R8, "reduce", 0, 7, "max", "b7"), ids())
    assert plan.copies == [Copy(100, R8, 1, 0, (6,), "b6", R8)]
    assert plan.prologue == [FoldAction(0, R8, "+", staged=100)]
    assert s2 == FieldState([Piece(R8, {0: 7}, None, "max", (Red(0, "b7", R8, 7),))])


def test_write_discard_drops_pending_reductions_and_fills():
    s = FieldState([Piece(R8, {}, 3.0, "+", (Red(1, "b", R8, 6),))])
    plan, s2 = s.access(Request(LO, "write_discard", 0, 7), ids())
    assert plan.copies == [] and plan.prologue == []
    assert s2 == FieldState([Piece(LO, {0: 7}), Piece(HI, {}, 3.0, "+", (Red(1, "b", R8, 6),))])


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
