"""The vectorised blocks of replicated parameters (legionpy.optimizer.
replicated) make exactly the tasks and edges of the general coherence
replay, and the same schedule."""

from __future__ import annotations

import random

import numpy as np
import pytest

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy
from legionpy.optimizer.search.space import ConfigSpace


def _canon(tg, blk):
    """A block as (sorted task rows, sorted edges between keys / external codes)."""
    rows = sorted(zip(*(getattr(blk, f).tolist() for f in ("key", "dur", "res", "kind",
                                                           "nbytes", "mdev", "mbytes",
                                                           "ends"))))
    key = blk.key.tolist()

    def name(c):
        return ("local", key[c]) if c >= 0 else ("ext", c)

    edges = sorted((name(a), name(b)) for a, b in zip(blk.esrc.tolist(), blk.edst.tolist()))
    return rows, edges


def _blocks(sim, strategy, fast):
    tg = sim.tg
    tg.fast_reads = fast
    tg._blocks.clear()
    bids = [("tensor", o) for o in range(len(sim.graph.ops))]
    bids += [("param", w) for w in range(len(tg.params))]
    return {b: _canon(tg, tg._make_block(b, strategy)) for b in bids}


CASES = [("lenet", {"batch_size": 8}, "p100:1x4"),
         ("lenet", {"batch_size": 16}, "h100:2x4"),
         ("rnntc", {"batch_size": 8, "steps": 3, "hidden": 8, "layers": 2, "vocab": 16},
          "p100:2x2"),
         ("inception_v3", {"batch_size": 8}, "p100:2x2")]


@pytest.mark.parametrize("name,sizes,spec", CASES)
def test_replicated_blocks_equal_the_coherence_replay(name, sizes, spec, monkeypatch):
    import legionpy.optimizer.taskgraph as tgm

    calls, aligned = [], []
    real = tgm.replicated_block
    monkeypatch.setattr(tgm, "replicated_block", lambda *a: calls.append(1) or real(*a))
    real_al = tgm.TaskGraph._aligned_tensor_block

    def counted(self, *a):
        b = real_al(self, *a)
        aligned.append(b is not None)
        return b

    monkeypatch.setattr(tgm.TaskGraph, "_aligned_tensor_block", counted)
    g = models.build(name, **sizes).graph
    m = Machine.parse(spec)
    sim = Simulator(g, m)
    rng = random.Random(5)
    space = ConfigSpace()
    strategies = [Strategy.data_parallel(g, m)]
    for _ in range(2):  # random strategies with some ops data parallel (replicated weights)
        s = space.random_strategy(g, m, rng)
        dp = Strategy.data_parallel(g, m)
        strategies.append(Strategy({op.name: (dp if rng.random() < 0.5 else s)[op.name]
                                    for op in g.ops}))
    for s in strategies:
        n, a = len(calls), sum(aligned)
        assert _blocks(sim, s, True) == _blocks(sim, s, False)
        assert len(calls) > n and sum(aligned) > a  # the vectorised paths were taken


def test_full_simulation_with_replicated_blocks_is_unchanged():
    g = models.resnet101(batch_size=16, image_size=32, width=0.125,
                         blocks=(1, 1, 1, 1), num_classes=10).graph
    m = Machine.parse("h100:2x4")
    s = Strategy.data_parallel(g, m)
    out = []
    for fast in (True, False):
        sim = Simulator(g, m, sync="shards")  # the replicated weights' copies
        sim.tg.fast_reads = fast
        r = sim.run(s)
        tl = sim.timeline()
        out.append((r.iteration_time_s, r.bytes_per_link, r.peak_memory, tl))
    assert out[0][0] == out[1][0]
    assert out[0][1] == out[1][1] and out[0][2] == out[1][2]
    assert out[0][3] == out[1][3]
    assert len(out[0][3]) > 1000 and np.isfinite(out[0][0])
