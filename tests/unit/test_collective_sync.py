"""Collective gradient sync in the simulator (docs/seam.md): bucket blocks,
their ``--taskgraph`` form, delta equals full, and symmetric simulation
equals the full one."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simhelpers import random_config, random_graph, random_strategy

from legionpy import collectives as C
from legionpy import models
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy


def _cnn(batch=16):
    return models.alexnet(batch_size=batch, image_size=67, width=0.125, hidden=64).graph


def test_taskgraph_has_one_collective_per_bucket_and_group():
    g, m = _cnn(), Machine.parse("p100:2x2")
    sim = Simulator(g, m, sync="collective")
    sim.run(Strategy.data_parallel(g, m))
    assert sim.tg.to_json()["symmetry"] == {"classes": 2, "devices_per_class": 2}
    sim.tg.symmetry = False  # the whole graph
    sim.run(Strategy.data_parallel(g, m))
    tg = sim.tg
    j = tg.to_json()
    assert "symmetry" not in j
    coll = [t for t in j["tasks"] if t["kind"] == "collective"]
    assert len(coll) == 2 * len(tg.buckets)  # one RS + one AG per bucket (one group)
    for t in coll:
        assert t["group"] == [0, 1, 2, 3] and t["device"] == "comm:0-3"
        assert t["algorithm"] in C.ALGORITHMS and t["collective"] in ("reduce_scatter",
                                                                     "all_gather")
    # the buffer of a bucket is its parameters' bytes; no weight copies at all
    for b, ws in enumerate(tg.buckets):
        nb = C.padded(sum(tg.params[w].rect.volume for w in ws), 4) * 4
        assert {t["bytes"] for t in coll if t["name"].startswith(f"RS:b{b}.")} == {nb}
    assert not [t for t in j["tasks"] if t["kind"] == "copy"]  # aligned activations
    ups = [t for t in j["tasks"] if t["kind"] == "update"]
    assert len(ups) == 4 * len(tg.buckets)  # one chunk per device per bucket
    # RS after every backward task that produces its gradients, AG after every U
    names = {t["id"]: t["name"] for t in j["tasks"]}
    preds: dict = {}
    for a, b in j["deps"]:
        preds.setdefault(names[b], set()).add(names[a])
    assert preds["AG:b0.0"] == {f"U:b0.0[{p}]" for p in range(4)}
    assert all(n.startswith("B:") for n in preds["RS:b0.0"])


def test_collectives_beat_point_to_point_and_fewer_tasks():
    g, m = _cnn(32), Machine.parse("p100:4x4")
    s = Strategy.data_parallel(g, m)
    shards = Simulator(g, m, sync="shards").run(s)
    coll = Simulator(g, m).run(s)  # the default
    assert coll.num_tasks < shards.num_tasks / 4
    assert coll.bytes_moved > 0 and coll.iteration_time_s > 0


def test_group_of_one_device_is_a_noop():
    g, m = _cnn(), Machine.parse("p100:1x2")
    one = Strategy({op.name: ParallelConfig.single(len(op.output_shape), 1) for op in g.ops},
                   g.name, m.name)
    sim = Simulator(g, m, sync="collective")
    r = sim.run(one)
    j = sim.tg.to_json()
    assert not [t for t in j["tasks"] if t["kind"] == "collective"]
    assert all(t["device"] == m.devices[1].name for t in j["tasks"] if t["kind"] == "update")
    assert r.bytes_moved == 0


def _orders(sim) -> dict:
    tg = sim.tg
    out = {}
    for r in range(len(tg.dhead)):
        t, keys = tg.dhead[r], []
        while t >= 0:
            keys.append(int(tg.key[t]))
            t = tg.dnext[t]
        if keys:
            out[tg.resource_name(r)] = keys
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_delta_equals_full_with_collectives(seed):
    g, m = _cnn(8), Machine.parse("p100:2x2")
    rng = random.Random(seed)
    _delta_equals_full(g, m, Strategy.data_parallel(g, m), rng, 6)


def _delta_equals_full(g, m, s, rng, changes: int) -> None:
    """``changes`` random single-op changes: delta simulation gives the
    timeline, per-device orders, time, link bytes and peak memory of a full
    simulation of the same strategy (symmetry off: Algorithm 2 itself)."""
    sim = Simulator(g, m, sync="collective")
    sim.tg.symmetry = False
    sim.run(s)
    for _ in range(changes):
        op = rng.choice(g.ops)
        cfg = random_config(rng, op, m.num_devices)
        s = s.with_config(op.name, cfg)
        r = sim.delta(op.name, cfg)
        assert sim.last_delta_pops >= 0
        ref = Simulator(g, m, sync="collective")
        ref.tg.symmetry = False
        rf = ref.run(s)
        assert sim.timeline() == ref.timeline()
        assert _orders(sim) == _orders(ref)
        assert r.iteration_time_s == rf.iteration_time_s
        assert r.bytes_per_link == rf.bytes_per_link
        assert r.peak_memory == rf.peak_memory


@pytest.mark.parametrize("spec,kind", [
    ("p100:4x4", "data"), ("h100:4x4", "hybrid"), ("p100:4x4", "owt"), ("k80:4x4", "hybrid"),
    ("h100:16x8", "data"),  # 128 GPUs
    pytest.param("h100:8x8", "data", marks=pytest.mark.slow),  # 64 GPUs: 16 and 128 cover it
    pytest.param("h100:8x8", "hybrid", marks=pytest.mark.slow)])  # 16 GPUs cover it
def test_symmetric_simulation_equals_full(spec, kind):
    g = _cnn(128)
    m = Machine.parse(spec)
    s = {"data": Strategy.data_parallel, "owt": Strategy.owt,
         "hybrid": Strategy.hybrid}[kind](g, m)
    full = Simulator(g, m, sync="collective")
    full.tg.symmetry = False
    rf = full.run(s)
    sym = Simulator(g, m, sync="collective")
    r = sym.run(s)
    # OWT's dense layers read every node's activations: not node-symmetric
    assert (sym.tg.sym is not None) == (kind != "owt")
    assert r.iteration_time_s == pytest.approx(rf.iteration_time_s, rel=1e-12)
    assert r.num_tasks == rf.num_tasks
    assert r.peak_memory == pytest.approx(rf.peak_memory, rel=1e-12)
    assert r.per_device_busy_s == pytest.approx(rf.per_device_busy_s, rel=1e-9)
    assert r.bytes_moved == pytest.approx(rf.bytes_moved, rel=1e-9)
    assert r.feasible == rf.feasible
    if sym.tg.sym is not None:
        assert sym.tg.alive.sum() < full.tg.alive.sum()
    # a delta on a symmetric graph is a full simulation of the new strategy
    op = g.ops[3]
    cfg = ParallelConfig.single(len(op.output_shape), 0)
    r2 = sym.delta(op.name, cfg)
    ref = Simulator(g, m, sync="collective")
    ref.tg.symmetry = False
    assert r2.iteration_time_s == pytest.approx(ref.run(s.with_config(op.name, cfg))
                                                .iteration_time_s, rel=1e-12)


def _records(sim) -> list[dict]:
    """What a runtime that ran exactly the simulated graph would record:
    one record per task, collectives as units (docs/seam.md)."""
    import re

    j = sim.tg.to_json()
    devs = {d.name: d.id for d in sim.machine.devices}
    deps: dict = {}
    for a, b in j["deps"]:
        deps.setdefault(b, []).append(a)
    out = []
    for t in j["tasks"]:
        r = {"id": t["id"], "kind": t["kind"], "deps": deps.get(t["id"], [])}
        if t["kind"] == "collective":
            kind, rest = t["name"].split(":", 1)
            r.update(name=f"{kind}({rest})", collective=t["collective"], group=t["group"],
                     algorithm=t["algorithm"], bytes=t["bytes"])
        else:
            m = re.match(r"^([FBU]):(.*)\[(\d+)\]$", t["name"])
            r.update(name=f"{m.group(1)}({m.group(2)})", launch=int(m.group(3)),
                     device=devs[t["device"]])
        out.append(r)
    return out


def test_mirror_compares_collectives_as_units():
    from legionpy.optimizer.mirror import compare, taskgraph_form, traced_taskgraph

    g, m = _cnn(), Machine.parse("p100:1x4")
    sim = Simulator(g, m, sync="collective")
    sim.run(Strategy.data_parallel(g, m))
    recs = _records(sim)
    sim_form = taskgraph_form(sim.tg)
    assert len(sim_form.collectives) == 2 * len(sim.tg.buckets)
    assert compare(traced_taskgraph(recs), sim_form) == []
    # a runtime that picked another algorithm, or dropped a collective, differs
    bad = [dict(r) for r in recs]
    c = next(r for r in bad if r["kind"] == "collective")
    c["algorithm"] = "tree" if c["algorithm"] != "tree" else "ring"
    diff = compare(traced_taskgraph(bad), sim_form)
    assert len(diff) == 1 and "algorithm" in diff[0] and c["name"][:2] in diff[0]
    gone = [r for r in recs if r["id"] != c["id"]]
    for r in gone:
        r["deps"] = [d for d in r["deps"] if d != c["id"]]
    assert any("in the taskgraph only" in d for d in compare(traced_taskgraph(gone), sim_form))


def test_hybrid_baseline_splits_parameters_inside_nodes():
    g, m = _cnn(64), Machine.parse("p100:4x4")
    s = Strategy.hybrid(g, m)
    conv = next(op for op in g.ops if op.kind == "conv2d")
    assert s[conv.name].degrees[:2] == (4, 4)  # samples over nodes, channels in a node
    assert s[conv.name].devices == tuple(range(16))


@pytest.mark.parametrize("sync", ["collective", None])
def test_search_at_scale_runs_symmetric_methods(monkeypatch, sync):
    """With collectives (named, or the default: None once crashed at 1,024
    GPUs into the full-graph methods) past AT_SCALE devices."""
    from legionpy.optimizer import search

    monkeypatch.setattr(search, "AT_SCALE", 8)
    monkeypatch.delenv("LEGIONPY_SYNC", raising=False)
    g, m = _cnn(64), Machine.parse("p100:4x4")
    rep = search.run_all(g, m, budget_s=2, seed=0, sync=sync)
    assert set(rep.rows) == set(search.SCALE_METHODS)
    data = rep.rows["data"]["iteration_time_s"]
    assert rep.rows["mcmc"]["iteration_time_s"] <= min(data, rep.rows["hybrid"][
        "iteration_time_s"])
    assert rep.rows[rep.best]["iteration_time_s"] <= data


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 9))
def test_delta_equals_full_random_dags_with_collectives(seed, n_ops):
    """Shared weights under different configs (merged tiles), partial groups,
    groups of one device: Algorithm 2 stays exact with bucket blocks."""
    g, m = random_graph(seed, n_ops), Machine.parse("p100:2x2")
    rng = random.Random(seed)
    _delta_equals_full(g, m, random_strategy(rng, g, m), rng, 5)


def test_symmetric_table_holds_only_node_symmetric_configs():
    from legionpy.optimizer.search.space import symmetric_table
    from legionpy.optimizer.symmetry import symmetric_blocks

    g, m = _cnn(64), Machine.parse("p100:4x4")
    table = symmetric_table(g, m)
    assert all(Strategy.data_parallel(g, m)[n] in c for n, c in table.items())
    hyb = Strategy.hybrid(g, m)
    assert all(hyb[n] in c for n, c in table.items())
    rng = random.Random(0)
    for _ in range(10):
        s = Strategy({n: rng.choice(c) for n, c in table.items()}, g.name, m.name)
        s.validate(g, m)
        assert symmetric_blocks(g, s, 4, 4)
        sim = Simulator(g, m, sync="collective")
        sim.run(s)
        assert sim.tg.sym == (4, 4)  # no activation crosses a node either


def test_cli_simulate_sync_collective(tmp_path, capsys):
    import json

    from legionpy.cli import main

    graph = tmp_path / "tg.json"
    assert main(["simulate", "lenet", "--machine", "p100:2x2", "--strategy", "hybrid",
                 "--sync", "collective", "--json", "--taskgraph", str(graph)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sync"] == "collective" and out["iteration_time_s"] > 0
    tg = json.loads(graph.read_text())
    coll = [t for t in tg["tasks"] if t["kind"] == "collective"]
    assert coll and all({"group", "algorithm", "collective", "bytes"} <= set(t) for t in coll)
    assert out["symmetry_classes"] == tg.get("symmetry", {}).get("classes", 1)
    # --compare --sync collective runs for real now (the runtime half, nn/sync.py):
    # tests/runtime/test_fidelity.py::test_simulate_compare_collective_sync
