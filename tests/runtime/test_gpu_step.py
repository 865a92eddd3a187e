"""bench/gpu_step.py (issue 16 item 7) without a GPU: it declines to
measure, its --emulated --small smoke run goes through every part of the
script, and its PyTorch baseline computes what legionpy computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from seeded import still_seeded

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LEGIONPY_GPU_BACKEND", "LEGIONPY_GPUS")}
    return subprocess.run([sys.executable, str(BENCH / "gpu_step.py"), *args], env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("name", ["alexnet", "resnet101", "rnnlm"])
def test_the_torch_baseline_computes_what_legionpy_computes(name):
    torch = pytest.importorskip("torch")
    from torch_zoo import TorchGraph

    import legionpy as lp
    from legionpy import data as D
    from legionpy import models

    lp.init(cpus=1)
    try:
        m = models.build(name, scale="small", seed=0)
        m.compile(optimizer=lp.nn.SGD(lr=0.01), strategy="data")
        xs, y = D.for_model(m, m.batch_size, seed=0)
        feeds = xs if isinstance(xs, list) else [xs]
        tg = TorchGraph(m.graph, params=m.parameters())
        theirs = tg.probabilities([torch.tensor(x) for x in feeds]).numpy()
        np.testing.assert_allclose(m.predict(xs), theirs, rtol=1e-4, atol=1e-6)
        if name != "alexnet":  # no dropout: the training losses agree too
            loss = float(tg.step([torch.tensor(x) for x in feeds], torch.tensor(y)))
            assert m.fit(xs, y, verbose=0, shuffle=False)["step_loss"][0] == pytest.approx(
                loss, rel=1e-4)
    finally:
        lp.runtime.shutdown()


def test_without_a_gpu_it_says_so_and_measures_nothing():
    from gpu_step import cuda_status

    if cuda_status()[0]:
        pytest.skip("a CUDA GPU is visible: the benchmark would run")
    r = _run()
    assert r.returncode == 0, r.stderr
    assert "no CUDA GPU here" in r.stdout and "nothing measured" in r.stdout
    assert " ms" not in r.stdout and "ratio" not in r.stdout


def test_emulated_smoke_run_covers_the_step_table_and_the_comparison(monkeypatch, capsys):
    """In this process (the script's imports, and torch warmed up by the
    tests above, are the suite's): main() as `python bench/gpu_step.py
    --emulated --small ...` runs it."""
    from gpu_step import main

    for var in ("LEGIONPY_GPU_BACKEND", "LEGIONPY_GPUS"):  # main sets them; undone after
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("LEGIONPY_SEARCH_BUDGET", "1")
    assert main(["--emulated", "--small", "--models", "rnnlm", "--repeat", "1",
                 "--compare-steps", "1", "--json"]) == 0  # compare on 2 emulated GPUs
    stdout = capsys.readouterr().out
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["emulated"] and out["scale"] == "small"
    step = out["steps"]["rnnlm"]
    assert step["legionpy_s"] > 0 and np.isfinite(step["loss"])
    assert 0 < step["legionpy_steady_s"] < 2 * step["legionpy_s"]
    try:
        import torch  # noqa: F401
        assert step["torch_s"] > 0 and step["torch_cudnn_s"] > 0
        assert out["baseline"] == "torch on cpu"
    except ImportError:
        assert step["torch_s"] is None and "torch is not installed" in out["baseline"]
    assert [c["strategy"] for c in out["compare"]] == ["data", "model", "search"]
    assert "on 2 EMULATED GPU(s)" in stdout
    assert all(c["simulated_s"] > 0 and c["measured_s"] > 0 for c in out["compare"])
    # kernels timed on the (emulated) GPU, not CPU seconds of contending threads
    assert {c["cost_model"] for c in out["compare"]} == {"measured on the GPU"}
    assert out["worst_error"] == max(c["relative_error"] for c in out["compare"])
    assert "EMULATED" in stdout and "n/a (emulated" in stdout and " met" not in stdout


def test_no_steps_and_no_compare_measure_nothing(monkeypatch, capsys):
    """`--no-steps` leaves the step table out (bench/gpu_runs.sh times the
    comparison on its own): with `--no-compare` too, nothing is measured."""
    from gpu_step import main

    for var in ("LEGIONPY_GPU_BACKEND", "LEGIONPY_GPUS"):
        monkeypatch.setenv(var, "")
    assert main(["--emulated", "--small", "--no-steps", "--no-compare", "--json"]) == 0
    stdout = capsys.readouterr().out
    out = json.loads(stdout.strip().splitlines()[-1])
    assert "steps" not in out and "compare" not in out and "one training step" not in stdout


def test_simulate_compare_runs_on_this_process_gpus(monkeypatch, capsys, seed_overhead):
    """`legionpy simulate --compare` (and `train`) start the runtime on the
    process's GPUs when it has some, and time the GPU's kernels on the GPU
    (the machine model's overhead seeded: its calibration is not the point)."""
    from legionpy.cli import main as cli

    monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
    monkeypatch.setenv("LEGIONPY_GPUS", "1")
    path = seed_overhead("local:1")
    assert cli(["simulate", "lenet", "--scale", "small", "--machine", "local", "--compare",
                "--steps", "1", "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["machine"] == "local:1" and list(out["per_device_busy_s"]) == ["gpu0"]
    assert out["cost_model"] == "measured on the GPU" and out["measured_time_s"] > 0
    assert still_seeded(path)  # the seeded figures were the ones used (no calibration)
