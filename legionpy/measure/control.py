"""The control thread's cost of a model, profiled on one device (issue 26).

The local machine model charges the control thread (the thread that runs
``fit``: the batch's gather, the step's trace replay, every launch and fill)
``step_s`` a step plus per-task, per-requirement and per-copy terms
regressed on synthetic calibration models. Those models' launches are
cheaper than the zoo's: fitted on one calibration's rows, the regression
predicted the zoo's control-thread CPU 27% low on average (alexnet 447 us
a step for 968 measured; 28 Nov: 0.5 ms against 1.6 on alexnet's one-device
row), and adding the ops' count or the input's bytes as regressors left it
19-25% low (docs/decisions.md). The difference is per model: alexnet's
batch gather (its 786 KB input) and its launches' argument handling, an
RNN's many fills.

So the control thread is profiled per model, as FlexFlow profiles each
operator's kernel: :func:`control_profile` trains a twin of the model (its
graph, optimizer and loss, compiled ``single``: every op on the first
device) for a few steps and keeps the control thread's CPU per step
(cached per model and machine in ``$LEGIONPY_CACHE/control-v1.json``,
the fits retaken while the host ran Python slowly, and the figure scaled
to the calibration's quiet host speed: :mod:`legionpy.probe.hostspeed`).
:func:`control_offset` is that figure less the model's own control time
for the same one-device run; the prediction of any strategy of the model
then adds it to ``step_s``, so the regression still says how strategies
differ (points, requirements, copies) and the profile says where the
model's level is.
"""

from __future__ import annotations

import copy
import os
import statistics
from collections.abc import Callable
from typing import Any

from ..atomic import cache_dir
from ..optimizer.costmodel import cached_table, merge_table
from ..optimizer.search import graph_hash
from ..optimizer.strategy import Strategy
from ..probe.hostspeed import median_probe, retake
from ..runtime import get_runtime
from ..runtime.mpi import bcast_root

__all__ = ["control_profile", "control_offset", "at_quiet_speed", "CONTROL_STEPS",
           "CONTROL_WARMUP", "CONTROL_FITS", "CONTROL_MAX_STEP_S"]

#: timed and untimed steps of each profiling fit, and the fits kept
CONTROL_STEPS = 8
CONTROL_WARMUP = 3
CONTROL_FITS = 3
#: a model whose one-device step is predicted longer is not profiled: the
#: 33-55 steps would take over 3 s, and the control thread (0.5-3 ms a
#: step in the zoo at small scale) is then a small part of a step
CONTROL_MAX_STEP_S = 0.1


def _path() -> str:
    """The cache: ``{model key: [control seconds a step, host probe]}``."""
    return os.path.join(str(cache_dir()), "control-v1.json")


def _twin(model: Any) -> Any:
    """An uncompiled model with a copy of ``model``'s graph, its seed and
    name (its optimizer and loss are given at compile). Not the graph
    itself: two compiled models sharing one graph ran the twin's steps with
    1.5-2x the control-thread CPU (rnntc on one device: 1.3-1.6 ms against
    0.76-0.87 with a copy, 0.93-1.03 for the model built afresh)."""
    twin = type(model).__new__(type(model))
    type(model).__init__(twin, model.batch_size, seed=model.seed, name=model.graph.name)
    twin.graph = copy.deepcopy(model.graph)
    return twin


def control_profile(model: Any, machine: Any,
                    measure: Callable[..., dict[str, Any]],
                    reference: float | None = None) -> float | None:
    """The control thread's CPU seconds per step of the compiled ``model``
    trained on one device of ``machine`` (module doc); ``measure`` is
    :func:`~legionpy.measure.fidelity.measure_runtime`, ``reference`` the
    calibration's quiet host probe. Cached; None when the model cannot run
    on one device. Collective under MPI."""
    key = graph_hash(model.graph, machine, optimizer=type(model.optimizer).__name__,
                     loss=model.loss, v=1)
    have = bcast_root(cached_table(_path()).get(key))
    if have is not None:
        return at_quiet_speed(*have, reference)
    twin = _twin(model)
    try:
        twin.compile(optimizer=copy.deepcopy(model.optimizer), loss=model.loss,
                     strategy=Strategy.single_device(model.graph, machine), machine=machine)
        runs, _ = retake(lambda _: measure(twin, None, machine, steps=CONTROL_STEPS,
                                           warmup=CONTROL_WARMUP), reference, CONTROL_FITS)
    except Exception:  # noqa: BLE001 - a model one device cannot hold: no profile
        return None
    control = float(statistics.median(r["measured_control_cpu_s"] for r in runs))
    probe = median_probe(runs)
    if get_runtime().rank == 0:
        os.makedirs(os.path.dirname(_path()), exist_ok=True)
        merge_table(_path(), {key: [control, probe]})
    return at_quiet_speed(control, probe, reference)


def at_quiet_speed(control: float, probe: float | None, reference: float | None) -> float:
    """``control`` seconds measured while the host probe read ``probe``, at
    the calibration's quiet ``reference`` speed (unchanged when either is
    unknown). Profiles taken while the host ran Python slowly (28 Nov:
    probes of 13.3-14.2 us against the calibration's 11.0, the fits retaken
    twice and still slow) read the control thread 34-62% above the
    one-device rows the bench measured minutes later (rnntc 1480 against
    1100 us, alexnet 1335 against 1000, rnnlm 1940 against 1200; lenet,
    probed at 10.8 us, 679 against 600); so scaled, 10-25% above (1206,
    1104, 1503; lenet 692).

    >>> at_quiet_speed(2.0, 1.5, 1.0), at_quiet_speed(2.0, None, 1.0)
    (1.3333333333333333, 2.0)
    """
    if not probe or not reference:
        return float(control)
    return float(control) * reference / probe


def control_offset(profile: float | None, modelled: float | None) -> float:
    """Seconds a step to add to the control thread's modelled time: the
    profile less the model's figure for the same one-device run (0 when
    either is unknown).

    >>> round(control_offset(1.5e-3, 0.5e-3), 6), control_offset(None, 0.5e-3)
    (0.001, 0.0)
    """
    if profile is None or modelled is None:
        return 0.0
    return profile - modelled
