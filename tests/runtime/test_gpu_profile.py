"""Items 6-7 of issue 16 on a real GPU, at small scale (skipped without
CuPy and a visible GPU; none has run yet): a recorded profile names the
GPU and backs the preset of its name, and bench/gpu_step.py measures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from legionpy.cli import main
from legionpy.runtime.gpu import visible_gpus

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


@pytest.fixture(autouse=True)
def real_gpu(monkeypatch):
    monkeypatch.delenv("LEGIONPY_GPU_BACKEND", raising=False)
    monkeypatch.delenv("LEGIONPY_GPUS", raising=False)
    if visible_gpus() == 0:
        pytest.skip("no CUDA device visible")


def test_a_profile_recorded_on_this_gpu_backs_the_preset_of_its_name(tmp_path, monkeypatch,
                                                                     capsys):
    from legionpy.optimizer import Machine
    from legionpy.optimizer.costmodel import default_cost_model
    from legionpy.optimizer.recorded_profiles import preset_for_gpu, read_profile

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    preset = preset_for_gpu(name) or "h100"
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "cache"))
    assert main(["profile", "--zoo", "--models", "lenet", "--scale", "small", "--preset",
                 preset, "--devices", "1,2", "--out", str(tmp_path), "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    prof = read_profile(rec["profiles"][0]["file"])
    assert prof.device["name"] == name and prof.device_kind == "gpu" and not prof.emulated
    assert prof.versions["cupy"] == cupy.__version__ and prof.versions["cuda_runtime"] > 0
    assert all(0 < f < 1 and 0 < b < 1 for f, b in prof.table.values())
    monkeypatch.setenv("LEGIONPY_PROFILES", str(tmp_path))
    cm = default_cost_model(Machine.parse(f"{preset}:1x2"))
    assert cm.source == f"profile {preset}-lenet.json"


def test_gpu_step_bench_measures_on_this_gpu(monkeypatch, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from gpu_step import main as bench

    monkeypatch.setenv("LEGIONPY_GPUS", "")  # the bench sets it; undone after
    monkeypatch.setenv("LEGIONPY_SEARCH_BUDGET", "1")
    assert bench(["--small", "--models", "rnnlm", "--repeat", "1", "--compare-steps", "1",
                  "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not out["emulated"] and out["gpu"] and out["steps"]["rnnlm"]["legionpy_s"] > 0
    assert {c["cost_model"] for c in out["compare"]} == {"measured on the GPU"}
