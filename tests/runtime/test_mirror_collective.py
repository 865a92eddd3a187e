"""DESIGN.md invariant 3 under collective gradient sync (docs/seam.md): the
runtime's traced iteration with ``sync="collective"`` equals the
simulator's task graph with ``sync="collective"``: the same tasks on the
same devices (``U:b<bucket>.<group>[p]`` on the group's position ``p``), no
weight copies, the collectives compared as units (kind, group, algorithm,
bytes) and the same dependences.

Stable-id order: the runtime launches each group's RS, U points and AG in
turn; the task graph's keys put a bucket's groups side by side (k before
the group index), so the order is compared only where every bucket has
one group of several devices (data and model parallelism here)."""

from __future__ import annotations

import pytest
from test_mirror import MODELS, STRATS, data_for, train_traced

import legionpy as lp
from legionpy.optimizer import Machine, Simulator
from legionpy.optimizer.mirror import compare, taskgraph_form, traced_taskgraph


def mirror(build, n, strategy, steps=3):
    rt = lp.init(cpus=n)
    try:
        m = build()
        mach = Machine.local(n)
        if callable(strategy):
            strategy = strategy(m.graph, n)
        m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9), strategy=strategy, machine=mach,
                  sync="collective")
        xs, y = data_for(m)
        recs = train_traced(rt, m, xs, y, steps)
        sim = Simulator(m.graph, mach, sync="collective")
        sim.run(m.strategy)
        return traced_taskgraph(recs), taskgraph_form(sim.tg), recs
    finally:
        lp.runtime.shutdown()


@pytest.mark.parametrize("model", ["mlp", "cnn", "rnn"])
@pytest.mark.parametrize("n", [2, 4])
def test_trace_equals_taskgraph_collective(model, n):
    for sname, s in STRATS.items():
        a, b, recs = mirror(MODELS[model], n, s)
        diff = compare(a, b, order=sname in ("data", "model"))
        assert not diff, f"{model} {sname} on {n} devices:\n" + "\n".join(diff)
        if sname == "data":
            assert a.collectives and all(v[1] == tuple(range(n))
                                         for v in a.collectives.values())
            assert not [c for c in a.copies.values() if c[0].startswith("F:")], \
                "collective sync moves no weights by copies"
            coll = [r for r in recs if r["kind"] == "collective"]
            assert all(r["steps"] and r["device"] == "comm:" + ",".join(map(str, range(n)))
                       for r in coll)
