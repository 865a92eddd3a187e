"""The pure half of the local machine model's calibration (issue 9 item 3).

The layer-API calibration (:mod:`legionpy.measure.calibration`) trains
synthetic models and regresses the runtime's per-step, per-task,
per-requirement and per-copy costs on the counts of the simulator's task
graph; this module holds what that needs below ``nn``:

* :func:`task_counts`: ``tasks``, ``reqs`` (region requirements, as the layer
  API launches them) and ``copies`` of a simulator task graph;
* :func:`nnls`: non-negative least squares (numpy);
* **kernel concurrency** (:func:`measure_kernel_concurrency`): a GEMM task
  launched on ONE device, then on every device at once, through the runtime
  (so with its worker threads, BLAS limits and MPI ranks as in training);
  the ratio of the median kernel times is ``kernel_scale``, by which the
  simulator's isolated kernel timings are stretched when devices share the
  machine's cores;
* **cores** (:func:`local_cores`): ``len(os.sched_getaffinity(0))`` (else
  ``os.cpu_count()``). On a CPU machine the control threads and the device
  workers run on the same cores, so the iteration is also bounded below by
  ``(sum of device busy + control_threads * control) / cores``;
* :class:`ContendedCostModel`: tile kernels timed with the other devices busy.

The figures are cached by :func:`legionpy.measure.runtime_overhead` in
``$LEGIONPY_CACHE/overhead-v4-MACHINE.json``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import numpy as np

__all__ = ["task_counts", "nnls", "measure_kernel_concurrency", "local_cores", "cpu_clock",
           "background_cores",
           "ContendedCostModel", "time_contended"]


def local_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_clock() -> tuple[float, float, float] | None:
    """``(wall s, CPU-seconds the whole machine has been busy, CPU-seconds of
    this process)`` now, from ``/proc/stat`` (busy = all but idle and iowait,
    steal included) and :func:`os.times`; None where ``/proc/stat`` is missing."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return time.perf_counter(), (sum(v) - v[3] - v[4]) / tick, t.user + t.system


def background_cores(start: tuple | None, end: tuple | None) -> float | None:
    """Cores other programs kept busy between two :func:`cpu_clock` readings:
    the machine's busy CPU-seconds less this job's (every rank's, summed under
    MPI: collective, ranks assumed on one host, rank 0's figure returned on
    every rank), over the wall seconds. None when either reading is missing."""
    from ..runtime.mpi import cluster, launched_under_mpi

    ok = start is not None and end is not None
    own = end[2] - start[2] if ok else 0.0
    mpi = launched_under_mpi()
    if mpi:
        parts = cluster().coll.allgather((ok, own))
        ok, own = all(p[0] for p in parts), sum(p[1] for p in parts)
    out = None
    if ok and end[0] > start[0]:
        out = max(0.0, ((end[1] - start[1]) - own) / (end[0] - start[0]))
    # rank 0's figure on every rank: what depends on it (a prediction) is collective
    return cluster().coll.bcast(out, root=0) if mpi else out


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
            with rt.trace.tap() as tap:  # leaves the user's LEGIONPY_TRACE whole
                for _ in range(reps):
                    lr.index_launch(task, cs, part, launch_options=opts)
                    lr.fence()  # one launch at a time: the devices overlap only within it
            recs = tap.records()
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


# -- kernels timed in the conditions they run -------------------------------------------------

class ContendedCostModel:
    """Factory of a :class:`~legionpy.optimizer.costmodel.MeasuredCostModel`
    whose tile kernels are timed while ``concurrency - 1`` other threads run
    the same kernel (the other devices of this host busy, as in a training
    step), with one BLAS thread each, as the runtime's workers run them.
    Timed in the thread's CPU seconds (:func:`time_contended`), so a profile
    taken while other programs load the machine is the profile of a quiet one
    (their share of the cores is modelled apart,
    :meth:`~legionpy.optimizer.fidelity.RuntimeOverhead.under_load`); cached
    apart from the isolated profile in ``$LEGIONPY_CACHE/costs-contended-cpu-K.json``."""

    @staticmethod
    def local(concurrency: int, cache_path: str | None = None) -> Any:
        from .costmodel import MeasuredCostModel, default_cache_path
        from .profile import tile_runner

        path = cache_path or os.path.join(os.path.dirname(default_cache_path()),
                                          f"costs-contended-cpu-{concurrency}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

        class _Contended(MeasuredCostModel):
            def time_callable(self, fn: Any, warmup: int = 2, repeats: int = 5) -> float:
                return time_contended(fn, concurrency, warmup, repeats)

        model = _Contended(tile_runner, path)
        model.concurrency = concurrency
        return model


def time_contended(fn: Any, concurrency: int, warmup: int = 2, repeats: int = 5) -> float:
    """Median CPU seconds of the calling thread running ``fn()`` (after
    ``warmup`` runs, one BLAS thread) while ``concurrency - 1`` helper threads
    call ``fn`` in a loop: what the kernel costs when the other devices share
    the memory system, without the time spent waiting for a core or for the
    interpreter lock (the model's CPU and interpreter bounds count those)."""
    from threadpoolctl import threadpool_limits

    from .costmodel import MeasuredCostModel

    stop = threading.Event()

    def helper() -> None:
        while not stop.is_set():
            fn()

    helpers = [threading.Thread(target=helper, daemon=True) for _ in range(concurrency - 1)]
    with threadpool_limits(1):
        for h in helpers:
            h.start()
        try:
            return MeasuredCostModel.time_callable(fn, warmup, repeats, clock=time.thread_time)
        finally:
            stop.set()
            for h in helpers:
                h.join()
