"""Recorded GPU profiles backing machine presets (issue 16 item 6):
recording (`legionpy profile --zoo`), the naming rule, loading as a preset's
default cost model, `legionpy machines` and `simulate` reporting them, and
the refusal of emulated profiles. No GPU here: the profiles are recorded on
the CPU and on the emulated GPU backend at small scale."""

from __future__ import annotations

import json
import os

import pytest

from legionpy.cli import main
from legionpy.models import graph as zoo_graph
from legionpy.optimizer import Machine, Simulator, Strategy, TableCostModel, search
from legionpy.optimizer.costmodel import AnalyticCostModel, cost_key, default_cost_model
from legionpy.optimizer.machine import PRESETS
from legionpy.optimizer.recorded_profiles import (
    packaged_dir,
    preset_for_gpu,
    preset_profile,
    profile_file_name,
    read_profile,
)


def _record(cli_out, tmp_path, monkeypatch, emulated: bool = False):
    """Record lenet (small, 1 and 2 devices) for preset h100 into a folder of
    its own, on the CPU or the emulated GPU; returns (folder, --json output)."""
    folder = tmp_path / ("emu" if emulated else "cpu")
    folder.mkdir()
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "cache"))
    if emulated:
        monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
        monkeypatch.setenv("LEGIONPY_GPUS", "1")
    else:
        monkeypatch.setenv("LEGIONPY_GPUS", "0")
    assert main(["profile", "--zoo", "--models", "lenet", "--scale", "small", "--preset",
                 "h100", "--devices", "1,2", "--out", str(folder), "--json"]) == 0
    monkeypatch.delenv("LEGIONPY_GPU_BACKEND", raising=False)
    monkeypatch.delenv("LEGIONPY_GPUS", raising=False)
    return folder, json.loads(cli_out.readouterr().out)


def _busy(machine, cost=None) -> float:
    g = zoo_graph("lenet", scale="small").graph
    sim = Simulator(g, machine, cost)
    return sim.run(Strategy.data_parallel(g, machine)).per_device_busy_s, sim


def test_a_cpu_profile_backs_its_preset_and_replaces_the_analytic_times(
        tmp_path, monkeypatch, capsys):
    folder, rec = _record(capsys, tmp_path, monkeypatch)
    assert [os.path.basename(p["file"]) for p in rec["profiles"]] == ["h100-lenet.json"]
    prof = read_profile(folder / "h100-lenet.json")
    assert prof.preset == "h100" and prof.device_kind == "cpu" and not prof.emulated
    assert prof.models[0]["model"] == "lenet" and prof.models[0]["device_counts"] == [1, 2]
    assert prof.versions["numpy"] and len(prof.table) == rec["profiles"][0]["tiles"] > 0

    monkeypatch.setenv("LEGIONPY_PROFILES", str(folder))
    h100 = Machine.parse("h100:1x1")
    cm = default_cost_model(h100)
    assert isinstance(cm, TableCostModel) and "h100-lenet.json" in cm.source
    assert isinstance(default_cost_model(Machine.parse("p100:1x1")), AnalyticCostModel)
    busy, sim = _busy(h100)
    assert sim.cost.coverage() == {"table": sum(op.kind != "input" for op in sim.graph.ops),
                                   "analytic": 0, "scaled": 0}
    # one device: its busy time moves by exactly the measured minus the analytic op times
    analytic = AnalyticCostModel()
    busy0, _ = _busy(h100, analytic)
    dev = h100.devices[0]
    delta = 0.0
    for op in sim.graph.ops:
        if op.kind != "input":
            f, b = prof.table[cost_key(op, op.output_rect, "cpu")]
            fa, ba = analytic.op_time(op, op.output_rect, dev)
            delta += (f + b) - (fa + ba) if op.has_backward else f - fa
    (name, t), = busy.items()
    assert t - busy0[name] == pytest.approx(delta, rel=1e-6)

    # the search runs on it too, and says so
    rep = search.run_all(sim.graph, Machine.parse("h100:1x2"), methods=["data", "model"])
    assert "h100-lenet.json" in rep.details["cost_model"]["name"]
    assert rep.details["cost_model"]["tiles"]["table"] > 0 and "tiles from the table" in rep.table()

    # the commands say so
    assert main(["simulate", "lenet", "--scale", "small", "--machine", "h100:1x2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost_model"] == "profile" and out["cost_tiles"]["analytic"] == 0
    assert out["cost_tiles"]["table"] > 0 and "h100-lenet.json" in out["cost_source"]
    assert main(["simulate", "lenet", "--scale", "small", "--machine", "h100:1x2",
                 "--cost", "analytic", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["iteration_time_s"] != out["iteration_time_s"] and "cost_tiles" not in plain
    assert main(["machines", "--json"]) == 0
    rows = {r["spec"]: r for r in json.loads(capsys.readouterr().out)["machines"]}
    h = rows["h100:NODESxGPUS"]["cost_model"]
    assert h["kind"] == "profile" and [f["file"] for f in h["files"]] == ["h100-lenet.json"]
    assert h["models"] == ["lenet[small]"] and h["devices"][0].startswith("cpu: ")
    assert rows["p100:NODESxGPUS"]["cost_model"]["kind"] == "analytic"
    assert main(["machines"]) == 0
    assert "profile h100-lenet.json" in capsys.readouterr().out


def test_a_gpu_profile_drives_its_preset_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    """A GPU-named profile (as `profile --zoo` writes on a GPU) is used as it
    is on this CPU-only machine: measured GPU kernel times anywhere."""
    g = zoo_graph("lenet", scale="small").graph
    ops = [op for op in g.ops if op.kind != "input"]
    table = {cost_key(op, op.output_rect, "gpu"): [1e-3 * (i + 1), 2e-3 * (i + 1)]
             for i, op in enumerate(ops[:-1])}  # the last op is left to the analytic model
    doc = {"format": "legionpy-costs/1", "profile": "legionpy-gpu-profile/1",
           "preset": "h100", "emulated": False,
           "device": {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "backend": "cupy"},
           "versions": {"cupy": "13.3.0", "cuda_runtime": 12040},
           "models": [{"model": "lenet", "scale": "small"}], "costs": table}
    (tmp_path / profile_file_name("h100", "lenet")).write_text(json.dumps(doc))
    monkeypatch.setenv("LEGIONPY_PROFILES", str(tmp_path))
    m = Machine.parse("h100:1x1")
    sim = Simulator(g, m)
    sim.run(Strategy.data_parallel(g, m))
    assert sim.cost.coverage() == {"table": len(ops) - 1, "analytic": 1, "scaled": 0}
    for i, op in enumerate(ops[:-1]):
        assert sim.cost.op_time(op, op.output_rect, m.devices[0]) == (1e-3 * (i + 1),
                                                                       2e-3 * (i + 1))
    # a tile shape the profile lacks: the roofline times the op's measured efficiency
    m2 = Machine.parse("h100:1x2")
    cm, plain = default_cost_model(m2), AnalyticCostModel()
    dense = next(op for op in ops if op.kind == "dense")
    i = ops.index(dense)
    half = dense.output_rect.split((2, 1))[0]
    fa, ba = plain.op_time(dense, dense.output_rect, m2.devices[0])
    fh, bh = plain.op_time(dense, half, m2.devices[0])
    assert cm.op_time(dense, half, m2.devices[0]) == pytest.approx(
        (fh * 1e-3 * (i + 1) / fa, bh * 2e-3 * (i + 1) / ba), rel=1e-9)
    assert cm.coverage() == {"table": 0, "analytic": 1, "scaled": 1}
    assert preset_profile("h100").describe()["devices"] == ["NVIDIA H100 80GB HBM3"]
    # strategies found on the profile are cached apart from analytic ones
    with_profile = m.cache_key()
    monkeypatch.setenv("LEGIONPY_PROFILES", "off")
    assert with_profile["cost_profile"] and "cost_profile" not in m.cache_key()


def test_an_emulated_profile_is_recorded_but_never_loaded_nor_shipped(
        tmp_path, monkeypatch, capsys):
    folder, rec = _record(capsys, tmp_path, monkeypatch, emulated=True)
    prof = read_profile(folder / "h100-lenet.json")
    assert prof.emulated and prof.device_kind == "gpu" and prof.device["backend"] == "emulated"
    assert all(k.endswith("|gpu") for k in prof.table) and rec["device"]["emulated"]
    monkeypatch.setenv("LEGIONPY_PROFILES", str(folder))
    assert isinstance(default_cost_model(Machine.parse("h100:1x2")), AnalyticCostModel)
    assert main(["machines", "--json"]) == 0
    h = {r["spec"]: r for r in json.loads(capsys.readouterr().out)["machines"]}[
        "h100:NODESxGPUS"]["cost_model"]
    assert h["kind"] == "analytic" and h["refused"][0]["file"] == "h100-lenet.json"
    assert "emulated" in h["refused"][0]["why"]
    # and it cannot be written into the packaged folder
    before = sorted(os.listdir(packaged_dir()))
    monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
    monkeypatch.setenv("LEGIONPY_GPUS", "1")
    assert main(["profile", "--zoo", "--models", "lenet", "--scale", "small", "--preset",
                 "h100", "--devices", "1", "--out", str(packaged_dir())]) != 0
    assert "refusing" in capsys.readouterr().err
    assert sorted(os.listdir(packaged_dir())) == before


def test_profile_zoo_needs_a_preset_and_a_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LEGIONPY_GPUS", "0")
    assert main(["profile", "--zoo", "--models", "lenet", "--out", str(tmp_path)]) != 0
    assert "--preset" in capsys.readouterr().err  # a CPU's name names no preset
    assert main(["profile", "--zoo", "--models", "lenet", "--preset", "h100", "--out",
                 str(tmp_path / "x.json")]) != 0
    assert "folder" in capsys.readouterr().err


def test_gpu_names_map_to_presets():
    assert preset_for_gpu("NVIDIA H100 80GB HBM3") == "h100"
    assert preset_for_gpu("NVIDIA H200") == "h200"
    assert preset_for_gpu("Tesla V100-SXM2-16GB") == "dgx1"
    assert preset_for_gpu("Tesla P100-PCIE-16GB") == "p100"
    assert preset_for_gpu("NVIDIA A100-SXM4-40GB") is None
    assert profile_file_name("h100", "resnet101") == "h100-resnet101.json"


def test_every_packaged_profile_is_a_real_gpu_profile_named_by_the_rule():
    """What ships in legionpy/data/profiles: recorded on a real GPU, for a
    known preset, loadable, named PRESET-MODEL.json."""
    files = sorted(p for p in os.listdir(packaged_dir()) if p.endswith(".json"))
    for name in files:
        prof = read_profile(packaged_dir() / name)
        assert prof.refusal is None and prof.device_kind == "gpu", name
        assert prof.preset in PRESETS and prof.preset != "local", name
        assert name in {profile_file_name(prof.preset, m["model"]) for m in prof.models}
    for preset in {n.split("-")[0] for n in files}:
        assert len(preset_profile(preset, packaged_dir()).files) >= 1
