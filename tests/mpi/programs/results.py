"""fit's results under mpirun come in batches (issue 26): a data-parallel
model with batch norm trains STEPS steps; every step's loss reaches
``on_step`` in order, equal to a one-process run's, the running statistics
are the same, and the ranks exchanged results a few times, not once per
step per FutureMap. Prints one JSON line per rank (or, without MPI, one)."""

import json
import math
import sys

import numpy as np

import legionpy as lp
from legionpy.nn.execution import MPI_RESULTS_EVERY
from legionpy.runtime import mpi

B, STEPS = 8, 37
rng = np.random.default_rng(5)
X = rng.standard_normal((STEPS * B, 6)).astype(np.float32)
Y = rng.integers(0, 3, STEPS * B)

exchanges = []
if mpi.launched_under_mpi():
    exchange = mpi.Cluster.exchange

    def counted(self, *args, **kwargs):
        exchanges.append(args[2])
        return exchange(self, *args, **kwargs)

    mpi.Cluster.exchange = counted

m = lp.nn.Model(batch_size=B, seed=3)
t = m.batch_norm(m.dense(m.input((6,), name="x"), 8, name="fc1"), momentum=0.2, name="bn")
m.softmax(m.dense(m.relu(t, name="relu"), 3, name="fc2"), name="softmax")
m.compile(optimizer=lp.nn.SGD(lr=0.05), strategy="data")
seen = []
h = m.fit(X, Y, verbose=0, shuffle=False, on_step=lambda i, logs: seen.append((i, logs["loss"])))
bufs = m.buffers()
rank = mpi.cluster().rank if mpi.launched_under_mpi() else 0
if mpi.launched_under_mpi():
    # the steps' results and the statistics: a few exchanges for 37 steps,
    # where one per step each (74) went before
    assert len(exchanges) <= 2 * math.ceil(STEPS / MPI_RESULTS_EVERY) + 1, exchanges
stamps = [t for t, _ in h.step_finished]
assert len(stamps) == STEPS and stamps == sorted(stamps)
assert [i for i, _ in seen] == list(range(STEPS))
# one write per rank: the ranks share the stdout pipe, unbuffered
sys.stdout.write(json.dumps({"rank": rank, "losses": [v for _, v in seen],
                             "mean": bufs["bn.running_mean"].tolist(),
                             "var": bufs["bn.running_var"].tolist(),
                             "exchanges": len(exchanges)}) + "\n")
sys.stdout.flush()
