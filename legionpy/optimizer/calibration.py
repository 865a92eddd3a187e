"""The pure half of the local machine model's calibration (issue 9 item 3).

The layer-API calibration (:mod:`legionpy.measure.calibration`) trains
synthetic models and regresses the runtime's per-step, per-task,
per-requirement and per-copy costs on the counts of the simulator's task
graph; this module holds what that needs below ``nn``:

* :func:`task_counts`: ``tasks``, ``reqs`` (region requirements, as the layer
  API launches them) and ``copies`` of a simulator task graph;
* :func:`nnls`: non-negative least squares (numpy);
* **kernel concurrency** (``kernel_scale``, measured by
  :func:`legionpy.probe.overhead.measure_kernel_concurrency` through the
  runtime): the factor by which the simulator's isolated kernel timings are
  stretched when devices share the machine's cores;
* **cores** (:func:`local_cores`): ``len(os.sched_getaffinity(0))`` (else
  ``os.cpu_count()``; an MPI rank bound to its share of the node counts
  the node's, legionpy/affinity.py). On a CPU machine the control threads
  and the device workers run on the same cores, so the iteration is also bounded below by
  ``(sum of device busy + control_threads * control) / cores``;
* :class:`ContendedCostModel`: tile kernels timed with the other devices busy.

The figures are cached by :func:`legionpy.measure.runtime_overhead` in
``$LEGIONPY_CACHE/overhead-v10-MACHINE[-bound].json``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from ..affinity import node_cores, unbound

__all__ = ["task_counts", "nnls", "local_cores", "ContendedCostModel", "time_contended"]


def local_cores() -> int:
    """CPU cores the job may run on on this node: the process's own, or,
    once an MPI rank was bound to its share of them, what it had before
    (:func:`legionpy.affinity.node_cores`)."""
    return node_cores()


def task_counts(taskgraph: dict, graph: Any, update_fields: int = 2) -> dict[str, int]:
    """``{"tasks", "reqs", "copies", "backward"}`` of a simulator task graph
    (``to_json``): compute and update tasks, their region requirements (as
    the layer API launches them), copy tasks and backward (``B:``) tasks."""
    from .fidelity import requirement_counts

    tasks = taskgraph["tasks"]
    reqs = requirement_counts(tasks, graph, update_fields)
    comp = [i for i, t in enumerate(tasks) if t["kind"] != "copy"]
    return {"tasks": len(comp), "reqs": int(sum(reqs[i] for i in comp)),
            "copies": len(tasks) - len(comp),
            "backward": sum(1 for i in comp if tasks[i]["name"].startswith("B:"))}


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
        from .kernel_timing import tile_runner

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
    interpreter lock (the model's CPU and interpreter bounds count those).
    Runs on every core of the process's node share (an MPI rank bound to
    one core would otherwise time its helpers' turns, not the memory system
    the devices share: :func:`legionpy.affinity.unbound`)."""
    from threadpoolctl import threadpool_limits

    from .costmodel import MeasuredCostModel

    stop = threading.Event()

    def helper() -> None:
        while not stop.is_set():
            fn()

    helpers = [threading.Thread(target=helper, daemon=True) for _ in range(concurrency - 1)]
    with unbound(), threadpool_limits(1):
        for h in helpers:
            h.start()
        try:
            return MeasuredCostModel.time_callable(fn, warmup, repeats, clock=time.thread_time)
        finally:
            stop.set()
            for h in helpers:
                h.join()
