"""Measuring real models on this machine: the fidelity check (simulated vs
measured iteration time) and the layer-API calibration of the local machine
model. It trains :mod:`legionpy.nn` models, so it sits above ``nn`` and
``models``; what it measures feeds the optimizer's pure models
(:class:`legionpy.optimizer.fidelity.RuntimeOverhead`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..mapper.resolve import search_judge, set_search_judge
from .calibration import calibrate_layer_overhead, calibrated_overhead, runtime_overhead
from .fidelity import (
    LOCAL_COST,
    FidelityResult,
    compare,
    local_judge,
    measure_runtime,
    optimizer_update_terms,
    predict,
    predict_model,
    train_prediction,
)


@contextmanager
def judge_searches() -> Iterator[None]:
    """Inside it, ``strategy="search"`` on this job's devices keeps the
    search's pick only if the local machine model times it
    ``JUDGE_MARGIN`` (5%) faster than data, model, owt and one device,
    ``single``, else the fastest of those runs (:func:`local_judge`;
    legionpy/mapper/resolve.py module doc); the previous judge (normally
    none) is back after it.
    ``legionpy train``, ``simulate --compare`` and the benches run inside
    it."""
    before = search_judge()
    set_search_judge(local_judge)
    try:
        yield
    finally:
        set_search_judge(before)


__all__ = ["FidelityResult", "compare", "local_judge", "judge_searches", "measure_runtime",
           "predict",
           "predict_model", "optimizer_update_terms", "train_prediction",
           "LOCAL_COST", "calibrate_layer_overhead", "calibrated_overhead", "runtime_overhead"]
