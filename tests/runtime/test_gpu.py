"""GPU devices through CuPy (skipped without CuPy or a visible GPU)."""

import numpy as np
import pytest

import legionpy as lp
import legionpy.runtime as lr
from legionpy.runtime.gpu import visible_gpus

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")
if visible_gpus() == 0:
    pytest.skip("no CUDA device visible", allow_module_level=True)


@pytest.fixture
def gpurt(monkeypatch):
    monkeypatch.setenv("LEGIONPY_GPUS", str(max(visible_gpus(), 2)))  # 2 devices even on 1 GPU
    rt = lr.init()
    yield rt
    lr.shutdown()


def test_tasks_get_cupy_arrays_and_halos_cross_devices(gpurt):
    assert all(d.kind == "gpu" for d in gpurt.devices) and len(gpurt.devices) >= 2

    @lp.task(privileges=[lp.R("u"), lp.WD("v")])
    def shift(halo, tile):
        assert isinstance(tile.v, cupy.ndarray)
        lo = tile.rect.lo[0] - halo.rect.lo[0]
        tile.v[...] = halo.u[lo:lo + tile.v.shape[0]] + 1

    R = lp.Region((64,), {"u": np.float32, "v": np.float32})
    P = lp.Partition.equal(R, (len(gpurt.devices),))
    H = lp.Partition.restriction(R, (64 // len(gpurt.devices),), halo=(1,))
    R.write("u", np.arange(64, dtype=np.float32))
    lp.index_launch(shift, P.colors, H, P)
    np.testing.assert_array_equal(R.read("v"), np.arange(64, dtype=np.float32) + 1)


def test_reductions_on_gpus(gpurt):
    @lp.task(privileges=[lp.Reduce("+", "s")])
    def one(r):
        r.s[...] += 1

    R = lp.Region((32,), {"s": np.float64})
    H = lp.Partition.restriction(R, (8,), halo=(2,))
    lp.index_launch(one, H.colors, H)
    got = R.read("s")
    assert got.sum() == sum(H[c].rect.volume for c in H.colors)


def test_tasks_run_on_one_non_default_stream_per_device(gpurt):
    """Never the legacy stream (pointer 0): each device's compute stream."""
    seen = {}

    @lp.task(privileges=[lp.WD("u")])
    def where(t):
        seen[t.rect.lo[0]] = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr)
        t.u[...] = 1

    n = len(gpurt.devices)
    R = lp.Region((8 * n,), {"u": np.float32})
    P = lp.Partition.equal(R, (n,))
    lp.index_launch(where, P.colors, P)
    np.testing.assert_array_equal(R.read("u"), np.ones(8 * n, np.float32))
    ptrs = [p for _, p in seen.values()]
    assert 0 not in ptrs and len(set(ptrs)) == n


def test_nccl_collectives_train_as_shards(monkeypatch):
    """On two real GPUs the data-parallel gradient exchange runs on NCCL
    (cupy.cuda.nccl) and trains the same parameters as point-to-point
    shards (one GPU: two devices would share it; NCCL refuses that)."""
    if visible_gpus() < 2:
        pytest.skip("NCCL needs two GPUs (a communicator may not hold one GPU twice)")
    from test_collective_training import X_IMG, cnn, same, train

    monkeypatch.setenv("LEGIONPY_GPUS", "2")
    a = train(cnn, X_IMG, 2, "data", "shards", start=lr.init)[0]
    b, _, _, colls = train(cnn, X_IMG, 2, "data", "collective", start=lr.init)
    same(a, b, "cnn data on 2 GPUs, NCCL")
    assert colls and {r["transport"] for r in colls} == {"nccl"}
