"""The task graph follows DESIGN.md section 2 exactly."""

from __future__ import annotations

from collections import Counter

import legionpy.placement as strategy_mod
from legionpy.optimizer import Graph, Machine, ParallelConfig, Simulator, Strategy
from legionpy.optimizer.taskgraph import pack_key


def _tiny():
    g = Graph(8, name="tiny")
    x = g.input((6,), name="x")
    h = g.dense(x, 4, name="fc1")
    g.softmax(h, name="loss")
    return g


def _build(g, m, cfgs):
    """Point-to-point shard updates (sync="shards"), the structure these
    tests check (collectives: tests/unit/test_collective_sync.py)."""
    s = Strategy({k: ParallelConfig(*v) for k, v in cfgs.items()})
    sim = Simulator(g, m, sync="shards")
    sim.run(s)
    return sim, sim.tg.to_json()


def test_data_parallel_shards_updates(monkeypatch):
    monkeypatch.setattr(strategy_mod, "SHARD_MIN_BYTES", 1)  # tiny weights, sharded
    g, m = _tiny(), Machine.parse("p100:1x2")
    _, tj = _build(g, m, {"x": ((2, 1), (0, 1)), "fc1": ((2, 1), (0, 1)),
                          "loss": ((2, 1), (0, 1))})
    kinds = Counter(t["kind"] for t in tj["tasks"])
    # x: 2 loads; fc1, loss: 2 F + 2 B each; fc1's weight and bias are each used
    # by devices 0 and 1 -> 2 update shards each (homes 0 and 1); every device
    # fetches the shard homed on the other (2 + 2 copies) and sends it its
    # gradient of that shard (2 + 2 copies); activations stay local
    assert kinds["compute"] == 2 + 4 + 4
    assert kinds["update"] == 4
    assert kinds["copy"] == 8
    byname = {t["name"]: t for t in tj["tasks"]}
    assert byname["X:F:fc1[1].2.0@0->1"]["bytes"] == 3 * 4 * 4  # half of the 6 x 4 weight
    assert byname["X:U:fc1.weight[0].0.0@1->0"]["bytes"] == 3 * 4 * 4


def test_copy_bytes_are_intersection_volumes():
    g, m = _tiny(), Machine.parse("p100:1x2")
    sim, tj = _build(g, m, {"x": ((1, 1), (0,)), "fc1": ((1, 2), (1, 0)),
                            "loss": ((1, 1), (0,))})
    names = {t["name"]: t for t in tj["tasks"]}
    # fc1 tile 0 (columns 0:2) on device 1 needs all of x (8 x 6 floats) from device 0
    assert names["X:F:fc1[0].1.0@0->1"]["bytes"] == 8 * 6 * 4
    # loss (whole, dev 0) needs fc1 tile 0 (8 x 2) from device 1; tile 1 is local
    assert names["X:F:loss[0].1.0@1->0"]["bytes"] == 8 * 2 * 4
    assert not [n for n in names if n.startswith("X:F:loss[0].1.1")]
    # fc1's weight split by columns: two tiles, each used once -> no weight copies
    assert not [n for n in names if n.startswith(("X:F:fc1[0].2", "X:F:fc1[0].3",
                                                  "X:F:fc1[1].2", "X:F:fc1[1].3"))]
    # the gradient of x's part read by fc1[0] goes back to device 0 (one copy)
    assert names["X:B:x[0].0.0@1->0"]["bytes"] == 8 * 6 * 4 if "X:B:x[0].0.0@1->0" in names \
        else True


def test_dependences_of_forward_backward_update(monkeypatch):
    monkeypatch.setattr(strategy_mod, "SHARD_MIN_BYTES", 1)  # tiny weights, sharded
    g, m = _tiny(), Machine.parse("p100:1x2")
    sim, tj = _build(g, m, {"x": ((2, 1), (0, 1)), "fc1": ((2, 1), (0, 1)),
                            "loss": ((2, 1), (0, 1))})
    ids = {t["name"]: t["id"] for t in tj["tasks"]}
    deps = {tuple(d) for d in tj["deps"]}
    assert (ids["F:fc1[1]"], ids["B:fc1[1]"]) in deps
    assert (ids["B:loss[1]"], ids["B:fc1[1]"]) in deps
    assert (ids["F:x[0]"], ids["F:fc1[0]"]) in deps
    w = "fc1.weight"
    assert (ids["X:F:fc1[1].2.0@0->1"], ids["F:fc1[1]"]) in deps
    assert (ids["B:fc1[1]"], ids[f"X:U:{w}[0].0.0@1->0"]) in deps
    assert (ids[f"X:U:{w}[0].0.0@1->0"], ids[f"U:{w}[0]"]) in deps
    assert (ids["B:fc1[0]"], ids[f"U:{w}[0]"]) in deps
    # the input op has no backward task
    assert "B:x[0]" not in ids


def test_multi_hop_copy_occupies_each_link():
    g, m = _tiny(), Machine.parse("p100:2x1")
    sim, tj = _build(g, m, {"x": ((1, 1), (0,)), "fc1": ((1, 1), (1,)),
                            "loss": ((1, 1), (1,))})
    hops = [t for t in tj["tasks"] if t["name"].startswith("X:F:fc1[0].1.0@0->1")]
    assert [t["device"] for t in hops] == [m.links[i].name for i in m.route(0, 1)]
    assert len(hops) == 4 and len({t["bytes"] for t in hops}) == 1


def test_shared_parameters_are_sharded_over_their_users(monkeypatch):
    monkeypatch.setattr(strategy_mod, "SHARD_MIN_BYTES", 1)  # tiny weights, sharded
    g = Graph(4, name="rnn")
    tok = g.input((3,), dtype="int32", name="tok")
    s = None
    first = None
    for t in range(3):
        e = g.embedding(tok.select(1, t), 10, 8, share=first, name=f"emb{t}")
        first = first or e
        s = g.lstm(e, s, 8, share=s, name=f"cell{t}")
    g.softmax(g.dense(s.h, 5, name="out"), name="loss")
    m = Machine.parse("p100:1x4")
    cfg = {op.name: ParallelConfig.single(len(op.output_shape), op.index % 4) for op in g.ops}
    sim, tj = _build(g, m, {k: (v.degrees, v.devices) for k, v in cfg.items()})
    names = [t["name"] for t in tj["tasks"]]
    assert g.num_parameters() == 10 * 8 + (4 * 8 * 8) * 2 + 4 * 8 + 8 * 5 + 5
    # cells run on devices 2, 0, 2: users (2, 0) -> 2 shards homed on 2 and 0
    assert sum(n.startswith("U:cell0.w_ih") for n in names) == 2
    # each device fetches the shard homed on the other once (de-duplicated)
    wcopies = [n for n in names if n.startswith(("X:F:cell0[0].2.", "X:F:cell1[0].3.",
                                                 "X:F:cell2[0].3."))]  # the w_ih argument
    assert sorted(n.split("@")[1] for n in wcopies) == ["0->2", "2->0"]
    # one reduction buffer per device: cell0 and cell2 (device 2) accumulate
    # into one buffer, sent once (shard 1) to device 0; cell1 (device 0) sends
    # its gradient of shard 0 to device 2
    gcopies = [n for n in names if n.startswith("X:U:cell0.w_ih")]
    assert len(gcopies) == 2


def test_keys_are_stable_ids():
    assert pack_key(1, 0) < pack_key(1, 1) < pack_key(2, 0)
    g, m = _tiny(), Machine.parse("p100:1x2")
    a = _build(g, m, {"x": ((2, 1), (0, 1)), "fc1": ((1, 2), (0, 1)),
                      "loss": ((2, 1), (0, 1))})[1]
    b = _build(g, m, {"x": ((2, 1), (0, 1)), "fc1": ((1, 2), (0, 1)),
                      "loss": ((2, 1), (0, 1))})[1]
    assert a == b
    assert [t["id"] for t in a["tasks"]] == list(range(len(a["tasks"])))


def _random_strategy(graph, n, rng, shared_weights=True):
    """Random degrees on parallel dims and random (repeating) devices."""
    import math

    from tiny_models import random_degrees

    out, by_param = {}, {}
    for op in graph.ops:
        key = tuple(sorted(p.name for p in op.params.values()))
        if shared_weights and key and key in by_param and rng.random() < 0.5:
            out[op.name] = by_param[key]
            continue
        deg = random_degrees(op, n, rng)
        k = math.prod(deg)
        out[op.name] = ParallelConfig(tuple(deg), tuple(rng.randrange(n) for _ in range(k)))
        if key:
            by_param[key] = out[op.name]
    return Strategy(out)


def _blocks(sim, strategy, fast):
    tg = sim.tg
    tg.fast_reads = fast
    tg._blocks.clear()
    ops = sim.graph.ops
    bids = [("tensor", o) for o in range(len(ops))] + [("param", w)
                                                        for w in range(len(tg.params))]
    out = {}
    for b in bids:  # canonical: task rows by key, edges between keys (order-free)
        blk = tg._make_block(b, strategy)
        key = blk.key.tolist()
        e = sorted(tuple(key[c] if c >= 0 else c - 2**62 for c in ab)
                   for ab in zip(blk.esrc.tolist(), blk.edst.tolist()))
        out[b] = (sorted(zip(*(getattr(blk, f).tolist() for f in (
            "key", "dur", "res", "kind", "nbytes", "mdev", "mbytes", "ends")))), e)
    return out


def test_fast_read_replay_agrees_with_fieldstate():
    """Property: the forward-read fast path of the task graph makes exactly the
    tasks and edges of the general FieldState replay, on random configs."""
    import random

    from legionpy import models

    rng = random.Random(11)
    cases = [(models.lenet(batch_size=8).graph, "p100:1x4"),
             (models.rnntc(batch_size=8, steps=3, hidden=8, layers=2, vocab=16).graph,
              "p100:2x2"),
             (models.inception_v3(batch_size=8).graph, "p100:2x2")]
    for g, spec in cases:
        m = Machine.parse(spec)
        sim = Simulator(g, m)
        for _ in range(3 if len(g.ops) < 100 else 1):
            s = _random_strategy(g, m.num_devices, rng)
            assert _blocks(sim, s, True) == _blocks(sim, s, False)
