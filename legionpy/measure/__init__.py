"""Measuring real models on this machine: the fidelity check (simulated vs
measured iteration time) and the layer-API calibration of the local machine
model. It trains :mod:`legionpy.nn` models, so it sits above ``nn`` and
``models``; what it measures feeds the optimizer's pure models
(:class:`legionpy.optimizer.fidelity.RuntimeOverhead`).
"""

from __future__ import annotations

from .calibration import calibrate_layer_overhead, calibrated_overhead, runtime_overhead
from .fidelity import (
    LOCAL_COST,
    FidelityResult,
    compare,
    measure_runtime,
    optimizer_update_terms,
    predict,
    predict_model,
    train_prediction,
)

__all__ = ["FidelityResult", "compare", "measure_runtime", "predict", "predict_model",
           "optimizer_update_terms", "train_prediction",
           "LOCAL_COST", "calibrate_layer_overhead", "calibrated_overhead", "runtime_overhead"]
