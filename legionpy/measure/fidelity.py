"""Fidelity: is the simulator right about this machine? (issue 9 item 3)

:func:`compare` simulates one training iteration of a model under a
strategy on the local machine (``Machine.local()``: this process's devices,
or every rank of an ``mpirun`` job), then runs the same strategy for real
with the same devices -- ``compile``, then ONE ``fit`` call over ``warmup +
steps`` batches (pipelined: step i+1 is launched before step i is waited
for), the steady-state period timed from the last warm-up step's loss to
the last step's, with the runtime's trace on -- and returns a
:class:`FidelityResult`: simulated and measured seconds per iteration, the
relative error ``|sim - real| / real`` and the busy seconds of every device
in both halves (the measured ones summed from the trace's compute and update
records, per step).

The simulation side (the runtime-overhead model, the re-scheduler, Kendall's
tau) is :mod:`legionpy.optimizer.fidelity`; this module runs real models, so
it sits above :mod:`legionpy.nn` and :mod:`legionpy.models`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .. import data as D
from .. import models as zoo
from .. import nn
from .. import runtime as lr
from ..mapper.resolve import resolve_strategy
from ..optimizer.breakdown import breakdown, worst_term
from ..optimizer.fidelity import RuntimeOverhead, relative_error, simulate_strategy
from ..optimizer.machine import Machine
from ..optimizer.strategy import Strategy
from ..probe.hostspeed import median_probe, retake, slowdown
from ..probe.overhead import background_cores, cpu_clock
from ..runtime.mpi import allgather, bcast_root, launched_under_mpi, on_rank0_alone
from .control import CONTROL_MAX_STEP_S, control_offset, control_profile

__all__ = ["FidelityResult", "compare", "measure_runtime", "predict", "predict_model",
           "train_prediction", "optimizer_update_terms", "local_judge", "LOCAL_COST",
           "median_of"]

#: the cost model of the local machine model's predictions (``simulate
#: --compare``, ``legionpy train``, the benches): tile kernels timed on this
#: machine as a device's worker runs them (alone, one BLAS thread, in the
#: thread's CPU seconds), scaled by the measured concurrency slowdown; the
#: interpreter lock's share of them is the sharing model's
#: (docs/decisions.md: timing them with the other devices busy counted the
#: lock's hand-overs twice and tripled small kernels on one device). On GPU
#: devices: timed on the GPU (:func:`~legionpy.measure.record_profiles.
#: device_cost_model`)
LOCAL_COST = "worker"


def measure_runtime(model: Any, strategy: Any, machine: Any, steps: int = 5, warmup: int = 2,
                    seed: int = 0, sync: str | None = None,
                    optimizer: Any = None) -> dict[str, Any]:
    """Compile ``model`` (an uncompiled ``nn.Model``) with ``strategy`` and
    ``optimizer`` (default ``SGD(lr=1e-3)``; ``strategy`` None: ``model`` is
    compiled already, as :func:`compare` does to predict from it) and train
    ``warmup + steps`` batches in ONE ``fit`` call, as training runs
    (``fit`` launches step i+1 before waiting for step i, so the control
    thread's analysis overlaps the devices' work). ``fit`` stamps the
    moment it sees each step finish (``History.step_finished``); the
    steady-state iteration time is the
    time from the end of the last warm-up step to the end of the last step,
    divided by ``steps`` (max over ranks). Returns ``{"measured_time_s",
    "measured_step_times_s" (the stamps' differences), "measured_per_device_busy_s"
    (trace busy time inside that window, per step), "measured_phase_s" (the
    same of the layer API's forward, backward and update tasks: ``{"F", "B",
    "U"}``), "measured_terms" (where the
    window's time went per device and kind, per step:
    :func:`~legionpy.optimizer.breakdown.breakdown`), "measured_control_cpu_s" (CPU
    seconds of the calling -- control -- thread per step over the window, max
    over ranks), "measured_collective_s" (the same of its collectives),
    "measured_copy_s" (the median wall seconds of the window's
    copies, every rank's; None without copies), "measured_background_cores"
    (cores other programs kept busy over the timed steps,
    :func:`~legionpy.probe.overhead.background_cores`),
    "measured_host_probe_s" (the mean over the timed steps of the host-speed
    probe ``fit`` runs after each step, :mod:`legionpy.probe.hostspeed`,
    max over ranks; its CPU is not in the control thread's), "final_loss"}``.
    Collective under MPI."""

    rt = lr.get_runtime()
    if strategy is not None:
        model.compile(optimizer=optimizer or nn.SGD(lr=1e-3),
                      loss="sparse_categorical_crossentropy",
                      strategy=strategy, machine=machine, sync=sync)
    b = model.batch_size
    warmup = max(1, warmup)
    total = warmup + steps
    try:
        xs, y = D.for_model(model, total * b, seed=seed)
    except (ValueError, TypeError):  # not a zoo-shaped model: random data of its shapes
        xs, y = _random_data(model.graph, total * b, seed)
    lr.fence()
    c0 = cpu_clock()  # the machine's busy CPU time, for the background load
    rt.count_span_cpu(True)
    try:
        with rt.trace.tap() as tap:  # the user's LEGIONPY_TRACE keeps recording, whole
            h = model.fit(xs, y, epochs=1, verbose=0, shuffle=False)
            lr.fence()
    finally:
        rt.count_span_cpu(False)
    c1 = cpu_clock()
    recs = tap.records()
    # when each step finished here, and the control thread's CPU time then
    stamps = [t for t, _ in h.step_finished]
    cpu = [c for _, c in h.step_finished]
    if len(stamps) != total or len(h["step_loss"]) != total:
        raise RuntimeError(f"measure_runtime: {len(stamps)} steps finished and "
                           f"{len(h['step_loss'])} reported, {total} launched")
    times = [stamps[i] - stamps[i - 1] for i in range(warmup, total)]
    period = (stamps[-1] - stamps[warmup - 1]) / steps
    lo, hi = stamps[warmup - 1] - rt.trace.t0, stamps[-1] - rt.trace.t0
    busy: dict[int, float] = {}
    copies: list[float] = []  # wall seconds of each copy inside the window
    colls: list[float] = []  # and of each collective
    phase: dict[str, float] = {}  # wall seconds of the F, B and U tasks
    timeline: list[dict] = []  # this rank's records inside the window, clipped to it
    for r in recs:
        a, z = max(r["start"], lo), min(r["end"], hi)
        if r["device"] is not None and r["kind"] in ("compute", "update") and z > a:
            busy[r["device"]] = busy.get(r["device"], 0.0) + z - a
            p = str(r["name"])[:2]
            if p in ("F(", "B(", "U("):
                phase[p[0]] = phase.get(p[0], 0.0) + z - a
        if r["kind"] == "copy" and r["start"] >= lo and r["end"] <= hi:
            copies.append(r["end"] - r["start"])
        if r["kind"] == "collective" and r["start"] >= lo and r["end"] <= hi:
            colls.append(r["end"] - r["start"])
        if z < a or (z == a and r["kind"] != "fill"):
            continue
        if r.get("link") is not None:
            row = "link " + "->".join("host" if int(m) < 0 else str(int(m)) for m in r["link"])
        elif isinstance(r["device"], str):  # a collective's communicator, comm:0,1
            row = r["device"]
        elif r["device"] is not None:
            row = f"dev {int(r['device'])}"
        else:
            continue
        timeline.append({"row": row, "kind": r["kind"], "name": r["name"],
                         "start_s": a - lo, "end_s": z - lo})
    names = {d.id: d.name for d in machine.devices}
    worker_cpu = _window_cpu(h.device_cpu, warmup, steps, names)
    span_cpu = _window_cpu(h.device_span_cpu, warmup, steps, names)
    merged: dict[str, float] = {names.get(d, str(d)): 0.0 for d in names}
    for part in allgather(busy):
        for d, v in part.items():
            key = names.get(d, str(d))
            merged[key] = merged.get(key, 0.0) + v / steps
    phases: dict[str, float] = {}
    for part in allgather(phase):
        for k, v in part.items():
            phases[k] = phases.get(k, 0.0) + v / steps
    all_times = allgather(times)
    bg = background_cores(c0, c1)
    # over the whole window: a step's own figure alternates where the steps do
    # (one device: the launch of two steps falls between two stamps, none
    # between the next two), so its median is not the period's
    # less the host probes fit ran between the stamps (probe i follows stamp i)
    probes = h.host_probe[warmup - 1:total - 1]
    control_cpu = (cpu[-1] - cpu[warmup - 1] - sum(probes)) / steps
    # each rank's own devices (a rank also records copies it sends to another's)
    local = {f"dev {d.id}" for d in rt.devices if d.rank == rt.rank}
    mine = {row: v for row, v in breakdown(timeline, period_s=hi - lo,
                                           iterations=steps).items() if row in local}
    terms: dict[str, dict[str, float]] = {}
    for part in allgather(mine):
        terms.update(part)
    terms["control"] = {"control": max(allgather(control_cpu))}
    # how the workers spent their time (breakdown "wait" and "between")
    for d in machine.devices:
        row, name = f"dev {d.id}", names.get(d.id, str(d.id))
        if row in terms and name in span_cpu and name in worker_cpu:
            terms[row]["wait"] = max(0.0, merged.get(name, 0.0) - span_cpu[name])
            terms[row]["between"] = max(0.0, worker_cpu[name] - span_cpu[name])
    every_copy = [c for part in allgather(copies) for c in part]
    # how fast the host ran Python meanwhile (probe.hostspeed): the slowest rank's
    probe = max((p for p in allgather(sum(probes) / len(probes) if probes else None)
                 if p is not None), default=None)
    return {"measured_time_s": max(allgather(period)),
            "measured_host_probe_s": probe,
            "measured_control_cpu_s": max(allgather(control_cpu)),
            "measured_copy_s": median_of(every_copy),
            "measured_collective_s": median_of(c for part in allgather(colls) for c in part),
            "measured_step_times_s": [max(ts) for ts in zip(*all_times)],
            "measured_per_device_busy_s": merged, "measured_phase_s": phases,
            "measured_per_device_cpu_s": worker_cpu, "measured_per_device_span_cpu_s": span_cpu,
            "final_loss": float(h["step_loss"][-1]),
            "measured_terms": terms,
            "measured_background_cores": bg}


def _window_cpu(snapshots: list[dict], warmup: int, steps: int,
                names: dict) -> dict[str, float]:
    """Device name -> CPU seconds per step between the stamps of the last
    warm-up step and the last step (``History.device_cpu`` or
    ``device_span_cpu``), every rank's devices."""
    first, last = snapshots[warmup - 1], snapshots[-1]
    out: dict[str, float] = {}
    for part in allgather({d: (last[d] - first.get(d, 0.0)) / steps for d in last}):
        for d, v in part.items():
            out[names.get(d, str(d))] = v
    return out


def median_of(values: Any) -> float | None:
    """The median of the values that are not None; None when there are none."""
    have = [float(v) for v in values if v is not None]
    return float(np.median(have)) if have else None


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
    #: each device worker's CPU seconds per step, and its tasks' bodies' alone
    #: (:func:`measure_runtime`; empty with the serial executor)
    measured_per_device_cpu_s: dict = field(default_factory=dict)
    measured_per_device_span_cpu_s: dict = field(default_factory=dict)
    measured_step_times_s: list = field(default_factory=list)
    kernel_time_s: float = 0.0
    kernel_relative_error: float = 0.0
    bytes_moved: float = 0.0
    num_tasks: int = 0
    overhead: dict | None = None
    simulation: dict = field(default_factory=dict)
    #: cores other programs kept busy during the measurement, and the
    #: prediction for a machine that loaded (None: not measured)
    background_cores: float | None = None
    loaded_time_s: float = 0.0
    loaded_relative_error: float = 0.0
    #: where an iteration goes, ``{"sim": {row: {term: s}}, "real": ...}``
    #: (:mod:`legionpy.optimizer.breakdown`), and the (row, term) missed most
    terms: dict = field(default_factory=dict)
    worst_term: dict | None = None
    #: each fit's steady-state step time when measured over several fits
    #: (``compare(fits=n)``; ``measured_time_s`` is their median)
    measured_fits_s: list = field(default_factory=list)
    #: how many times slower than the calibration's quiet figure the host ran
    #: Python while the kept fits ran (:mod:`legionpy.probe.hostspeed`; None:
    #: not known), and how many fits ``compare(quiet=True)`` took again
    host_slowdown: float | None = None
    host_retakes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table_row(self) -> str:
        return (f"{self.model:<10} {self.strategy:<12} {self.iteration_time_s * 1e3:>9.2f} "
                f"{self.measured_time_s * 1e3:>9.2f} {self.relative_error * 100:>6.1f}%")


def _strategy_label(spec: Any) -> str:
    if isinstance(spec, (str, os.PathLike)):
        return os.fspath(spec)
    return "given"


def optimizer_update_terms(optimizer: Any) -> tuple[int, float]:
    """``(update_fields, update_scale)`` of ``optimizer``'s update task for
    :func:`~legionpy.optimizer.fidelity.simulate_with_runtime`: the region
    fields it touches (weight, gradient and its state fields) and its kernel
    relative to the cost model's update (plain SGD's ``w -= lr * g; g = 0``,
    3 array passes), counted as the array passes its numpy ``update`` makes
    (legionpy/nn/optimizers.py): momentum +3, Nesterov +2, weight decay +2,
    Adam 14. None: plain SGD ``(2, 1.0)``."""
    if optimizer is None:
        return 2, 1.0
    fields = 2 + len(getattr(optimizer, "fields", ()))
    if type(optimizer).__name__ == "Adam":
        passes = 14
    else:
        passes = 3 + (3 if getattr(optimizer, "momentum", 0) else 0) \
            + (2 if getattr(optimizer, "nesterov", False) else 0)
    passes += 2 if getattr(optimizer, "weight_decay", 0) else 0
    return fields, passes / 3.0


def predict(graph: Any, strategy: Any, machine: Any = None, cost: Any = LOCAL_COST,
            overhead: bool | RuntimeOverhead = True,
            background_cores: float | None = None, sync: str | None = None,
            optimizer: Any = None, trace: str | None = None,
            control_s: float | None = None) -> dict[str, Any]:
    """The local machine model's prediction of one training iteration of
    ``graph`` under ``strategy`` (a Strategy): the simulator with ``cost``
    and this machine's cached :class:`RuntimeOverhead` (``overhead=True``),
    none (``False``) or given figures. The one prediction ``simulate
    --compare``, ``legionpy train`` and the benches print.
    ``background_cores``: predict for a machine where other programs keep
    that many cores busy (:meth:`RuntimeOverhead.under_load`); ``optimizer``:
    the training's (:func:`optimizer_update_terms`; None: plain SGD);
    ``trace``: rank 0 writes the simulated timeline there (Perfetto JSON,
    for ``legionpy compare-traces``); ``control_s``: the control thread's
    measured CPU per step of this model on one device
    (:func:`~legionpy.measure.control.control_profile`): the overhead's
    ``step_s`` moves by its difference from the model's own figure for that
    run (``control_offset_s`` in the result). Use
    :func:`predict_model` for a compiled model: it takes every input from
    it. Returns
    :func:`~legionpy.optimizer.fidelity.simulate_strategy`'s dict (rank 0's
    on every rank; collective under MPI)."""
    from .calibration import runtime_overhead  # calibration trains through measure_runtime

    machine = machine or Machine.local()
    if cost in ("worker", "contended") and any(d.kind == "gpu" for d in machine.devices):
        # a GPU kernel's cost is its synchronised wall time on the GPU, not the
        # CPU seconds of a thread contending for cores
        from .record_profiles import device_cost_model

        cost = device_cost_model()
    if overhead is True:
        ovh: RuntimeOverhead | None = runtime_overhead(machine)
    elif overhead is False or overhead is None:
        ovh = None
    else:
        ovh = overhead
    if ovh is not None:
        ovh = ovh.under_load(background_cores)
    if cost == "worker":  # its kernels timed, and their lock shares, on rank 0 alone
        from ..optimizer.calibration import StepCostModel

        cost = StepCostModel.local()
        prime_alone(cost, graph, strategy, machine)
    fields, uscale = optimizer_update_terms(optimizer)
    offset = 0.0
    if ovh is not None and control_s is not None:
        # the model's own control time for the profiled one-device run: counts
        # only, so the analytic kernels serve
        single = simulate_strategy(graph, machine, Strategy.single_device(graph, machine),
                                   "analytic", ovh, sync=sync, update_fields=fields,
                                   update_scale=uscale)
        offset = control_offset(control_s, single.get("control_busy_s"))
        ovh = replace(ovh, step_s=max(0.0, ovh.step_s + offset))
    out = simulate_strategy(graph, machine, strategy, cost, ovh, sync=sync,
                            update_fields=fields, update_scale=uscale,
                            trace=trace if lr.get_runtime().rank == 0 else None)
    if control_s is not None:
        out["control_profile_s"], out["control_offset_s"] = control_s, offset
    return bcast_root(out)


def prime_alone(cm: Any, graph: Any, strategy: Any, machine: Any) -> None:
    """``cm.prime`` (a step cost model's kernel timings and lock shares) for
    ``strategy``, on rank 0 alone under ``mpirun`` while the other ranks
    sleep (:func:`~legionpy.runtime.mpi.on_rank0_alone`); every rank then
    takes rank 0's tables. Two threads timing a kernel's hold on the
    interpreter lock beside a rank that polls look short of the lock and
    are not kept (optimizer/lockshare.py). Collective under MPI."""
    if not hasattr(cm, "prime"):
        return
    if not launched_under_mpi():
        cm.prime(graph, strategy, machine)
        return

    def prime() -> tuple[dict, dict]:
        cm.prime(graph, strategy, machine)
        return dict(cm.table), dict(getattr(cm, "shares", {}))

    table, shares = on_rank0_alone(prime)
    cm.table.update(table)
    if hasattr(cm, "shares"):
        cm.shares.update(shares)


def local_judge(graph: Any, strategy: Any, machine: Any) -> float | None:
    """The judge of ``strategy="search"`` (:func:`legionpy.mapper.resolve.
    set_search_judge`): :func:`predict`'s seconds per step on this job's own
    machine (``Machine.local()``, named ``local...``); None for any other
    machine, whose runtime this process cannot speak for. Collective under
    MPI."""
    if not str(getattr(machine, "name", "")).startswith("local"):
        return None
    return float(predict(graph, strategy, machine)["iteration_time_s"])


def predict_model(model: Any, strategy: Any = None, background_cores: float | None = None,
                  cost: Any = LOCAL_COST, overhead: bool | RuntimeOverhead = True,
                  machine: Any = None, trace: str | None = None,
                  profile_control: bool = True) -> dict[str, Any]:
    """THE local machine model's prediction for a compiled ``nn.Model``:
    :func:`predict` with every input taken from the model -- its graph (so
    its batch and scale), strategy (or ``strategy``), gradient sync and
    optimizer -- on ``Machine.local()`` (this job's devices and ranks), with
    ``cost`` (:data:`LOCAL_COST`) and this machine's cached overhead.
    ``legionpy train`` (:func:`train_prediction`), ``simulate --compare``
    (:func:`compare`) and the benches all predict through it, so one
    configuration gets one number (issue 26). ``profile_control``: with the
    overhead, the control thread's cost is this model's, profiled on one
    device (:mod:`legionpy.measure.control`; cached, ~1 s the first time),
    unless the predicted devices' busy time adds up to more than
    :data:`CONTROL_MAX_STEP_S` (a one-device step that long would take
    minutes to profile, and its control thread is a small part of it), or
    the machine has GPUs (the control thread's CPU time there includes the
    driver's spin in every synchronisation, which overlaps the GPU's work).
    Collective under MPI."""
    ex = getattr(model, "_ex", None)
    if ex is None:
        from ..errors import ModelError

        raise ModelError(f"predict_model needs a compiled model, got an uncompiled "
                         f"{type(model).__name__}: call model.compile(...) first")
    machine = machine or Machine.local()
    strategy = strategy if strategy is not None else model.strategy

    def run(control: float | None) -> dict[str, Any]:
        return predict(model.graph, strategy, machine, cost, overhead,
                       background_cores=background_cores, sync=ex.sync,
                       optimizer=model.optimizer, trace=trace, control_s=control)

    out = run(None)
    if overhead is False or overhead is None or not profile_control:
        return out
    # on GPUs the control thread's CPU time is not its cost: the CUDA driver
    # spins in the host's synchronisations (alexnet, one H200: 37 ms of a
    # 94 ms step, the profile put the step 56% high; without it, 9%)
    if any(d.kind == "gpu" for d in machine.devices):
        return out
    # a one-device step of more than CONTROL_MAX_STEP_S: the control thread is
    # a small part of it, and profiling it would take minutes
    if sum(out.get("per_device_busy_s", {}).values()) > CONTROL_MAX_STEP_S:
        return out
    return run(control_profile(model, machine, measure_runtime, quiet_probe(out)))


def quiet_probe(sim: dict[str, Any]) -> float | None:
    """The host's quiet probe (:mod:`legionpy.probe.hostspeed`) of the
    calibration a :func:`predict` result ``sim`` used (None without one)."""
    return (((sim.get("overhead") or {}).get("calibration") or {})
            .get("host_probe_s"))


def train_prediction(model: Any, measured_s: float,
                     background_cores: float | None = None) -> dict[str, float]:
    """What ``legionpy train`` prints next to its measurement: :func:`predict`
    for the compiled ``model``'s strategy and for data parallelism on this
    job's devices (``simulated_iteration_s``, ``simulated_data_parallel_s``:
    this machine to itself), the same for the ``background_cores`` other
    programs used meanwhile (``loaded_iteration_s``), ``measured_iteration_s``
    and the ``prediction_error`` of the loaded prediction (of the plain one
    when nothing was measured); ``control_profile_s``: the model's control
    thread as profiled on one device (:mod:`legionpy.measure.control`);
    ``host_quiet_probe_s``: the calibration's quiet host probe, against which
    ``legionpy train`` reports how fast the host ran Python meanwhile
    (:mod:`legionpy.probe.hostspeed`). Collective under MPI."""
    machine = Machine.local()
    sim = predict_model(model, machine=machine)
    mine = sim["iteration_time_s"]
    data = Strategy.data_parallel(model.graph, machine)
    dp = mine if data == model.strategy else predict_model(
        model, data, machine=machine)["iteration_time_s"]
    loaded = predict_model(model, background_cores=background_cores,
                           machine=machine)["iteration_time_s"] if background_cores else mine
    return {"simulated_iteration_s": mine, "simulated_data_parallel_s": dp,
            "control_profile_s": sim.get("control_profile_s"),
            "host_quiet_probe_s": quiet_probe(sim),
            "loaded_iteration_s": loaded, "background_cores": background_cores,
            "measured_iteration_s": measured_s,
            "prediction_error": relative_error(loaded, measured_s),
            "quiet_prediction_error": relative_error(mine, measured_s)}


#: seconds of measurement after which ``compare(quiet=True)`` takes no more
QUIET_BUDGET_S = 10.0


def compare(model: Any, strategy: Any = "data", *, scale: str = "small",
            sizes: dict | None = None, cost: Any = LOCAL_COST, steps: int = 5, warmup: int = 2,
            overhead: bool | RuntimeOverhead = True, seed: int = 0,
            machine: Any = None, sync: str | None = None, fits: int = 1,
            trace: str | None = None, quiet: bool = False) -> FidelityResult:
    """Simulate ``model`` under ``strategy`` on the local machine, run it for
    real, and compare (module doc).

    ``model``: a zoo name (built with ``scale`` and ``sizes``) or an
    uncompiled ``nn.Model``; ``strategy``: ``"data" | "model" | "owt" |
    "expert" | "search"``, a JSON path or a Strategy; ``cost``: a CostModel
    or ``"worker" | "contended" | "measured" | "analytic" | FILE`` (default
    :data:`LOCAL_COST`); ``overhead``: True to add the measured
    :class:`RuntimeOverhead` of this machine (cached), False for the plain
    simulator, or given figures. ``fits``: measure that many ``fit`` calls
    of ``warmup + steps`` steps on the same compiled model and keep the
    median fit (which thread takes the interpreter lock first sets a whole
    fit's interleaving, so one fit's step time varies from fit to fit by
    more than the steps inside it do; ``measured_fits_s`` keeps each fit's);
    ``trace``: write the simulated timeline there (:func:`predict`);
    ``quiet``: a fit that ran while the host ran Python more than
    :data:`~legionpy.probe.hostspeed.QUIET_SLOWDOWN` times slower than at
    its calibration is taken again, up to twice
    (:func:`~legionpy.probe.hostspeed.retake`: the host's other tenants,
    which no load figure of this machine shows); ``host_slowdown`` reports
    the kept fits' slowdown either way. Uses the current runtime (start
    it first, e.g. ``lp.init(cpus=2)``); collective under MPI, every rank
    returns rank 0's simulation and the job's measurement. A zoo model is
    built, compiled and trained as ``legionpy train`` does (its
    :func:`~legionpy.models.training.default_optimizer`) and both predict
    through :func:`predict_model`; a given ``nn.Model`` trains with
    ``SGD(lr=1e-3)``."""
    from ..models.training import default_optimizer

    name = model if isinstance(model, str) else getattr(model.graph, "name", "model")
    m = zoo.build(model, scale=scale, seed=seed, **(sizes or {})) if isinstance(model, str) \
        else model
    machine = machine or Machine.local()
    strat = resolve_strategy(strategy, m.graph, machine)
    opt = default_optimizer(model) if isinstance(model, str) else nn.SGD(lr=1e-3)
    m.compile(optimizer=opt, loss="sparse_categorical_crossentropy", strategy=strat,
              machine=machine, sync=sync)
    sim = predict_model(m, cost=cost, overhead=overhead, machine=machine, trace=trace)
    ref = quiet_probe(sim)

    def measure(_: int) -> dict[str, Any]:
        return measure_runtime(m, None, machine, steps=steps, warmup=warmup, seed=seed)

    # quiet: a busy host's fit is taken again (not for long steps: a
    # measurement of seconds is retaken at most once); else exactly ``fits``
    reals, retakes = retake(measure, ref, max(1, fits), extra=2 if quiet else 0,
                            budget_s=QUIET_BUDGET_S)
    real = sorted(reals, key=lambda r: r["measured_time_s"])[(len(reals) - 1) // 2]
    t_sim, t_real = sim["iteration_time_s"], real["measured_time_s"]
    bg = real.get("measured_background_cores")
    t_load = predict_model(m, cost=cost, overhead=overhead, background_cores=bg,
                           machine=machine)["iteration_time_s"] if bg else t_sim
    return FidelityResult(
        model=name, strategy=_strategy_label(strategy), machine=machine.name,
        cost_model=("measured on the GPU" if cost in ("worker", "contended") and any(
            d.kind == "gpu" for d in machine.devices) else
            cost if isinstance(cost, str) else type(cost).__name__), steps=steps,
        iteration_time_s=t_sim, measured_time_s=t_real,
        relative_error=relative_error(t_sim, t_real),
        per_device_busy_s=sim["per_device_busy_s"],
        measured_per_device_busy_s=real["measured_per_device_busy_s"],
        measured_per_device_cpu_s=real["measured_per_device_cpu_s"],
        measured_per_device_span_cpu_s=real["measured_per_device_span_cpu_s"],
        measured_step_times_s=real["measured_step_times_s"],
        kernel_time_s=sim["kernel_time_s"],
        kernel_relative_error=relative_error(sim["kernel_time_s"], t_real),
        bytes_moved=sim["bytes_moved"], num_tasks=sim["num_tasks"], overhead=sim["overhead"],
        simulation={**{k: v for k, v in sim.items() if k not in ("per_device_busy_s", "terms")},
                    "measured_control_cpu_s": real["measured_control_cpu_s"]},
        background_cores=bg, loaded_time_s=t_load,
        loaded_relative_error=relative_error(t_load, t_real),
        terms={"sim": sim.get("terms", {}), "real": real["measured_terms"]},
        worst_term=worst_term(sim.get("terms", {}), real["measured_terms"]),
        measured_fits_s=[r["measured_time_s"] for r in reals],
        host_slowdown=slowdown(median_probe(reals), ref), host_retakes=retakes)
