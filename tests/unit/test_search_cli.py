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
