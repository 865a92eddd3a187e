"""CUDA graphs of replayed traces on emulated GPUs (runtime/graphs.py) and the
emulated stream capture underneath (runtime/emugraph.py): a replay launched
as graphs computes exactly what a live replay computes."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from tiny_models import BATCH, cnn

import legionpy as lp
import legionpy.runtime as lr
from legionpy.errors import GraphCaptureError
from legionpy.runtime import emugraph
from legionpy.runtime.emugpu import Device, Stream, xp


@pytest.fixture
def emu(monkeypatch):
    def start(n: int = 2, graphs: bool = True, executor: str = "threads"):
        monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
        monkeypatch.setenv("LEGIONPY_GPUS", str(n))
        monkeypatch.setenv("LEGIONPY_CUDA_GRAPHS", "1" if graphs else "0")
        return lr.init(executor=executor)
    yield start
    lr.shutdown()


# -- the emulated capture --------------------------------------------------------------
def test_capture_records_without_changing_memory_and_launch_reruns_on_new_inputs():
    with Device(1):
        s = Stream(1, "s")
        with s:
            x = xp.arange(4, dtype=np.float32)
            out = xp.zeros(4, np.float32)
            emugraph.begin_capture(s, 1)
            t = x * 2 + 1  # temporaries made during the capture
            out[...] = t
            out += xp.sum(x)  # a reduction's 0-d result feeds the next kernel
            g = emugraph.end_capture(s)
        s.synchronize()
        np.testing.assert_array_equal(out.get(), 0)  # a capture writes nothing
        g.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(out.get(), [7, 9, 11, 13])
        with s:
            x[...] = 1  # inputs are read when the graph is launched
        g.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(out.get(), [7, 7, 7, 7])
    assert len(g) >= 4 and g.launches == 2


def test_a_graph_launch_is_checked_by_the_race_detector():
    from legionpy.errors import DeviceError

    with Device(0):
        s, other = Stream(0, "s"), Stream(0, "other")
        with s:
            a = xp.zeros(4, np.float32)
            emugraph.begin_capture(s, 0)
            a += 1
            g = emugraph.end_capture(s)
        s.synchronize()
        with other:
            a[...] = 2  # another stream writes a, unordered with the graph's launch
        with pytest.raises(DeviceError, match="race"):
            g.launch(s)


@pytest.mark.parametrize("sync", [
    lambda a: float(xp.sum(a)), lambda a: a.get(), lambda a: a.item(),
    lambda a: xp.asarray(np.ones(4, np.float32)), lambda a: Device(1).synchronize(),
    lambda a: a[a > 0],
    # results whose size depends on the data: CuPy reads a count back to the host
    lambda a: np.flatnonzero(a), lambda a: xp.flatnonzero(a), lambda a: a.nonzero(),
    lambda a: xp.unique(a), lambda a: np.argwhere(a)])
def test_host_synchronisation_during_capture_raises_and_invalidates(sync):
    with Device(1), Stream(1, "s") as s:
        a = xp.ones(4, np.float32)
        emugraph.begin_capture(s, 1)
        a += 1
        with pytest.raises(GraphCaptureError, match="cudaErrorStreamCaptureUnsupported"):
            sync(a[:1] if sync.__code__.co_names == ("item",) else a)
        with pytest.raises(GraphCaptureError, match="invalidated"):
            emugraph.end_capture(s)
        s.synchronize()
        np.testing.assert_array_equal(a.get(), 1)  # the capture's work never ran


def test_a_capturing_stream_may_wait_only_on_events_of_its_capture():
    """CUDA: cudaErrorStreamCaptureIsolation (seen on an H100 when a capture
    waited on a pooled buffer's last user)."""
    from legionpy.runtime.emugpu import Event
    with Device(0), Stream(0, "s") as s, Stream(0, "t") as t:
        before = Event()
        before.record(t)
        emugraph.begin_capture(s, 0)
        assert s.is_capturing() and not t.is_capturing()
        inside = Event()
        inside.record(s)
        s.wait_event(inside)  # its own capture's event: fine
        with pytest.raises(GraphCaptureError, match="cudaErrorStreamCaptureIsolation"):
            s.wait_event(before)
        with pytest.raises(GraphCaptureError, match="invalidated"):
            emugraph.end_capture(s)
        assert not s.is_capturing()


def test_cupys_capture_refusals_are_told_from_task_errors():
    from legionpy.runtime.graphcap import cuda_refusal

    class CUDARuntimeError(RuntimeError):  # cupy_backends.cuda.api.runtime's, by name
        pass
    assert cuda_refusal(CUDARuntimeError("cudaErrorStreamCaptureIsolation: dependency "
                                         "created on uncaptured work in another stream"))
    assert cuda_refusal(RuntimeError("the current stream is capturing, so D2H transfers "
                                     "are disallowed"))
    assert cuda_refusal(CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")) is None
    assert cuda_refusal(ValueError("shapes (3,4) and (5,6) not aligned")) is None


def test_abort_restores_and_captures_do_not_nest():
    with Device(0), Stream(0, "s") as s:
        a = xp.zeros(3, np.float32)
        emugraph.begin_capture(s, 0)
        with pytest.raises(GraphCaptureError, match="do not nest"):
            emugraph.begin_capture(s, 0)
        a[...] = 5
        emugraph.abort()
        s.synchronize()
        np.testing.assert_array_equal(a.get(), 0)
        assert emugraph.capturing() is None


# -- replays launched as graphs ---------------------------------------------------------
@lp.task(privileges=[lp.RW("x"), lp.R("y")])
def axpy(a, r):
    t = r.x * 2
    r.x[...] = t - r.x + a * r.y


@lp.task(privileges=[lp.RW("y")])
def bump(r):
    r.y[...] = r.y + 1


@lp.task(privileges=[lp.RW("x")])
def halve_if_big(r):
    """Data-dependent Python control flow: a host sync, never capturable."""
    if float(xp.max(r.x) if not isinstance(r.x, np.ndarray) else r.x.max()) > 50:
        r.x[...] = r.x * 0.5


def _steps(n: int, extra: bool = False) -> np.ndarray:
    R = lp.Region((40,), {"x": np.float32, "y": np.float32})
    P = lp.Partition.equal(R, (2,))
    for _ in range(n):
        with lp.trace("step"):
            lp.index_launch(axpy, P.colors, 2.0, P)
            lp.index_launch(bump, P.colors, P)
            if extra:
                lp.index_launch(halve_if_big, P.colors, P)
            lp.index_launch(axpy, P.colors, 2.0, P)
        if extra:  # what a replay finds live is used from the next replay on
            lp.fence()
    return R.read("x")


@pytest.mark.parametrize("executor", ["threads", "serial"])
def test_replays_are_captured_once_then_launched(emu, executor):
    rt = emu(2, executor=executor)
    emugraph.reset_stats()
    x = _steps(7)
    st = rt.tracer.graphs.stats
    # steps 1-2 record, step 3 probes the bodies for host syncs (live), step 4
    # captures one segment per GPU, steps 5-7 launch them
    assert st["captured"] == 2 and st["launched"] == 6 and st["replaced"] == 6 * 3
    assert emugraph.stats()["captures"] == 2
    lr.shutdown()
    emu(2, graphs=False, executor=executor)
    np.testing.assert_array_equal(x, _steps(7))


def test_ops_the_host_issues_per_replayed_step_drop(emu):
    def issued(graphs: bool) -> int:
        emu(2, graphs=graphs)
        R = lp.Region((40,), {"x": np.float32, "y": np.float32})
        P = lp.Partition.equal(R, (2,))
        for i in range(5):
            if i == 4:
                lp.fence()
                lr.get_runtime().trace.start()
            with lp.trace("step"):
                for _ in range(3):
                    lp.index_launch(axpy, P.colors, 2.0, P)
                    lp.index_launch(bump, P.colors, P)
        lp.fence()
        recs = lr.get_runtime().trace.stop()
        lr.shutdown()
        return sum(r["device"] is not None or r["link"] is not None for r in recs)
    assert issued(False) == 12  # 6 launches x 2 points, each run by its GPU
    assert issued(True) == 2  # one graph launch per GPU


def test_an_op_that_syncs_the_host_stays_live_and_correct(emu):
    rt = emu(2)
    x = _steps(7, extra=True)
    st = rt.tracer.graphs.stats
    assert st["capture_failed"] >= 1 and st["launched"] > 0
    live = rt.tracer.recordings["step"].gplan.live
    names = {rt.tracer.recordings["step"].ops[o].name for o in live}
    assert "halve_if_big" in names and "axpy" not in names
    lr.shutdown()
    emu(2, graphs=False)
    np.testing.assert_array_equal(x, _steps(7, extra=True))


def test_without_a_probe_a_refused_capture_runs_the_op_live(emu, monkeypatch):
    """CuPy's path: no probe can tell a host synchronisation, so the capture
    meets it, and CuPy raises its own error (not GraphCaptureError) inside
    the body. The runtime must tell that refusal from a failing task and run
    the op live (on an H100 every such op failed its step instead)."""
    from legionpy.runtime import graphcap

    def refuse(what: str) -> None:
        if emugraph.capturing() is not None:
            emugraph.capturing().invalid = what
            raise RuntimeError("the current stream is capturing, so D2H transfers are "
                               "disallowed")
    monkeypatch.setattr(graphcap.EmuCapture, "can_probe", False)
    monkeypatch.setattr(graphcap.EmuCapture, "refusal", staticmethod(graphcap.cuda_refusal))
    monkeypatch.setattr("legionpy.runtime.emugpu._sync", refuse)
    rt = emu(2)
    x = _steps(7, extra=True)
    st = rt.tracer.graphs.stats
    assert st["capture_failed"] >= 1 and st["launched"] > 0
    live = rt.tracer.recordings["step"].gplan.live
    assert "halve_if_big" in {rt.tracer.recordings["step"].ops[o].name for o in live}
    lr.shutdown()
    monkeypatch.undo()
    emu(2, graphs=False)
    np.testing.assert_array_equal(x, _steps(7, extra=True))


def test_a_grown_instance_makes_graphs_stale(emu):
    rt = emu(2)
    R = lp.Region((40,), {"x": np.float32, "y": np.float32})
    P = lp.Partition.equal(R, (2,))
    for i in range(8):
        if i == 5:
            rt.instances.generation += 1  # what Instances.reserve does when it grows one
        with lp.trace("step"):
            fm = lp.index_launch(axpy, P.colors, 2.0, P)
        fm.wait()
    st = rt.tracer.graphs.stats
    assert st["stale"] == 2 and st["captured"] == 4
    x = R.read("x")
    lr.shutdown()
    emu(2, graphs=False)
    R = lp.Region((40,), {"x": np.float32, "y": np.float32})
    P = lp.Partition.equal(R, (2,))
    for _ in range(8):
        with lp.trace("step"):
            lp.index_launch(axpy, P.colors, 2.0, P)
    np.testing.assert_array_equal(x, R.read("x"))


def _captured_after_steps(**init: object) -> tuple[bool, int]:
    """(graphs on?, graphs captured) after 4 traced steps."""
    rt = lr.init(**init)
    try:
        _steps(4)
        return rt.tracer.graphs.on, rt.tracer.graphs.stats["captured"]
    finally:
        lr.shutdown()


def test_no_graphs_on_cpu_devices_or_when_turned_off(monkeypatch, capfd):
    monkeypatch.delenv("LEGIONPY_GPU_BACKEND", raising=False)
    assert _captured_after_steps(cpus=2) == (False, 0)
    monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
    monkeypatch.setenv("LEGIONPY_CUDA_GRAPHS", "0")
    assert _captured_after_steps()[1] == 0
    monkeypatch.setenv("LEGIONPY_CUDA_GRAPHS", "1")
    monkeypatch.setenv("LEGIONPY_REPLAY_ORDER", "ready")
    monkeypatch.setenv("LEGIONPY_DEBUG", "1")
    assert _captured_after_steps()[1] == 0
    assert "replays without CUDA graphs: LEGIONPY_REPLAY_ORDER=ready" in capfd.readouterr().err


# -- training through the layer API -------------------------------------------------------
def _fit(model: str, strategy: str, opt: lp.nn.Optimizer, steps: int = 6) -> tuple:
    m = cnn(extra=True) if model == "cnn" else getattr(tiny_models, model)()
    shape = m.graph.ops[0].output_shape[1:]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, *shape)).astype(np.float32)
    y = rng.integers(0, 3, steps * BATCH)
    m.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
              strategy=strategy)
    hist = m.fit(x, y, epochs=1, verbose=0, shuffle=False)
    return m, hist["step_loss"], m.parameters()


@pytest.mark.parametrize("model,strategy,opt,n", [
    ("mlp", "data", lp.nn.SGD(lr=0.05, momentum=0.9), 2),
    ("mlp", "model", lp.nn.Adam(lr=0.01), 4),
    ("cnn", "data", lp.nn.Adam(lr=0.01), 4)])
def test_fit_with_graphs_equals_fit_without(emu, model, strategy, opt, n):
    rt = emu(n)
    _, loss, params = _fit(model, strategy, opt)
    st = dict(rt.tracer.graphs.stats)
    assert st["captured"] > 0 and st["launched"] > 0
    lr.shutdown()
    emu(n, graphs=False)
    _, loss0, params0 = _fit(model, strategy, opt)
    assert loss == loss0
    for k in params0:
        np.testing.assert_array_equal(params[k], params0[k])


def test_a_fit_captures_every_op_that_neither_syncs_nor_returns(emu):
    """A body that waits on an event recorded before the capture (a pooled
    buffer's last user, a reduction buffer's grower) has the wait deferred to
    the graph's launch: CUDA refuses it inside a capture
    (cudaErrorStreamCaptureIsolation, found on an H100; the emulation refuses
    it too). No op of a one-GPU fit syncs the host, so every capture works."""
    rt = emu(1)
    _fit("mlp", "data", lp.nn.SGD(lr=0.05, momentum=0.9), steps=8)
    st = dict(rt.tracer.graphs.stats)
    assert st["capture_failed"] == 0 and st["captured"] > 0 and st["launched"] > 0


def _embedding_fit(steps: int = 10) -> tuple:
    """A model whose sparse embedding update touches a different number of
    rows at each step (issue 22: its captured update was relaunched with
    another size and failed, or on a GPU would write the wrong rows)."""
    m = lp.nn.Model(batch_size=4)
    t = m.input((2,), dtype="int32")
    t = m.flat(m.embedding(t, 16, 3))
    m.softmax(m.dense(t, 3))
    m.compile(optimizer=lp.nn.SGD(lr=0.1), loss="sparse_categorical_crossentropy",
              strategy="data")
    rows = [[0, 1], [0, 1], [2, 3], [4, 5]]  # 6 distinct ids
    x = np.array([rows, [[0, 1], [2, 3], [4, 5], [6, 7]],  # 8
                  [[0, 0], [0, 0], [1, 1], [1, 1]],  # 2
                  [[9, 8], [7, 6], [5, 4], [3, 2]],  # 8
                  [[1, 2], [1, 2], [1, 2], [3, 3]]] * 2, np.int32)[:steps].reshape(-1, 2)
    y = np.arange(len(x)) % 3
    hist = m.fit(x, y, epochs=1, verbose=0, shuffle=False)
    return hist["step_loss"], m.parameters()


def test_a_sparse_update_with_a_data_dependent_size_is_not_captured(emu):
    """flatnonzero in the sparse update is a host synchronisation (as in
    CuPy), so that op stays live and the step equals the run without graphs."""
    rt = emu(1, executor="serial")  # one order of events: the same graphs every run
    loss, params = _embedding_fit()
    st = dict(rt.tracer.graphs.stats)
    assert st["captured"] > 0 and st["launched"] > 0  # the rest was captured
    lr.shutdown()
    emu(1, graphs=False, executor="serial")
    loss0, params0 = _embedding_fit()
    assert loss == loss0
    for k in params0:
        np.testing.assert_array_equal(params[k], params0[k])


def test_a_launch_whose_kernel_changes_size_fails_clearly():
    """A graph writes the sizes it captured: a kernel whose result size moved
    at launch is named as a capture bug, not a broadcast error downstream."""
    with Device(0), Stream(0, "s") as s:
        a = xp.ones(3, np.float32)
        emugraph.begin_capture(s, 0)
        a * 2
        g = emugraph.end_capture(s)
        s.synchronize()
        fn, buf = g.steps[0]
        g.steps[0] = (lambda: np.zeros(4, np.float32), buf)  # its size moved
        with pytest.raises(GraphCaptureError, match="depends on the data"):
            g.launch(s)


def test_set_strategy_drops_the_graphs(emu):
    rt = emu(2)
    m, _, _ = _fit("mlp", "data", lp.nn.SGD(lr=0.05))
    st = rt.tracer.graphs.stats
    captured = st["captured"]
    held = sum(seg.graph is not None for rec in rt.tracer.recordings.values()
               for seg in rec.gplan.segs)
    assert held > 0
    before = st["invalidated"]
    m.set_strategy("model")
    assert st["invalidated"] - before == held  # every graph went with its recording
    rng = np.random.default_rng(1)
    m.fit(rng.standard_normal((5 * BATCH, 7)).astype(np.float32), rng.integers(0, 3, 5 * BATCH),
          epochs=1, verbose=0, shuffle=False)
    assert st["captured"] > captured  # the new strategy's steps were captured anew


def test_a_backend_that_cannot_capture_replays_without_graphs(emu, monkeypatch):
    """CuPy 14 refuses every cuBLAS call during a capture (seen on an H100):
    graphs are then off unless LEGIONPY_CUDA_GRAPHS=1 asks for them."""
    from legionpy.runtime import graphcap

    why = "CuPy 14.2.0 cannot capture a cuBLAS call (NotImplementedError: ...)"
    monkeypatch.setattr(graphcap.EmuCapture, "unsupported", staticmethod(lambda: why))
    monkeypatch.delenv("LEGIONPY_CUDA_GRAPHS", raising=False)
    monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
    monkeypatch.setenv("LEGIONPY_GPUS", "2")
    rt = lr.init(executor="threads")
    assert not rt.tracer.graphs.on and rt.tracer.graphs.why_off == why
    x = _steps(6)
    assert rt.tracer.graphs.stats["captured"] == 0
    lr.shutdown()
    rt = emu(2)  # LEGIONPY_CUDA_GRAPHS=1: used anyway
    assert rt.tracer.graphs.on and rt.tracer.graphs.why_off is None
    np.testing.assert_array_equal(_steps(6), x)
    assert rt.tracer.graphs.stats["captured"] > 0


def test_legionpy_train_uses_graphs_on_emulated_gpus(monkeypatch):
    """``legionpy train`` (models.training.train) runs on the GPUs when GPUs
    are asked for, and replays its steps as graphs by default."""
    from legionpy.models.training import train

    monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
    monkeypatch.setenv("LEGIONPY_GPUS", "2")
    try:
        r = train("lenet", strategy="data", steps=7)
        assert lr.get_runtime().devices[0].kind == "gpu"
    finally:
        lr.shutdown()
    assert r["cuda_graphs"]["captured"] > 0 and r["cuda_graphs"]["launched"] > 0
    assert r["cuda_graphs"]["off_because"] is None
