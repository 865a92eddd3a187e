"""Pipelines under mpirun (issue 25, docs/pipeline.md): ``pipeline.py``.

The zoo transformer (small) trained three steps on this job's devices (one
per rank) with the even-cut pipeline under both schedules and with
recomputation gives every rank the losses and parameters of the
unpipelined data-parallel run (same seed, same global batch) to 1e-6."""

import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime"))

import legionpy as lp  # noqa: E402
from legionpy import models  # noqa: E402
from legionpy.optimizer import Machine, Strategy  # noqa: E402

rank = MPI.COMM_WORLD.rank
BATCH, STEPS = 8, 3


def train(strategy):
    lp.init()
    try:
        n = len(lp.runtime.get_runtime().devices)
        m = models.transformer(batch_size=BATCH, scale="small", seed=2)
        mach = Machine.local(n)
        s = strategy(m.graph, mach) if callable(strategy) else strategy
        m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9), strategy=s,
                  loss="sparse_categorical_crossentropy", machine=mach)
        rng = np.random.default_rng(11)
        seq = m.graph.ops[0].output_shape[1:]
        x = rng.integers(0, 16, (STEPS * BATCH, *seq)).astype(np.int32)
        last = m.graph.ops[-1].output_shape
        y = rng.integers(0, last[-1], (STEPS * BATCH, *last[1:-1]))
        h = m.fit(x, y, epochs=1, verbose=0, shuffle=False)
        return list(h["step_loss"]), m.parameters()
    finally:
        lp.runtime.shutdown()


ref = train("data")
for kw in ({"schedule": "gpipe"}, {"schedule": "1f1b"},
           {"schedule": "1f1b", "microbatches": 2, "recompute": [0]}):
    got = train(lambda g, mach, kw=kw: Strategy.pipeline(g, mach, **kw))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=1e-6, err_msg=str(kw))
    for k in ref[1]:
        np.testing.assert_allclose(got[1][k], ref[1][k], rtol=1e-6, atol=1e-6,
                                   err_msg=f"{kw} {k}")
print(f"OK pipeline training rank {rank}", flush=True)
