"""The GPU code path on emulated GPUs (runtime/emugpu.py): every array a task,
fold, fill, copy or reduction buffer touches lives on that task's device, and
a training step through the layer API runs there as on CPU devices."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from test_nn_invariance import hybrid
from tiny_models import BATCH, cnn

import legionpy as lp
import legionpy.runtime as lr
from legionpy.errors import DeviceError
from legionpy.runtime import emugpu
from legionpy.runtime.emugpu import Device, EmuArray, xp


# -- the backend itself ---------------------------------------------------------------
def test_arrays_live_on_the_current_device_and_refuse_another():
    with Device(1):
        a = xp.ones((4,), np.float32)
        b = a * 2 + 1
        assert isinstance(b, EmuArray) and b.device.id == 1
        np.testing.assert_array_equal((~(a > 2)).get(), [True] * 4)  # unary ops are not in place
    with Device(2):
        c = xp.zeros((4,), np.float32)
        with pytest.raises(DeviceError, match="GPU 1 while GPU 2 is current"):
            c + a  # noqa: B018 - the operation is the test
        with pytest.raises(DeviceError, match="GPU 1"):
            a[...] = 0
        with pytest.raises(DeviceError):
            np.add(a, 1, out=a)  # a ufunc through numpy is checked too
        with pytest.raises(DeviceError, match="host numpy array"):
            c[...] = np.arange(4, dtype=np.float32)
    with pytest.raises(DeviceError, match="implicit"):
        np.asarray(a)
    with Device(1):
        np.add(a, b, out=a)
        np.testing.assert_array_equal(a.get(), [4, 4, 4, 4])
        assert float(xp.sum(a)) == 16.0
        v = a[1:3]  # a view needs no kernel: allowed anywhere, but writing it is checked
    with Device(0), pytest.raises(DeviceError):
        v[...] = 0


def test_allocations_are_counted_per_device():
    emugpu.reset_stats()
    before = emugpu.stats()["bytes"].get(3, 0)
    a = emugpu.alloc(3, (100,), np.float64)
    assert emugpu.stats()["bytes"][3] - before == 800
    del a
    assert emugpu.stats()["bytes"].get(3, 0) == before
    assert emugpu.stats()["peak"][3] >= before + 800


# -- the runtime on emulated GPUs -----------------------------------------------------
@pytest.mark.parametrize("executor", ["threads", "serial"])
def test_tasks_get_device_arrays_and_halos_cross_devices(emu, executor):
    rt = emu(3, executor)
    assert [d.kind for d in rt.devices] == ["gpu"] * 3
    seen = {}

    @lp.task(privileges=[lp.R("u"), lp.WD("v")])
    def shift(halo, tile):
        assert isinstance(tile.v, EmuArray) and tile.v.device.id == emugpu.current()
        seen[tile.rect.lo[0]] = emugpu.current()
        lo = tile.rect.lo[0] - halo.rect.lo[0]
        tile.v[...] = halo.u[lo:lo + tile.v.shape[0]] + 1

    R = lp.Region((60,), {"u": np.float32, "v": np.float32})
    P = lp.Partition.equal(R, (3,))
    H = lp.Partition.restriction(R, (20,), halo=(1,))
    R.write("u", np.arange(60, dtype=np.float32))
    lp.index_launch(shift, P.colors, H, P)
    np.testing.assert_array_equal(R.read("v"), np.arange(60, dtype=np.float32) + 1)
    assert sorted(seen.values()) == [0, 1, 2]  # each tile on its own device


def test_fills_folds_and_reduction_buffers_stay_on_the_task_device(emu):
    emu(4)

    @lp.task(privileges=[lp.Reduce("+", "s")])
    def one(r):
        r.s[...] += 1

    @lp.task(privileges=[lp.RW("s")])
    def double(r):
        r.s[...] *= 2

    R = lp.Region((32,), {"s": np.float64})
    lp.fill(R, "s", 3.0)
    H = lp.Partition.restriction(R, (8,), halo=(2,))
    P = lp.Partition.equal(R, (4,))
    for _ in range(2):  # reduction buffers made, folded into filled tiles, reused
        lp.index_launch(one, H.colors, H)
        lp.index_launch(double, P.colors, P)
    cover = np.zeros(32)
    for c in H.colors:
        cover[H[c].rect.to_slices()] += 1
    np.testing.assert_array_equal(R.read("s"), (3 + cover) * 4 + cover * 2)


@pytest.mark.parametrize("model,strategy", [
    ("mlp", "data"), ("mlp", "model"), ("cnn", "data"), ("cnn", "hybrid"),
    ("megatron_mlp", "megatron")])
def test_training_steps_on_emulated_gpus_equal_cpu(monkeypatch, model, strategy):
    """Four Adam steps (recorded, then replayed traces) through the layer API on 4
    emulated GPUs give the CPU's parameters."""
    def train(gpus: bool) -> dict:
        if gpus:
            monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
            monkeypatch.setenv("LEGIONPY_GPUS", "4")
            lr.init()
        else:
            monkeypatch.delenv("LEGIONPY_GPU_BACKEND", raising=False)
            lr.init(cpus=4)
        try:
            m = cnn(extra=True) if model == "cnn" else getattr(tiny_models, model)()
            shape = m.graph.ops[0].output_shape[1:]
            rng = np.random.default_rng(0)
            x = rng.standard_normal((4 * BATCH, *shape)).astype(np.float32)
            y = rng.integers(0, 3, 4 * BATCH)
            strat = hybrid(m.graph, 4) if strategy == "hybrid" else strategy
            m.compile(optimizer=lp.nn.Adam(lr=0.01), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], strategy=strat)
            m.fit(x, y, epochs=1, verbose=0, shuffle=False)
            if gpus:  # later steps replay the trace: views bound once, buffers reset in place
                assert sum(r.replays for r in lr.get_runtime().tracer.recordings.values()) >= 2
            return m.parameters()
        finally:
            lr.shutdown()

    on_gpu, on_cpu = train(True), train(False)
    assert on_gpu.keys() == on_cpu.keys()
    for k in on_cpu:
        np.testing.assert_allclose(on_gpu[k], on_cpu[k], rtol=1e-5, atol=1e-6)


def test_the_local_gpu_s_memory_bandwidth_is_probed_read_and_write(emu, tmp_path,
                                                                   monkeypatch):
    """``Machine.local()``'s GPUs carry the probe's memory traffic per second
    (a copy reads and writes each byte: twice the copy rate), not the copy
    link's bytes: a gradient reduction's passes are charged at it
    (``device_reduce_byte_s``). On an H200 the 4 MiB copy probe read 312
    GB/s, and every reduction was charged at it."""
    from legionpy.optimizer import Machine
    from legionpy.probe.job import describe_job

    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path))
    emu(2)
    devs = Machine.local(refresh=True).devices
    gpu = describe_job()["links"]["gpu_memcpy"]  # the figures it was built from
    assert gpu["mem_bw"] == pytest.approx(2 * gpu["bandwidth"])
    assert [d.kind for d in devs] == ["gpu", "gpu"]
    assert all(d.mem_bw == pytest.approx(gpu["mem_bw"]) for d in devs)
