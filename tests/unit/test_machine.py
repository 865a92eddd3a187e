"""Machine presets, routing over directed links, JSON and validation."""

from __future__ import annotations

import json

import pytest

from legionpy.errors import MachineError
from legionpy.optimizer import Machine


def test_p100_preset_figures_and_routes():
    m = Machine.parse("p100:4x4")
    assert m.num_devices == 16 and m.num_nodes == 4
    d = m.devices[5]
    assert d.node == 1 and d.flops == 9.3e12 and d.memory == 16 * 2**30
    r = m.route(0, 1)
    assert len(r) == 1 and m.links[r[0]].bandwidth == 18.52e9
    far = m.route(0, 5)  # gpu -> host -> ib -> host -> gpu
    assert [m.links[i].name.split(":")[0] for i in far] == ["pcie", "ib", "ib", "pcie"]
    assert m.route(5, 0) != far and len(m.route(5, 0)) == 4  # directed links
    assert m.route(3, 3) == ()


def test_other_presets():
    k = Machine.parse("k80:2x4")
    assert len(k.route(0, 1)) == 2 and len(k.route(0, 2)) == 4  # pair on one PCIe switch
    dgx = Machine.preset("dgx1")
    assert dgx.num_devices == 8 and len(dgx.route(0, 1)) == 1 and len(dgx.route(0, 7)) == 2
    h = Machine.parse("h100:2x8")
    assert h.num_devices == 16 and len(h.route(0, 9)) == 2 and len(h.route(0, 1)) == 2
    length, links = h.route_table()
    assert length.shape == (16, 16) and (links[0, 9, :2] == h.route(0, 9)).all()


def test_local_machine_has_a_link_per_ordered_pair():
    m = Machine.local(3)
    assert [d.kind for d in m.devices] == ["cpu"] * 3
    assert m.num_links == 6
    assert {(ln.src, ln.dst) for ln in m.links} == {
        (f"cpu{a}", f"cpu{b}") for a in range(3) for b in range(3) if a != b}
    assert all(len(m.route(a, b)) == 1 for a in range(3) for b in range(3) if a != b)
    assert Machine.local(3).links[0].bandwidth == m.links[0].bandwidth  # measured once


def test_json_round_trip(tmp_path):
    m = Machine.parse("k80:2x2")
    p = tmp_path / "m.json"
    m.save(str(p))
    m2 = Machine.from_json(str(p))
    assert m2.to_dict() == m.to_dict()
    assert Machine.parse(str(p)).route(0, 3) == m.route(0, 3)


def test_validation_names_the_bad_field(tmp_path):
    d = Machine.parse("p100:1x2").to_dict()
    d["links"][0]["bandwidth"] = -1
    with pytest.raises(MachineError, match="'bandwidth'"):
        Machine.from_dict(d)
    d = Machine.parse("p100:1x2").to_dict()
    d["devices"][1]["flops"] = 0
    with pytest.raises(MachineError, match="'flops'"):
        Machine.from_dict(d)
    d = Machine.parse("p100:1x2").to_dict()
    d["links"][0]["dst"] = "nowhere"
    with pytest.raises(MachineError, match="nowhere"):
        Machine.from_dict(d)
    with pytest.raises(MachineError, match="lacks the field 'links'"):
        Machine.from_dict({"devices": []})
    with pytest.raises(MachineError, match="unknown machine preset 'tpu'"):
        Machine.parse("tpu:2x2")
    with pytest.raises(MachineError, match="device id 9"):
        Machine.parse("p100:1x2").route(0, 9)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"devices": [{"name": "a"}], "links": [], "switches": []}))
    Machine.from_json(str(p))  # defaults fill a minimal device
