"""Calibrating the local machine model through the layer API (issue 9 item 3).

The empty-task microbenchmark of :func:`~legionpy.optimizer.fidelity.measure_runtime_overhead`
times ``index_launch`` alone; a training step through the layer API does more
per task (the StrategyMapper, the nn executor, sharding, fills, futures), so
it under-predicts the control thread by ~3x. This module measures the
runtime *as the models use it*, on synthetic calibration models only (deep
narrow MLPs and tiny conv stacks whose kernels are negligible, under a few
strategies) -- never on the models whose fidelity is then reported:

* **control thread** (:func:`calibrate_layer_overhead`): each calibration
  model is trained with ONE pipelined ``fit`` call
  (:func:`~legionpy.optimizer.fidelity.measure_runtime`); its kernels being
  negligible, the steady-state period is the control thread's work per step.
  The periods are regressed (non-negative least squares, numpy) on the counts
  of the simulator's task graph for the same model, strategy and machine::

      period = step_s + tasks * launch_s + reqs * req_launch_s + copies * copy_launch_s

  (``tasks``: compute and update tasks, ``reqs``: their region requirements,
  ``copies``: copy tasks).
* **workers**: the measured busy time of the devices per step, less the
  kernels' simulated time, regressed on ``tasks`` and ``reqs``
  (``task_s``, ``req_task_s``).
* **kernel concurrency** (:func:`measure_kernel_concurrency`): a GEMM task
  launched on ONE device, then on every device at once, through the runtime
  (so with its worker threads, BLAS limits and MPI ranks as in training);
  the ratio of the median kernel times is ``kernel_scale``, by which the
  simulator's isolated kernel timings are stretched when devices share the
  machine's cores.
* **cores** (:func:`local_cores`): ``len(os.sched_getaffinity(0))`` (else
  ``os.cpu_count()``), and ``control_threads``: the control threads of the
  job on this host (1, or the ranks of an ``mpirun`` job). On a CPU machine
  the control threads and the device workers run on the same cores, so the
  iteration is also bounded below by the total CPU work divided by the cores:
  ``(sum of device busy + control_threads * control) / cores`` (processor
  sharing); with at least ``devices + control_threads`` cores this bound is
  never the binding one.

Every figure is machine- (and rank-layout-) specific and cached by
:func:`~legionpy.optimizer.fidelity.runtime_overhead` in
``$LEGIONPY_CACHE/overhead-v3-MACHINE.json``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import numpy as np

__all__ = ["calibration_models", "task_counts", "nnls", "calibrate_layer_overhead",
           "measure_kernel_concurrency", "local_cores"]

#: (name, builder kwargs) of the synthetic calibration models
CALIBRATION_MODELS = (("mlp", {"depth": 2}), ("mlp", {"depth": 6}), ("mlp", {"depth": 12}),
                      ("mlp", {"depth": 6, "split_act": True}),
                      ("conv", {"depth": 2}), ("conv", {"depth": 4}),
                      ("lstm", {"steps": 3}), ("lstm", {"steps": 6, "layers": 2}))
CALIBRATION_STRATEGIES = ("data", "model")


def local_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _mlp(depth: int, split_act: bool = False, width: int = 8, batch: int = 8) -> Any:
    from .. import nn

    m = nn.Model(batch_size=batch, name=f"calib_mlp{depth}{'a' if split_act else ''}")
    t = m.input((width,))
    for i in range(depth):
        if split_act:
            t = m.relu(m.dense(t, width, name=f"d{i}"), name=f"a{i}")
        else:
            t = m.dense(t, width, activation="relu", name=f"d{i}")
    m.softmax(m.dense(t, 4, name="out"))
    return m


def _conv(depth: int, batch: int = 8) -> Any:
    from .. import nn

    m = nn.Model(batch_size=batch, name=f"calib_conv{depth}")
    t = m.input((2, 6, 6))
    for i in range(depth):
        t = m.conv2d(t, 2, 3, padding=1, activation="relu", name=f"c{i}")
    t = m.pool2d(t, 2, name="pool")
    m.softmax(m.dense(m.flat(t, name="flat"), 4, name="out"))
    return m


def _lstm(steps: int, layers: int = 1, hidden: int = 4, vocab: int = 8,
          batch: int = 8) -> Any:
    """A tiny unrolled LSTM classifier: per-step shared embeddings and cells
    sharing their parameters (the structure, not the sizes, of the zoo's RNNs)."""
    from .. import nn
    from ..models.rnn import _embed, _stack

    m = nn.Model(batch_size=batch, name=f"calib_lstm{steps}x{layers}")
    tokens = m.input((steps,), dtype="int32", name="tokens")
    tops, _ = _stack(m, _embed(m, tokens, steps, vocab, hidden, "emb"), layers, hidden, "l")
    m.softmax(m.dense(tops[-1].h, 2, name="out"))
    return m


def calibration_models() -> list[Any]:
    """Fresh (uncompiled) synthetic calibration models: deep narrow MLPs
    (with fused and with separate activations), tiny conv stacks and tiny
    unrolled LSTMs (shared parameters)."""
    build = {"mlp": _mlp, "conv": _conv, "lstm": _lstm}
    return [build[kind](**kw) for kind, kw in CALIBRATION_MODELS]


def task_counts(taskgraph: dict, graph: Any, update_fields: int = 2) -> dict[str, int]:
    """``{"tasks", "reqs", "copies"}`` of a simulator task graph (``to_json``):
    compute and update tasks, their region requirements (as the layer API
    launches them) and copy tasks."""
    from .fidelity import _requirements

    tasks = taskgraph["tasks"]
    reqs = _requirements(tasks, graph, update_fields)
    comp = [i for i, t in enumerate(tasks) if t["kind"] != "copy"]
    return {"tasks": len(comp), "reqs": int(sum(reqs[i] for i in comp)),
            "copies": len(tasks) - len(comp)}


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by dropping the most negative coefficient
    and refitting (few columns: exact enough, numpy only)."""
    a = np.asarray(a, float)
    b = np.asarray(b, float)
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0.0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def measure_kernel_concurrency(n: int = 320, elems: int = 1_000_000,
                               reps: int = 10) -> dict[str, float]:
    """Kernel slowdown when every device runs at once (module doc), for a
    compute-bound kernel (four ``n`` x ``n`` float32 GEMMs) and a
    memory-bound one (four elementwise passes over ``elems`` floats): each
    launched ``reps`` times as a task on device 0 alone, then on every
    device at once; medians of the trace's task durations. Returns
    ``kernel_scale`` / ``kernel_scale_mem`` (together / alone, at least 1)
    and the two kernels' arithmetic intensities (flop per byte), between
    which :meth:`RuntimeOverhead.scale_for` interpolates. Collective under
    MPI (rank 0's figures on every rank)."""
    from .. import runtime as lr
    from ..regions import WD, Partition, Region
    from ..runtime import LaunchOptions, TaskFunction
    from .fidelity import _bcast

    rt = lr.get_runtime()
    ndev = len(rt.devices)
    reg = Region((ndev * 4, 4), {"x": np.float32}, name="_calib_conc")
    reg.write("x", np.zeros((ndev * 4, 4), np.float32))
    part = Partition.equal(reg, (ndev, 1))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    bm = rng.standard_normal((n, n)).astype(np.float32)
    local = threading.local()  # each worker streams over its own array

    def gemm(*_args: Any) -> None:
        for _ in range(4):
            a @ bm

    def stream(*_args: Any) -> None:
        x = getattr(local, "x", None)
        if x is None:
            x = local.x = np.ones(elems, np.float32)
        for _ in range(4):
            np.maximum(x, 0.0)

    colors = part.colors
    figures: dict[str, float] = {}
    for label, fn in (("gemm", gemm), ("stream", stream)):
        name = f"_calib_{label}"
        task = TaskFunction(fn, [WD("x")], name=name, kind="compute")
        opts = LaunchOptions(name, "compute", None)
        med = {}
        for mode, cs in (("alone", colors[:1]), ("together", colors)):
            for _ in range(2):
                lr.index_launch(task, cs, part, launch_options=opts)
            lr.fence()
            rt.trace.start()
            for _ in range(reps):
                lr.index_launch(task, cs, part, launch_options=opts)
                lr.fence()  # one launch at a time: the devices overlap only within it
            recs = rt.trace.stop()
            rt.trace.clear()
            ds = [r["end"] - r["start"] for r in recs
                  if r["kind"] == "compute" and r["name"].startswith(name)]
            med[mode] = statistics.median(ds) if ds else 0.0
        figures[f"{label}_alone_s"] = med["alone"]
        figures[f"{label}_together_s"] = med["together"]
    g = figures["gemm_together_s"] / figures["gemm_alone_s"] if figures["gemm_alone_s"] else 1
    m = (figures["stream_together_s"] / figures["stream_alone_s"]
         if figures["stream_alone_s"] else 1)
    figures.update(kernel_scale=max(1.0, g), kernel_scale_mem=max(1.0, m),
                   intensity_compute=2.0 * n ** 3 / (3 * n * n * 4),  # flop / byte
                   intensity_mem=1.0 / 8)  # one op per float read and written
    return _bcast(figures)


def calibrate_layer_overhead(machine: Any, steps: int = 9, warmup: int = 3,
                             cost: Any = "measured", verbose: bool = False,
                             models: Any = None, strategies: Any = CALIBRATION_STRATEGIES
                             ) -> dict[str, Any]:
    """Regress the runtime's per-step, per-task, per-requirement and per-copy
    costs from synthetic models trained through the layer API (module doc).
    Returns the :class:`~legionpy.optimizer.fidelity.RuntimeOverhead` fields
    plus ``"calibration"`` (the rows, the fits' residuals, the seconds taken).
    ``models``: a callable returning fresh uncompiled models (default
    :func:`calibration_models`). Collective under MPI; takes ~5-20 s."""
    from ..nn.strategies import resolve_strategy
    from .costmodel import CostModel, cost_model_from_spec
    from .fidelity import _bcast, measure_runtime
    from .simulator import Simulator

    t0 = time.perf_counter()
    cm = cost if isinstance(cost, CostModel) else cost_model_from_spec(cost)
    rows = []
    for sname in strategies:
        for m in (models() if models is not None else calibration_models()):
            strat = resolve_strategy(sname, m.graph, machine)
            sim = Simulator(m.graph, machine, cm)
            res = sim.run(strat)
            counts = task_counts(sim.tg.to_json(include_times=False), m.graph)
            kernels = float(sum(res.per_device_busy_s.values()))
            real = measure_runtime(m, strat, machine, steps=steps, warmup=warmup)
            real = _bcast(real)
            busy = float(sum(real["measured_per_device_busy_s"].values()))
            rows.append({"model": m.graph.name, "strategy": sname, **counts,
                         "period_s": real["measured_time_s"],
                         "control_s": real["measured_control_cpu_s"],
                         "worker_extra_s": max(0.0, busy - kernels)})
            if verbose:
                print(f"  calibrate {m.graph.name:<14} {sname:<6} tasks {counts['tasks']:>4} "
                      f"reqs {counts['reqs']:>5} copies {counts['copies']:>4} period "
                      f"{real['measured_time_s'] * 1e3:7.2f} ms control "
                      f"{real['measured_control_cpu_s'] * 1e3:7.2f} ms", flush=True)
    a = np.array([[1.0, r["tasks"], r["reqs"], r["copies"]] for r in rows])
    period = np.array([r["control_s"] for r in rows])
    ctl = nnls(a, period)
    w = np.array([[r["tasks"], r["reqs"]] for r in rows])
    extra = np.array([r["worker_extra_s"] for r in rows])
    wk = nnls(w, extra)

    def rel(fit: np.ndarray, y: np.ndarray) -> float:
        return float(np.max(np.abs(fit - y) / np.maximum(y, 1e-12)))

    return {"step_s": float(ctl[0]), "launch_s": float(ctl[1]), "req_launch_s": float(ctl[2]),
            "copy_launch_s": float(ctl[3]), "task_s": float(wk[0]), "req_task_s": float(wk[1]),
            "calibration": {"rows": rows, "control_worst_residual": rel(a @ ctl, period),
                            "worker_worst_residual": rel(w @ wk, extra),
                            "seconds": time.perf_counter() - t0}}


# -- kernels timed in the conditions they run -------------------------------------------------

class ContendedCostModel:
    """Factory of a :class:`~legionpy.optimizer.costmodel.MeasuredCostModel`
    whose tile kernels are timed while ``concurrency - 1`` other threads run
    the same kernel (the other devices of this host busy, as in a training
    step), with the runtime's BLAS limit in force; cached apart from the
    isolated profile in ``$LEGIONPY_CACHE/costs-contended-K.json``."""

    @staticmethod
    def local(concurrency: int, cache_path: str | None = None) -> Any:
        from .costmodel import MeasuredCostModel, default_cache_path
        from .profile import tile_runner

        path = cache_path or os.path.join(os.path.dirname(default_cache_path()),
                                          f"costs-contended-{concurrency}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

        class _Contended(MeasuredCostModel):
            def time_callable(self, fn: Any, warmup: int = 2, repeats: int = 5) -> float:
                return time_contended(fn, concurrency, warmup, repeats)

        model = _Contended(tile_runner, path)
        model.concurrency = concurrency
        return model


def time_contended(fn: Any, concurrency: int, warmup: int = 2, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` (after ``warmup`` runs) while
    ``concurrency - 1`` helper threads call ``fn`` in a loop."""
    stop = threading.Event()

    def helper() -> None:
        while not stop.is_set():
            fn()

    from .costmodel import MeasuredCostModel

    helpers = [threading.Thread(target=helper, daemon=True) for _ in range(concurrency - 1)]
    for h in helpers:
        h.start()
    try:
        return MeasuredCostModel.time_callable(fn, warmup, repeats)
    finally:
        stop.set()
        for h in helpers:
            h.join()
