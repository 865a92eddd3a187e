"""How fast the host runs the interpreter while a measurement runs (issue 26:
"quiet and loaded").

On the project's 2-core virtual machine the interpreter's speed changes while
the machine itself is idle (28 Nov, nothing else running): a fixed Python
loop took 5.3 ms or 9.0-9.5 ms of its thread's CPU time, bimodal, in
stretches of 20 ms to 10 s, on either core, while a 256x256 float32 GEMM
stayed at 6.6-7.3 ms. That is the host's other tenants on the physical
cores: neither this machine's ``/proc/stat`` (the background load,
:func:`~legionpy.probe.overhead.background_cores`) nor its steal time shows
it. The runtime's own per-task work is Python, so it moves with it: one
calibration row (calib_mlp12 on one device) measured 464-950 us of control
thread CPU per step within 20 s, and its step time 1.68-3.47 ms.

:func:`speed_probe` times a fixed small piece of interpreter work (~10 us) in
its thread's CPU seconds. ``fit`` runs it once per step while
:func:`~legionpy.measure.fidelity.measure_runtime` measures (its mean over
the timed steps: ``measured_host_probe_s``). Over 20 measurements of that
row the probe's mean followed the control thread's CPU (correlation 0.80;
the row's control CPU moved 2.05x, its ratio to the probe 1.39x). The
calibration keeps its rows' quietest probes as the host's quiet figure
(:func:`quiet_reference`); a measurement whose probe is more than
:data:`QUIET_SLOWDOWN` times that ran on a busy host (:func:`slowdown`).
The calibration and ``compare(quiet=True)`` measure such a row again
(:func:`retake`), and every figure reports the slowdown it ran at.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime.mpi import bcast_root

__all__ = ["speed_probe", "quiet_reference", "slowdown", "retake", "median_probe",
           "host_speed_text", "QUIET_SLOWDOWN", "PROBE_WORK"]

#: iterations of the probe's loop (~10 us on the project's machine)
PROBE_WORK = 300

#: a measurement whose probe ran more than this many times the quiet figure
#: ran on a busy host (the probe's own spread on a quiet host: under 10%)
QUIET_SLOWDOWN = 1.2


def speed_probe(work: int = PROBE_WORK) -> float:
    """CPU seconds of this thread for a fixed piece of interpreter work."""
    c = time.thread_time()
    s = 0
    for i in range(work):
        s += i
    return time.thread_time() - c


def quiet_reference(probes: Sequence[float | None]) -> float | None:
    """The host's quiet figure from many measurements' probes: their lower
    quartile (a host that is busy for part of a calibration still has a
    quiet quarter; the minimum would be one lucky measurement).

    >>> quiet_reference([1.0, 1.1, 2.0, 1.05, 1.9, None])
    1.05
    """
    got = sorted(p for p in probes if p)
    if not got:
        return None
    return got[(len(got) - 1) // 4]


def slowdown(probe: float | None, reference: float | None) -> float | None:
    """How many times slower than ``reference`` the host ran at ``probe``
    (None when either is unknown).

    >>> slowdown(1.5, 1.0), slowdown(None, 1.0)
    (1.5, None)
    """
    if not probe or not reference:
        return None
    return probe / reference


def retake(measure: Callable[[int], dict[str, Any]], reference: float | None, count: int,
           extra: int = 2, limit: float = QUIET_SLOWDOWN,
           budget_s: float | None = None) -> tuple[list[dict], int]:
    """``count`` measurements (``measure(k)``, k the attempt from 0, returns
    a dict with ``measured_host_probe_s``), plus up to ``extra`` more while fewer than
    ``count`` of them ran on a quiet host (probe within ``limit`` times
    ``reference``; the reference None: the quietest probe seen so far),
    and, given ``budget_s``, while the measurements so far took less than
    that many seconds (a step of seconds is not retaken for a slow stretch
    of the host's).
    Returns the ``count`` quietest (by probe, never by the measured time)
    in the order taken, and how many were taken beyond ``count``. Under MPI
    every rank must see the same probes (``measure_runtime``'s are the
    ranks' maximum) and ``budget_s`` is judged by rank 0's clock, so every
    rank measures the same number of times."""
    runs: list[dict] = []
    t0 = time.perf_counter()

    def quiet(r: dict, ref: float | None) -> bool:
        s = slowdown(r.get("measured_host_probe_s"), ref)
        return s is None or s <= limit

    while True:
        runs.append(measure(len(runs)))
        ref = reference or min((p for r in runs if (p := r.get("measured_host_probe_s"))),
                               default=None)
        done = sum(1 for r in runs if quiet(r, ref)) >= count
        # rank 0's clock decides for every rank (each measurement is collective)
        spent = budget_s is not None and bcast_root(time.perf_counter() - t0 >= budget_s)
        if len(runs) >= count and (done or spent or len(runs) >= count + extra):
            break
    keep = sorted(range(len(runs)),
                  key=lambda k: runs[k].get("measured_host_probe_s") or 0.0)[:count]
    return [runs[k] for k in sorted(keep)], len(runs) - count


def host_speed_text(slow: float, retake: bool = True) -> str:
    """One line on how fast the host ran Python during a measurement,
    against its calibration (``slow``: :func:`slowdown`; ``retake``: where
    the host ran over :data:`QUIET_SLOWDOWN` times faster, whether the
    next run calibrates again,
    :func:`legionpy.measure.calibration.note_faster_run`).

    >>> host_speed_text(1.02)
    'the host ran Python at x1.02 its calibrated speed (quiet)'
    >>> host_speed_text(0.7).endswith("for a slower host; the next run calibrates again")
    True
    """
    text = f"the host ran Python at x{slow:.2f} its calibrated speed"
    if slow * QUIET_SLOWDOWN < 1.0:
        return (text + ": faster than while the calibration ran (the host's other tenants "
                "were busy then), so the prediction is for a slower host; " +
                ("the next run calibrates again" if retake else
                 "it was taken again once already and is kept"))
    if slow <= QUIET_SLOWDOWN:
        return text + " (quiet)"
    return (text + ": busy (the host's other tenants: no load figure of this machine "
            "shows them), so the runtime's Python work ran slower than the prediction "
            "assumes; measure again when it is quiet")


def median_probe(runs: Sequence[dict]) -> float | None:
    """The median ``measured_host_probe_s`` of ``runs`` (None without one)."""
    got = [r.get("measured_host_probe_s") for r in runs if r.get("measured_host_probe_s")]
    return float(statistics.median(got)) if got else None
