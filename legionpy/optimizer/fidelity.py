"""Fidelity, the simulation side: the runtime-overhead model of the local
machine and the re-scheduler that adds it to the simulator (issue 9 item 3).

:func:`legionpy.measure.compare` runs a model for real and compares it with
:func:`simulate_strategy`; the code that trains real models lives there
(above ``nn``), this module only simulates.

The machine model of a Python runtime
-------------------------------------
Kernel timings (:class:`~legionpy.optimizer.costmodel.MeasuredCostModel`)
say what the *kernels* cost. On a CPU with small models, legionpy's own
per-task work in Python is of the same order: the control thread analyses
every point task (dependences, mapping, coherence) before a worker can run
it, and each worker spends time on a task's prologue and epilogue around
the kernel. Legion has the same costs; FlexFlow's simulator leaves them
out because its GPU kernels dwarf them. :class:`RuntimeOverhead` holds
them, measured once per machine with empty tasks (never with the models
being compared; :func:`legionpy.probe.overhead.measure_runtime_overhead`):
``launch_s`` + ``req_launch_s`` per region requirement (control
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
(:func:`legionpy.measure.runtime_overhead` ``source="layer"``) the terms are calibrated
THROUGH THE LAYER API on synthetic models only
(:mod:`legionpy.measure.calibration`: least squares of the control
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
``$LEGIONPY_CACHE/overhead-v27-MACHINE[-bound].json``.

The interpreter lock and the cores are *processor-shared* (issue 26,
:mod:`.sharing`): every device and link is a thread of its process (devices
numbered rank-major, ``control_threads`` processes). A task's Python work
-- its worker overhead, the first ``gil_kernel_s`` of its kernel (numpy's
dispatch and small loops; larger loops release the lock), or its measured
``lock_share`` of it where that is longer (small convolutions and pools
hold the lock for most of their time: :mod:`.lockshare`; a share over 1,
numpy handing the lock over at every call, also slows two such kernels of
one process beside each other), and a copy's
``copy_s`` -- is interleaved with the rest of it; a process's running
threads get its lock first come, first served (the control thread first:
pipelined, it runs ``control_s`` of every task from when the step's loss
arrives, as ``fit`` launches the next step then), so small-kernel tasks of
one process run one at a time and lock-releasing ones overlap, slowed by
``gil_switch`` while they interleave; a worker whose queue was empty wakes
in ``wake_s``, and so does one whose task waited for the lock, when it
gets it; a copy between two processes keeps a core busy on each side
(both wait on the transfer); all threads share ``cores`` (ranks bound to
their own blocks of them, ``bound``, share only their block:
legionpy/affinity.py). So two Python-bound tasks of one process take twice
as long as one, and of two processes (``mpirun``) as long as one.

Ranks of one core each (``mpirun -n 2`` on this 2-core machine; not two
ranks to a core, :func:`_one_core_each`) are not pipelined whatever
``pipelined`` says: the control thread yields its core every 25 us and the
OS hands it to a device worker for the rest of a kernel, so it does not
run a step ahead (a step's replay took 4.3-8.1 ms to submit, for 0.8 ms of
work; 28 Nov). There it runs from the step's start *behind* the rank's
other threads, on the lock and the core they leave, and each task waits
until every rank it runs on has issued it (:func:`.sharing.share_schedule`'s
``issue``). On the saved measurements of five ``mpirun -n 2`` benches, each
with its lock terms fitted again under either model, the mean error went
9.0/12.2/10.6/13.3/11.5 -> 8.4/9.8/8.2/11.5/9.6% and the worst row
22.5/27.9/22.7/22.9/26.3 -> 20.3/19.4/16.2/20.6/23.4%, and the fit
explained the calibration's own rows better in all five
(docs/decisions.md). Its lock fit takes about as long as the plain
model's did (40 s against 35 on one calibration's rows) because the ranks
share the fit (:func:`legionpy.measure.calibration.fit_lock_terms_on_ranks`;
taken whole on every rank, it took 88 s). Each
device and link stays FIFO in order of readiness: the task graph and every
resource's order are the simulator's, only the durations stretch. These
terms are fitted on synthetic models
(:func:`legionpy.measure.calibration.fit_lock_terms`). ``gil_kernel_s``
None (or ``cores`` 0) turns the sharing off: a plain list schedule (only
the ``gil_bound_s`` bound remains).

:func:`kendall_tau` is Kendall's tau-b (ties handled), for the rank order
of strategies in ``bench/fidelity.py``.

>>> round(kendall_tau([1, 2, 3, 4], [10, 20, 40, 30]), 4)
0.6667
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from ..affinity import core_blocks
from .breakdown import breakdown, sim_timeline
from .lockshare import contention
from .trace import write_chrome_trace

__all__ = ["RuntimeOverhead", "simulate_with_runtime", "simulate_strategy", "kendall_tau",
           "relative_error", "requirement_counts", "device_reduce_byte_s", "REDUCE_PASSES",
           "annotate_lock_shares"]


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
    #: seconds a copy between two processes waits besides its transfer and
    #: ``copy_s``, using neither a core nor the lock: the sending link
    #: thread's wake-up and the receiving one's next poll (runtime/mpi.py
    #: ``Cluster.wait``), which a ping-pong between blocked ranks never sees
    #: (fitted under ``mpirun``: :func:`legionpy.measure.calibration.fit_lock_terms`)
    hop_s: float = 0.0
    req_launch_s: float = 0.0
    req_task_s: float = 0.0
    #: worker seconds a backward task costs beyond ``task_s`` (its gradient
    #: reductions: buffers to fill and fold; regressed with the others)
    back_task_s: float = 0.0
    #: worker seconds an update task costs beyond ``task_s`` (folding the
    #: weights' gradients in, the optimizer's Python; measured on one device);
    #: not charged to an update after a reduce-scatter, which folded them
    update_task_s: float = 0.0
    #: worker seconds per gradient a backward task reduces (the runtime's
    #: reduction buffer and view, the fold's Python; measured on one device)
    reduce_req_s: float = 0.0
    #: worker seconds per reduction buffer a step allocates, fills and folds,
    #: beyond ``reduce_req_s`` per contribution (:func:`gradient_buffers`:
    #: an RNN's shared weights have one buffer per device that every time
    #: step's cell reduces into); 0 where the calibration could not tell the
    #: two apart
    reduce_buf_s: float = 0.0
    #: worker seconds after each task's body (finishing it, releasing its
    #: successors, taking the next task from its queue: Python), and more per
    #: copy among its successors (handing the copy to its link's thread):
    #: measured as the workers' CPU time between their tasks
    #: (:meth:`legionpy.runtime.core.Runtime.worker_span_cpu`; 6-8 us a task
    #: on the project's machine, which the tasks' spans never showed)
    finish_s: float = 0.0
    finish_copy_s: float = 0.0
    #: worker seconds per byte of a backward task's gradient reductions: each
    #: gradient it reduces (of its inputs and weights) is an identity-filled
    #: buffer it accumulates into and its reader folds in (seven passes over
    #: its bytes: fill 1, += 3, fold 3) at the measured stream rate (a GPU
    #: machine's: its GPUs' memory bandwidth, :func:`device_reduce_byte_s`)
    #: (:func:`reduction_bytes`; the synthetic models' gradients are too small
    #: to fit it: zoo backward tasks took 50-250 us beyond their kernels)
    reduce_byte_s: float = 0.0
    #: control-thread seconds per step besides its tasks (fit's loop, loss readback)
    step_s: float = 0.0
    #: kernels' slowdown when every device runs at once (measured, >= 1): a
    #: compute-bound GEMM's, a memory-bound stream's, and their intensities
    kernel_scale: float = 1.0
    kernel_scale_mem: float = 1.0
    intensity_compute: float = 0.0
    intensity_mem: float = 0.0
    #: CPU cores shared by the control threads and the devices (0: no CPU bound);
    #: fractional when other programs use part of the machine (:meth:`under_load`)
    cores: float = 0
    #: control threads on this host (ranks of the job)
    control_threads: int = 1
    #: the interpreter lock as a scheduled resource (one per process; with
    #: ``cores``): a task holds it for its worker overhead, at most this many
    #: seconds of its kernel (numpy's dispatch around the loops that release
    #: it) and, pipelined, the control thread's launch of it. None: no lock
    #: schedule (only the ``gil_bound_s`` bound)
    gil_kernel_s: float | None = None
    #: the lock's hand-over cost under contention (with ``gil_kernel_s``): a
    #: process's lock delivers ``1 / (1 + gil_switch)`` seconds of Python work
    #: per second while two or more of its threads want it (calibrated on the
    #: synthetic models, :func:`legionpy.measure.calibration.fit_lock_terms`)
    gil_switch: float = 0.0
    #: seconds a device's or link's worker thread takes to wake up when a task
    #: arrives at its idle queue, or when the lock its task waited for comes
    #: to it (with ``gil_kernel_s``; calibrated likewise)
    wake_s: float = 0.0
    #: who gets a contended lock: ``"fcfs"`` (the thread that has held it
    #: longest keeps it while it has work: the convoy) or ``"fair"`` (max-min
    #: fair shares), :mod:`.sharing`
    gil_order: str = "fcfs"
    #: a collective between ranks takes at least ``coll_s + coll_byte_s *
    #: bytes`` (its buffer's): the runtime's MPI transport measured
    #: (:func:`legionpy.probe.overhead.measure_mpi_collectives`), where the
    #: machine model's links (a blocking ping-pong) see a few microseconds
    coll_s: float = 0.0
    coll_byte_s: float = 0.0
    #: seconds a collective inside one process costs besides its bytes: its
    #: prologue's folds of the gradient buffers and the rule's steps in
    #: Python (measured: :func:`legionpy.measure.calibration.measured_collective_cost`)
    local_coll_s: float = 0.0
    #: each rank bound to its own block of the ``cores`` (legionpy/affinity.py,
    #: as the runtime binds the ranks of an MPI job): a process's threads share
    #: its block, not every core of the node
    bound: bool = False
    #: how much longer a kernel runs on a rank whose threads share one core
    #: (``bound``, a core each) than timed alone: the rank's control, link
    #: and communicator threads time-slice that core with its worker (a
    #: Python thread working 15 us of every 50 beside alexnet's tiles took
    #: 34% more of their CPU time; alexnet's data step under ``mpirun -n 2``
    #: used 7-15% more worker CPU than the model gave it, 28 Nov), fitted with
    #: the lock terms (:func:`legionpy.measure.calibration.fit_lock_terms`)
    one_core_scale: float = 1.0
    #: the share of its core a rank whose threads share one core loses to a
    #: pending collective's waits: the communicator thread wakes every 50 us
    #: to poll MPI (runtime/mpi.py ``Cluster.wait``), and each wake-up takes
    #: the core from the worker's kernel (a 256 x 256 GEMM beside such a wait
    #: ran 1.28x as long in a bare script, 1.47-1.51x under ``mpirun -n 2``,
    #: 28 Nov); measured
    #: (:func:`legionpy.probe.overhead.measure_poll_share`), used only where
    #: :meth:`one_core_ranks`
    poll_share: float = 0.0
    #: "layer-api" (calibrated on synthetic models) or "empty-tasks"
    source: str = "empty-tasks"
    machine: str = ""
    calibration: dict | None = None

    def one_core_ranks(self) -> bool:
        """Whether the job's ranks are bound a core each (``one_core_scale``
        and ``poll_share`` apply; a rank's control thread issues behind its
        workers).

        >>> RuntimeOverhead(cores=2, control_threads=2, bound=True).one_core_ranks()
        True
        >>> RuntimeOverhead(cores=2, control_threads=1).one_core_ranks()
        False
        """
        return self.bound and _one_core_each(_core_groups(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_zero(self) -> bool:
        return not (self.launch_s or self.copy_launch_s or self.task_s or self.copy_s
                    or self.hop_s
                    or self.req_launch_s or self.req_task_s or self.step_s or self.cores
                    or self.back_task_s or self.reduce_byte_s or self.update_task_s
                    or self.reduce_req_s or self.reduce_buf_s or self.local_coll_s
                    or self.kernel_scale != 1.0)

    def under_load(self, background_cores: float | None) -> RuntimeOverhead:
        """These figures on a machine where other programs keep
        ``background_cores`` cores busy (measured over the run,
        :func:`~legionpy.probe.overhead.background_cores`): the job
        gets ``cores - background`` cores (at least 5% of one), processor
        sharing. Unchanged when nothing else ran or nothing was measured."""
        if not background_cores or self.cores <= 0:
            return self
        return replace(self, cores=max(0.05, self.cores - background_cores))

    def control_s(self, reqs: int) -> float:
        return self.launch_s + reqs * self.req_launch_s

    def worker_s(self, reqs: int, backward: bool = False, update: bool = False) -> float:
        return (self.task_s + reqs * self.req_task_s + (self.back_task_s if backward else 0.0)
                + (self.update_task_s if update else 0.0))

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


# -- simulation with the runtime's overhead --------------------------------------------------

_NAME = re.compile(r"^(?P<phase>[A-Za-z]+):(?P<what>[^\[@]+)(?:\[(?P<k>[^\]]*)\])?")


def _op_name(what: str, ops: Any) -> str:
    """The op a task name's ``what`` part names: the whole of it when an op
    is called that (RNN cells are ``lstm0.t3``), else its part before a dot."""
    return what if what in ops else what.split(".")[0]


def annotate_lock_shares(taskgraph: dict, graph: Any,
                         shares: dict[tuple[str, str], float]) -> dict:
    """Set ``lock_share`` on the forward and backward tasks of
    ``taskgraph`` (``TaskGraph.to_json()``) whose op has a measured share
    (``{(op name, "F" | "B"): share}``, optimizer/lockshare.py), at most 1,
    and ``lock_contention`` where the share is over 1 (its
    :func:`~legionpy.optimizer.lockshare.contention`); returns ``taskgraph``."""
    if not shares or graph is None:
        return taskgraph
    ops = {op.name for op in graph.ops}
    for t in taskgraph["tasks"]:
        m = _NAME.match(t["name"]) if t["kind"] != "copy" else None
        if m is None or m.group("phase") not in ("F", "B"):
            continue
        share = shares.get((_op_name(m.group("what"), ops), m.group("phase")))
        if share:
            t["lock_share"] = min(1.0, share)
            k = contention(share)
            if k > 1.0:
                t["lock_contention"] = k
    return taskgraph


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
        base = _op_name(what, op_index)
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


def requirement_counts(tasks: list[dict], graph: Any, update_fields: int) -> list[int]:
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
        op = ops.get(_op_name(m.group("what"), ops)) if m is not None else None
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


def reduction_bytes(tasks: list[dict], graph: Any) -> list[float]:
    """Bytes of gradient each task reduces (:func:`gradient_reductions`)."""
    return gradient_reductions(tasks, graph)[0]


def _backward_op_names(tasks: list[dict], ops: dict) -> list[str | None]:
    """The op each ``B`` task of ``tasks`` runs the backward of (None for
    every other task)."""
    names: list[str | None] = []
    for t in tasks:
        m = _NAME.match(t["name"]) if t["kind"] != "copy" else None
        names.append(_op_name(m.group("what"), ops)
                     if m is not None and m.group("phase") == "B" else None)
    return names


def _reduced_inputs(op: Any) -> list:
    """The inputs of ``op`` whose gradients its backward reduces: those whose
    producer has a backward (with its weights, every gradient it reduces)."""
    return [ref for ref in op.inputs if ref.op.has_backward]


def gradient_reductions(tasks: list[dict], graph: Any) -> tuple[list[float], list[int]]:
    """``(bytes, gradients)`` each task reduces (legionpy/nn/execution.py
    ``B(op)``: the gradient of every input whose producer has a backward,
    and of every weight; of a sparsely updated embedding table, the rows
    the batch used: its output's bytes): bytes, the op's whole shared alike
    by its ``B`` tasks (equal tiles), and how many gradients; 0 for every
    other task and without a graph."""
    if graph is None:
        return [0.0] * len(tasks), [0] * len(tasks)
    from .graph import sparse_params

    sparse = sparse_params(graph)
    ops = {op.name: op for op in graph.ops}
    names = _backward_op_names(tasks, ops)
    points: dict[str, int] = {}
    for n in names:
        if n is not None:
            points[n] = points.get(n, 0) + 1
    whole: dict[str, tuple[float, int]] = {}
    for n in points:
        op = ops.get(n)
        if op is None:
            whole[n] = (0.0, 0)
            continue
        ins = _reduced_inputs(op)
        b = sum(float(np.prod(ref.op.output_shape)) * np.dtype(ref.op.dtype).itemsize
                for ref in ins)
        b += sum(float(np.prod(op.output_shape)) * np.dtype(op.dtype).itemsize
                 if p.name in sparse else float(p.nbytes) for p in op.params.values())
        whole[n] = (b, len(ins) + len(op.params))
    return ([whole[n][0] / points[n] if n is not None else 0.0 for n in names],
            [whole[n][1] if n is not None else 0 for n in names])


def gradient_buffers(tasks: list[dict], graph: Any) -> list[int]:
    """How many of the gradients each task reduces (:func:`gradient_reductions`)
    it is the first of its step to reduce on its device: the reduction
    buffers it allocates (runtime/instances.py: one per memory, root and
    field, shared by every reducer on that memory, the first allocates and
    fills it, a reader folds it once), in task order. A weight shared by an
    RNN's time steps has one buffer per device; an input's gradient one per
    producer. 0 for every other task and without a graph."""
    if graph is None:
        return [0] * len(tasks)
    ops = {op.name: op for op in graph.ops}
    seen: set[tuple] = set()
    out = []
    for t, name in zip(tasks, _backward_op_names(tasks, ops)):
        op = ops.get(name) if name is not None else None
        if op is None:
            out.append(0)
            continue
        keys = [("in", ref.op.name) for ref in _reduced_inputs(op)]
        keys += [("param", p.name) for p in op.params.values()]
        fresh = [(t["device"], k) for k in keys if (t["device"], k) not in seen]
        seen.update(fresh)
        out.append(len(fresh))
    return out


#: memory passes over a reduced gradient's bytes: the buffer's identity fill
#: (1), the task's ``+=`` (read two, write one) and the reader's fold (3)
REDUCE_PASSES = 7


def device_reduce_byte_s(machine: Any) -> dict[str, float]:
    """Seconds per byte of gradient reductions on each GPU of ``machine``:
    :data:`REDUCE_PASSES` passes at its memory bandwidth. A GPU reduces in
    its own memory; ``RuntimeOverhead.reduce_byte_s`` is the host's stream
    rate, measured for the CPU devices' reductions (a GPU machine charged at
    it predicted alexnet's step on an H200 at 355 ms for 89 measured,
    26 Nov). CPU devices are left to the overhead's figure."""
    return {d.name: REDUCE_PASSES / float(d.mem_bw) for d in getattr(machine, "devices", ())
            if d.kind == "gpu" and getattr(d, "mem_bw", 0)}


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
        op = ops.get(_op_name(m.group("what"), ops)) if m is not None else None
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
                          pipelined: bool = False, update_fields: int = 2,
                          update_scale: float = 1.0,
                          reduce_byte_s: dict[str, float] | None = None) -> dict[str, Any]:
    """Re-schedule a simulator task graph (``TaskGraph.to_json()``: tasks with
    ``duration_s`` and ``device``, ``deps``) with ``overhead`` (module doc).
    ``graph``: the operator graph, for the launch order and each task's
    region requirements (else: id order, one requirement per task).
    ``pipelined``: the steady state of ``fit``, which launches step i+1
    before waiting for step i, so the control thread works one step ahead of
    the devices: the iteration takes the longer of the control thread's
    work and the devices' schedule (tasks ready when their inputs are, the
    control thread's issue times dropped); not on ranks of one core each,
    whose control thread cannot run ahead (module doc). Otherwise (one
    step, then wait) every task also waits for its issue.
    ``update_fields``: region fields an update task reads and writes
    (weight, gradient and the optimizer's state); ``update_scale``: the
    optimizer's update kernel relative to the cost model's (plain SGD's;
    Adam makes ~4.7x the array passes,
    :func:`legionpy.measure.fidelity.optimizer_update_terms`). ``reduce_byte_s``:
    a device's seconds per byte of gradient reductions where it is not
    ``overhead.reduce_byte_s`` (measured on the host's memory): a GPU's
    (:func:`device_reduce_byte_s`). Returns ``{"iteration_time_s",
    "per_device_busy_s", "control_busy_s", "schedule_s", "per_device_wait_s"
    (what each device's tasks waited for a core or the lock),
    "per_device_finish_s" (its worker's work between them), ...}``."""
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
    reqs = requirement_counts(tasks, graph, update_fields)
    # the control thread issues every task in launch order
    issued = [0.0] * n
    clock = overhead.step_s
    for tid in sorted(range(n), key=lambda i: keys[i]):
        is_copy = tasks[tid]["kind"] == "copy"
        clock += overhead.copy_launch_s if is_copy else overhead.control_s(reqs[tid])
        issued[tid] = clock
    scale = _kernel_scales(tasks, graph, overhead)
    if overhead.one_core_scale != 1.0 and overhead.one_core_ranks():
        scale = [k * overhead.one_core_scale for k in scale]
    if update_scale != 1.0:
        for i, t in enumerate(tasks):
            if t["kind"] != "copy" and t["name"].startswith("U:"):
                scale[i] *= update_scale
    # a task's kernel: its op's, and a backward's gradient reductions (memory passes)
    kern = [0.0 if t["kind"] == "copy" else t["duration_s"] * scale[i] for i, t in
            enumerate(tasks)]
    op_kern = list(kern)
    rbytes, rgrads = gradient_reductions(tasks, graph)
    rbufs = gradient_buffers(tasks, graph) if overhead.reduce_buf_s else [0] * n
    per_byte = reduce_byte_s or {}
    if overhead.reduce_byte_s or per_byte:
        kern = [k + b * per_byte.get(t["device"], overhead.reduce_byte_s)
                for k, b, t in zip(kern, rbytes, tasks)]
    # an update after a reduce-scatter has its gradient folded by the
    # collective: update_task_s (measured on one device, where the update task
    # folds the gradient buffers itself) is not its cost (traced 27 Nov: such
    # updates took 13-160 us where it charged 100-400)
    folded = [t["name"].startswith("U:")
              and any(tasks[p]["kind"] == "collective" for p in preds[i])
              for i, t in enumerate(tasks)]
    # the worker's work after a task's body (breakdown "between")
    finish = [0.0 if t["kind"] in ("copy", "collective")
              else overhead.finish_s + overhead.finish_copy_s
              * sum(1 for j in succs[i] if tasks[j]["kind"] == "copy")
              for i, t in enumerate(tasks)] \
        if overhead.finish_s or overhead.finish_copy_s else [0.0] * n
    dur = [t["duration_s"] + overhead.copy_s if t["kind"] == "copy"
           else kern[i] + overhead.worker_s(reqs[i], t["name"].startswith("B:"),
                                            t["name"].startswith("U:") and not folded[i])
           + rgrads[i] * overhead.reduce_req_s + rbufs[i] * overhead.reduce_buf_s + finish[i]
           for i, t in enumerate(tasks)]
    proc = _processes(tasks, overhead.control_threads)
    between = overhead.coll_s or overhead.coll_byte_s
    if overhead.local_coll_s or between:  # collectives, as measured
        for i, t in enumerate(tasks):
            if t["kind"] != "collective":
                continue
            if not _spanned(t, proc):  # inside one process: its folds and steps
                dur[i] += overhead.local_coll_s
            elif between:  # between ranks: the MPI transport
                dur[i] = max(t["duration_s"],
                             overhead.coll_s + overhead.coll_byte_s * float(t.get("bytes", 0)))
    # a copy between processes also waits for its threads to see it (hop_s)
    hop = [overhead.hop_s if overhead.hop_s and t["kind"] == "copy" and _spanned(t, proc)
           else 0.0 for t in tasks]
    # the interpreter lock and the cores, processor-shared (issue 26, optimizer/sharing.py)
    locks = overhead.gil_kernel_s is not None and overhead.cores > 0
    if locks:
        loss = _loss_tasks(tasks, graph) if pipelined else []
        end, starts, admit, ctl_end = _shared_schedule(tasks, succs, dur, kern, op_kern,
                                                       proc, issued, overhead, pipelined,
                                                       clock, loss, hop)
        wait = [max(0.0, end[i] - admit[i] - dur[i] - hop[i] - overhead.wake_s)
                for i in range(n)]
    else:
        end, starts, _, wait = _list_schedule(tasks, preds, succs,
                                              [d + h for d, h in zip(dur, hop)],
                                              [0.0] * n if pipelined else list(issued))
        ctl_end = clock
    devices = {t["device"] for t in tasks if t["kind"] != "copy"}
    # each task's span, as a trace measures it: wall seconds, stretched by any
    # sharing, without its worker's finish; and what each device's tasks
    # waited for a core or the lock (breakdown "wait") and finished (its "between")
    busy: dict[str, float] = {}
    dev_wait: dict[str, float] = {}
    dev_finish: dict[str, float] = {}
    for i, t in enumerate(tasks):
        busy[t["device"]] = busy.get(t["device"], 0.0) + end[i] - starts[i] - finish[i]
        if t["kind"] in ("compute", "update"):
            dev_wait[t["device"]] = dev_wait.get(t["device"], 0.0) + wait[i]
            dev_finish[t["device"]] = dev_finish.get(t["device"], 0.0) + finish[i]
    sched = max(end, default=0.0)
    # the cores are shared by the devices' workers, the links and the control threads
    cpu = ((sum(dur) + overhead.control_threads * clock) / overhead.cores
           if overhead.cores > 0 else 0.0)
    # one interpreter lock per process: its control thread and its workers' Python
    # work around the kernels (the devices' share of this process) run one at a time
    py = sum(dur[i] - kern[i] for i in range(n) if tasks[i]["kind"] != "copy")
    gil = clock + py / max(1, overhead.control_threads) if overhead.cores > 0 else 0.0
    it = max(sched, ctl_end) if pipelined else sched
    # fewer than one core left to the job (a loaded machine): every serial chain
    # runs at that fraction of a core's speed (processor sharing has it already)
    slow = 1.0 / min(1.0, overhead.cores) if overhead.cores > 0 and not locks else 1.0
    it = it * slow
    gil = gil / min(1.0, overhead.cores) if overhead.cores > 0 else gil
    return {"iteration_time_s": max(it, cpu, gil), "gil_bound_s": gil,
            "per_device_busy_s": {d: busy.get(d, 0.0) for d in sorted(devices)},
            "control_busy_s": clock, "schedule_s": sched, "cpu_bound_s": cpu,
            "task_start_s": starts, "task_end_s": end, "task_finish_s": finish,
            "lock_wait_s": sum(wait),
            "per_device_wait_s": {d: dev_wait.get(d, 0.0) for d in sorted(devices)},
            "per_device_finish_s": {d: dev_finish.get(d, 0.0) for d in sorted(devices)}}


def _list_schedule(tasks: list[dict], preds: list, succs: list, dur: list,
                   ready: list) -> tuple:
    """The simulator's event rule with fixed durations: FIFO per resource in
    order of readiness, ties by id. Returns (end, start, busy, wait)."""
    n = len(tasks)
    waiting = [len(p) for p in preds]
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
    return end, [end[i] - dur[i] for i in range(n)], busy, [0.0] * n


def _shared_schedule(tasks: list[dict], succs: list, dur: list, kern: list,
                     op_kern: list, proc: dict[str, int], issued: list,
                     overhead: RuntimeOverhead, pipelined: bool,
                     clock: float, loss: Sequence[int] = (),
                     hop: Sequence[float] | None = None) -> tuple:
    """:func:`~legionpy.optimizer.sharing.share_schedule` of the tasks (module
    doc): a task's Python work is its worker overhead and the first
    ``gil_kernel_s`` of its kernel (``kern``: its op's, and a backward's
    gradient reductions; a copy's: ``copy_s``); the control
    thread of every process runs ``clock`` seconds of Python from the
    step's start, or, given the ``loss`` tasks, from when they end: ``fit``
    launches step i+1, then waits for step i's loss, then launches step i+2,
    so in the steady state the launch runs while the devices start the
    backward pass (where the small tasks of the last layers need the lock
    it holds), not beside the forward pass's large kernels. ``hop``: the
    seconds each task waits once it has its thread, using neither a core nor
    the lock (a copy between processes: ``hop_s``). Returns (end,
    start, admission, the control threads' longest stretch of work)."""
    from .sharing import share_schedule

    n = len(tasks)
    g = overhead.gil_kernel_s or 0.0
    procs, python, weight, spread = [], [], [], []
    for i, t in enumerate(tasks):
        procs.append(_process_of(t["device"], proc))
        span = _spanned(t, proc)
        spread.append(span)
        if span:
            # between processes: every member rank's link or communicator
            # thread waits on the transfer (spinning with time.sleep(0), then
            # napping: runtime/mpi.py Cluster.wait), using a core, and giving
            # the lock up at every turn (no hand-over cost) beyond the send's
            # dispatch; a collective's members are busy only while the data
            # moves (the machine model's time), napping between polls for the
            # rest of the measured transport time (coll_s), leaving their cores
            busy = min(1.0, t["duration_s"] / dur[i]) \
                if t["kind"] == "collective" and dur[i] > 0 else 1.0
            weight.append(len(span) * busy)
            python.append(min(1.0, min(dur[i], g) / dur[i]) if dur[i] > 0 else 0.0)
            continue
        weight.append(1.0)
        if t["kind"] == "copy":
            py = overhead.copy_s + min(t["duration_s"], g)
        else:
            # the kernel holds the lock for its first g seconds, or for its
            # measured share where that is longer (optimizer/lockshare.py)
            held = max(min(kern[i], g), t.get("lock_share", 0.0) * op_kern[i])
            py = dur[i] - kern[i] + min(kern[i], held)
        python.append(min(1.0, py / dur[i]) if dur[i] > 0 else 0.0)
    ranks = max(1, overhead.control_threads)
    groups = _core_groups(overhead) if overhead.bound else None
    # ranks of one core each: the control thread is not a step ahead (it
    # yields the core to the workers); tasks wait for their issue
    gate = list(issued) if overhead.one_core_ranks() else None
    r = share_schedule([t["device"] for t in tasks], procs, dur, python,
                       [0.0] * n if pipelined or gate else list(issued), succs,
                       cores=overhead.cores, switch=overhead.gil_switch,
                       control=[clock] * ranks, weight=weight, wake=overhead.wake_s,
                       fair=overhead.gil_order == "fair", spread=spread,
                       core_groups=groups, control_after=loss, delay=hop,
                       contention=[t.get("lock_contention", 1.0) for t in tasks], issue=gate,
                       poll=[overhead.poll_share if t["kind"] == "collective" and span else 0.0
                             for t, span in zip(tasks, spread)]
                       if gate is not None and overhead.poll_share > 0 else None)
    return r["end"], r["start"], r["admit"], max(
        (e - s for e, s in zip(r["control_end"], r["control_start"])), default=0.0)


def _loss_tasks(tasks: list[dict], graph: Any) -> list[int]:
    """The forward tasks of ``graph``'s last operator (its loss: the results
    ``fit`` waits for before launching the next step); none without a graph."""
    if graph is None or not getattr(graph, "ops", None):
        return []
    last = graph.ops[-1].name
    return [i for i, t in enumerate(tasks)
            if t["kind"] == "compute" and t["name"].startswith(f"F:{last}[")]


def _one_core_each(groups: dict[int, tuple[int, float]] | None) -> bool:
    """Whether every rank has a core of its own and no more (module doc:
    its control thread then issues behind its workers). Two ranks to a core
    (``mpirun -n 4`` on 2 cores) are not: the OS shares the core between
    the ranks, and the model with issues fitted the calibration's rows
    better there but put the zoo's rows 18.6% low on average, against 10.6%
    without (offline on the bench of 28 Nov, R16).

    >>> _one_core_each({0: (0, 1.0), 1: (1, 1.0)}), _one_core_each(None)
    (True, False)
    >>> _one_core_each({0: (0, 1.0), 1: (1, 1.0), 2: (0, 1.0), 3: (1, 1.0)})
    False
    """
    if not groups:
        return False
    blocks = [g for g, _ in groups.values()]
    return len(set(blocks)) == len(blocks) and max(c for _, c in groups.values()) <= 1.0


def _core_groups(overhead: RuntimeOverhead) -> dict[int, tuple[int, float]]:
    """Process -> (its block of cores, the block's cores) for ranks bound as
    the runtime binds them (:func:`legionpy.affinity.core_blocks`); a loaded
    machine's fractional ``cores`` scale every block alike.

    >>> _core_groups(RuntimeOverhead(cores=2, control_threads=2, bound=True))
    {0: (0, 1.0), 1: (1, 1.0)}
    >>> _core_groups(RuntimeOverhead(cores=2, control_threads=4, bound=True))
    {0: (0, 1.0), 1: (1, 1.0), 2: (0, 1.0), 3: (1, 1.0)}
    """
    whole = max(1, math.ceil(overhead.cores - 1e-9))
    scale = overhead.cores / whole
    blocks = core_blocks(range(whole), max(1, overhead.control_threads))
    ids: dict[tuple[int, ...], int] = {}
    return {p: (ids.setdefault(b, len(ids)), len(b) * scale) for p, b in enumerate(blocks)}


def _processes(tasks: list[dict], control_threads: int) -> dict[str, int]:
    """Device name -> the process (rank) it lives in: devices are numbered
    rank-major (runtime/devices.py), ``control_threads`` ranks on this host.
    Only devices count: a communicator (``comm:0-1``, a collective's
    resource) is not one, and counting it put both ranks' devices of a
    two-rank job in one process (its lock serialised them).

    >>> _processes([{"device": "cpu0", "kind": "compute"}, {"device": "cpu1", "kind": "compute"},
    ...             {"device": "comm:0-1", "kind": "collective"}], 2)
    {'cpu0': 0, 'cpu1': 1}
    """
    names = sorted({t["device"] for t in tasks
                    if t["kind"] not in ("copy", "collective") and "->" not in t["device"]
                    and not t["device"].startswith("comm:")},
                   key=lambda d: (len(re.sub(r"\D", "", d)), re.sub(r"\D", "", d), d))
    per = max(1, -(-len(names) // max(1, control_threads)))
    return {d: k // per for k, d in enumerate(names)}


def _comm_members(resource: str) -> list[int]:
    """Device numbers of a communicator ``comm:0-3,8`` (:func:`.taskgraph.comm_name`)."""
    out: list[int] = []
    for part in resource[len("comm:"):].split(","):
        a, _, b = part.partition("-")
        if a.isdigit():
            out.extend(range(int(a), int(b if b.isdigit() else a) + 1))
    return out


def _spanned(task: dict, proc: dict[str, int]) -> tuple[int, ...]:
    """The processes a copy or collective between ranks keeps busy (a copy's
    sender and receiver; a communicator's members' ranks, sorted); ``()``
    for any task inside one process."""
    res = task["device"]
    if task["kind"] == "copy" and "->" in res:
        src = _process_of(res, proc)
        dst = proc.get(res.split("->")[1].split("/")[0], src)
        return (src, dst) if dst != src else ()
    if task["kind"] == "collective" and res.startswith("comm:"):
        spans = {_process_of(f"comm:{k}", proc) for k in _comm_members(res)}
        return tuple(sorted(spans)) if len(spans) > 1 else ()
    return ()


def _process_of(resource: str, proc: dict[str, int]) -> int:
    """The process whose thread runs ``resource``: a device's; a link
    ``A->B``'s source's (its sender); a communicator ``comm:...``'s first
    member's (by device number)."""
    if resource in proc:
        return proc[resource]
    if "->" in resource:
        return proc.get(resource.split("->")[0], 0)
    if resource.startswith("comm:"):
        first = re.match(r"comm:(\d+)", resource)
        if first is not None:
            k = int(first.group(1))
            for d, p in proc.items():
                if re.sub(r"\D", "", d) == str(k):
                    return p
    return 0


def simulate_strategy(graph: Any, machine: Any, strategy: Any, cost_model: Any = "measured",
                      overhead: RuntimeOverhead | None = None, pipelined: bool = True,
                      sync: str | None = None, update_fields: int = 2,
                      update_scale: float = 1.0, trace: str | None = None) -> dict[str, Any]:
    """Simulate one iteration; ``cost_model``: a CostModel, a ``--cost``
    spec, ``"worker"`` (tile kernels timed as a device's worker runs them
    in a step, :class:`~legionpy.optimizer.calibration.StepCostModel`), or
    ``"contended"`` (timed with every other device of
    the machine running the same kernel; the overhead's concurrency factors
    are then not applied).
    Returns the simulator's ``SimResult.to_dict()`` plus
    ``kernel_time_s`` (the plain simulator's iteration time); with
    ``overhead``, ``iteration_time_s`` and ``per_device_busy_s`` are those
    of :func:`simulate_with_runtime` and ``overhead`` is recorded; ``terms``:
    where the iteration goes, per device and kind
    (:func:`~legionpy.optimizer.breakdown.breakdown`). ``sync``:
    the gradient synchronisation simulated (docs/seam.md); ``update_fields``,
    ``update_scale``: the optimizer's update (:func:`simulate_with_runtime`;
    with ``overhead`` only); ``trace``: write the simulated timeline there
    (Perfetto JSON; with ``overhead``, each task where the runtime's model
    places it, for ``legionpy compare-traces``)."""
    from .costmodel import CostModel, cost_model_from_spec
    from .simulator import Simulator

    if cost_model == "contended":
        # kernels timed with the other devices busy: no further concurrency scaling
        from .calibration import ContendedCostModel

        cm = ContendedCostModel.local(max(1, len(machine.devices)))
        if overhead is not None:
            overhead = replace(overhead, kernel_scale=1.0, kernel_scale_mem=1.0)
    elif cost_model == "worker":  # as a worker runs them in a step; scaled by the overhead's
        from .calibration import StepCostModel

        cm = StepCostModel.local()
    else:
        cm = cost_model if isinstance(cost_model, CostModel) \
            else cost_model_from_spec(cost_model)
    if hasattr(cm, "prime"):  # kernels timed in the step's order (StepCostModel)
        cm.prime(graph, strategy, machine)
    sim = Simulator(graph, machine, cm, sync=sync)
    res = sim.run(strategy)
    out = res.to_dict()
    out["kernel_time_s"] = res.iteration_time_s
    out["kernel_per_device_busy_s"] = dict(res.per_device_busy_s)
    rows = {d.name: f"dev {d.id}" for d in machine.devices}
    tg = sim.tg.to_json(include_times=True)
    if hasattr(cm, "lock_shares"):  # the kernels' measured hold on the lock (lockshare.py)
        annotate_lock_shares(tg, graph, cm.lock_shares(graph, strategy, machine))
    out["terms"] = breakdown(sim_timeline(tg, [t["start_s"] for t in tg["tasks"]],
                                          [t["end_s"] for t in tg["tasks"]], rows),
                             period_s=res.iteration_time_s)
    if overhead is not None and not overhead.is_zero:
        r = simulate_with_runtime(tg, overhead, graph, pipelined=pipelined,
                                  update_fields=update_fields, update_scale=update_scale,
                                  reduce_byte_s=device_reduce_byte_s(machine))
        spans = [e - f for e, f in zip(r["task_end_s"], r["task_finish_s"])]
        out["terms"] = breakdown(sim_timeline(tg, r["task_start_s"], spans, rows),
                                 period_s=r["iteration_time_s"], control_s=r["control_busy_s"])
        for name, row in rows.items():
            if row in out["terms"]:
                out["terms"][row]["wait"] = r["per_device_wait_s"].get(name, 0.0)
                out["terms"][row]["between"] = r["per_device_finish_s"].get(name, 0.0)
        out["iteration_time_s"] = r["iteration_time_s"]
        out["per_device_busy_s"] = {d: r["per_device_busy_s"].get(d, 0.0)
                                    for d in res.per_device_busy_s}
        out["control_busy_s"] = r["control_busy_s"]
        out["schedule_s"] = r["schedule_s"]
        out["cpu_bound_s"] = r["cpu_bound_s"]
        out["gil_bound_s"] = r["gil_bound_s"]
        if trace:
            tg = {**tg, "tasks": [{**t, "start_s": s, "end_s": e} for t, s, e in
                                  zip(tg["tasks"], r["task_start_s"], spans)]}
    if trace:
        write_chrome_trace(tg["tasks"], trace)
    out["overhead"] = overhead.to_dict() if overhead is not None else None
    return out


# -- the real run ----------------------------------------------------------------------------


