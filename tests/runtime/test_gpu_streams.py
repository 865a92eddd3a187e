"""Streams, events and the emulated race detector (runtime/streams.py,
runtime/emurace.py): GPU work runs on one non-blocking stream per device
and per link, ordered by events, and a missing ordering is an error even
though the emulation runs every kernel at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import legionpy as lp
import legionpy.runtime as lr
from legionpy.errors import DeviceError, TaskError
from legionpy.runtime import emugpu, streams
from legionpy.runtime.emugpu import Device, Event, Stream, xp


def _streams(k: int) -> tuple[Stream, Stream]:
    with Device(k):
        return Stream(k, f"a of GPU {k}"), Stream(k, f"b of GPU {k}")


# -- the detector on the backend alone ----------------------------------------------------
def test_unordered_streams_race_and_an_event_orders_them():
    a0, b0 = _streams(0)
    x = emugpu.alloc(0, (16,), np.float32)
    with Device(0):
        with a0:
            x[...] = 1  # written on stream a
        with b0, pytest.raises(DeviceError, match=r"read-after-write.*b of GPU 0.*a of GPU 0"):
            xp.sum(x)  # read on stream b, no event between them
        ev = Event()
        ev.record(a0)
        b0.wait_event(ev)
        with b0:
            assert float(xp.sum(x)) == 16.0  # ordered: fine (and the host read syncs b)
            y = x * 2  # b reads x
        with a0, pytest.raises(DeviceError, match="write-after-read"):
            x[...] = 0  # a overwrites what b read after a's event: b must come first
        with a0, pytest.raises(DeviceError, match="write-after-write"):
            y[...] = 0  # y was written by b


def test_disjoint_tiles_of_one_allocation_do_not_conflict():
    a0, b0 = _streams(0)
    x = emugpu.alloc(0, (8, 8), np.float32)
    with Device(0):
        with a0:
            x[:, :4] = 1  # a column tile: same strides as the allocation, a box
        with b0:
            x[:, 4:] = 2  # the other columns: no overlap, no ordering needed
        with b0, pytest.raises(DeviceError, match="read-after-write"):
            xp.sum(x[2:3, 3:5])  # reaches into a's tile


def test_a_column_with_its_axis_dropped_is_a_box_of_its_allocation():
    """Column t of a (batch, time) array, indexed ``x[:, t]`` (the axis
    dropped, as a time step of an RNN reads its ids), interleaves in memory
    with column t + 1 but does not overlap it."""
    a0, b0 = _streams(0)
    x = emugpu.alloc(0, (16, 8), np.int32)
    with Device(0):
        with a0:
            x[:, 1] = 3  # a copy into column 1 on stream a
        with b0:
            assert int(xp.sum(x[:, 0].astype(np.float32))) == 0  # column 0: no conflict
            x[:, 2] = 5  # another column written on b: no conflict either
        with b0, pytest.raises(DeviceError, match="read-after-write"):
            xp.sum(x[:, 1])  # column 1 itself: a's write is not ordered before it
        with b0, pytest.raises(DeviceError, match="read-after-write"):
            xp.sum(x[3])  # a row crosses column 1


def test_host_reads_need_a_synchronisation_with_the_writer():
    a0, _ = _streams(1)
    x = emugpu.alloc(1, (4,), np.float64)
    with Device(1):
        with a0:
            x += 1
        with pytest.raises(DeviceError, match="host read-after-write|read-after-write"):
            x.get()  # on the legacy stream, which nothing orders after a
        ev = Event()
        ev.record(a0)
        ev.synchronize()  # the host waited for a's kernel
        np.testing.assert_array_equal(x.get(), [1, 1, 1, 1])
        with a0:
            x += 1
            assert float(x[0]) == 2.0  # on a: a copy to the host, then a sync


def test_a_stream_belongs_to_its_device():
    a1, _ = _streams(1)
    with Device(0), pytest.raises(DeviceError, match="enter Device\\(1\\)"), a1:
        pass


# -- the runtime --------------------------------------------------------------------------
def _halo_program(steps: int = 2) -> lp.Region:
    @lp.task(privileges=[lp.WD("u")])
    def init(t, k):
        t.u[...] = k

    @lp.task(privileges=[lp.R("u"), lp.WD("v")])
    def shift(halo, tile):
        lo = tile.rect.lo[0] - halo.rect.lo[0]
        tile.v[...] = halo.u[lo:lo + tile.v.shape[0]] + 1

    R = lp.Region((40,), {"u": np.float32, "v": np.float32})
    P = lp.Partition.equal(R, (2,))
    H = lp.Partition.restriction(R, (20,), halo=(1,))
    lp.index_launch(init, P.colors, P, 0)
    lp.index_launch(shift, P.colors, H, P)
    lp.fence()  # instances made and grown: steady state from here
    for k in range(1, steps + 1):
        lp.index_launch(init, P.colors, P, k)
        lp.index_launch(shift, P.colors, H, P)
    return R


@pytest.mark.parametrize("executor", ["threads", "serial"])
def test_the_runtime_orders_streams_with_events_and_never_uses_the_legacy_stream(emu, executor):
    emu(2, executor)
    emugpu.reset_stats()
    R = _halo_program()
    np.testing.assert_array_equal(R.read("v"), np.full(40, 3, np.float32))
    st = emugpu.stats()
    assert st["legacy_kernels"] == {}
    assert set(st["stream_kernels"]) == {
        "compute stream of device 0 (GPU 0)", "compute stream of device 1 (GPU 1)",
        "link stream mem0->mem1 (on GPU 1)", "link stream mem1->mem0 (on GPU 0)"}
    assert st["waits"] > 0 and st["syncs"] == {}  # events, never whole-device syncs


def test_a_missing_event_wait_is_caught(emu, monkeypatch):
    """The detector can fail: a runtime that forgets the waits races."""
    monkeypatch.setattr(streams.Streams, "_wait", lambda self, i, s, d: None)
    emu(2, "serial")
    with pytest.raises(TaskError, match=r"race \(read-after-write\).*link stream"):
        _halo_program()
        lp.fence()


# -- training steps ----------------------------------------------------------------------
def _train(monkeypatch, n: int, gpus: bool, executor: str = "threads", model: str = "mlp",
           strategy: str = "data", fits: int = 1, between: Any = None,
           sync: str | None = None) -> tuple[dict, set]:
    """Adam steps through the layer API (recorded, then replayed traces) on
    ``n`` emulated GPUs or CPU devices: (parameters, queues that ran ops)."""
    import tiny_models
    from test_nn_invariance import hybrid

    ran: set = set()
    if gpus:
        monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
        monkeypatch.setenv("LEGIONPY_GPUS", str(n))
        execute = streams.Streams.execute

        def spy(self, op):
            ran.add(op.queue)
            return execute(self, op)
        monkeypatch.setattr(streams.Streams, "execute", spy)
        lr.init(executor=executor)
    else:
        monkeypatch.delenv("LEGIONPY_GPU_BACKEND", raising=False)
        lr.init(cpus=n, executor=executor)
    try:
        m = tiny_models.cnn(extra=True) if model == "cnn" else getattr(tiny_models, model)()
        shape = m.graph.ops[0].output_shape[1:]
        rng = np.random.default_rng(0)
        x = rng.standard_normal((4 * tiny_models.BATCH, *shape)).astype(np.float32)
        y = rng.integers(0, 3, 4 * tiny_models.BATCH)
        strat = hybrid(m.graph, n) if strategy == "hybrid" else strategy
        m.compile(optimizer=lp.nn.Adam(lr=0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], strategy=strat, sync=sync)
        for i in range(fits):
            if between is not None and i == fits - 1:
                between()
            m.fit(x, y, epochs=1, verbose=0, shuffle=False, batch_size=tiny_models.BATCH)
        if gpus:
            rt = lr.get_runtime()
            assert sum(r.replays for r in rt.tracer.recordings.values()) >= 2
        return m.parameters(), ran
    finally:
        lr.shutdown()


@pytest.mark.parametrize("n,model,strategy,nccl", [(2, "mlp", "data", "1"),
                                                   (2, "mlp", "data", "0"),
                                                   (4, "cnn", "hybrid", "1")])
def test_training_steps_run_clean_on_one_stream_per_device_and_link(monkeypatch, n, model,
                                                                    strategy, nccl):
    """Recorded then replayed steps under the race detector (a race would fail
    a task) equal the CPU run, on non-default streams only: one per device,
    one per link that carried a copy, one per communicator and member device
    (the collective sync's reduce-scatters and all-gathers), and no device
    synchronisation. Collectives on NCCL, or (LEGIONPY_NCCL=0) by the rule's
    peer-copy steps with the rounds ordered by events."""
    monkeypatch.setenv("LEGIONPY_NCCL", nccl)
    emugpu.reset_stats()
    on_gpu, ran = _train(monkeypatch, n, True, model=model, strategy=strategy)
    st = emugpu.stats()
    on_cpu, _ = _train(monkeypatch, n, False, model=model, strategy=strategy)
    for k in on_cpu:
        np.testing.assert_allclose(on_gpu[k], on_cpu[k], rtol=1e-5, atol=1e-6)
    assert st["legacy_kernels"] == {} and st["syncs"] == {}
    links = {q for q in ran if isinstance(q, tuple)}
    compute = {f"compute stream of device {d} (GPU {d})" for d in range(n)}
    expect = compute | {f"link stream {streams._mem(s)}->{streams._mem(d)} "
                        f"(on GPU {d if d >= 0 else s})" for s, d in links}
    comms = {q for q in ran if isinstance(q, str) and q.startswith("comm:")}
    assert comms  # the default sync: collectives
    expect |= {f"{q} stream of device {d} (GPU {d})" for q in comms
               for d in map(int, q[5:].split(","))}
    assert set(st["stream_kernels"]) <= expect  # a link moving data to the host: no kernel
    assert compute <= set(st["stream_kernels"])
    if strategy != "data":  # (data parallelism moves gradients by collectives only)
        assert any(s != -1 and d != -1 for s, d in links)  # device-to-device copies ran


@pytest.mark.parametrize("sync", ["shards", "collective"])
def test_a_replayed_step_allocates_nothing(monkeypatch, sync):
    """Staging buffers of reduction copies come from the pool: once the trace
    replays, a step makes no allocation on any GPU (serial executor: the
    same interleaving every run); without the pool every step allocates
    (shards: the staged gradient copies; collectives stage nothing)."""
    pools = []

    def reset():
        emugpu.reset_stats()
        pool = lr.get_runtime().instances.staging_pool
        pools.append((pool, pool.hits))

    _train(monkeypatch, 2, True, executor="serial", fits=3, between=reset, sync=sync)
    st = emugpu.stats()
    assert st["allocs"] == {}
    assert st["stream_kernels"] and st["legacy_kernels"] == {}
    if sync == "collective":
        return
    pool, hits = pools[0]
    assert pool.hits > hits  # the staged reductions took pooled buffers
    monkeypatch.setattr(streams.BufferPool, "take", lambda self, m, shape, dtype, make: make())
    _train(monkeypatch, 2, True, executor="serial", fits=3, between=reset, sync=sync)
    assert sum(emugpu.stats()["allocs"].values()) > 0


# -- host consumers ------------------------------------------------------------------------
def test_host_reads_synchronise_only_what_they_need(emu, monkeypatch):
    emu(2, "serial")

    @lp.task(privileges=[lp.WD("u")])
    def fill(t, k):
        t.u[...] = k

    @lp.task(privileges=[lp.R("u")])
    def total(t):
        return emugpu.xp.sum(t.u)  # a GPU scalar: Future.get waits for its kernel

    R = lp.Region((20,), {"u": np.float64})
    P = lp.Partition.equal(R, (2,))
    lp.index_launch(fill, P.colors, P, 0)
    lp.fence()
    emugpu.reset_stats()
    lp.index_launch(fill, P.colors, P, 2)
    np.testing.assert_array_equal(P[(0,)].read("u"), np.full(10, 2.0))
    clock = emugpu.emurace.host_clock()
    s0, s1 = (lr.get_runtime().sched.streams.compute_stream(d) for d in (0, 1))
    assert clock[s0.name] == s0.seq  # the host waited for the kernel writing tile 0
    assert clock[s1.name] < s1.seq  # not for device 1's (tile 1 was not read)
    assert emugpu.stats()["syncs"] == {}
    assert float(total(P[(1,)]).get()) == 20.0
    monkeypatch.setattr(streams.Streams, "host_wait", lambda self, d: None)
    fut = total(P[(1,)])
    with pytest.raises(DeviceError, match="race"):
        float(fut.get())  # without the event synchronisation the host read races


def test_rnnlm_model_parallel_on_two_gpus_runs_race_free(emu):
    """Each time step's embedding reads one column of the token ids, copied
    to the other GPU column by column on a link stream: the detector sees
    the columns as disjoint, so the event per copy is all the order needed
    (it once flagged them, byte ranges interleaving)."""
    from legionpy import data as D
    from legionpy import models

    emu(2)
    m = models.build("rnnlm", scale="small", seed=0)
    xs, y = D.for_model(m, 3 * m.batch_size, seed=0)
    m.compile(optimizer=lp.nn.SGD(lr=0.01), loss="sparse_categorical_crossentropy",
              strategy="model")
    h = m.fit(xs, y, verbose=0, shuffle=False)
    lp.fence()
    assert len(h["step_loss"]) == 3 and np.isfinite(h["step_loss"]).all()
