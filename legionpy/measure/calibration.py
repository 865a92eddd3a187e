"""Calibrating the local machine model through the layer API (issue 9 item 3).

This is the half of the calibration that trains real (synthetic) models, so
it lives above :mod:`legionpy.nn` and :mod:`legionpy.models`; the pure parts
(:func:`~legionpy.optimizer.calibration.nnls`,
:func:`~legionpy.optimizer.calibration.task_counts`, the kernel-concurrency
microbenchmark) stay in :mod:`legionpy.optimizer.calibration`, the model
they feed (:class:`~legionpy.optimizer.fidelity.RuntimeOverhead`) in
:mod:`legionpy.optimizer.fidelity`.

* **control thread** (:func:`calibrate_layer_overhead`): each calibration
  model (deep narrow MLPs, tiny conv stacks, tiny unrolled LSTMs: kernels
  negligible, never the models whose fidelity is then reported), under each
  of :data:`CALIBRATION_STRATEGIES` (data, model, and single: one device),
  is trained with ONE pipelined ``fit`` call (:func:`~legionpy.measure.fidelity.measure_runtime`);
  the steady-state control-thread CPU time per step is regressed
  (non-negative least squares) on the counts of the simulator's task graph
  for the same model, strategy and machine::

      period = step_s + tasks * launch_s + reqs * req_launch_s + copies * copy_launch_s

  (each row's period, for the fits below: the median of its fits'
  steady-state periods, each over 15 steps);

* **workers** (:func:`phase_overheads`): on the rows run on one device (no
  second worker contends), the wall time of the forward, backward and
  update tasks, less their kernels (timed as a worker runs them) and the
  bytes of the gradients the backward tasks reduce (``reduce_byte_s``):
  ``task_s`` per task, ``reduce_req_s`` per gradient a backward task
  reduces and ``reduce_buf_s`` per reduction buffer a step fills and folds
  (an RNN's shared weights: one per device, however many cells reduce into
  it; told apart row by row where the LSTM rows have more contributions
  than buffers), ``update_task_s`` per update task. Measured, not regressed: the
  rows' totals cannot tell a forward task from a backward one (every model
  has as many of each), and the regression (the devices' busy time less the
  kernels on ``tasks``, ``reqs`` and backward tasks) put 30-37 us on every
  task where the traces show forward tasks ~5 us and backward ones 40-190
  us beyond their kernels. The regression stays when no row ran on one
  device, and with more ranks than cores (a one-device row's worker then
  has a core to itself while the other ranks idle).
* **the workers between their tasks** (:func:`finish_terms`): a worker
  finishes a task, releases its successors and takes the next one in
  Python, outside the task's span. The worker threads' CPU time less their
  tasks' bodies' (:meth:`legionpy.runtime.core.Runtime.worker_span_cpu`),
  regressed on tasks and copies: ``finish_s`` per task, ``finish_copy_s``
  per copy it hands to a link's thread. In CPU seconds it is steady (27 Nov,
  three calibrations minutes apart: 8.9, 9.1 and 9.7 us a task) where the
  wall-time terms moved 2.4x (``task_s`` 12.6-30.4 us).
* **the interpreter lock** (:func:`fit_lock_terms`, issue 26): with the
  regressed terms fixed, the lock-sharing terms of
  :mod:`legionpy.optimizer.sharing` -- the seconds of a kernel that hold the
  lock, the hand-over cost while two threads interleave, a worker's wake-up
  -- and, under ``mpirun``, the per-copy seconds ``copy_s`` (the
  communicator's per-message work; in one process it is measured:
  :func:`measured_copy_cost`, the rows' copies' wall time less the machine
  model's), whose simulated periods and busy times
  best match the measured ones (least squared log error over grids). Two
  wider synthetic models (kernels of 0.05-1 ms, which release the lock for
  part of their time) make the lock's share of a kernel identifiable, and
  an LSTM of 40-55 us cells (the zoo's RNN cells at ``scale="small"``)
  where a cell holds it whole or not (one process, 28 Nov: without it
  30 and 75 us fitted within 4% of each other; with it 30 us by 4-38%); the
  kernels are timed as predictions time them (``worker``: in a step's order).
  Where fits within :data:`NEAR_LOSS` of the best disagree on the lock's
  share, the one nearest the lock probe's figure is kept
  (:func:`choose_lock_fit`: the rows cannot tell them apart).
  :func:`fit_copy_cost` (``copy_s`` alone) remains for a machine model
  without the lock.
* :func:`calibrated_overhead` adds the kernels' concurrency slowdown, the
  interpreter lock's hold of a kernel
  (:func:`~legionpy.probe.overhead.measure_lock_hold`), the cores and the
  control threads; :func:`runtime_overhead` caches the result
  per machine in ``$LEGIONPY_CACHE/overhead-v27-MACHINE[-bound].json``.
* **a calibration taken under load is redone when the machine is quiet.**
  Every row measures the cores other programs kept busy meanwhile; when
  their median is over :data:`LOADED_CORES` the calibration is *loaded*
  (:func:`calibration_load`): it says so when it is made, and a
  later run that finds the machine quiet (under :data:`QUIET_CORES` over
  :data:`QUIET_SAMPLE_S`) calibrates again, kernel timings included. Two
  calibrations taken while a test suite ran predicted lenet's data-parallel
  step at 7.22 and 4.30 ms where a quiet one predicted 5.71 (measured
  4.6-6.4): its errors are not a constant the load correction can undo.
  So is one whose rows ran Python over ``QUIET_SLOWDOWN`` times slower
  than a later run found the host running it (:func:`note_faster_run`,
  from ``legionpy train`` and ``simulate --compare``: like for like, the
  probes the steps take): a busy spell of the host's other tenants, which
  ``/proc/stat`` does not show; once, so a host busy at every calibration
  costs one retake, not one per run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import nn
from ..affinity import binding
from ..mapper.resolve import resolve_strategy
from ..models.rnn import embed_tokens, lstm_stack
from ..optimizer.calibration import local_cores, nnls, task_counts
from ..optimizer.costmodel import CostModel, cost_model_from_spec, default_cache_path
from ..optimizer.fidelity import (
    REDUCE_PASSES,
    RuntimeOverhead,
    annotate_lock_shares,
    device_reduce_byte_s,
    gradient_buffers,
    gradient_reductions,
)
from ..optimizer.simulator import Simulator
from ..optimizer.strategy import atomic_write_json
from ..probe.hostspeed import QUIET_SLOWDOWN, median_probe, quiet_reference, retake, slowdown
from ..probe.overhead import (
    background_cores,
    cpu_clock,
    interpreter_speed,
    least_slowdown,
    measure_kernel_concurrency,
    measure_lock_hold,
    measure_mpi_collectives,
    measure_poll_share,
    measure_runtime_overhead,
)
from ..runtime import get_runtime
from ..runtime.mpi import bcast_root, share_among_ranks
from .fidelity import measure_runtime, median_of, prime_alone

__all__ = ["calibration_models", "calibrate_layer_overhead", "calibrated_overhead",
           "fit_copy_cost", "fit_lock_terms", "fit_lock_terms_on_ranks", "lock_fit_candidates",
           "choose_lock_fit",
           "runtime_overhead", "CALIBRATION_MODELS", "gil_grid",
           "drop_contended_costs", "calibration_load", "reduce_byte_cost",
           "measured_copy_cost", "measured_collective_cost", "apply_measured_collectives",
           "CALIBRATION_STRATEGIES"]

#: (name, builder kwargs) of the synthetic calibration models
CALIBRATION_MODELS = (("mlp", {"depth": 2}), ("mlp", {"depth": 6}), ("mlp", {"depth": 12}),
                      ("mlp", {"depth": 6, "split_act": True}),
                      ("conv", {"depth": 2}), ("conv", {"depth": 4}),
                      ("lstm", {"steps": 3}), ("lstm", {"steps": 6, "layers": 2}),
                      # wider ones, whose kernels (0.05-1 ms) release the interpreter
                      # lock for part of their time: they identify gil_kernel_s
                      ("mlp", {"depth": 3, "width": 384, "batch": 128}),
                      ("conv", {"depth": 2, "batch": 32, "channels": 8, "size": 16}),
                      # cells of 40-55 us, the zoo's RNN cells' (rnntc and rnnlm at
                      # scale="small"): whether such a kernel holds the lock whole
                      # or lets it go sits right at gil_kernel_s's likely values
                      ("lstm", {"steps": 4, "layers": 2, "hidden": 48, "batch": 16}))


#: the strategies every calibration model runs under: "single" (one device,
#: no second worker contending) anchors the per-task terms; with it, two
#: same-window pairs of bench/fidelity.py runs (3 processes each, 20 rows with
#: single and search) gave mean 11.6/14.1% and worst 31/36% against 16.6/15.7%
#: and 46/47% without
CALIBRATION_STRATEGIES = ("data", "model", "single")


def _mlp(depth: int, split_act: bool = False, width: int = 8, batch: int = 8) -> Any:

    wide = "w" if width != 8 else ""
    m = nn.Model(batch_size=batch, name=f"calib_mlp{depth}{'a' if split_act else ''}{wide}")
    t = m.input((width,))
    for i in range(depth):
        if split_act:
            t = m.relu(m.dense(t, width, name=f"d{i}"), name=f"a{i}")
        else:
            t = m.dense(t, width, activation="relu", name=f"d{i}")
    m.softmax(m.dense(t, 4, name="out"))
    return m


def _conv(depth: int, batch: int = 8, channels: int = 2, size: int = 6) -> Any:

    wide = "w" if channels != 2 else ""
    m = nn.Model(batch_size=batch, name=f"calib_conv{depth}{wide}")
    t = m.input((2, size, size))
    for i in range(depth):
        t = m.conv2d(t, channels, 3, padding=1, activation="relu", name=f"c{i}")
    t = m.pool2d(t, 2, name="pool")
    m.softmax(m.dense(m.flat(t, name="flat"), 4, name="out"))
    return m


def _lstm(steps: int, layers: int = 1, hidden: int = 4, vocab: int = 8,
          batch: int = 8) -> Any:
    """A tiny unrolled LSTM classifier: per-step shared embeddings and cells
    sharing their parameters (the structure, not the sizes, of the zoo's RNNs)."""

    wide = f"h{hidden}" if hidden != 4 else ""
    m = nn.Model(batch_size=batch, name=f"calib_lstm{steps}x{layers}{wide}")
    tokens = m.input((steps,), dtype="int32", name="tokens")
    xs = embed_tokens(m, tokens, steps, vocab, hidden, "emb")
    tops, _ = lstm_stack(m, xs, layers, hidden, "l")
    m.softmax(m.dense(tops[-1].h, 2, name="out"))
    return m


def calibration_models() -> list[Any]:
    """Fresh (uncompiled) synthetic calibration models: deep narrow MLPs
    (with fused and with separate activations), tiny conv stacks and tiny
    unrolled LSTMs (shared parameters), plus wider ones whose kernels
    identify the lock terms: a dense and a conv model of 0.05-1.4 ms
    kernels, an LSTM of 40-55 us cells (the zoo's RNN cells at
    ``scale="small"``)."""
    build = {"mlp": _mlp, "conv": _conv, "lstm": _lstm}
    return [build[kind](**kw) for kind, kw in CALIBRATION_MODELS]


def calibrate_layer_overhead(machine: Any, steps: int = 15, warmup: int = 3,
                             cost: Any = "measured", verbose: bool = False,
                             models: Any = None, strategies: Any = CALIBRATION_STRATEGIES,
                             repeats: int = 4) -> dict[str, Any]:
    """Regress the runtime's per-step, per-task, per-requirement and per-copy
    costs from synthetic models trained through the layer API (module doc).
    Returns the :class:`~legionpy.optimizer.fidelity.RuntimeOverhead` fields
    plus ``"calibration"`` (the rows, the fits' residuals, the seconds taken).
    ``models``: a callable returning fresh uncompiled models (default
    :func:`calibration_models`); ``repeats``: ``fit`` calls per row (a fit's
    steps settle in one of a few lock-interleaving regimes: the row pools
    the steps of all of them). Collective under MPI; takes ~10-40 s."""

    t0 = time.perf_counter()
    cm = cost if isinstance(cost, CostModel) else cost_model_from_spec(cost)
    rows = []
    graphs = []  # (task graph, graph) per row, for the copy term's fit
    seen: list[float | None] = []  # every kept fit's host probe
    again_later: list[tuple] = []  # per row: what the second pass needs to measure it again
    for sname in strategies:
        for m in (models() if models is not None else calibration_models()):
            strat = resolve_strategy(sname, m.graph, machine)
            prime_alone(cm, m.graph, strat, machine)  # kernels timed in the step's order
            sim = Simulator(m.graph, machine, cm)
            res = sim.run(strat)
            tg = sim.tg.to_json(include_times=False)
            if hasattr(cm, "lock_shares"):  # as simulate_strategy sees the kernels
                annotate_lock_shares(tg, m.graph, cm.lock_shares(m.graph, strat, machine))
            graphs.append((tg, m.graph))
            counts = task_counts(tg, m.graph)
            kernels = float(sum(res.per_device_busy_s.values()))
            phases = _phase_figures(tg, m.graph)
            # a fit that ran while the host ran Python slowly (its other
            # tenants, probe/hostspeed.py) is taken again, up to twice a row
            measure = functools.partial(_row_fit, m, strat, machine, steps, warmup)
            c0 = cpu_clock()
            runs, again = retake(measure, quiet_reference(seen), max(1, repeats))
            seen.extend(r["measured_host_probe_s"] for r in runs)
            row = {"model": m.graph.name, "strategy": sname, **counts}
            rows.append(_row_figures(row, runs, again, c0, kernels, tg, phases))
            again_later.append((functools.partial(_fresh_row, models, m.graph.name, sname,
                                                  machine, steps, warmup),
                                row, kernels, tg, phases))
            if verbose:
                print(f"  calibrate {m.graph.name:<14} {sname:<6} tasks {counts['tasks']:>4} "
                      f"reqs {counts['reqs']:>5} copies {counts['copies']:>4} period "
                      f"{rows[-1]['period_s'] * 1e3:7.2f} ms control "
                      f"{rows[-1]['control_s'] * 1e3:7.2f} ms", flush=True)
    _second_pass(rows, again_later, quiet_reference(seen), max(1, repeats), verbose)
    a = np.array([[1.0, r["tasks"], r["reqs"], r["copies"]] for r in rows])
    period = np.array([r["control_s"] for r in rows])
    ctl = nnls(a, period)
    w = np.array([[r["tasks"], r["reqs"], r.get("backward", 0)] for r in rows])
    extra = np.array([r["worker_extra_s"] for r in rows])
    wk = nnls(w, extra)

    def rel(fit: np.ndarray, y: np.ndarray) -> float:
        return float(np.max(np.abs(fit - y) / np.maximum(y, 1e-12)))

    return {"step_s": float(ctl[0]), "launch_s": float(ctl[1]), "req_launch_s": float(ctl[2]),
            "copy_launch_s": float(ctl[3]), "task_s": float(wk[0]), "req_task_s": float(wk[1]),
            "back_task_s": float(wk[2]), **finish_terms(rows),
            "calibration": {"rows": rows, "control_worst_residual": rel(a @ ctl, period),
                            # the host's quiet speed, for the measurements that follow
                            "host_probe_s": quiet_reference(r["host_probe_s"] for r in rows),
                            "worker_worst_residual": rel(w @ wk, extra),
                            "seconds": time.perf_counter() - t0},
            "taskgraphs": graphs}


def _row_figures(row: dict, runs: list[dict], again: int, c0: Any, kernels: float,
                 tg: dict, phases: dict) -> dict[str, Any]:
    """``row`` (its model, strategy and task counts) with the figures of
    its kept fits ``runs`` (``again``: fits taken beyond them; ``c0``: the
    CPU clock before the first, for the load meanwhile; ``kernels``: the
    simulated kernels' seconds; ``tg``: its task graph; ``phases``: its
    :func:`_phase_figures`)."""
    # the load over the row's whole time (0.3-1 s): one fit's window
    # (10-100 ms) is a few of /proc/stat's 10 ms ticks, +-0.3-1 core
    bg = background_cores(c0, cpu_clock())
    busy = float(np.mean([sum(r["measured_per_device_busy_s"].values()) for r in runs]))
    # the workers' CPU between their tasks (finishing, releasing, taking the next)
    between = float(np.mean([sum(r.get("measured_per_device_cpu_s", {}).values())
                             - sum(r.get("measured_per_device_span_cpu_s", {}).values())
                             for r in runs]))
    return {**row,
            # the median of the fits' steady-state periods: one stalled
            # fit (another program, the OS) must not pull a 30-row fit;
            # not the median step, which is the fast half of a step
            # pattern that alternates (one device: 0.4 and 3.4 ms for
            # a period of 1.8 ms)
            "period_s": float(np.median([r["measured_time_s"] for r in runs])),
            "background_cores": bg,
            "control_s": float(np.median([r["measured_control_cpu_s"] for r in runs])),
            "busy_s": busy, "worker_extra_s": max(0.0, busy - kernels),
            "between_s": max(0.0, between),
            # how fast the host ran Python over the kept fits
            "host_probe_s": median_probe(runs), "retakes": again,
            # a copy's wall time in the runtime, and the machine
            # model's for the same copies (latency and bytes)
            "copy_wall_s": median_of(r.get("measured_copy_s") for r in runs),
            "coll_wall_s": median_of(r.get("measured_collective_s") for r in runs),
            "coll_model_s": median_of(t["duration_s"] for t in tg["tasks"]
                                      if t["kind"] == "collective"),
            "copy_model_s": median_of(t["duration_s"] for t in tg["tasks"]
                                      if t["kind"] == "copy"),
            "phase_wall_s": {p: float(np.mean([r.get("measured_phase_s", {}).get(p, 0.0)
                                               for r in runs])) for p in "FBU"},
            **phases}


#: fits a row measured again in the second pass may take beyond its
#: repeats, and the seconds the whole second pass may take
SECOND_PASS_EXTRA = 4
SECOND_PASS_BUDGET_S = 15.0


def _second_pass(rows: list[dict], again_later: list[tuple], reference: float | None,
                 repeats: int, verbose: bool = False) -> None:
    """Measure again, in place, the rows whose kept fits still ran while
    the host ran Python over :data:`~legionpy.probe.hostspeed.QUIET_SLOWDOWN`
    times slower than the calibration's quiet figure ``reference`` (the
    lower quartile of every kept fit's probe): the first pass judges a
    row's fits against the rows before it, and a slow stretch of the host
    (20 ms to 10 s) can outlast a row's retakes. A row keeps its second
    measurement when that ran on a quieter host. 28 Nov: one calibration
    kept 13 of its 30 rows at 1.2-1.4x its quiet probe (up to 2.64 ms for
    a row measured at 1.72 elsewhere), and its fit read the workers'
    ``task_s`` at 12.1 us against 9.0 ten minutes before. Collective
    under MPI (the rows' probes are rank 0's)."""
    t0 = time.perf_counter()
    for i, (fresh, row, kernels, tg, phases) in enumerate(again_later):
        # rank 0's clock decides for every rank (the fits are collective)
        if bcast_root(time.perf_counter() - t0 > SECOND_PASS_BUDGET_S):
            break
        s = slowdown(rows[i]["host_probe_s"], reference)
        if s is None or s <= QUIET_SLOWDOWN:
            continue
        c0 = cpu_clock()
        runs, again = retake(fresh(), reference, repeats, extra=SECOND_PASS_EXTRA)
        if (median_probe(runs) or float("inf")) >= rows[i]["host_probe_s"]:
            continue
        rows[i] = {**_row_figures(row, runs, rows[i]["retakes"] + repeats + again, c0,
                                  kernels, tg, phases), "second_pass": True}
        if verbose:
            print(f"  calibrate {row['model']:<14} {row['strategy']:<6} again (the host was "
                  f"busy: x{s:.2f}): period {rows[i]['period_s'] * 1e3:7.2f} ms at "
                  f"x{slowdown(rows[i]['host_probe_s'], reference):.2f}", flush=True)


def _fresh_row(models: Any, name: str, sname: str, machine: Any, steps: int,
               warmup: int) -> Callable[[int], dict[str, Any]]:
    """A ``measure(attempt)`` of the calibration row of model ``name`` under
    strategy ``sname``, on a fresh instance compiled at its first attempt
    (``models``: :func:`calibrate_layer_overhead`'s), so the second
    measurement owes nothing to the first pass's instances and traces."""
    m = next(x for x in (models() if models is not None else calibration_models())
             if x.graph.name == name)
    return functools.partial(_row_fit, m, resolve_strategy(sname, m.graph, machine), machine,
                             steps, warmup)


def _row_fit(model: Any, strategy: Any, machine: Any, steps: int, warmup: int,
             attempt: int) -> dict[str, Any]:
    """A calibration row's fit ``attempt`` (the first compiles ``model`` with
    ``strategy``); rank 0's figures on every rank."""
    return bcast_root(measure_runtime(model, strategy if attempt == 0 else None, machine,
                                      steps=steps, warmup=warmup))


def finish_terms(rows: list[dict]) -> dict[str, float]:
    """``finish_s`` and ``finish_copy_s``: the workers' CPU seconds between
    their tasks (each row's ``between_s``, :func:`calibrate_layer_overhead`),
    by least squares on the rows' tasks and copies (every copy is handed to
    its link's thread by the worker that ran its source). Zero where the
    rows have no such figure (the serial executor)."""
    use = [r for r in rows if r.get("between_s", 0.0) > 0]
    if not use:
        return {"finish_s": 0.0, "finish_copy_s": 0.0}
    a = np.array([[r["tasks"], r.get("copies", 0)] for r in use], dtype=float)
    fit = nnls(a, np.array([r["between_s"] for r in use]))
    return {"finish_s": float(fit[0]), "finish_copy_s": float(fit[1])}


def measured_collective_cost(rows: list[dict]) -> float | None:
    """``local_coll_s`` as the runtime's collectives inside one process took
    it: over the rows with collectives, the median of each row's median
    collective wall time less the machine model's (its bytes), at least 0;
    None without such rows. A reduce-scatter folds its bucket's gradient
    buffers in its prologue and runs the rule's steps in Python: 154-184
    us each measured (27 Nov: prologue 58, transport 67-84) where the
    machine model has 8-11 for the bytes."""
    return _wall_less_model(rows, "coll")


def apply_measured_collectives(ovh: RuntimeOverhead, rows: list[dict],
                               ranks: int) -> float | None:
    """Set ``ovh``'s collective terms from the rows' collectives as the
    runtime ran them (:func:`measured_collective_cost`; returned, None
    without collectives). One rank: ``local_coll_s``, added to every
    collective inside one process. More ranks: the rows' collectives crossed
    them (one device per rank, or a group over every rank's devices), so
    the figure is a collective between ranks beside a step's work, its
    prologue and its transport: ``coll_s`` becomes at least it. The probe's
    bare transport (``measure_mpi_collectives``: ranks lined up by a
    barrier, nothing else running) read 142-180 us on 2 ranks where the
    rows' read 199-212 and a zoo model's reduce-scatter 300-450 (27 Nov,
    ``mpirun -n 2``: its prologue 166-233 us before the transport's wait)."""
    coll = measured_collective_cost(rows)
    if coll is None:
        return None
    if ranks == 1:
        ovh.local_coll_s = coll
    else:
        ovh.coll_s = max(ovh.coll_s, coll)
    return coll


def measured_copy_cost(rows: list[dict]) -> float | None:
    """``copy_s`` as the runtime's copies took it: over the rows with copies,
    the median of each row's median copy wall time less the machine model's
    median time for the same copies (latency and bytes), at least 0. None
    without such rows. In one process a copy is a memcpy and its link
    thread's Python (5-17 us measured, 27 Nov); fitted with the lock terms
    instead, ``copy_s`` took 10-50 us from one calibration to the next and
    moved the model-parallel rows by 20-40% (the breakdown of lenet model
    put 2.2 ms of copies on a device whose copies took 0.19)."""
    return _wall_less_model([r for r in rows if r.get("copies", 0) > 0], "copy")


def _wall_less_model(rows: list[dict], what: str) -> float | None:
    """Over the rows that measured both, the median of each row's median
    wall time of its ``what`` tasks (``WHAT_wall_s``) less the machine
    model's (``WHAT_model_s``), at least 0; None without such rows."""
    got = median_of(r[f"{what}_wall_s"] - r[f"{what}_model_s"] for r in rows
                    if r.get(f"{what}_wall_s") is not None
                    and r.get(f"{what}_model_s") is not None)
    return None if got is None else max(0.0, got)


def _phase_figures(tg: dict, graph: Any) -> dict[str, dict[str, float]]:
    """Per phase (``F``, ``B``, ``U``) of a simulated task graph: its tasks,
    their kernels' seconds and the gradient bytes they reduce."""
    out: dict[str, dict[str, float]] = {"phase_tasks": {}, "phase_kernel_s": {},
                                        "phase_reduce_bytes": {}, "phase_reduce_grads": {},
                                        "phase_reduce_bufs": {}}
    red, grads = gradient_reductions(tg["tasks"], graph)
    bufs = gradient_buffers(tg["tasks"], graph)
    for t, b, n, f in zip(tg["tasks"], red, grads, bufs):
        p = t["name"][:1]
        if t["kind"] == "copy" or t["name"][1:2] != ":" or p not in "FBU":
            continue
        for key, v in (("phase_tasks", 1.0), ("phase_kernel_s", t["duration_s"]),
                       ("phase_reduce_bytes", b), ("phase_reduce_grads", n),
                       ("phase_reduce_bufs", f)):
            out[key][p] = out[key].get(p, 0.0) + v
    return out


#: the share of a one-device row's backward phase its kernels may take for
#: the row to measure the workers' terms (the tiny models' kernels take
#: 7-32%, the two wide models' 64-67%)
PRECISE_KERNEL_SHARE = 0.5


def phase_overheads(rows: list[dict], reduce_byte_s: float) -> dict[str, float] | None:
    """The workers' per-task seconds beyond the kernels, by phase, from the
    rows run on one device (no second worker contends, so a task's wall time
    is its kernel, its gradient reductions and the runtime's work): ``task_s``
    (a forward task's), ``reduce_req_s`` (what a backward task costs beyond
    it, per gradient it reduces: an embedding's one, an LSTM cell's one per
    input and weight),
    ``reduce_buf_s`` (per reduction buffer beyond that, :func:`_buffer_split`;
    0 where the rows cannot tell the two apart) and
    ``update_task_s`` (an update task's beyond it). Each is the rows' summed
    wall time of that phase's tasks less their kernels and reductions' bytes,
    per task (per gradient). None without such rows. (The row totals cannot
    tell them apart: every model has as many backward tasks as forward ones.)

    Rows whose backward kernels take :data:`PRECISE_KERNEL_SHARE` or more of
    their backward phase (the two wide models, whose kernels identify the
    interpreter lock's hold) are left out while others remain: their
    overhead is the difference of two large times, one measured and one
    timed apart. Over eight calibrations of one hour (27 Nov), their 12
    gradients read 16-51 us each where the tiny rows' read 15-29, and the
    update term took 23.4-28.8 us without them against 25.6-36.8 with them
    (the seven quiet ones). Refitted and scored against the median of the
    hour's twelve bench measurements per row, the zoo's mean error went
    11.7 -> 6.9% and 11.7 -> 7.8% in two calibrations, moved at most 0.5
    points in five, and 40.3 -> 44.1% in the one taken in a noisy spell."""
    use = [r for r in rows if r.get("strategy") == "single" and r.get("phase_wall_s")]
    if not use:
        return None
    use = [r for r in use if r["phase_kernel_s"].get("B", 0.0)
           < PRECISE_KERNEL_SHARE * r["phase_wall_s"].get("B", 0.0)] or use

    def row_extra(r: dict, p: str) -> float:
        return (r["phase_wall_s"].get(p, 0.0) - r["phase_kernel_s"].get(p, 0.0)
                - reduce_byte_s * r["phase_reduce_bytes"].get(p, 0.0))

    def extra(p: str) -> float:
        return sum(row_extra(r, p) for r in use)

    def count(p: str, what: str = "phase_tasks") -> float:
        return sum(r[what].get(p, 0.0) for r in use)

    task = max(0.0, extra("F") / count("F")) if count("F") else 0.0
    grads = count("B", "phase_reduce_grads")
    backs = [row_extra(r, "B") - task * r["phase_tasks"].get("B", 0.0) for r in use]
    update = extra("U") - task * count("U")
    per_grad, per_buf = (max(0.0, sum(backs) / grads) if grads else 0.0), 0.0
    split = _buffer_split(use, backs)
    if split is not None:
        per_buf, per_grad = split
    return {"task_s": task, "req_task_s": 0.0, "back_task_s": 0.0,
            "reduce_req_s": per_grad, "reduce_buf_s": per_buf,
            "update_task_s": max(0.0, update / count("U")) if count("U") else 0.0}


def _buffer_split(use: list[dict], backs: list[float]) -> tuple[float, float] | None:
    """(``reduce_buf_s``, ``reduce_req_s``): each row's backward phase's
    seconds beyond its kernels, its reductions' bytes and ``task_s`` a task
    (``backs``, :func:`phase_overheads`), fitted row by
    row (non-negative least squares) on the reduction buffers the rows fill
    and fold and the contributions their tasks make
    (:func:`~legionpy.optimizer.fidelity.gradient_buffers`); None where the
    rows cannot tell them apart (a row of an older calibration without the
    buffer counts, or every row with one contribution per buffer)."""
    if any("B" not in r.get("phase_reduce_bufs", {}) for r in use):
        return None
    a = np.array([[r["phase_reduce_bufs"]["B"], r["phase_reduce_grads"].get("B", 0.0)]
                  for r in use])
    if len(use) < 3 or np.linalg.matrix_rank(a) < 2:
        return None
    buf, grad = nnls(a, np.array(backs))
    return float(buf), float(grad)


#: the per-copy costs tried by :func:`fit_copy_cost`, seconds
COPY_GRID = (0.0, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 3e-4, 5e-4, 7e-4, 1e-3, 1.5e-3, 2e-3)


def fit_copy_cost(ovh: RuntimeOverhead, rows: list[dict], graphs: list) -> float:
    """``copy_s``, the seconds a copy takes besides its latency and bytes (on
    a 2-rank job: the MPI communicator's per-message work), fitted on the
    calibration rows: of :data:`COPY_GRID`, the value whose simulated
    period (:func:`~legionpy.optimizer.fidelity.simulate_with_runtime` with
    every other term as calibrated, at each row's measured background load)
    has the least squared log error against the measured periods (issue 26:
    without it every ``mpirun -n 2`` row was 30-65% low, the breakdown's
    copy/collective term). Only rows with copies
    count; 0 when none has."""
    from dataclasses import replace

    from ..optimizer.fidelity import simulate_with_runtime

    pairs = [(r, g) for r, g in zip(rows, graphs) if r.get("copies", 0) > 0]
    if not pairs:
        return 0.0

    def loss(c: float) -> float:
        o = replace(ovh, copy_s=c)
        err = 0.0
        for r, (tg, graph) in pairs:
            # each row at the background load measured while it ran, so the
            # figure is the copy's own cost, not other programs' share of the cores
            t = simulate_with_runtime(tg, o.under_load(r.get("background_cores")), graph,
                                      pipelined=True)["iteration_time_s"]
            err += float(np.log(max(t, 1e-9) / max(r["period_s"], 1e-9))) ** 2
        return err

    return min(COPY_GRID, key=loss)


#: the lock's hand-over costs tried by :func:`fit_lock_terms`
SWITCH_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0)
#: the worker threads' wake-up times tried by :func:`fit_lock_terms`, seconds
WAKE_GRID = (0.0, 1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4)
#: the fractions of the regressed worker terms tried by :func:`fit_lock_terms`
WORKER_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
#: ``hop_s``: a copy between ranks' wait besides its transfer (no core, no lock)
HOP_GRID = (0.0, 2.5e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4)
#: ``one_core_scale``: a kernel's slowdown on a rank whose threads share one
#: core (fitted only where the ranks are bound a core each)
ONE_CORE_GRID = (1.0, 1.05, 1.1, 1.15, 1.2, 1.3)
#: the seconds of a kernel that hold the lock tried by :func:`fit_lock_terms`
#: (besides the probe's figure; 1 s: every kernel whole)
GIL_GRID = (1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 1e-3, 1.0)


def gil_grid(ovh: RuntimeOverhead) -> tuple[float, ...]:
    """The ``gil_kernel_s`` values :func:`fit_lock_terms` tries, in order
    (:func:`lock_fit_candidates`' ``part`` and ``"order"`` index them): :data:`GIL_GRID` and the
    probe's figure.

    >>> gil_grid(RuntimeOverhead(gil_kernel_s=2.5e-5))[:4]
    (1e-05, 2e-05, 2.5e-05, 3e-05)
    """
    return tuple(sorted({*GIL_GRID, ovh.gil_kernel_s}))


#: fits of the lock terms whose loss is within this fraction of the best
#: are near-equal: the calibration's rows cannot tell them apart, and
#: :func:`choose_lock_fit` takes the one whose ``gil_kernel_s`` is nearest the
#: probe's figure (29 Nov, seven calibrations' landscapes: the best loss alone
#: put one bench's worst row at 30%, the fit at 1 s within 0.4% of one at 10
#: us). 2% at first; a fresh ``mpirun -n 2`` calibration (R60, 29 Nov) then
#: fitted 1 s 4-13% better than every value from 10 us to 1 ms and put
#: alexnet model 39% and lenet owt 31% high. On eight calibrations' landscapes
#: any window of 5-10% gave the same worst rows (26.3% at most against 38.9,
#: 17.8 on average against 19.6) and means (7.9% against 8.2); 10%: a loss
#: is a sum of some 60 squared log errors of rows measured within +-5%, whose
#: noise alone moves it by about that much
NEAR_LOSS = 0.10


def fit_lock_terms(ovh: RuntimeOverhead, rows: list[dict], graphs: list,
                   rounds: int = 2, fit_copy: bool = True) -> dict[str, float] | None:
    """The lock-sharing terms (:mod:`legionpy.optimizer.sharing`), fitted
    on the calibration rows with the regressed terms fixed: the seconds of a
    kernel that hold the lock ``gil_kernel_s`` (:data:`GIL_GRID` and the
    probe's figure; the wide synthetic models identify it), the hand-over
    cost ``gil_switch`` (:data:`SWITCH_GRID`), the worker's wake-up
    ``wake_s`` (:data:`WAKE_GRID`), ``copy_s`` (:data:`COPY_GRID`; kept as
    given with ``fit_copy`` False: measured), with ranks and copies
    ``hop_s`` (:data:`HOP_GRID`: how long a copy between ranks waits without
    a core, apart from ``copy_s``, its threads' work) and a
    factor on the regressed worker terms (:data:`WORKER_GRID`: their
    dependent variable, the devices' measured busy time less the kernels,
    also holds time a task lost to the other threads). The loss is the
    squared log error of each row's simulated period and of its devices'
    busy time (each row at its measured background load): for every
    ``gil_kernel_s``, coordinate descent over the others (``rounds``
    sweeps, :func:`lock_fit_candidates`); of those, the best, or among
    near-equal ones the nearest the probe's figure (:func:`choose_lock_fit`).
    Where the ranks are bound a core each, also the
    kernels' slowdown beside their rank's other threads, ``one_core_scale``
    (:data:`ONE_CORE_GRID`; on R23's rows, 28 Nov, the fit took 1.1, its
    loss went from 1.72 to 1.57 and the bench's 16 rows from 7.8 / 24.5%
    mean / worst to 5.8 / 14.7%). Returns ``{"gil_kernel_s", "gil_switch",
    "wake_s", "copy_s", "hop_s", "one_core_scale", "task_s", "req_task_s",
    "back_task_s", "loss"}``. Takes 10-20 s on 20 rows;
    :func:`fit_lock_terms_on_ranks` shares it among the ranks."""
    return _chosen_terms(lock_fit_candidates(ovh, rows, graphs, rounds, fit_copy),
                         ovh.gil_kernel_s)


def _chosen_terms(fits: list[dict[str, float]],
                  probe: float | None) -> dict[str, float] | None:
    """:func:`choose_lock_fit`'s fit without its grid index (``"order"``)."""
    got = choose_lock_fit(fits, probe)
    return None if got is None else {k: v for k, v in got.items() if k != "order"}


def lock_fit_candidates(ovh: RuntimeOverhead, rows: list[dict], graphs: list,
                        rounds: int = 2, fit_copy: bool = True,
                        part: tuple[int, int] = (0, 1)) -> list[dict[str, float]]:
    """For every ``part[1]``-th ``gil_kernel_s`` of :func:`gil_grid` from the
    ``part[0]``-th, the best fit of the other lock terms with it
    (:func:`fit_lock_terms`), with its ``"loss"`` and ``"order"`` (the
    value's index in the grid)."""
    from dataclasses import replace

    from ..optimizer.fidelity import simulate_with_runtime

    sims = []
    for r, (tg, graph) in zip(rows, graphs):
        sims.append((r, tg, graph))
    cur = {"gil_switch": ovh.gil_switch, "copy_s": ovh.copy_s, "worker": 1.0,
           "wake_s": ovh.wake_s, "gil_kernel_s": ovh.gil_kernel_s, "hop_s": ovh.hop_s,
           "one_core_scale": ovh.one_core_scale}
    memo: dict[tuple, float] = {}

    def loss(c: dict) -> float:
        k = (c["gil_switch"], c["copy_s"], c["worker"], c["wake_s"], c["gil_kernel_s"],
             c["hop_s"], c["one_core_scale"])
        if k in memo:
            return memo[k]
        o = replace(ovh, gil_switch=c["gil_switch"], copy_s=c["copy_s"], wake_s=c["wake_s"],
                    gil_kernel_s=c["gil_kernel_s"], hop_s=c["hop_s"],
                    one_core_scale=c["one_core_scale"], **_workers(ovh, c["worker"]))
        err = 0.0
        for r, tg, graph in sims:
            out = simulate_with_runtime(tg, o.under_load(r.get("background_cores")), graph,
                                        pipelined=True)
            err += float(np.log(max(out["iteration_time_s"], 1e-9)
                                / max(r["period_s"], 1e-9))) ** 2
            if r.get("busy_s"):
                busy = sum(out["per_device_busy_s"].values())
                err += float(np.log(max(busy, 1e-9) / max(r["busy_s"], 1e-9))) ** 2
        memo[k] = err
        return err

    grids = {"worker": WORKER_GRID, "gil_switch": SWITCH_GRID, "wake_s": WAKE_GRID,
             "copy_s": COPY_GRID,
             "gil_kernel_s": gil_grid(ovh)}
    if not any(r.get("copies", 0) > 0 for r in rows):
        grids["copy_s"] = (0.0,)
        cur["copy_s"] = 0.0
    elif not fit_copy:  # measured (measured_copy_cost): kept as it is
        grids["copy_s"] = (ovh.copy_s,)
    if ovh.control_threads > 1 and any(r.get("copies", 0) > 0 for r in rows):
        # copies between ranks: their wait besides the work, fitted first (the
        # wake-ups and the workers' terms can stand in for it along a chain of
        # copies, and the descent then stops short of it)
        grids = {"hop_s": HOP_GRID, **grids}
    else:
        cur["hop_s"] = 0.0
    if ovh.one_core_ranks():  # kernels beside their rank's other threads on one core
        grids = {"one_core_scale": ONE_CORE_GRID, **grids}
    # every lock share of the kernels, each with coordinate descent over the
    # rest (the loss has local minima along gil_kernel_s)
    out = []
    gils = grids.pop("gil_kernel_s")
    for idx in range(part[0], len(gils), part[1]):
        c = {**cur, "gil_kernel_s": gils[idx]}
        for _ in range(rounds):
            before = dict(c)
            for name, grid in grids.items():
                c[name] = min(grid, key=lambda v: loss({**c, name: v}))
            if c == before:
                break
        out.append({"gil_switch": c["gil_switch"], "copy_s": c["copy_s"],
                    "wake_s": c["wake_s"], "gil_kernel_s": c["gil_kernel_s"],
                    "hop_s": c["hop_s"], "one_core_scale": c["one_core_scale"],
                    **_workers(ovh, c["worker"]), "loss": loss(c), "order": idx})
    return out


def choose_lock_fit(fits: list[dict[str, float]],
                    probe: float | None) -> dict[str, float] | None:
    """Of the lock fits of :func:`lock_fit_candidates` (any order), the one
    whose ``gil_kernel_s`` is nearest ``probe`` (in ratio; the figure
    :func:`~legionpy.probe.overhead.measure_lock_hold` measured directly)
    among those within :data:`NEAR_LOSS` of the best loss; at equal
    distance the lower loss, then the first in the grid. Without a probe,
    the best loss. The rows cannot tell near-equal fits apart, yet they put
    the zoo's steps apart: under ``mpirun -n 2`` (R53, 29 Nov) 1 s (every
    kernel holding the lock whole) fitted 0.4% better than 10 us and put
    alexnet's model-parallel rows 25-30% high; the probe read 29 us, whose
    fits put that bench's rows at 5.4-6.4% mean, 11.6-15.5% worst.

    >>> fits = [{"gil_kernel_s": 1e-5, "loss": 1.70, "order": 0},
    ...         {"gil_kernel_s": 3e-5, "loss": 1.90, "order": 1},
    ...         {"gil_kernel_s": 1.0, "loss": 1.69, "order": 2}]
    >>> choose_lock_fit(fits, 2.9e-5)["gil_kernel_s"]   # 1.70 within 10% of 1.69, 1.90 not
    1e-05
    >>> choose_lock_fit(fits, None)["gil_kernel_s"]
    1.0
    """
    if not fits:
        return None
    best = min(f["loss"] for f in fits)
    near = [f for f in fits if f["loss"] <= best * (1.0 + NEAR_LOSS)]

    def distance(f: dict) -> float:
        if not probe or probe <= 0 or f["gil_kernel_s"] <= 0:
            return 0.0
        return round(abs(float(np.log(f["gil_kernel_s"] / probe))), 9)  # ties exact

    return min(near, key=lambda f: (distance(f), f["loss"], f.get("order", 0)))


def fit_lock_terms_on_ranks(ovh: RuntimeOverhead, rows: list[dict], graphs: list,
                            fit_copy: bool = True) -> dict[str, float]:
    """:func:`fit_lock_terms` with its ``gil_kernel_s`` grid shared among the
    ranks (each descends from every ``size``-th value, then every rank
    chooses from all of them alike: the fit one process takes alone). Rank
    0's ``ovh``, rows (each rank measured
    its own background load) and task graphs go to every rank, so every rank
    fits the same loss. Under ``mpirun -n 2`` on two cores the fit takes
    about half as long (it was taken whole on every rank: 17.5 s against
    34.8 on one calibration's rows). Collective."""
    ovh, rows, tgs = bcast_root((ovh, rows, [tg for tg, _ in graphs]))
    same = [(tg, g) for tg, (_, g) in zip(tgs, graphs)]
    parts = share_among_ranks(lambda rank, size: lock_fit_candidates(
        ovh, rows, same, fit_copy=fit_copy, part=(rank, size)))
    return _chosen_terms([f for part in parts for f in part], ovh.gil_kernel_s)


#: the workers' per-task terms (RuntimeOverhead.worker_s and the gradients'
#: reduce_req_s), which fit_lock_terms scales by one factor
WORKER_TERMS = ("task_s", "req_task_s", "back_task_s", "update_task_s", "reduce_req_s",
                "reduce_buf_s")


def _workers(ovh: RuntimeOverhead, factor: float) -> dict[str, float]:
    return {k: getattr(ovh, k) * factor for k in WORKER_TERMS}


def _overhead_path(machine_name: str) -> str:

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", machine_name)
    return os.path.join(os.path.dirname(default_cache_path()), f"overhead-v27-{safe}.json")


def _calibration_path(machine_name: str, bound: bool) -> str:
    """The cached layer calibration of the machine ``machine_name``;
    ``bound``: its ranks bound to their cores (legionpy/affinity.py), which
    run differently and keep their own figures."""
    return _overhead_path(machine_name + ("-bound" if bound else ""))


#: median background cores over a calibration's rows above which it is
#: loaded (quiet calibrations here measured 0.13-0.19, one beside a test
#: suite 1.2, one beside a busy loop 1.1)
LOADED_CORES = 0.5
#: background cores under which the machine counts as quiet (a loaded
#: calibration is then redone), sampled over QUIET_SAMPLE_S seconds
QUIET_CORES = 0.2
QUIET_SAMPLE_S = 0.3


def calibration_load(rows: list[dict]) -> float | None:
    """The median cores other programs kept busy while the calibration
    ``rows`` ran (each row measured its own); None when none was measured."""
    return median_of(r.get("background_cores") for r in rows)


def _quiet_now() -> bool:
    """Other programs keep under QUIET_CORES busy now (collective)."""
    c0 = cpu_clock()
    time.sleep(QUIET_SAMPLE_S)
    now = background_cores(c0, cpu_clock())
    return now is not None and now < QUIET_CORES


def note_faster_run(machine_name: str, slow: float | None) -> bool:
    """Record, on the cached calibration of the machine ``machine_name``
    (``Machine.name``), that a run found
    the host running Python ``1 / slow`` times faster than while the
    calibration measured its rows (``slow``: the run's
    :func:`~legionpy.probe.hostspeed.slowdown` against the calibration's
    quiet probe), when that is over
    :data:`~legionpy.probe.hostspeed.QUIET_SLOWDOWN`: the calibration ran in
    a busy spell of the host's other tenants, and the next run calibrates
    again (:func:`runtime_overhead`), unless this calibration is itself such
    a retake. Returns whether the next run calibrates again (rank 0's
    answer; rank 0 writes)."""
    if slow is None or slow <= 0 or 1.0 / slow <= QUIET_SLOWDOWN:
        return False
    return bool(bcast_root(_mark_faster(machine_name, 1.0 / slow)
                           if get_runtime().rank == 0 else None))


def _mark_faster(machine_name: str, faster: float) -> bool:
    """Mark the cached calibration of ``machine_name`` as ``faster`` times
    slower than a run (:func:`note_faster_run`); False where there is none,
    or it is already a retake for that reason (kept)."""
    path = _calibration_path(machine_name, binding() is not None)
    try:
        with open(path) as f:
            have = json.load(f)
    except (OSError, ValueError):
        return False
    calib = have.get("calibration")
    if not isinstance(calib, dict) or calib.get("speed_retake"):
        return False
    calib["slower_than_run"] = max(faster, calib.get("slower_than_run") or 0.0)
    atomic_write_json(path, have)
    return True


def _stale_reason(have: dict) -> tuple[str, bool] | None:
    """Why the cached calibration ``have`` (its JSON) must be taken again,
    and whether for the host's speed, or None to keep it (module doc): it
    ran under other programs' load and the machine is quiet now, or a run
    found the host running Python over
    :data:`~legionpy.probe.hostspeed.QUIET_SLOWDOWN` times faster than for
    its rows (:func:`note_faster_run`) -- a busy spell of the host's other
    tenants, which no load figure of this machine shows (29 Nov: a
    calibration whose rows' probes read x1.44 the quiet figure predicted the
    README's first command 26% high, quiet ones 2-5%). A calibration retaken
    for the second reason is kept the next time whatever its speed, so a
    host busy at every calibration costs one retake, not one per run.
    Collective."""
    calib = have.get("calibration") or {}
    load = calibration_load(calib.get("rows") or [])
    if load is not None and load > LOADED_CORES and _quiet_now():
        return (f"the cached calibration ran while other programs kept {load:.1f} cores "
                "busy, and the machine is quiet now"), False
    faster = calib.get("slower_than_run")
    if faster and not calib.get("speed_retake"):
        return (f"a run found the host running Python x{faster:.2f} faster than while the "
                "cached calibration ran (other tenants of the host were busy then)"), True
    return None


def _say(text: str) -> None:
    if get_runtime().rank == 0:
        print(f"legionpy: {text}", file=sys.stderr, flush=True)


def calibrated_overhead(machine: Any, verbose: bool = False) -> RuntimeOverhead:
    """The local machine model calibrated through the layer API on synthetic
    models (module doc): control-thread and worker
    terms by least squares, the kernels' concurrency slowdown, the cores and
    the control threads. Collective under MPI."""

    rt = get_runtime()
    # the kernels as predictions time them (legionpy.measure.fidelity.LOCAL_COST):
    # as a device's worker runs them, so the lock's share of them is fitted on
    # the same figures; GPU devices keep the isolated profile
    cost: Any = "measured"
    if machine.devices and all(d.kind == "cpu" for d in machine.devices):
        from ..optimizer.calibration import StepCostModel

        cost = StepCostModel.local()
    # the kernels' concurrency slowdown before and after the rows, the least
    # of both (probe.overhead.least_slowdown): a passing episode of contention
    # seldom covers both
    before = measure_kernel_concurrency()
    # the interpreter's speed the rows ran at (probe.overhead.interpreter_speed):
    # a later figure taken in a slower window of a shared host can say so
    speed = bcast_root(interpreter_speed() if rt.rank == 0 else None)
    figures = calibrate_layer_overhead(machine, verbose=verbose, cost=cost)
    graphs = figures.pop("taskgraphs")
    conc = least_slowdown(before, measure_kernel_concurrency())
    lock = measure_lock_hold()
    coll = measure_mpi_collectives()
    poll = measure_poll_share()
    calib = dict(figures.pop("calibration"), **conc, lock_hold=lock["lock_hold"],
                 lock_measured=lock["lock_measured"],
                 collective_points=coll.get("coll_points", []), interpreter_s=speed,
                 poll_share=poll)
    load = calibration_load(calib["rows"])
    if load is not None and load > LOADED_CORES:
        _say(f"other programs kept {load:.1f} cores busy while legionpy calibrated its "
             "machine model, so its predictions may be off; it calibrates again once the "
             "machine is quiet")
    ranks = 1 + max((d.rank for d in rt.devices), default=0)
    ranks = max(ranks, int(getattr(rt, "size", 1) or 1))
    cores = bcast_root(local_cores())
    # ranks bound to their own cores (legionpy/affinity.py): rank 0's word
    bound = bcast_root(binding() is not None) and ranks > 1
    ovh = RuntimeOverhead(bound=bound, coll_s=coll["coll_s"], coll_byte_s=coll["coll_byte_s"],
                          kernel_scale=conc["kernel_scale"],
                          kernel_scale_mem=conc["kernel_scale_mem"],
                          intensity_compute=conc["intensity_compute"],
                          intensity_mem=conc["intensity_mem"], cores=cores,
                          reduce_byte_s=max(device_reduce_byte_s(machine).values(),
                                            default=reduce_byte_cost(conc)),
                          control_threads=ranks, source="layer-api", machine=machine.name,
                          gil_kernel_s=lock["gil_kernel_s"], poll_share=poll,
                          calibration=calib, **figures)
    # the workers' per-task terms measured by phase on the one-device rows
    # (the regression above cannot tell a forward task from a backward one);
    # not with more ranks than cores: there a one-device row's worker has a
    # core to itself while the other ranks idle, and the regression over every
    # row keeps more of what oversubscribed cores cost a task (mpirun -n 4 on
    # 2 cores, 26 Nov: mean error 20.3% with the one-device terms, 16.8% with
    # the regression; tau 0.80-0.95 and 0.95)
    measured = phase_overheads(calib["rows"], ovh.reduce_byte_s) if ranks <= cores else None
    if measured is not None:
        calib["worker_by_phase"] = measured
        for k, v in measured.items():
            setattr(ovh, k, v)
    # one process: a copy's own cost as the runtime's copies took it; between
    # ranks a copy's wall time is mostly the wait for the other rank, and the
    # fit keeps the communicator's per-message work
    copy = measured_copy_cost(calib["rows"]) if ranks == 1 else None
    if copy is not None:
        calib["copy_measured_s"] = copy
        ovh.copy_s = copy
    # and a collective's, inside one process or between the ranks
    coll = apply_measured_collectives(ovh, calib["rows"], ranks)
    if coll is not None:
        calib["collective_measured_s"] = coll
    _dump_rows(ovh, calib["rows"], graphs, copy is None)
    if ovh.gil_kernel_s is not None and ovh.cores > 0:
        fit = fit_lock_terms_on_ranks(ovh, calib["rows"], graphs, fit_copy=copy is None)
        calib["lock_fit_loss"] = fit.pop("loss")
        calib["worker_regressed"] = {"task_s": ovh.task_s, "req_task_s": ovh.req_task_s}
        for k, v in fit.items():
            setattr(ovh, k, v)
    elif copy is None:
        ovh.copy_s = bcast_root(fit_copy_cost(ovh, calib["rows"], graphs))
    return ovh


def _dump_rows(ovh: RuntimeOverhead, rows: list[dict], graphs: list, fit_copy: bool) -> None:
    """With ``LEGIONPY_CALIBRATION_ROWS=FILE``: rank 0 writes the rows, their
    task graphs and the overhead before :func:`fit_lock_terms` to ``FILE``
    (pickle), so the lock fit can be taken again offline
    (``bench/refit_locks.py``) on exactly what a calibration measured."""
    path = os.environ.get("LEGIONPY_CALIBRATION_ROWS")
    if not path or get_runtime().rank != 0:
        return
    import pickle
    from dataclasses import replace

    with open(path, "wb") as f:
        pickle.dump({"overhead": replace(ovh, calibration=None).to_dict(), "rows": rows,
                     "taskgraphs": [tg for tg, _ in graphs],
                     "models": [g.name for _, g in graphs], "fit_copy": fit_copy}, f)


def reduce_byte_cost(conc: dict) -> float:
    """``RuntimeOverhead.reduce_byte_s`` of CPU devices (a GPU's reduce in its
    own memory: :func:`~legionpy.optimizer.fidelity.device_reduce_byte_s`):
    :data:`REDUCE_PASSES` passes over a
    byte at the rate :func:`~legionpy.probe.overhead.measure_kernel_concurrency`'s
    stream kernel moved bytes (alone: a pass moves each byte once, read or
    written, as the stream counts them); 0 without that figure."""
    moved, secs = conc.get("stream_bytes"), conc.get("stream_alone_s")
    if not moved or not secs:
        return 0.0
    return REDUCE_PASSES * float(secs) / float(moved)


def drop_contended_costs() -> None:
    """Forget the kernel timings the local machine model took on this
    machine (``worker`` and ``contended``: they ran under the same load as
    the calibration): they are timed again when next used."""
    if get_runtime().rank != 0:
        return
    folder = os.path.dirname(default_cache_path())
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if (name.startswith("costs-contended-cpu-") or name.startswith("costs-step-cpu")) \
                and name.endswith(".json"):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass


def runtime_overhead(machine: Any, refresh: bool = False, source: str = "layer",
                     verbose: bool = False) -> RuntimeOverhead:
    """The runtime's overhead on this machine, cached per machine name in
    ``$LEGIONPY_CACHE/overhead-v27-NAME[-bound].json`` (``-bound``: the ranks
    were bound to their cores, legionpy/affinity.py; ``overhead-v27-empty-NAME.json``
    for ``source="empty"``); collective under MPI. ``source``: ``"layer"``
    (default, :func:`calibrated_overhead`) or ``"empty"``
    (:func:`measure_runtime_overhead`, empty tasks, no CPU model)."""

    if source not in ("layer", "empty"):
        raise ValueError(f"runtime_overhead: source {source!r} is not 'layer' or 'empty'")
    path = (_calibration_path(machine.name, bcast_root(binding() is not None))
            if source == "layer" else _overhead_path(f"empty-{machine.name}"))
    have = None
    if not refresh and os.path.exists(path):
        try:
            with open(path) as f:
                have = json.load(f)
        except (OSError, ValueError):
            have = None
    have = bcast_root(have)  # every rank takes rank 0's decision
    retake_for_speed = False
    if have is not None and source == "layer":
        stale = _stale_reason(have)
        if stale is not None:
            why, retake_for_speed = stale
            _say(f"calibrating again (about 45 s): {why}")
            have = None
            drop_contended_costs()
    if have is not None:
        ovh = RuntimeOverhead(**{k: have[k] for k in RuntimeOverhead.__dataclass_fields__
                                 if k in have})
        if source == "layer" and "gil_kernel_s" not in have:
            # a figure calibrated before the lock schedule (issue 26): measure
            # the lock's hold (~2 s) and keep it with the rest
            lock = measure_lock_hold()
            ovh.gil_kernel_s = lock["gil_kernel_s"]
            if ovh.calibration is not None:
                ovh.calibration["lock_hold"] = lock["lock_hold"]
            if get_runtime().rank == 0:
                atomic_write_json(path, ovh.to_dict())
        return ovh
    if source == "layer":
        ovh = calibrated_overhead(machine, verbose=verbose)
        if retake_for_speed and ovh.calibration is not None:
            ovh.calibration["speed_retake"] = True
    else:
        ovh = measure_runtime_overhead()
        ovh.machine = machine.name

    if get_runtime().rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_json(path, ovh.to_dict())
    return ovh
