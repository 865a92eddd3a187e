"""Fit the ten calibration models under model parallelism, then each again
(tests/mpi/test_replication.py: a known bug, 28 Nov)."""

import legionpy as lp
from legionpy.mapper.resolve import resolve_strategy
from legionpy.measure.calibration import calibration_models
from legionpy.measure.fidelity import measure_runtime
from legionpy.optimizer import Machine

lp.init()
machine = Machine.local()
models = calibration_models()
for m in models:
    measure_runtime(m, resolve_strategy("model", m.graph, machine), machine, steps=2, warmup=1)
for m in models:
    measure_runtime(m, None, machine, steps=2, warmup=1)
print(f"OK revisit rank {lp.runtime.get_runtime().rank}", flush=True)
lp.runtime.shutdown()
