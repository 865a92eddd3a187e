"""Collective ops in the runtime (runtime/collectives.py, issue 24): one op
per collective on the group's communicator queue, the shared rule's steps,
one trace record with per-step link events; traced and replayed; a group
of one device is a no-op; the emulated GPU backend runs the same path."""

from __future__ import annotations

import numpy as np
import pytest

import legionpy.runtime as lr
from legionpy.geometry import Rect
from legionpy.regions import RW, WD, Partition, R, Region
from legionpy.runtime import gpu
from legionpy.runtime.collectives import Collective

L = 10  # elements per flat buffer (padded chunks: 4 positions -> 3, 3, 3, 1 used)


def _rows(n: int):
    reg = Region((n * L,), {"x": np.float32}, name="flat")
    part = Partition.by_rects(reg, {(p,): Rect((p * L,), ((p + 1) * L,)) for p in range(n)})
    return reg, part


def _writer(values):
    def put(v):
        p = v.rect.lo[0] // L
        if gpu.is_gpu(v.x):
            gpu.from_host(v.x, values[p])
        else:
            v.x[...] = values[p]
    return lr.TaskFunction(put, [WD("x")], name="put")


def _get(part, n):
    out = {}

    def get(v):
        return np.array(gpu.to_host(v.x))
    t = lr.TaskFunction(get, [R("x")], name="get")
    fm = lr.index_launch(t, part.colors, part)
    for p in range(n):
        out[p] = np.asarray(fm[(p,)].get())
    return out


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(L).astype(np.float32) for _ in range(n)]


def _bounds(n):
    c = -(-L // n)
    return [(p * c, min(L, (p + 1) * c)) for p in range(n)]


@pytest.mark.parametrize("alg", ["ring", "tree", "hierarchical"])
def test_all_reduce_in_process(rt4, alg):
    n = 4
    _, part = _rows(n)
    vals = _data(n)
    lr.index_launch(_writer(vals), part.colors, part)
    rt4.trace.start()
    ar = Collective("all_reduce", range(n), [part[(p,)] for p in range(n)], "x", alg,
                    name="AR(t)", node_of=lambda d: d // 2)
    ar()
    got = _get(part, n)
    lr.fence()
    total = sum(vals)
    for p in range(n):
        np.testing.assert_allclose(got[p], total, rtol=1e-5, atol=1e-6)
    recs = [r for r in rt4.trace.stop() if r["kind"] == "collective"]
    assert len(recs) == 1
    r = recs[0]
    assert (r["collective"], r["group"], r["algorithm"], r["bytes"]) == (
        "all_reduce", [0, 1, 2, 3], alg, L * 4.0)
    assert r["device"] == "comm:0,1,2,3"
    assert r["steps"] and all({"src", "dst", "bytes", "start", "end"} <= set(e)
                              for e in r["steps"])


def test_reduce_scatter_then_all_gather(rt4):
    n = 4
    _, part = _rows(n)
    vals = _data(n, 1)
    lr.index_launch(_writer(vals), part.colors, part)
    parts = [part[(p,)] for p in range(n)]
    rs = Collective("reduce_scatter", range(n), parts, "x", name="RS(t)")
    ag = Collective("all_gather", range(n), parts, "x", name="AG(t)")
    rs()
    got = _get(part, n)
    total = sum(vals)
    for p, (lo, hi) in enumerate(_bounds(n)):
        np.testing.assert_allclose(got[p][lo:hi], total[lo:hi], rtol=1e-5, atol=1e-6)
        rest = np.ones(L, bool)
        rest[lo:hi] = False
        assert not got[p][rest].any()  # the rest of the gradient buffer is consumed
    ag()
    got = _get(part, n)
    for p in range(n):
        np.testing.assert_allclose(got[p], total, rtol=1e-5, atol=1e-6)
    lr.fence()


def test_group_of_one_is_a_noop(rt4):
    _, part = _rows(1)
    lr.index_launch(_writer([np.ones(L, np.float32)]), part.colors, part)
    assert Collective("all_reduce", (0,), [part[(0,)]], "x")() is None
    np.testing.assert_array_equal(_get(part, 1)[0], np.ones(L))


def test_traced_and_replayed(rt4):
    n = 2
    _, part = _rows(n)
    parts = [part[(p,)] for p in range(n)]
    ar = Collective("all_reduce", (0, 1), parts, "x", name="AR(t)")
    dbl = lr.TaskFunction(lambda v: v.x.__imul__(2), [RW("x")], name="dbl")
    vals = _data(n, 2)
    lr.index_launch(_writer(vals), part.colors, part)
    expect = [v.copy() for v in vals]
    for _ in range(4):
        with lr.trace("step"):
            lr.index_launch(dbl, part.colors, part)
            ar()
        s = 2 * expect[0] + 2 * expect[1]
        expect = [s, s]
    got = _get(part, n)
    lr.fence()
    for p in range(n):
        np.testing.assert_allclose(got[p], expect[p], rtol=1e-5)
    assert rt4.tracer.stats["replayed"] >= 2  # the collective replays with the step


def test_emulated_gpus_same_path(emu):
    emu(2)
    n = 2
    _, part = _rows(n)
    vals = _data(n, 3)
    lr.index_launch(_writer(vals), part.colors, part)
    Collective("all_reduce", (0, 1), [part[(p,)] for p in range(n)], "x", name="AR(g)")()
    got = _get(part, n)
    lr.fence()
    for p in range(n):
        np.testing.assert_allclose(np.asarray(got[p]), vals[0] + vals[1], rtol=1e-5, atol=1e-6)


def test_a_collective_ending_while_the_runtime_closes_starts_no_runtime():
    """At exit under mpirun the runtime fences after it is marked closed; a
    collective still in flight then asked for the runtime, got a new one
    made on its worker thread (a world allgather racing MPI_Finalize), and
    10-20% of a 2-rank job's runs ended in a segfault or "corrupted
    double-linked list". A collective's body reads the runtime as it is."""
    import time

    from legionpy.runtime import collectives

    rt = lr.init(cpus=2)
    rt.closed = True  # as while shutdown() fences
    try:
        collectives._stand_in("RS:b0.0", time.perf_counter())
        assert lr.current_runtime() is rt
    finally:
        rt.closed = False
        lr.shutdown()
    assert lr.current_runtime() is None
