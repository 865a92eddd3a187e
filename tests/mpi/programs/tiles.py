"""Tile-sized instances under mpirun (issue 16 item 1): an MLP trains with
traced replays on the ranks' devices (``tiles.py data|model``); under data
parallelism every device's activation instances cover its batch tile only;
every device holds less than whole tensors; and every rank ends with the
same parameters.
Prints "OK tiles rank R"."""

import sys

import numpy as np
from mpi4py import MPI

import legionpy as lp
import legionpy.runtime as lr

B, STEPS = 8, 5
rng = np.random.default_rng(0)
X = rng.standard_normal((STEPS * B, 7)).astype(np.float32)
Y = rng.integers(0, 3, STEPS * B)
rt = lp.runtime()
n = len(rt.devices)

m = lp.nn.Model(batch_size=B, seed=1)
t = m.dense(m.input((7,), name="x"), 64, activation="relu", name="fc1")
t = m.dense(t, 64, activation="relu", name="fc2")
m.softmax(m.dense(t, 3, name="fc3"), name="softmax")
m.compile(optimizer=lp.nn.SGD(lr=0.1), loss="sparse_categorical_crossentropy",
          strategy=sys.argv[1])
m.fit(X, Y, verbose=0, shuffle=False)
assert sum(r.replays for r in rt.tracer.recordings.values()) >= 2, "no replay"
mine = [d.id for d in rt.devices if d.rank == MPI.COMM_WORLD.rank]
inst = rt.instances
whole = 0
for (mem, uid, f), r in inst.rects.items():
    if mem in mine and f == "val" and sys.argv[1] == "data":  # activations: its batch tile
        assert r.shape[0] == B // n, (mem, uid, r)
for reg in m._ex.regions.values():
    whole += sum(int(np.prod(reg.shape)) * dt.itemsize for dt in reg.fields.values())
stats = lr.memory_stats()
for d in mine:
    acts = sum(a.nbytes for (mem, _, f), a in inst.arrays.items()
               if mem == d and f in ("val", "grad"))
    bound = 0.75 if sys.argv[1] == "data" else 0.9  # model: every device reads whole inputs
    assert acts < bound * whole, (d, acts, whole)  # tiles, not whole tensors
    assert stats[d]["peak_bytes"] > 0 and stats[d]["peak_by_kind"]["instances"] > 0
ps = MPI.COMM_WORLD.allgather(m.parameters())
assert all(np.array_equal(ps[0][k], q[k]) for q in ps for k in ps[0])
print(f"OK tiles rank {MPI.COMM_WORLD.rank} peak {[stats[d]['peak_bytes'] for d in mine]}",
      flush=True)
