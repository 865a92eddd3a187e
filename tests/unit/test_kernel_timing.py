"""Profiling with the real tile kernels, `legionpy profile` and `simulate --cost`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from legionpy.cli import main
from legionpy.optimizer import Graph, Machine, Simulator, Strategy, TableCostModel
from legionpy.optimizer.costmodel import MeasuredCostModel, cost_key
from legionpy.optimizer.kernel_timing import profile_model, required_tiles, tile_arrays, tile_runner


def _graph():
    g = Graph(8)
    x = g.input((3, 12, 12))
    t = g.conv2d(x, 4, kernel=3, padding=1, activation="relu")
    t = g.pool2d(t, 2, stride=2)
    t = g.dense(g.flat(t), 5)
    g.softmax(t)
    return g


def test_tile_arrays_match_the_rects():
    g = _graph()
    conv = g.ops[1]
    tile = conv.output_rect.split((1, 1, 2, 1))[0]  # a row band: a halo row
    xs, ws = tile_arrays(conv, tile)
    assert xs[0].shape == conv.input_rect(0, tile).shape
    assert ws["weight"].shape == conv.weight_rect("weight", tile).shape


def test_tile_runner_runs_the_kernels():
    g = _graph()
    dense = g.ops[-2]
    fwd, bwd = tile_runner(dense, dense.output_rect, Machine.local(1).devices[0])
    y = fwd()
    assert y.shape == dense.output_rect.shape and np.isfinite(y).all()
    dxs, dws = bwd()
    assert dws["weight"].shape == dense.params["weight"].shape


def test_profile_model_covers_every_tile_and_drives_the_simulator(tmp_path):
    g = _graph()
    m = Machine.local(2)
    strategies = [Strategy.data_parallel(g, m), Strategy.model_parallel(g, m)]
    cm = MeasuredCostModel(tile_runner, str(tmp_path / "cache.json"))
    table = profile_model(g, m, strategies, cm)
    assert len(table) == len(required_tiles(g, strategies))
    assert all(f > 0 and b > 0 for f, b in table.values())
    sim = Simulator(g, m, TableCostModel(table, fallback=False))
    assert sim.simulate(strategies[0]) > 0
    # the cache makes a second profile free: the runner is never called
    again = MeasuredCostModel(None, str(tmp_path / "cache.json"))
    assert profile_model(g, m, strategies, again) == table


def test_profile_and_simulate_commands(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lenet.json"
    assert main(["profile", "lenet", "--machine", "local:2", "--out", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tiles"] == len(r["costs"]) > 0 and r["device_kinds"] == ["cpu"]
    saved = json.loads(out.read_text())
    assert saved["format"] == "legionpy-costs/1" and saved["costs"] == r["costs"]
    assert main(["simulate", "lenet", "--scale", "small", "--machine", "local:2", "--cost",
                 str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["iteration_time_s"] > 0 and s["cost_model"] == str(out)
    # the profile prices exactly the tiles of the small lenet under data parallel
    from legionpy.models import graph

    g = graph("lenet", scale="small").graph
    st = Strategy.data_parallel(g, Machine.local(2))
    op = g.ops[1]
    assert cost_key(op, op.output_rect.split(st[op.name].degrees)[0], "cpu") in r["costs"]


@pytest.mark.parametrize("spec", ["analytic", "measured"])
def test_simulate_cost_option(spec, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path))
    assert main(["simulate", "lenet", "--scale", "small", "--machine", "local:2", "--cost", spec,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0
