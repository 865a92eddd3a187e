"""Dynamic tracing (runtime/tracing.py): replays keep sequential semantics
(invariant 1), skip the analysis and the mapper, detect a differing launch,
re-record after a strategy change, and are deterministic."""

from __future__ import annotations

import os

import numpy as np
import pytest
import test_sequential_semantics as seq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import mlp

import legionpy as lp
import legionpy.runtime as lr
from legionpy.errors import LaunchError, TraceMismatchError
from legionpy.mapper import DefaultMapper, RandomMapper

_EXAMPLES = int(os.environ.get("LEGIONPY_TEST_EXAMPLES", "30"))

block_op = st.one_of(
    st.tuples(st.just("fill"), seq.fields, seq.ks, st.sampled_from([None, "eq4", "halo"])),
    st.tuples(st.just("write"), seq.fields, seq.ks),
    st.tuples(st.just("read"), seq.fields, st.sampled_from([None, "eq4", "halo"])),
    st.tuples(st.just("single"), seq.modes, seq.fields, seq.ks,
              st.sampled_from([None, "eq4", "eq22"])),
    st.tuples(st.just("index"), seq.modes, seq.fields, seq.ks,
              st.sampled_from(["eq4", "eq22", "halo"])),
)
blocks = st.lists(block_op, min_size=1, max_size=6).map(
    lambda b: [o for o in b if seq._allowed(o)] or [("read", "a", None)])
# a program: untraced ops, then a traced block repeated, with untraced ops
# (maybe a fence) between the repetitions
programs = st.tuples(st.lists(seq.op, max_size=4).map(lambda p: [o for o in p if seq._allowed(o)]),
                     blocks, st.integers(1, 5),
                     st.lists(seq.op, max_size=2).map(lambda p: [o for o in p
                                                                  if seq._allowed(o)]))


def flatten(program):
    pre, block, reps, between = program
    out = list(pre)
    for _ in range(reps):
        out += block + between
    return out


def run_traced(program, cpus, mapper, executor="threads"):
    """``seq.run_runtime`` with the block inside ``lp.trace``; also the
    tracer's counters."""
    pre, block, reps, between = program
    rt = lr.init(cpus=cpus, executor=executor, mapper=mapper)
    A = lp.Region(seq.SHAPE, {f: np.float64 for f in seq.FIELDS}, name="A")
    P = seq._parts(A)
    out = []

    def run(ops):
        for o in ops:
            if o[0] == "fill":
                lp.fill(A if o[3] is None else P[o[3]][1, 0], o[1], o[2])
            elif o[0] == "write":
                A.write(o[1], np.arange(np.prod(seq.SHAPE)).reshape(seq.SHAPE) % (o[2] + 2))
            elif o[0] == "read":
                out.append((A if o[2] is None else P[o[2]][2, 0]).read(o[1]))
            elif o[0] == "fence":
                lp.fence()
            else:
                redop, mode = seq._split(o[1])
                if o[0] == "single":
                    t = seq._task(mode, redop, o[2])
                    out.append(t(o[3], A if o[4] is None else P[o[4]][1, 0]))
                else:
                    Q = P[o[4]]
                    fm = lp.index_launch(seq._point_task(mode, redop, o[2]), Q.colors, o[3], Q)
                    out.extend(fm[c] for c in Q.colors)

    run(pre)
    for _ in range(reps):
        with lp.trace("block"):
            run(block)
        run(between)
    data = {f: A.read(f) for f in seq.FIELDS}
    vals = [v.get() if isinstance(v, lp.Future) else v for v in out]
    lp.fence()
    stats = dict(rt.tracer.stats)
    lr.shutdown()
    return data, vals, stats


def check(program, cpus, mapper, executor="threads"):
    ref_data, ref_out = seq.run_reference(flatten(program))
    data, out, stats = run_traced(program, cpus, mapper, executor)
    for f in seq.FIELDS:
        np.testing.assert_array_equal(data[f], ref_data[f], err_msg=f"field {f}, {cpus} cpus")
    assert len(out) == len(ref_out)
    for got, want in zip(out, ref_out):
        np.testing.assert_array_equal(got, want)
    return stats


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs, st.integers(0, 2**16))
def test_traced_programs_keep_sequential_semantics(program, seed):
    for cpus in (1, 2, 4):
        check(program, cpus, DefaultMapper())
        check(program, cpus, RandomMapper(seed))


@pytest.mark.parametrize("executor", ["threads", "serial"])
@pytest.mark.parametrize("cpus", [1, 2, 4])
def test_a_repeated_block_replays(cpus, executor):
    """Reads, writes, fills, reductions and index launches in a block:
    the first two runs record, the rest replay, with the numbers of an
    untraced run. (A block that leaves a reduction pending for its next run
    to fold is recorded every time: correct, not faster; see tracing.py.)"""
    block = [("fill", "b", 1, None), ("index", "red+", "b", 2, "eq22"),
             ("index", "RW2", "a", 3, "eq4"), ("single", "R", "a", 0, "eq22"),
             ("read", "a", "halo"), ("index", "RW", "a", 1, "eq4"),
             ("write", "b", 4), ("index", "redmax", "a", 5, "halo"), ("read", "a", None)]
    stats = check(([("write", "a", 3)], block, 6, []), cpus, DefaultMapper(), executor)
    assert stats["replayed"] >= 4, stats
    assert stats["mismatched"] == 0


def test_replay_makes_no_mapper_calls():
    class Counting(DefaultMapper):
        calls = 0

        def slice_task(self, task, domain):
            Counting.calls += 1
            return super().slice_task(task, domain)

    lr.init(cpus=2, mapper=Counting())
    A = lp.Region((8, 4), {"x": np.float64})
    P = lp.Partition.equal(A, (4, 1))
    inc = lp.task(lambda r: r.x.__iadd__(1), name="inc", privileges=[lp.RW("x")])
    seen = []
    for _ in range(6):
        before = Counting.calls
        with lp.trace("t"):
            lp.index_launch(inc, P.colors, P)
            lp.index_launch(inc, P.colors, P)
        seen.append(Counting.calls - before)
    np.testing.assert_array_equal(A.read("x"), 12.0)
    lr.shutdown()
    assert seen[:2] == [2, 2] and seen[2:] == [0, 0, 0, 0], seen


def _prog(A, P, tasks, second):
    lp.index_launch(tasks[0], P.colors, P)
    lp.index_launch(tasks[1] if second else tasks[0], P.colors, P)


def test_a_differing_launch_rerecords_and_keeps_semantics(capfd):
    rt = lr.init(cpus=2, debug=1)
    A = lp.Region((8, 4), {"x": np.float64})
    P = lp.Partition.equal(A, (4, 1))
    inc = lp.task(lambda r: r.x.__iadd__(1), name="inc", privileges=[lp.RW("x")])
    dbl = lp.task(lambda r: r.x.__imul__(2), name="dbl", privileges=[lp.RW("x")])
    want = np.zeros((8, 4))
    for i in range(5):
        with lp.trace("t"):
            _prog(A, P, (inc, dbl), second=(i == 3))
        want = (want + 1) * 2 if i == 3 else want + 2
    np.testing.assert_array_equal(A.read("x"), want)
    assert rt.tracer.stats["mismatched"] == 1
    err = capfd.readouterr().err
    assert "index launch of 'dbl'" in err and "index launch of 'inc'" in err, err
    lr.shutdown()


def test_strict_trace_raises_naming_both_launches():
    lr.init(cpus=2)
    A = lp.Region((8, 4), {"x": np.float64})
    P = lp.Partition.equal(A, (4, 1))
    inc = lp.task(lambda r: r.x.__iadd__(1), name="inc", privileges=[lp.RW("x")])
    dbl = lp.task(lambda r: r.x.__imul__(2), name="dbl", privileges=[lp.RW("x")])
    for _ in range(3):
        with lp.trace("t", strict=True):
            _prog(A, P, (inc, dbl), second=False)
    with pytest.raises(TraceMismatchError, match="'dbl'.*'inc'"):
        with lp.trace("t", strict=True):
            _prog(A, P, (inc, dbl), second=True)
    lp.fence()
    np.testing.assert_array_equal(A.read("x"), 7.0)  # 3 x 2 + the replayed first launch
    lr.shutdown()


def test_begin_end_and_misuse():
    lr.init(cpus=1)
    A = lp.Region((4,), {"x": np.float64})
    inc = lp.task(lambda r: r.x.__iadd__(1), name="inc", privileges=[lp.RW("x")])
    for _ in range(4):
        lp.begin_trace("t")
        inc(A)
        lp.end_trace("t")
    np.testing.assert_array_equal(A.read("x"), 4.0)
    lp.begin_trace("t")
    with pytest.raises(LaunchError, match="do not nest"):
        lp.begin_trace("u")
    with pytest.raises(LaunchError, match="fence inside trace"):
        lp.fence()
    with pytest.raises(LaunchError, match="without begin_trace"):
        lp.end_trace("u")
    lp.end_trace("t")
    lr.shutdown()


def test_futures_of_a_replay_carry_each_steps_values():
    lr.init(cpus=2)
    A = lp.Region((8,), {"x": np.float64})
    P = lp.Partition.equal(A, (2,))

    @lp.task(privileges=[lp.RW("x")])
    def step(k, r):
        r.x[...] += k
        return float(r.x.sum())

    got = []
    for k in range(6):
        with lp.trace("t"):
            fm = lp.index_launch(step, P.colors, float(k), P)
        got.append(fm.get())
    want, x = [], 0.0
    for k in range(6):
        x += k
        want.append([4 * x, 4 * x])
    assert got == want
    lr.shutdown()


def _fit_losses(strategy_change: bool, trace_steps: bool, monkeypatch) -> tuple[list, dict]:
    monkeypatch.setenv("LEGIONPY_TRACE_STEPS", "1" if trace_steps else "0")
    rt = lr.init(cpus=2)
    m = mlp()
    m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9), strategy="data")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m.batch_size * 4, *m.graph.ops[0].output_shape[1:]))
    y = rng.integers(0, m.graph.ops[-1].output_shape[-1], m.batch_size * 4)
    h1 = m.fit(x.astype(np.float32), y, verbose=0, shuffle=False)
    if strategy_change:
        m.set_strategy("model")
    h2 = m.fit(x.astype(np.float32), y, verbose=0, shuffle=False)
    stats = dict(rt.tracer.stats)
    lr.shutdown()
    return h1["step_loss"] + h2["step_loss"], stats


def test_set_strategy_rerecords_and_training_matches_untraced(monkeypatch):
    traced, stats = _fit_losses(True, True, monkeypatch)
    plain, _ = _fit_losses(True, False, monkeypatch)
    np.testing.assert_allclose(traced, plain, rtol=1e-6)
    assert stats["recorded"] == 4 and stats["replayed"] == 4, stats


def test_replays_are_deterministic(monkeypatch):
    a, sa = _fit_losses(False, True, monkeypatch)
    b, sb = _fit_losses(False, True, monkeypatch)
    assert a == b and sa == sb


def test_a_replay_starts_after_everything_before_it():
    """The begin marker holds back every replayed op, not only those that
    waited for something before the trace when it was recorded. Here the
    writer of a fresh region waits for nothing in its recording; without
    the begin marker, the next replay's writer on cpu 0 started while this
    replay's slow point on cpu 1 still ran (under ``mpirun`` the same gap
    let two ranks take one link's transfers in different orders and hang:
    ``tests/mpi/test_replication.py::test_a_model_fitted_again_after_many_others``)."""
    import time

    lr.init(cpus=2)
    B = lp.Region((4,), {"x": np.float64}, name="B")
    C = lp.Region((4,), {"y": np.float64}, name="C")
    PB, PC = lp.Partition.equal(B, (2,)), lp.Partition.equal(C, (2,))
    C.write("y", np.zeros(4))
    log: list = []

    def write(r):
        log.append(("w", int(r.rect.lo[0]), time.perf_counter()))
        r.x[...] = 1.0

    def slow(r):
        if r.rect.lo[0] == 2:  # the point on the second cpu
            time.sleep(0.05)
            log.append(("s", 2, time.perf_counter()))

    w = lp.task(write, name="w", privileges=[lp.WD("x")])
    s = lp.task(slow, name="s", privileges=[lp.R("y")])
    for i in range(5):
        if i == 1:  # before the recording: its writer then waits for nothing
            lp.fence()
        with lp.trace("t"):
            lp.index_launch(w, PB.colors, PB)
            lp.index_launch(s, PC.colors, PC)
    lp.fence()
    rt = lr.get_runtime()
    assert rt.tracer.recordings["t"].replays >= 3
    lr.shutdown()
    ends = [t for k, _, t in log if k == "s"]
    starts = [t for k, _, t in log if k == "w"]
    # each replay's writers (steps 2-4; steps 0 and 1 record, and there
    # independent launches may overlap) start after the previous step's
    # slow point ended
    for i in range(2, 5):
        assert min(starts[2 * i:2 * i + 2]) >= ends[i - 1], (i, log)
