"""``legionpy search --out FILE`` never silently overwrites a better or
different strategy (issue 15 item 4)."""

from __future__ import annotations

import json

from legionpy import models
from legionpy.commands.search import write_strategy
from legionpy.optimizer import Machine, Simulator, Strategy


def test_keeps_a_faster_file_replaces_a_slower_one_and_says_so(tmp_path):
    graph = models.build("lenet").graph
    machine = Machine.parse("p100:1x4")
    sim = Simulator(graph, machine)
    a, b = Strategy.data_parallel(graph, machine), Strategy.model_parallel(graph, machine)
    fast, slow = (a, b) if sim.run(a).iteration_time_s < sim.run(b).iteration_time_s else (b, a)
    path = tmp_path / "s.json"
    assert write_strategy(str(path), fast, graph, machine)["action"] == "wrote"
    note = write_strategy(str(path), slow, graph, machine)
    assert note["action"] == "kept" and "--force" in note["message"]
    assert Strategy.load(str(path), graph) == fast
    assert write_strategy(str(path), fast, graph, machine)["action"] == "unchanged"
    note = write_strategy(str(path), slow, graph, machine, force=True)
    assert note["action"] == "replaced" and "different strategy" in note["message"]
    assert write_strategy(str(path), fast, graph, machine)["action"] == "replaced"
    path.write_text(json.dumps({"something": "else"}))
    note = write_strategy(str(path), fast, graph, machine)
    assert note["action"] == "replaced" and "no strategy for this model" in note["message"]
