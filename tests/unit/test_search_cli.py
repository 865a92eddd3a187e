"""``legionpy search`` and run_all / search_for_model plumbing."""

from __future__ import annotations

import json

from legionpy import models
from legionpy.cli import main
from legionpy.optimizer import Machine, ParallelConfig
from legionpy.optimizer.search import partition, search_for_model
from legionpy.optimizer.search.space import ConfigSpace


def test_cli_json_keys(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["search", "lenet", "--machine", "p100:1x4", "--iterations", "24", "--json",
               "--no-progress", "--batch-size", "16", "--out", str(out)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert {"search_time_s", "strategies", "best"} <= set(res)
    for name in ("data", "model", "owt", "partitioner", "elimination", "mcmc"):
        row = res["strategies"][name]
        assert {"iteration_time_s", "speedup_vs_data", "bytes_moved"} <= set(row)
    assert res["best"] in res["strategies"]
    assert json.loads(out.read_text())["ops"]


def test_search_for_model_caches(tmp_path):
    g, m = models.lenet(batch_size=16).graph, Machine.parse("p100:1x2")
    a = search_for_model(g, m, seed=0, iterations=16, cache_dir=str(tmp_path))
    assert len(list(tmp_path.iterdir())) == 1
    b = search_for_model(g, m, seed=0, iterations=16, cache_dir=str(tmp_path))
    assert a == b
    a.validate(g, m)


def test_space_configs_valid():
    g, m = models.alexnet(batch_size=32, image_size=67, width=0.25).graph, Machine.parse(
        "p100:2x4")
    for op in g.ops:
        for c in ConfigSpace().configs(op, m):
            c.validate(op, m)
            assert c.num_tiles <= m.num_devices
            assert list(c.devices) == list(range(c.devices[0], c.devices[0] + c.num_tiles))


def test_partitioner_whole_ops_balanced():
    g, m = models.alexnet(batch_size=32, image_size=67, width=0.25).graph, Machine.parse(
        "p100:1x4")
    r = partition(g, m, eps=0.1)
    for op in g.ops:
        assert r.strategy[op.name] == ParallelConfig.single(len(op.output_shape),
                                                            r.strategy[op.name].devices[0])
    r.strategy.validate(g, m)


def test_search_cache_hits_on_the_local_machine(tmp_path, monkeypatch):
    """Machine.local() holds still: a second, fresh process (in-memory
    calibration dropped) builds the same model and hits the first one's
    cached strategy, even when a re-measurement would give other figures."""
    import itertools

    from legionpy.probe import machine as machine_mod

    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "cache"))
    noise = itertools.count(1)

    def noisy(repeats: int = 31) -> dict:  # every measurement differs, as on a busy host
        k = next(noise)
        return {"bandwidth": 1e9 * k, "flops": 1e10 * k, "repeats": repeats,
                "measured_at": float(k)}

    monkeypatch.setattr(machine_mod, "measure_cpu", noisy)
    monkeypatch.setattr(machine_mod, "_cpu_memo", {})
    g = models.lenet(batch_size=16).graph
    first = Machine.local(2)
    a = search_for_model(g, first, seed=0, iterations=8, cache_dir=str(tmp_path / "s"))
    machine_mod._cpu_memo.clear()  # a new process: only the disk cache remains
    second = Machine.local(2)
    assert second.to_dict() == first.to_dict()
    assert second.cache_key() == first.cache_key()
    b = search_for_model(g, second, seed=0, iterations=8, cache_dir=str(tmp_path / "s"))
    assert a == b
    assert len(list((tmp_path / "s").glob("strategy-*.json"))) == 1  # the cache hit
    assert next(noise) == 2  # measured once
    # a re-measurement is a new calibration: a new key, so stale strategies miss
    third = Machine.local(2, refresh=True)
    assert third.cache_key() != first.cache_key()
    assert third.devices[0].flops != first.devices[0].flops


def test_local_machine_figures_are_cached_on_disk(tmp_path, monkeypatch):
    from legionpy.probe import machine as machine_mod

    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path))
    monkeypatch.setattr(machine_mod, "_cpu_memo", {})
    m = Machine.local(2)
    files = list(tmp_path.glob("cpu-*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["flops"] == m.devices[0].flops and rec["bandwidth"] == m.links[0].bandwidth
    assert rec["repeats"] >= 5  # a median of repeats, not one run
    assert Machine.parse("p100:1x2").cache_key() == Machine.parse("p100:1x2").to_dict()
