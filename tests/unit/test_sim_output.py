"""Chrome trace, --taskgraph JSON and the strategy PNG."""

from __future__ import annotations

import json

import pytest

from legionpy import models
from legionpy.optimizer import Machine, Simulator, Strategy, chrome_trace, plot_strategy
from legionpy.optimizer.trace import write_chrome_trace


def _sim(sync=None):
    g = models.lenet(batch_size=8).graph
    m = Machine.parse("p100:1x2")
    sim = Simulator(g, m, sync=sync)
    s = Strategy.owt(g, m)
    sim.run(s)
    return g, m, s, sim


def test_chrome_trace_format(tmp_path):
    g, m, s, sim = _sim()
    tasks = sim.tasks()
    tr = chrome_trace(tasks)
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tasks)
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name"}
    assert "n0gpu0" in names and any(":" in n for n in names)  # devices and links
    end = max(e["ts"] + e["dur"] for e in xs)
    assert abs(end - sim.iteration_time() * 1e6) < 1e-6
    p = tmp_path / "t.json"
    write_chrome_trace(tasks, str(p))
    assert json.loads(p.read_text()) == json.loads(json.dumps(tr))


@pytest.mark.parametrize("sync,kinds", [("shards", {"compute", "copy", "update"}),
                                        ("collective", {"compute", "copy", "collective",
                                                        "update"})])
def test_taskgraph_json_resimulates(tmp_path, sync, kinds):
    g, m, s, sim = _sim(sync)
    tj = sim.tg.to_json()
    assert set(tj) == {"tasks", "deps"}
    t0 = tj["tasks"][0]
    assert {"id", "name", "kind", "device", "duration_s", "bytes"} <= set(t0)
    assert {t["kind"] for t in tj["tasks"]} == kinds
    from test_simulator import reference_schedule
    ref = reference_schedule(tj)
    assert abs(max(e for _, e in ref.values()) - sim.iteration_time()) < 1e-12


def test_strategy_png(tmp_path):
    g, m, s, sim = _sim()
    p = tmp_path / "s.png"
    plot_strategy(g, s, m, str(p))
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
