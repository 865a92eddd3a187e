"""Inference mode under mpirun (issue 14 item 4): batch norm split by
channels across the ranks' devices, its batch statistics folded on every
rank; each rank holds the running statistics of a one-process run and
predicts the same. Prints "OK inference rank R"."""

import numpy as np
from mpi4py import MPI

import legionpy as lp
from legionpy.optimizer import Machine, ParallelConfig, Strategy

B, STEPS, MOM = 8, 3, 0.3
rng = np.random.default_rng(4)
X = (rng.standard_normal((STEPS * B, 4, 3, 3)) * 2 + 1).astype(np.float32)
Y = rng.integers(0, 3, STEPS * B)
n = len(lp.runtime().devices)

m = lp.nn.Model(batch_size=B, seed=2)
t = m.batch_norm(m.input((4, 3, 3), name="x"), momentum=MOM, name="bn")
t = m.dropout(m.flat(t, name="flat"), 0.5, seed=1, name="drop")
m.softmax(m.dense(t, 3, name="fc"), name="softmax")
cfg = {}
for op in m.graph.ops:
    deg = [1] * len(op.output_shape)
    if op.kind == "batch_norm":
        deg[1] = n
    k = int(np.prod(deg))
    cfg[op.name] = ParallelConfig(tuple(deg), tuple(range(k)))
m.compile(optimizer=lp.nn.SGD(lr=1e-9), strategy=Strategy(cfg), machine=Machine.local(n))
m.fit(X, Y, verbose=0, shuffle=False)
bufs = m.buffers()
rm, rv = np.zeros(4), np.ones(4)
for s in range(STEPS):
    xb = X[s * B:(s + 1) * B].astype(np.float64)
    rm = (1 - MOM) * rm + MOM * xb.mean(axis=(0, 2, 3))
    rv = (1 - MOM) * rv + MOM * xb.var(axis=(0, 2, 3), ddof=1)
np.testing.assert_allclose(bufs["bn.running_mean"], rm, rtol=1e-5)
np.testing.assert_allclose(bufs["bn.running_var"], rv, rtol=1e-5)
p = m.predict(X)
assert np.array_equal(p, m.predict(X))  # dropout off
ps = MPI.COMM_WORLD.allgather(p)
assert all(np.array_equal(ps[0], q) for q in ps)
print(f"OK inference rank {MPI.COMM_WORLD.rank}", flush=True)
