"""DESIGN.md invariant 3 under collective gradient sync (docs/seam.md): the
runtime's traced iteration with ``sync="collective"`` equals the
simulator's task graph with ``sync="collective"``: the same tasks on the
same devices (``U:b<bucket>.<group>[p]`` on the group's position ``p``), no
weight copies, the collectives compared as units (kind, group, algorithm,
bytes), the same dependences and the same stable-id order (the runtime
launches a bucket's RS, U points and AG in the task graph's key order:
RS, U of position 0, 1, ..., AG, each over the bucket's groups)."""

from __future__ import annotations

import pytest
from test_mirror import MODELS, STRATS
from test_mirror import mirror as mirror_shards

from legionpy.optimizer.mirror import compare


def mirror(build, n, strategy, steps=3):
    return mirror_shards(build, n, strategy, steps, sync="collective", records=True)


@pytest.mark.parametrize("model", ["mlp", "cnn", "rnn"])
@pytest.mark.parametrize("n", [2, 4])
def test_trace_equals_taskgraph_collective(model, n):
    for sname, s in STRATS.items():
        a, b, recs = mirror(MODELS[model], n, s)
        diff = compare(a, b)
        assert not diff, f"{model} {sname} on {n} devices:\n" + "\n".join(diff)
        if sname == "data":
            assert a.collectives and all(v[1] == tuple(range(n))
                                         for v in a.collectives.values())
            assert not [c for c in a.copies.values() if c[0].startswith("F:")], \
                "collective sync moves no weights by copies"
            coll = [r for r in recs if r["kind"] == "collective"]
            assert all(r["steps"] and r["device"] == "comm:" + ",".join(map(str, range(n)))
                       for r in coll)
