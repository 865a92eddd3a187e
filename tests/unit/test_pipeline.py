"""The pipeline rule (legionpy/pipeline.py, docs/pipeline.md): schedules,
program order, micro-batches as tiles, bad input named before any work,
and the simulator's pipelined task graph (the bubble is simulated)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from legionpy import pipeline as P
from legionpy.errors import StrategyError
from legionpy.optimizer import Graph, Machine, ParallelConfig, Simulator, Strategy
from legionpy.pipeline import Pipeline


def chain(p: int, batch: int = 64, width: int = 2048) -> tuple[Graph, list]:
    """Input, 2p equal dense layers, softmax; stage s = layers 2s, 2s+1."""
    g = Graph(batch, name="uniform")
    x = g.input((width,), name="x")
    for i in range(2 * p):
        x = g.dense(x, width, name=f"d{i}")
    g.softmax(x, name="out")
    stages = [("x", "d1")] + [(f"d{2 * s}", f"d{2 * s + 1}") for s in range(1, p - 1)]
    stages.append((f"d{2 * p - 2}", "out") if p > 1 else ("x", "out"))
    return g, stages


def on_stages(g: Graph, stages, m: int, schedule: str = "1f1b", recompute=()) -> Strategy:
    stage = P.stage_index(g, stages)
    cfg = {op.name: ParallelConfig.single(len(op.output_shape), stage[op.index])
           for op in g.ops}
    return Strategy(cfg, pipeline=Pipeline(stages, [(s,) for s in range(len(stages))], m,
                                           schedule, recompute))


# -- schedules -----------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 4), (4, 2), (3, 8)])
def test_1f1b_is_pipedream_flush(p, m):
    for s in range(p):
        seq = P.stage_order(s, p, m, "1f1b")
        assert sorted(seq) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        w = min(p - s - 1, m)
        assert seq[:w] == [("F", j) for j in range(w)]  # warm-up forwards
        assert P.in_flight(s, p, m, "1f1b") == min(p - s, m)  # at most p - s alive
        assert P.in_flight(s, p, m, "gpipe") == m
        for j in range(m):  # every micro-batch's backward after its forward
            assert seq.index(("F", j)) < seq.index(("B", j))


@pytest.mark.parametrize("schedule", P.SCHEDULES)
def test_launch_order_respects_data_flow_and_each_stage(schedule):
    p, m = 4, 6
    order = P.launch_order(p, m, schedule)
    pos = {u: i for i, u in enumerate(order)}
    assert len(order) == 2 * p * m
    for s in range(p):
        assert [(w, j) for t, w, j in order if t == s] == P.stage_order(s, p, m, schedule)
        for j in range(m):
            if s:
                assert pos[(s - 1, "F", j)] < pos[(s, "F", j)]
            if s < p - 1:
                assert pos[(s + 1, "B", j)] < pos[(s, "B", j)]


def test_expand_config_makes_micro_batches_tiles():
    g, _ = chain(2, batch=8)
    d0 = g.op("d0")
    c = ParallelConfig((2, 3), (4, 5, 6, 7, 8, 9))  # sample 2 x features 3
    deg, devs, red = P.expand_config(d0, c, 4, major=True)
    assert deg == (8, 3) and red == 1
    fine = ParallelConfig(deg, devs)
    for k, dev in enumerate(devs):
        j = P.micro_of(d0, c.degrees, deg, k, major=True)
        f, col = divmod(k, 3)
        assert j == f % 4 and dev == c.devices[(f // 4) * 3 + col]
    # micro-batch j is the j-th sample of each device's four (rows j, 4 + j);
    # each device's tiles are contiguous (its instance is its coarse tile)
    tiles = d0.output_rect.split(fine.degrees)
    for j in range(4):
        rows = {r for k, t in enumerate(tiles) if P.micro_of(d0, c.degrees, deg, k,
                                                             major=True) == j
                for r in range(t.lo[0], t.hi[0])}
        assert rows == {j, 4 + j}
    for dev in set(devs):
        rows = sorted(r for k, t in enumerate(tiles) if devs[k] == dev
                      for r in range(t.lo[0], t.hi[0]))
        assert rows == list(range(rows[0], rows[0] + len(rows)))


def test_micro_batch_major_layout_keeps_micro_batches_contiguous():
    """Ops that split samples differently: micro-batch j is rows [2j, 2j+2)
    in every op, whatever its sample degree."""
    g, _ = chain(2, batch=8)
    d0 = g.op("d0")
    for c in (ParallelConfig((2, 1), (0, 1)), ParallelConfig((1, 2), (0, 1))):
        deg, devs, _ = P.expand_config(d0, c, 4)
        tiles = d0.output_rect.split(deg)
        for j in range(4):
            rows = {r for k, t in enumerate(tiles) if P.micro_of(d0, c.degrees, deg, k) == j
                    for r in range(t.lo[0], t.hi[0])}
            assert rows == {2 * j, 2 * j + 1}
    s = Strategy.pipeline(g, Machine.parse("p100:1x4"), stages=2, microbatches=2)
    assert P.device_major(g, s) and s["d2"].devices == (2, 3)
    assert not P.device_major(g, s.with_config("d2", ParallelConfig((1, 2), (2, 3))))


def test_even_cuts_balance_and_cover():
    assert P.even_cuts([1] * 8, 4) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert P.even_cuts([10, 1, 1, 1], 2) == [(0, 0), (1, 3)]
    w = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    cuts = P.even_cuts(w, 4)
    assert [a for a, _ in cuts] == [0] + [b + 1 for _, b in cuts[:-1]] and cuts[-1][1] == 9
    assert max(sum(w[a:b + 1]) for a, b in cuts) == 14  # the best bottleneck (9+2 | 6+5+3)
    with pytest.raises(StrategyError, match="cannot cut 2 ops into 3"):
        P.even_cuts([1, 1], 3)


# -- strategy: JSON, baseline, bad input ------------------------------------------------------
def test_strategy_json_round_trip_and_baseline():
    g, _ = chain(2, batch=8)
    mach = Machine.parse("p100:2x2")
    s = Strategy.pipeline(g, mach, microbatches=4, schedule="gpipe", recompute=[1])
    assert s.pipeline.num_stages == 2 and s.pipeline.devices == ((0, 1), (2, 3))
    s.validate(g, mach)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["pipeline"] == {"stages": [list(x) for x in s.pipeline.stages],
                             "devices": [[0, 1], [2, 3]], "microbatches": 4,
                             "schedule": "gpipe", "recompute": [1]}
    assert Strategy.from_dict(d, g) == s
    assert s.with_config("d0", s["d0"]).pipeline == s.pipeline
    micro = s.micro(g)
    assert micro.pipeline is None and micro["d0"].degrees == (8, 1)  # 2 x 4 micro-batches
    # one node: a stage per device
    assert Strategy.pipeline(g, Machine.parse("p100:1x2")).pipeline.num_stages == 2


@pytest.mark.parametrize("change,match", [
    (dict(stages=[("d0", "out"), ("x", "x")]), "not a topological split"),
    (dict(stages=[("x", "d1"), ("d3", "out")]), "not a topological split"),
    (dict(stages=[("x", "d1"), ("d2", "d3")]), "must end at 'out'"),
    (dict(stages=[("x", "nope"), ("d2", "out")]), "no op named 'nope'"),
    (dict(microbatches=3), "microbatches 3 does not divide the batch 8"),
    (dict(schedule="zigzag"), "schedule 'zigzag' does not exist"),
    (dict(devices=[(0, 1), (1, 2)]), "overlap on device 1"),
    (dict(devices=[(0,), (9,)]), "device 9 is not on the machine"),
    (dict(recompute=[5]), "recompute names stages \\[5\\]"),
])
def test_bad_pipelines_are_named_before_any_work(change, match):
    g, stages = chain(2, batch=8)
    mach = Machine.parse("p100:1x4")
    kw = dict(stages=stages, devices=[(0,), (1,)], microbatches=4, schedule="1f1b",
              recompute=())
    kw.update(change)
    s = on_stages(g, stages, 4)
    s = s.with_pipeline(Pipeline(**kw))
    with pytest.raises(StrategyError, match=match):
        Simulator(g, mach).run(s)


def test_an_op_outside_its_stage_block_is_named():
    g, stages = chain(2, batch=8)
    s = on_stages(g, stages, 4)
    s = s.with_config("d0", ParallelConfig((1, 1), (1,)))
    with pytest.raises(StrategyError,
                       match="'d0' is in pipeline stage 0 .* places tiles on \\[1\\]"):
        s.validate(g, Machine.parse("p100:1x2"))


# -- the simulator ------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 8)])
def test_simulated_1f1b_bubble_matches_the_formula(p, m):
    """Equal stages: every device idles (p - 1) / (m + p - 1) of the step."""
    g, stages = chain(p)
    r = Simulator(g, Machine.parse(f"p100:1x{p}")).run(on_stages(g, stages, m))
    it = r.iteration_time_s
    bubble = np.mean([1 - b / it for b in r.per_device_busy_s.values()])
    assert abs(bubble - P.bubble_fraction(p, m)) <= 0.02


def test_each_device_runs_its_micro_batches_in_schedule_order():
    g, stages = chain(3, batch=12)
    sim = Simulator(g, Machine.parse("p100:1x3"))
    for schedule in P.SCHEDULES:
        sim.run(on_stages(g, stages, 4, schedule))
        tg = sim.tg
        start = {tg.task_name(int(t)): float(tg.start[t]) for t in np.flatnonzero(tg.alive)}
        for st, op in enumerate(("d0", "d2", "d4")):  # each stage's first layer
            units = sorted((start[f"{w}:{op}[{j}]"], w, j) for w in "FB" for j in range(4))
            assert [(w, j) for _, w, j in units] == P.stage_order(st, 3, 4, schedule)


def test_1f1b_holds_fewer_activations_than_gpipe_and_recompute_fewer_still():
    g, stages = chain(4, batch=32, width=512)
    sim = Simulator(g, Machine.parse("p100:1x4"))
    peak, time = {}, {}
    for name, kw in (("gpipe", dict(schedule="gpipe")), ("1f1b", {}),
                     ("recompute", dict(recompute=[0, 1, 2, 3]))):
        r = sim.run(on_stages(g, stages, 8, **kw))
        peak[name], time[name] = r.peak_memory["n0gpu0"], r.iteration_time_s
    assert peak["recompute"] < peak["1f1b"] < peak["gpipe"]
    assert time["recompute"] > time["1f1b"]  # its backward does the forward again


def test_delta_on_a_pipeline_equals_full_simulation():
    g, _ = chain(2, batch=8)
    mach = Machine.parse("p100:1x4")
    sim = Simulator(g, mach)
    s = Strategy.pipeline(g, mach, stages=2, microbatches=2)
    sim.run(s)
    stage1 = s.pipeline.devices[1]
    new = ParallelConfig((1, 2), stage1)  # d2: features split over its stage's block
    got = sim.delta("d2", new).iteration_time_s
    assert got == pytest.approx(Simulator(g, mach).run(s.with_config("d2", new)).iteration_time_s)
    assert got != pytest.approx(Simulator(g, mach).run(s).iteration_time_s)
