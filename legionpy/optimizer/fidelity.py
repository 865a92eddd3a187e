"""Fidelity: is the simulator right about this machine? (issue 9 item 3)

:func:`compare` simulates one training iteration of a model under a
strategy on the local machine (``Machine.local()``: this process's devices,
or every rank of an ``mpirun`` job), then runs the same strategy for real
with the same devices -- ``compile``, then ONE ``fit`` call over ``warmup +
steps`` batches (pipelined: step i+1 is launched before step i is waited
for), the steady-state period timed from the last warm-up step's loss to
the last step's, with the runtime's trace on -- and
returns a :class:`FidelityResult`: simulated and measured seconds per
iteration, the relative error ``|sim - real| / real`` and the busy seconds of
every device in both halves (the measured ones summed from the trace's
compute and update records, per step).

The machine model of a Python runtime
-------------------------------------
Kernel timings (:class:`~legionpy.optimizer.costmodel.MeasuredCostModel`)
say what the *kernels* cost. On a CPU with small models, legionpy's own
per-task work in Python is of the same order: the control thread analyses
every point task (dependences, mapping, coherence) before a worker can run
it, and each worker spends time on a task's prologue and epilogue around
the kernel. Legion has the same costs; FlexFlow's simulator leaves them
out because its GPU kernels dwarf them. :class:`RuntimeOverhead` measures
them once per machine with empty tasks (never with the models being
compared): ``launch_s`` + ``req_launch_s`` per region requirement (control
thread per point task), ``copy_launch_s`` (extra control-thread time per
copy), ``task_s`` + ``req_task_s`` per requirement (worker time per task
besides its kernel) and ``copy_s`` (per copy besides latency and bytes).
With ``pipelined`` (the default of :func:`simulate_strategy`, as ``fit``
runs) the control thread works one step ahead of the devices and the
iteration takes the longer of its work and the devices' schedule.
:func:`simulate_with_runtime` then re-schedules the simulator's task graph
with those terms: every task lasts ``duration + task_s`` (copies ``+
copy_s``) and becomes ready only after the control thread has issued it,
the control thread being one more FIFO resource that issues the tasks in
the program's launch order (all F in graph order, all B in reverse, then
the updates; a copy is issued just before its first consumer). The same
event rule as the simulator (FIFO per resource in order of readiness, ties
by id) is used, so with zero overhead it reproduces the simulator's
iteration time exactly.

The empty-task figures under-predict the control thread ~3x for real
models (the layer API does more per task), so by default
(:func:`runtime_overhead` ``source="layer"``) the terms are calibrated
THROUGH THE LAYER API on synthetic models only
(:mod:`legionpy.optimizer.calibration`: least squares of the control
thread's CPU time per step and the workers' time on the task graphs' counts
of tasks, requirements and copies, plus a per-step term ``step_s``), and the
local machine model adds CPU contention: the control threads and the device
workers share ``cores`` (``os.sched_getaffinity``), so the iteration is at
least ``(device + link busy + control_threads * control) / cores``; one
interpreter lock per process, so at least ``control + the workers' Python
work / control_threads``; and the kernels, profiled in isolation, are
stretched by the measured slowdown of a GEMM / a memory-bound stream run on
every device at once (interpolated by arithmetic intensity), unless the
cost model is ``"contended"`` (kernels profiled with the other devices
busy). The figures are cached per machine in
``$LEGIONPY_CACHE/overhead-v3-MACHINE.json``.

:func:`kendall_tau` is Kendall's tau-b (ties handled), for the rank order
of strategies in ``bench/fidelity.py``.

>>> round(kendall_tau([1, 2, 3, 4], [10, 20, 40, 30]), 4)
0.6667
"""

from __future__ import annotations

import heapq
import json
import os
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["FidelityResult", "RuntimeOverhead", "compare", "measure_runtime",
           "measure_runtime_overhead", "runtime_overhead", "simulate_with_runtime",
           "simulate_strategy", "kendall_tau", "relative_error"]


# -- statistics ------------------------------------------------------------------------------

def relative_error(simulated: float, measured: float) -> float:
    """``|simulated - measured| / measured`` (``inf`` when nothing was measured)."""
    if measured <= 0:
        return float("inf")
    return abs(simulated - measured) / measured


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between paired samples ``x`` and ``y``:
    ``(concordant - discordant) / sqrt((n0 - ties_x) * (n0 - ties_y))`` over
    all pairs, ``n0 = n (n - 1) / 2``. 1: same order, -1: reversed, 0: none
    (also when either side is constant). O(n^2): fine for tens of points."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: {len(x)} x values but {len(y)} y values")
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue  # tied in both: counts in neither tie term of tau-b's n1/n2
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + tx) * (conc + disc + ty)) ** 0.5
    return (conc - disc) / denom if denom > 0 else 0.0


# -- runtime overhead ------------------------------------------------------------------------

@dataclass
class RuntimeOverhead:
    """Per-task costs of legionpy's runtime itself, in seconds (module doc).
    A point task with ``r`` region requirements (argument x field) costs the
    control thread ``launch_s + r * req_launch_s`` and its worker ``task_s +
    r * req_task_s`` besides the kernel; a copy costs the control thread
    ``copy_launch_s`` and its link ``copy_s`` besides latency and bytes."""

    launch_s: float = 0.0
    copy_launch_s: float = 0.0
    task_s: float = 0.0
    copy_s: float = 0.0
    req_launch_s: float = 0.0
    req_task_s: float = 0.0
    #: control-thread seconds per step besides its tasks (fit's loop, loss readback)
    step_s: float = 0.0
    #: kernels' slowdown when every device runs at once (measured, >= 1): a
    #: compute-bound GEMM's, a memory-bound stream's, and their intensities
    kernel_scale: float = 1.0
    kernel_scale_mem: float = 1.0
    intensity_compute: float = 0.0
    intensity_mem: float = 0.0
    #: CPU cores shared by the control threads and the devices (0: no CPU bound)
    cores: int = 0
    #: control threads on this host (ranks of the job)
    control_threads: int = 1
    #: "layer-api" (calibrated on synthetic models) or "empty-tasks"
    source: str = "empty-tasks"
    machine: str = ""
    calibration: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_zero(self) -> bool:
        return not (self.launch_s or self.copy_launch_s or self.task_s or self.copy_s
                    or self.req_launch_s or self.req_task_s or self.step_s or self.cores
                    or self.kernel_scale != 1.0)

    def control_s(self, reqs: int) -> float:
        return self.launch_s + reqs * self.req_launch_s

    def worker_s(self, reqs: int) -> float:
        return self.task_s + reqs * self.req_task_s

    def scale_for(self, intensity: float | None) -> float:
        """Concurrency slowdown of a kernel of ``intensity`` flop/byte: the
        memory-bound factor at or below the stream's intensity, the GEMM's
        at or above the GEMM's, log-linear in between (unknown: the GEMM's)."""
        lo, hi = self.intensity_mem, self.intensity_compute
        if intensity is None or not (0 < lo < hi):
            return self.kernel_scale
        f = (np.log(max(intensity, 1e-12)) - np.log(lo)) / (np.log(hi) - np.log(lo))
        f = min(1.0, max(0.0, float(f)))
        return self.kernel_scale_mem + f * (self.kernel_scale - self.kernel_scale_mem)


def _overhead_path(machine_name: str) -> str:
    from .costmodel import default_cache_path

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", machine_name)
    return os.path.join(os.path.dirname(default_cache_path()), f"overhead-v3-{safe}.json")


def _bcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (identity outside MPI)."""
    from ..runtime.mpi import cluster, launched_under_mpi

    if not launched_under_mpi():
        return value
    return cluster().coll.bcast(value, root=0)


def _gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (a one-element list outside MPI)."""
    from ..runtime.mpi import cluster, launched_under_mpi

    if not launched_under_mpi():
        return [value]
    return cluster().coll.allgather(value)


def measure_runtime_overhead(launches: int = 120, tile_rows: int = 16) -> RuntimeOverhead:
    """Measure :class:`RuntimeOverhead` on the current runtime with empty
    tasks (never with the models being compared): index launches of one
    point per device with 1 and with 6 region requirements (the per-task and
    per-requirement terms are the line through the two medians, for the
    control thread and for the workers), then pairs of launches where the
    second reads, with a one-tile shift, what the first wrote on another
    device (one copy per point: the extra control-thread time of the second
    launch, and the copy records' durations less the link model's latency
    and bytes). Under MPI it is collective and returns rank 0's figures on
    every rank. Takes ~0.3 s."""
    from .. import runtime as lr
    from ..regions import WD, Partition, R, Region
    from ..runtime import LaunchOptions, TaskFunction

    rt = lr.get_runtime()
    n = len(rt.devices)
    shape = (n * tile_rows, 16)
    regs = [Region(shape, {"x": np.float32}, name=f"_ovh_{i}") for i in range(6)]
    for r in regs:
        r.write("x", np.zeros(shape, np.float32))
    parts = [Partition.equal(r, (n, 1)) for r in regs]
    colors = parts[0].colors
    shifted = Partition.by_rects(regs[1], {c: parts[1][((c[0] + 1) % n, 0)].rect
                                           for c in colors})

    def empty(*_args: Any) -> None:
        return None

    tasks = {}
    for k in (1, 6):
        tasks[k] = (TaskFunction(empty, [WD("x")] + [R("x")] * (k - 1), name=f"_ovh_{k}",
                                 kind="compute"), LaunchOptions(f"_ovh_{k}", "compute", None))
    wr = (TaskFunction(empty, [WD("x")], name="_ovh_w", kind="compute"),
          LaunchOptions("_ovh_w", "compute", None))
    rd = (TaskFunction(empty, [WD("x"), R("x")], name="_ovh_r", kind="compute"),
          LaunchOptions("_ovh_r", "compute", None))

    def launch(t: tuple, args: list) -> float:
        t0 = time.perf_counter()
        lr.index_launch(t[0], colors, *args, launch_options=t[1])
        return (time.perf_counter() - t0) / n

    control: dict[int, list] = {1: [], 6: []}
    for k, t in tasks.items():
        for _ in range(10):  # warm up the launch path's caches
            launch(t, parts[:k])
        lr.fence()
    rt.trace.start()
    for i in range(launches):
        for k, t in tasks.items():
            control[k].append(launch(t, parts[:k]))
        if i % 10 == 9:
            lr.fence()  # keep the queues short: the workers never starve the control thread
    lr.fence()
    plain, copied = [], []
    if n > 1:
        for i in range(launches // 2):
            launch(wr, [parts[1]])
            plain.append(launch(rd, [parts[2], parts[1]]))
            launch(wr, [parts[1]])
            copied.append(launch(rd, [parts[2], shifted]))
            if i % 10 == 9:
                lr.fence()
    lr.fence()
    recs = rt.trace.stop()
    rt.trace.clear()
    med = statistics.median
    work = {k: [r["end"] - r["start"] for r in recs if r["kind"] == "compute"
                and r["name"].startswith(f"_ovh_{k}")] for k in (1, 6)}
    copies = [r["end"] - r["start"] for r in recs if r["kind"] == "copy"]
    c1, c6 = med(control[1]), med(control[6])
    w1, w6 = med(work[1]), med(work[6])
    mine = {"req_launch_s": max(0.0, (c6 - c1) / 5), "req_task_s": max(0.0, (w6 - w1) / 5)}
    mine["launch_s"] = max(0.0, c1 - mine["req_launch_s"])
    mine["task_s"] = max(0.0, w1 - mine["req_task_s"])
    mine["copy_launch_s"] = max(0.0, med(copied) - med(plain)) if copied else 0.0
    mine["copy_s"] = 0.0
    # Copies: subtract what the link model already charges (latency + bytes / bw).
    if copies and n > 1:
        from .machine import Machine

        ln = Machine.local().links[0]
        nbytes = tile_rows * 16 * 4
        mine["copy_s"] = max(0.0, med(copies) - ln.latency - nbytes / ln.bandwidth)
    figures = _bcast(mine)
    return RuntimeOverhead(machine="", **figures)


def calibrated_overhead(machine: Any, verbose: bool = False) -> RuntimeOverhead:
    """The local machine model calibrated through the layer API on synthetic
    models (:mod:`legionpy.optimizer.calibration`): control-thread and worker
    terms by least squares, the kernels' concurrency slowdown, the cores and
    the control threads. Collective under MPI."""
    from ..runtime import get_runtime
    from .calibration import calibrate_layer_overhead, local_cores, measure_kernel_concurrency

    rt = get_runtime()
    figures = calibrate_layer_overhead(machine, verbose=verbose)
    conc = measure_kernel_concurrency()
    calib = dict(figures.pop("calibration"), **conc)
    ranks = 1 + max((d.rank for d in rt.devices), default=0)
    ranks = max(ranks, int(getattr(rt, "size", 1) or 1))
    cores = _bcast(local_cores())
    return RuntimeOverhead(kernel_scale=conc["kernel_scale"],
                           kernel_scale_mem=conc["kernel_scale_mem"],
                           intensity_compute=conc["intensity_compute"],
                           intensity_mem=conc["intensity_mem"], cores=cores,
                           control_threads=ranks, source="layer-api", machine=machine.name,
                           calibration=calib, **figures)


def runtime_overhead(machine: Any, refresh: bool = False, source: str = "layer",
                     verbose: bool = False) -> RuntimeOverhead:
    """The runtime's overhead on this machine, cached per machine name in
    ``$LEGIONPY_CACHE/overhead-v3-NAME.json`` (``overhead-v3-empty-NAME.json``
    for ``source="empty"``); collective under MPI. ``source``: ``"layer"``
    (default, :func:`calibrated_overhead`) or ``"empty"``
    (:func:`measure_runtime_overhead`, empty tasks, no CPU model)."""
    from .strategy import atomic_write_json

    if source not in ("layer", "empty"):
        raise ValueError(f"runtime_overhead: source {source!r} is not 'layer' or 'empty'")
    path = _overhead_path(machine.name if source == "layer" else f"empty-{machine.name}")
    have = None
    if not refresh and os.path.exists(path):
        try:
            with open(path) as f:
                have = json.load(f)
        except (OSError, ValueError):
            have = None
    have = _bcast(have)  # every rank takes rank 0's decision
    if have is not None:
        return RuntimeOverhead(**{k: have[k] for k in RuntimeOverhead.__dataclass_fields__
                                  if k in have})
    if source == "layer":
        ovh = calibrated_overhead(machine, verbose=verbose)
    else:
        ovh = measure_runtime_overhead()
        ovh.machine = machine.name
    from ..runtime import get_runtime

    if get_runtime().rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_json(path, ovh.to_dict())
    return ovh


# -- simulation with the runtime's overhead --------------------------------------------------

_NAME = re.compile(r"^(?P<phase>[A-Za-z]+):(?P<what>[^\[@]+)(?:\[(?P<k>[^\]]*)\])?")


def _issue_keys(tasks: list[dict], preds: list[list[int]], succs: list[list[int]],
                op_index: dict[str, int], param_index: dict[str, int]) -> list[tuple]:
    """A sort key per task giving the runtime's launch order (module doc).
    Names that do not parse fall back to the task id, keeping the order stable."""
    keys: list[tuple | None] = [None] * len(tasks)
    for t in tasks:
        if t["kind"] == "copy":
            continue
        m = _NAME.match(t["name"])
        tid = t["id"]
        if m is None:
            keys[tid] = (3, 0, tid, 0)
            continue
        phase, what = m.group("phase"), m.group("what")
        base = what.split(".")[0]
        if phase == "F" and base in op_index:
            keys[tid] = (0, op_index[base], tid, 1)
        elif phase == "B" and base in op_index:
            keys[tid] = (1, -op_index[base], tid, 1)
        elif what in param_index:
            keys[tid] = (2, param_index[what], tid, 1)
        else:
            keys[tid] = (3, 0, tid, 1)
    # a copy is issued with (just before) its first issued consumer
    for t in reversed(tasks):
        if t["kind"] != "copy":
            continue
        cons = [keys[s] for s in succs[t["id"]] if keys[s] is not None]
        if cons:
            k = min(cons)
            keys[t["id"]] = (k[0], k[1], k[2], 0)
        else:
            keys[t["id"]] = (3, 0, t["id"], 0)
    return keys  # type: ignore[return-value]


def _requirements(tasks: list[dict], graph: Any, update_fields: int) -> list[int]:
    """Region requirements (argument x field) of every task, as the layer API
    launches them (legionpy/nn/execution.py): ``F(op)`` writes its output and
    reads its inputs and weights; ``B(op)`` reads the output's value (and
    gradient, but for the last op), each input's value (and reduces its
    gradient when its producer has a backward) and reduces each weight's
    gradient besides reading it; ``U(param)`` reads and writes ``w``, ``g``
    and the optimizer's state (``update_fields`` in all). 1 when unknown."""
    ops = {op.name: op for op in graph.ops} if graph is not None else {}
    last = graph.ops[-1].name if graph is not None and graph.ops else None
    out = []
    for t in tasks:
        m = _NAME.match(t["name"]) if t["kind"] != "copy" else None
        op = ops.get(m.group("what").split(".")[0]) if m is not None else None
        if m is None:
            out.append(0 if t["kind"] == "copy" else 1)
        elif m.group("phase") == "U":
            out.append(update_fields)
        elif op is None:
            out.append(1)
        elif m.group("phase") == "F":
            out.append(1 + len(op.inputs) + len(op.params))
        else:
            ins = sum(2 if ref.op.has_backward else 1 for ref in op.inputs)
            out.append((1 if op.name == last else 2) + ins + 2 * len(op.params))
    return out


def _kernel_scales(tasks: list[dict], graph: Any, overhead: RuntimeOverhead) -> list[float]:
    """Each task's kernel concurrency slowdown (:meth:`RuntimeOverhead.scale_for`)
    from its op's arithmetic intensity (whole output; ``F`` forward, ``B``
    backward); updates are memory-bound; copies are not scaled."""
    if overhead.kernel_scale == 1.0 and overhead.kernel_scale_mem == 1.0:
        return [1.0] * len(tasks)
    ops = {op.name: op for op in graph.ops} if graph is not None else {}
    memo: dict[tuple, float] = {}
    out = []
    for t in tasks:
        m = _NAME.match(t["name"]) if t["kind"] != "copy" else None
        if t["kind"] == "copy":
            out.append(1.0)
            continue
        if m is not None and m.group("phase") == "U":
            out.append(overhead.scale_for(overhead.intensity_mem))
            continue
        op = ops.get(m.group("what").split(".")[0]) if m is not None else None
        if op is None:
            out.append(overhead.scale_for(None))
            continue
        k = (op.name, m.group("phase"))
        if k not in memo:
            try:
                rect = op.output_rect
                fl, by = op.flops(rect), op.bytes(rect)
                j = 0 if m.group("phase") == "F" else 1
                memo[k] = overhead.scale_for(fl[j] / by[j] if by[j] > 0 else None)
            except Exception:  # an op without a cost formula: the GEMM's factor
                memo[k] = overhead.scale_for(None)
        out.append(memo[k])
    return out


def simulate_with_runtime(taskgraph: dict, overhead: RuntimeOverhead, graph: Any = None,
                          pipelined: bool = False, update_fields: int = 2) -> dict[str, Any]:
    """Re-schedule a simulator task graph (``TaskGraph.to_json()``: tasks with
    ``duration_s`` and ``device``, ``deps``) with ``overhead`` (module doc).
    ``graph``: the operator graph, for the launch order and each task's
    region requirements (else: id order, one requirement per task).
    ``pipelined``: the steady state of ``fit``, which launches step i+1
    before waiting for step i, so the control thread works one step ahead of
    the devices: the iteration takes the longer of the control thread's
    work and the devices' schedule (tasks ready when their inputs are, the
    control thread's issue times dropped). Otherwise (one step, then wait)
    every task also waits for its issue. Returns ``{"iteration_time_s",
    "per_device_busy_s", "control_busy_s", "schedule_s"}``."""
    tasks = taskgraph["tasks"]
    n = len(tasks)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for a, b in taskgraph["deps"]:
        preds[b].append(a)
        succs[a].append(b)
    op_index: dict[str, int] = {}
    param_index: dict[str, int] = {}
    if graph is not None:
        for i, op in enumerate(graph.ops):
            op_index[op.name] = i
            for p in op.params.values():
                param_index.setdefault(p.name, len(param_index))
    keys = _issue_keys(tasks, preds, succs, op_index, param_index)
    reqs = _requirements(tasks, graph, update_fields)
    # the control thread issues every task in launch order
    issued = [0.0] * n
    clock = overhead.step_s
    for tid in sorted(range(n), key=lambda i: keys[i]):
        is_copy = tasks[tid]["kind"] == "copy"
        clock += overhead.copy_launch_s if is_copy else overhead.control_s(reqs[tid])
        issued[tid] = clock
    scale = _kernel_scales(tasks, graph, overhead)
    dur = [t["duration_s"] + overhead.copy_s if t["kind"] == "copy"
           else t["duration_s"] * scale[i] + overhead.worker_s(reqs[i])
           for i, t in enumerate(tasks)]
    waiting = [len(p) for p in preds]
    ready = [0.0] * n if pipelined else list(issued)
    heap = [(ready[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    free: dict[str, float] = {}
    busy: dict[str, float] = {}
    end = [0.0] * n
    done = 0
    while heap:
        r, i = heapq.heappop(heap)
        res = tasks[i]["device"]
        start = max(r, free.get(res, 0.0))
        end[i] = start + dur[i]
        free[res] = end[i]
        busy[res] = busy.get(res, 0.0) + dur[i]
        done += 1
        for s in succs[i]:
            ready[s] = max(ready[s], end[i])
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (ready[s], s))
    if done != n:
        raise ValueError(f"task graph has a cycle: {n - done} of {n} tasks never ran")
    devices = {t["device"] for t in tasks if t["kind"] != "copy"}
    sched = max(end, default=0.0)
    # the cores are shared by the devices' workers, the links and the control threads
    cpu = ((sum(busy.values()) + overhead.control_threads * clock) / overhead.cores
           if overhead.cores > 0 else 0.0)
    # one interpreter lock per process: its control thread and its workers' Python
    # work around the kernels (the devices' share of this process) run one at a time
    py = sum(dur[i] - tasks[i]["duration_s"] * scale[i]
             for i in range(n) if tasks[i]["kind"] != "copy")
    gil = clock + py / max(1, overhead.control_threads) if overhead.cores > 0 else 0.0
    it = max(sched, clock) if pipelined else sched
    return {"iteration_time_s": max(it, cpu, gil), "gil_bound_s": gil,
            "per_device_busy_s": {d: busy.get(d, 0.0) for d in sorted(devices)},
            "control_busy_s": clock, "schedule_s": sched, "cpu_bound_s": cpu}


def simulate_strategy(graph: Any, machine: Any, strategy: Any, cost_model: Any = "measured",
                      overhead: RuntimeOverhead | None = None, pipelined: bool = True
                      ) -> dict[str, Any]:
    """Simulate one iteration; ``cost_model``: a CostModel, a ``--cost``
    spec, or ``"contended"`` (tile kernels timed with every other device of
    the machine running the same kernel, :class:`~legionpy.optimizer.calibration.
    ContendedCostModel`; the overhead's concurrency factors are then not applied).
    Returns the simulator's ``SimResult.to_dict()`` plus
    ``kernel_time_s`` (the plain simulator's iteration time); with
    ``overhead``, ``iteration_time_s`` and ``per_device_busy_s`` are those
    of :func:`simulate_with_runtime` and ``overhead`` is recorded."""
    from .costmodel import CostModel, cost_model_from_spec
    from .simulator import Simulator

    if cost_model == "contended":
        # kernels timed with the other devices busy: no further concurrency scaling
        from .calibration import ContendedCostModel

        cm = ContendedCostModel.local(max(1, len(machine.devices)))
        if overhead is not None:
            overhead = replace(overhead, kernel_scale=1.0, kernel_scale_mem=1.0)
    else:
        cm = cost_model if isinstance(cost_model, CostModel) \
            else cost_model_from_spec(cost_model)
    sim = Simulator(graph, machine, cm)
    res = sim.run(strategy)
    out = res.to_dict()
    out["kernel_time_s"] = res.iteration_time_s
    out["kernel_per_device_busy_s"] = dict(res.per_device_busy_s)
    if overhead is not None and not overhead.is_zero:
        tg = sim.tg.to_json(include_times=False)
        r = simulate_with_runtime(tg, overhead, graph, pipelined=pipelined)
        out["iteration_time_s"] = r["iteration_time_s"]
        out["per_device_busy_s"] = {d: r["per_device_busy_s"].get(d, 0.0)
                                    for d in res.per_device_busy_s}
        out["control_busy_s"] = r["control_busy_s"]
        out["schedule_s"] = r["schedule_s"]
        out["cpu_bound_s"] = r["cpu_bound_s"]
        out["gil_bound_s"] = r["gil_bound_s"]
    out["overhead"] = overhead.to_dict() if overhead is not None else None
    return out


# -- the real run ----------------------------------------------------------------------------

def measure_runtime(model: Any, strategy: Any, machine: Any, steps: int = 5, warmup: int = 2,
                    seed: int = 0) -> dict[str, Any]:
    """Compile ``model`` (an uncompiled ``nn.Model``) with ``strategy`` and
    train ``warmup + steps`` batches in ONE ``fit`` call, as training runs
    (``fit`` launches step i+1 before waiting for step i, so the control
    thread's analysis overlaps the devices' work). ``on_step`` stamps the
    moment each step's loss arrives; the steady-state iteration time is the
    time from the end of the last warm-up step to the end of the last step,
    divided by ``steps`` (max over ranks). Returns ``{"measured_time_s",
    "measured_step_times_s" (the stamps' differences), "measured_per_device_busy_s"
    (trace busy time inside that window, per step), "measured_control_cpu_s" (CPU
    seconds of the calling -- control -- thread per step: median step, max over
    ranks),
    "final_loss"}``.
    Collective under MPI."""
    from .. import data as D
    from .. import nn
    from .. import runtime as lr

    rt = lr.get_runtime()
    model.compile(optimizer=nn.SGD(lr=1e-3), loss="sparse_categorical_crossentropy",
                  strategy=strategy, machine=machine)
    b = model.batch_size
    warmup = max(1, warmup)
    total = warmup + steps
    try:
        xs, y = D.for_model(model, total * b, seed=seed)
    except (ValueError, TypeError):  # not a zoo-shaped model: random data of its shapes
        xs, y = _random_data(model.graph, total * b, seed)
    stamps: list[float] = []
    cpu: list[float] = []  # the control (calling) thread's CPU time at each step

    def on_step(i: int, logs: dict) -> None:
        stamps.append(time.perf_counter())
        cpu.append(time.thread_time())

    lr.fence()
    rt.trace.start()
    h = model.fit(xs, y, epochs=1, verbose=0, shuffle=False, on_step=on_step)
    lr.fence()
    recs = rt.trace.stop()
    rt.trace.clear()
    if len(stamps) != total:
        raise RuntimeError(f"measure_runtime: {len(stamps)} steps reported, {total} launched")
    times = [stamps[i] - stamps[i - 1] for i in range(warmup, total)]
    period = (stamps[-1] - stamps[warmup - 1]) / steps
    lo, hi = stamps[warmup - 1] - rt.trace.t0, stamps[-1] - rt.trace.t0
    busy: dict[int, float] = {}
    for r in recs:
        if r["device"] is not None and r["kind"] in ("compute", "update"):
            v = min(r["end"], hi) - max(r["start"], lo)
            if v > 0:
                busy[r["device"]] = busy.get(r["device"], 0.0) + v
    names = {d.id: d.name for d in machine.devices}
    merged: dict[str, float] = {names.get(d, str(d)): 0.0 for d in names}
    for part in _gather(busy):
        for d, v in part.items():
            key = names.get(d, str(d))
            merged[key] = merged.get(key, 0.0) + v / steps
    all_times = _gather(times)
    control_cpu = statistics.median(cpu[i] - cpu[i - 1] for i in range(warmup, total))
    return {"measured_time_s": max(_gather(period)),
            "measured_control_cpu_s": max(_gather(control_cpu)),
            "measured_step_times_s": [max(ts) for ts in zip(*all_times)],
            "measured_per_device_busy_s": merged, "final_loss": float(h["step_loss"][-1])}


def _random_data(graph: Any, n: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Seeded inputs and class labels of ``graph``'s shapes (float inputs
    ~ N(0, 1), integer inputs in [0, 2), one label per output row)."""
    rng = np.random.default_rng(seed)
    xs = []
    for op in graph.ops:
        if op.kind != "input":
            continue
        shape = (n, *op.output_shape[1:])
        if np.dtype(op.dtype).kind in "iu":
            xs.append(rng.integers(0, 2, shape).astype(op.dtype))
        else:
            xs.append(rng.standard_normal(shape).astype(op.dtype))
    out = graph.ops[-1].output_shape
    y = rng.integers(0, out[-1], (n, *out[1:-1])).astype(np.int64)
    return xs, y


@dataclass
class FidelityResult:
    """Simulated vs measured figures of one (model, strategy) on the local machine."""

    model: str
    strategy: str
    machine: str
    cost_model: str
    steps: int
    iteration_time_s: float
    measured_time_s: float
    relative_error: float
    per_device_busy_s: dict = field(default_factory=dict)
    measured_per_device_busy_s: dict = field(default_factory=dict)
    measured_step_times_s: list = field(default_factory=list)
    kernel_time_s: float = 0.0
    kernel_relative_error: float = 0.0
    bytes_moved: float = 0.0
    num_tasks: int = 0
    overhead: dict | None = None
    simulation: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table_row(self) -> str:
        return (f"{self.model:<10} {self.strategy:<12} {self.iteration_time_s * 1e3:>9.2f} "
                f"{self.measured_time_s * 1e3:>9.2f} {self.relative_error * 100:>6.1f}%")


def _strategy_label(spec: Any) -> str:
    if isinstance(spec, (str, os.PathLike)):
        return os.fspath(spec)
    return "given"


def compare(model: Any, strategy: Any = "data", *, scale: str = "small",
            sizes: dict | None = None, cost: Any = "measured", steps: int = 5, warmup: int = 2,
            overhead: bool | RuntimeOverhead = True, seed: int = 0,
            machine: Any = None) -> FidelityResult:
    """Simulate ``model`` under ``strategy`` on the local machine, run it for
    real, and compare (module doc).

    ``model``: a zoo name (built with ``scale`` and ``sizes``) or an
    uncompiled ``nn.Model``; ``strategy``: ``"data" | "model" | "owt" |
    "expert" | "search"``, a JSON path or a Strategy; ``cost``: a CostModel
    or ``"measured" | "analytic" | FILE``; ``overhead``: True to add the
    measured :class:`RuntimeOverhead` of this machine (cached), False for
    the plain simulator, or given figures. Uses the current runtime (start
    it first, e.g. ``lp.init(cpus=2)``); collective under MPI, every rank
    returns rank 0's simulation and the job's measurement."""
    from .. import models as zoo
    from ..nn.strategies import resolve_strategy
    from .machine import Machine

    name = model if isinstance(model, str) else getattr(model.graph, "name", "model")
    m = zoo.build(model, scale=scale, seed=seed, **(sizes or {})) if isinstance(model, str) \
        else model
    machine = machine or Machine.local()
    strat = resolve_strategy(strategy, m.graph, machine)
    if overhead is True:
        ovh: RuntimeOverhead | None = runtime_overhead(machine)
    elif overhead is False or overhead is None:
        ovh = None
    else:
        ovh = overhead
    sim = simulate_strategy(m.graph, machine, strat, cost, ovh)
    sim = _bcast(sim)
    real = measure_runtime(m, strat, machine, steps=steps, warmup=warmup, seed=seed)
    t_sim, t_real = sim["iteration_time_s"], real["measured_time_s"]
    return FidelityResult(
        model=name, strategy=_strategy_label(strategy), machine=machine.name,
        cost_model=cost if isinstance(cost, str) else type(cost).__name__, steps=steps,
        iteration_time_s=t_sim, measured_time_s=t_real,
        relative_error=relative_error(t_sim, t_real),
        per_device_busy_s=sim["per_device_busy_s"],
        measured_per_device_busy_s=real["measured_per_device_busy_s"],
        measured_step_times_s=real["measured_step_times_s"],
        kernel_time_s=sim["kernel_time_s"],
        kernel_relative_error=relative_error(sim["kernel_time_s"], t_real),
        bytes_moved=sim["bytes_moved"], num_tasks=sim["num_tasks"], overhead=sim["overhead"],
        simulation={**{k: v for k, v in sim.items() if k not in ("per_device_busy_s",)},
                    "measured_control_cpu_s": real["measured_control_cpu_s"]})
