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
``$LEGIONPY_CACHE/overhead-v27-MACHINE[-bound].json``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from ..affinity import node_cores, unbound
from .costmodel import TABLES, cached_table, merge_table
from .lockshare import cache_file as lock_cache_file
from .lockshare import looping, measure_shares, op_shares

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
    apart from the isolated profile in ``$LEGIONPY_CACHE/costs-contended-cpu-K-v2.json``."""

    @staticmethod
    def local(concurrency: int, cache_path: str | None = None) -> Any:
        return _cpu_cost_model(f"costs-contended-cpu-{concurrency}-{TABLES}.json", concurrency,
                               cache_path, in_step=False)


#: the step tables' own generation, after :data:`TABLES` in their file name:
#: s2 scales each batch to the process's usual speed (:func:`time_in_step`),
#: s3 keeps each kernel's median batch rather than its least, so tables timed
#: before are timed again
STEP_TABLES = "s3"


class StepCostModel:
    """Factory of a :class:`~legionpy.optimizer.costmodel.MeasuredCostModel`
    whose tile kernels are timed as a device's worker runs them inside a
    training step: in the thread's CPU seconds, one BLAS thread, each
    strategy's tiles one after another in the step's order (the forward in
    graph order, then the backward in reverse, :func:`time_in_step`), so a
    kernel finds the caches as the kernels before it left them. Timed alone
    and repeated, alexnet's tiles took 10% less (a backward's
    forward-pass state is out of the caches by the time it runs), lenet's
    8%. A tile it is asked for outside :meth:`prime` is timed alone. Cached
    in ``$LEGIONPY_CACHE/costs-step-cpu-v2s3.json``."""

    @staticmethod
    def local(cache_path: str | None = None) -> Any:
        return _cpu_cost_model(f"costs-step-cpu-{TABLES}{STEP_TABLES}.json", 1, cache_path,
                               in_step=True)


def _cpu_cost_model(filename: str, concurrency: int, cache_path: str | None,
                    in_step: bool) -> Any:
    """A MeasuredCostModel of tile kernels timed by :func:`time_contended`
    (``concurrency - 1`` helper threads), cached in ``cache_path`` or
    ``$LEGIONPY_CACHE/filename``; ``in_step``: with :meth:`prime`
    (:func:`time_in_step`)."""
    from .costmodel import MeasuredCostModel, default_cache_path
    from .kernel_timing import tile_runner

    path = cache_path or os.path.join(os.path.dirname(default_cache_path()), filename)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    class _Timed(MeasuredCostModel):
        def time_callable(self, fn: Any, warmup: int = 2, repeats: int = 5) -> float:
            return time_contended(fn, concurrency, warmup, repeats)

    class _Step(_Timed):
        def prime(self, graph: Any, strategy: Any, machine: Any) -> None:
            time_in_step(self, graph, strategy, machine)
            prime_lock_shares(self, graph, strategy, machine)

        def lock_shares(self, graph: Any, strategy: Any, machine: Any) -> dict:
            """The interpreter lock's share per (op, phase) (optimizer/lockshare.py)."""
            kind = machine.devices[0].kind if machine.devices else "cpu"
            return op_shares(self.shares, graph, strategy, kind)

    model = (_Step if in_step else _Timed)(tile_runner, path)
    if in_step:
        model.shares_path = lock_cache_file(path)
        model.shares = cached_table(model.shares_path)
    model.concurrency = concurrency
    return model


#: batches of :func:`time_in_step`'s rounds, apart in time, and the pause
#: between them: each kernel keeps its median batch, each batch's
#: medians scaled to the process's usual speed (:func:`speed_reference`)
STEP_BATCHES = 5
STEP_GAP_S = 0.05

#: :func:`speed_reference`'s readings in this process, one per batch of
#: :func:`time_in_step`: their median is the speed the batches are scaled to
_SPEEDS: list[float] = []


def speed_reference() -> float:
    """Least thread CPU seconds, of three, of a fixed piece of work made like
    a small step's kernels (GEMMs, tanh and adds on a 16 x 64 batch, and the
    interpreter's dict and list traffic between them): ~0.25 ms on the
    project's 2-core machine. A spell in which the host's other tenants
    slow such kernels slows it alike: with a memory-bound program on the
    other core, rnntc's step kernels took 1.85x their time and this 1.67x,
    where alexnet's larger ones took 1.1x and this 1.03x (27 Nov); one
    calibration's rnntc tiles read 1.5-1.7x the next one's, all five batches
    of them, and the row was predicted 23% high."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    best = math.inf
    for _ in range(3):
        t0 = time.thread_time()
        x, d, out = a, {}, []
        for i in range(20):
            h = np.tanh(x @ w)
            x = h[:, :64] * 0.5 + a
            for j in range(50):
                d[j & 15] = i
                out.append((j, d.get(j & 7)))
        best = min(best, time.thread_time() - t0)
    return best


def time_in_step(cm: Any, graph: Any, strategy: Any, machine: Any, warmup: int = 2,
                 rounds: int = 5, batches: int = STEP_BATCHES,
                 gap_s: float = STEP_GAP_S) -> None:
    """Time the tiles of ``strategy`` that ``cm``'s table lacks, on one
    device of each kind of ``machine``, as a step runs them: every tile's
    forward in graph order, then every backward in reverse, ``warmup +
    rounds`` times, in ``batches`` batches ``gap_s`` apart, in its thread's
    CPU seconds with one BLAS thread; each kernel's median batch median of
    the last ``rounds``, into ``cm.table`` (and its disk cache). Each
    batch's medians are first scaled by the process's usual speed over the
    batch's own (:func:`speed_reference` before and after it, against the
    median of every batch's in this process). One batch of a few
    milliseconds can fall whole into a slow spell of a shared host (27 Nov:
    one calibration's rnntc LSTM cells read 83 and 92 us where the next
    read 52 and 60, and the row was predicted 55% high); a spell seldom
    covers three batches, and one that covers them all slows the reference
    too."""
    from threadpoolctl import threadpool_limits

    from .costmodel import cost_key
    from .kernel_timing import required_tiles

    kinds: dict[str, Any] = {}
    for d in machine.devices:
        kinds.setdefault(d.kind, d)
    added = False
    for dev in kinds.values():
        tiles = [(op, t) for op, t in required_tiles(graph, [strategy])
                 if cost_key(op, t, dev.kind) not in cm.table]
        if not tiles:
            continue
        runs = [cm.runner(op, t, dev) for op, t in tiles]
        timed = []  # (the batch's speed, its medians)
        with unbound(), threadpool_limits(1):
            for b in range(max(1, batches)):
                if b:
                    time.sleep(gap_s)
                before = speed_reference()
                medians = _step_medians(runs, warmup, rounds)
                timed.append(((before + speed_reference()) / 2, medians))
                _SPEEDS.append(timed[-1][0])
        usual = float(np.median(_SPEEDS))
        scaled = [[(f * usual / speed, bw * usual / speed) for f, bw in medians]
                  for speed, medians in timed]
        best = [[float(np.median([b[i][0] for b in scaled])),
                 float(np.median([b[i][1] for b in scaled]))] for i in range(len(runs))]
        for (op, t), times in zip(tiles, best):
            cm.table[cost_key(op, t, dev.kind)] = times
        added = True
    if added and cm.cache_path:
        cm._write_cache()


def _step_medians(runs: list, warmup: int, rounds: int) -> list[tuple[float, float]]:
    """Each ``(forward, backward)`` kernel pair's median CPU seconds over
    ``rounds`` passes of a step (forwards in order, backwards in reverse),
    after ``warmup`` passes."""
    fwd: list[list[float]] = [[] for _ in runs]
    bwd: list[list[float]] = [[] for _ in runs]
    clock = time.thread_time
    for _ in range(warmup + rounds):
        for i, (f, _) in enumerate(runs):
            t0 = clock()
            f()
            fwd[i].append(clock() - t0)
        for i in reversed(range(len(runs))):
            t0 = clock()
            runs[i][1]()
            bwd[i].append(clock() - t0)
    return [(float(np.median(f[warmup:])), float(np.median(b[warmup:])))
            for f, b in zip(fwd, bwd)]


def prime_lock_shares(cm: Any, graph: Any, strategy: Any, machine: Any) -> None:
    """Measure the lock shares (optimizer/lockshare.py) of ``strategy``'s
    CPU tiles that ``cm.shares`` lacks, into it and its cache file. GPU
    kernels release the lock (their launches are a few us: the cap)."""
    from .kernel_timing import required_tiles, tile_runner
    from .twinproc import TwinProcess

    cpus = [d for d in machine.devices if d.kind == "cpu"]
    if not cpus:
        return
    # the control (lockshare.lock_share): the same kernels in another process
    apart = TwinProcess.shared if cm.runner is tile_runner else None
    if measure_shares(cm.shares, cm.runner, required_tiles(graph, [strategy]), cpus[0],
                      cm.table, apart):
        merge_table(cm.shares_path, cm.shares)


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

    with unbound(), threadpool_limits(1), looping(fn, concurrency - 1):
        return MeasuredCostModel.time_callable(fn, warmup, repeats, clock=time.thread_time)
