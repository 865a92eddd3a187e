"""Invariant 3 on several ranks (the MPI half of tests/runtime/test_mirror.py):
one steady-state training iteration (step 3) of an MLP, a CNN with halos, an
Inception/ResNet-like branchy block and an RNN with shared weights under
data, model, hybrid and seeded random strategies, one CPU
device per rank, traced on every rank; rank 0 gathers every rank's records
(they carry ``rank``), converts them with ``mirror.traced_taskgraph`` and
compares them with the task graph of ``Machine.local()`` for the same
strategy. Prints "OK mirror MODEL STRATEGY" per case on rank 0, or
"DIFF MODEL STRATEGY" and the differences. Usage: mirror.py [CASE...]
(CASE: model:strategy; default all 16)."""

import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from test_mirror import MODELS, STRATS, data_for, train_traced  # noqa: E402

import legionpy as lp  # noqa: E402
from legionpy.optimizer import Machine, Simulator  # noqa: E402
from legionpy.optimizer.mirror import compare, taskgraph_form, traced_taskgraph  # noqa: E402

comm = MPI.COMM_WORLD
STEPS = 4  # the traced iteration is step 3 (weights at their homes since step 1)
cases = sys.argv[1:] or [f"{m}:{s}" for m in ("mlp", "cnn", "branchy", "rnn")
                         for s in ("data", "model", "hybrid", "random")]
failed = 0
for case in cases:
    mname, sname = case.split(":")
    rt = lp.init(cpus=1)
    try:
        m = MODELS[mname]()
        mach = Machine.local()
        n = mach.num_devices
        assert n == comm.size, (n, comm.size)
        s = STRATS[sname]
        s = s(m.graph, n) if callable(s) else s
        m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9), strategy=s, machine=mach)
        xs, y = data_for(m)
        xs, y = comm.bcast((xs, y), root=0)  # every rank feeds the same batch
        recs = train_traced(rt, m, xs, y, STEPS)
        everyone = comm.gather(recs, root=0)
        if comm.rank == 0:
            assert {r["rank"] for part in everyone for r in part} == set(range(comm.size))
            sim = Simulator(m.graph, mach)
            sim.run(m.strategy)
            a = traced_taskgraph([r for part in everyone for r in part])
            b = taskgraph_form(sim.tg)
            diff = compare(a, b)
            if diff:
                failed += 1
                print(f"DIFF {case} on {n} ranks ({a.summary()} vs {b.summary()}):\n  "
                      + "\n  ".join(diff), flush=True)
            else:
                if sname == "data":  # the gradients cross ranks: one collective per group
                    assert b.copies or b.collectives, \
                        "data parallelism across ranks moves gradients"
                print(f"OK mirror {case} on {n} ranks: {a.summary()}", flush=True)
    finally:
        lp.runtime.shutdown()
comm.Barrier()
if comm.rank == 0:
    print(f"{len(cases) - failed} of {len(cases)} cases equal", flush=True)
