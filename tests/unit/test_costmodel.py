"""Cost models: analytic roofline, measured cache, recorded tables."""

from __future__ import annotations

import json

import pytest

from legionpy.errors import StrategyError
from legionpy.ops import TensorRef
from legionpy.optimizer import (
    AnalyticCostModel,
    Graph,
    Machine,
    MeasuredCostModel,
    Simulator,
    Strategy,
    TableCostModel,
)
from legionpy.optimizer.costmodel import cost_key


def _dense():
    g = Graph(64)
    return g, g.dense(g.input((1024,)), 1024).op


def test_analytic_roofline_and_copy_time():
    g, op = _dense()
    m = Machine.parse("p100:1x2")
    cm = AnalyticCostModel(gpu_overhead_s=5e-6, efficiency=0.5)
    f, b = cm.op_time(op, op.output_rect, m.devices[0])
    assert f == pytest.approx(5e-6 + 2 * 64 * 1024 * 1024 / (9.3e12 * 0.5))
    assert b > f
    half = op.output_rect.split((2, 1))[0]
    assert cm.op_time(op, half, m.devices[0])[0] < f
    ln = m.links[0]
    assert cm.copy_time(1e6, ln) == pytest.approx(ln.latency + 1e6 / ln.bandwidth)


def test_measured_cache_keyed_without_device_id(tmp_path):
    g, op = _dense()
    m = Machine.parse("p100:1x2")
    calls = []

    def runner(op_, rect, dev):
        calls.append(dev.id)
        return (lambda: None), (lambda: None)

    path = tmp_path / "cache.json"
    cm = MeasuredCostModel(runner, str(path))
    t0 = cm.op_time(op, op.output_rect, m.devices[0])
    t1 = cm.op_time(op, op.output_rect, m.devices[1])
    assert calls == [0] and t0 == t1  # same kind, shapes: measured once
    table = json.loads(path.read_text())
    assert list(table) == [cost_key(op, op.output_rect, "gpu")]
    again = MeasuredCostModel(None, str(path))
    assert again.op_time(op, op.output_rect, m.devices[1]) == t0
    assert MeasuredCostModel.time_callable(lambda: sum(range(100))) > 0


def test_table_cost_model_drives_simulation(tmp_path):
    g, op = _dense()
    g.softmax(TensorRef(op))
    m = Machine.parse("p100:1x1")
    key = cost_key(op, op.output_rect, "gpu")
    p = tmp_path / "t.json"
    p.write_text(json.dumps({key: [0.5, 1.0]}))
    sim = Simulator(g, m, TableCostModel.from_json(str(p)))
    r = sim.run(Strategy.data_parallel(g, m))
    assert r.iteration_time_s > 1.5
    strict = TableCostModel({}, fallback=False)
    with pytest.raises(StrategyError, match="no entry"):
        strict.op_time(op, op.output_rect, m.devices[0])


def test_table_from_wrapped_profile_and_spec(tmp_path):
    from legionpy.optimizer.costmodel import cost_model_from_spec

    g, op = _dense()
    m = Machine.parse("p100:1x2")
    key = cost_key(op, op.output_rect, "gpu")
    path = tmp_path / "prof.json"
    path.write_text(json.dumps({"format": "legionpy-costs/1", "model": "x",
                                "costs": {key: [1e-3, 2e-3]}}))
    t = cost_model_from_spec(str(path))
    assert isinstance(t, TableCostModel)
    assert t.op_time(op, op.output_rect, m.devices[1]) == (1e-3, 2e-3)
    assert isinstance(cost_model_from_spec("analytic"), AnalyticCostModel)
    with pytest.raises(StrategyError, match="unknown cost model"):
        cost_model_from_spec("nope")


def test_measured_local_uses_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "c"))
    g, op = _dense()
    cm = MeasuredCostModel.local()
    f, b = cm.op_time(op, op.output_rect.split((4, 1))[0], Machine.local(2).devices[0])
    assert f > 0 and b > 0
    table = json.loads((tmp_path / "c" / "costs-v2.json").read_text())
    assert list(table) == [cost_key(op, op.output_rect.split((4, 1))[0], "cpu")]


def test_a_layer_fed_by_the_data_is_keyed_apart_from_the_same_shapes_later():
    """The first dense layer computes no gradient for its input (the data),
    the second does: same shapes, different kernels, different keys; a
    table recorded before the distinction still serves the first."""
    from legionpy.optimizer.costmodel import NOGRAD

    g = Graph(8)
    d0 = g.dense(g.input((16,)), 16)
    d1 = g.dense(d0, 16)
    k0 = cost_key(d0.op, d0.op.output_rect, "cpu")
    k1 = cost_key(d1.op, d1.op.output_rect, "cpu")
    assert k0 != k1 and NOGRAD in k0 and NOGRAD not in k1
    assert k0.replace(NOGRAD, "") == k1
    legacy = TableCostModel({k1: [2e-3, 4e-3]}, fallback=False)
    dev = Machine.local(1).devices[0]
    assert legacy.op_time(d0.op, d0.op.output_rect, dev) == (2e-3, 4e-3)
