"""The ``legionpy`` command: --version, --help, and the demo's JSON output."""

import json
import subprocess
import sys

from legionpy import __version__
from legionpy.cli import main


def test_version_and_help(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert __version__ in capsys.readouterr().out
    assert main([]) == 0
    assert "demo" in capsys.readouterr().out


def test_demo_json_describes_the_partitions(capsys):
    assert main(["demo", "--json", "--rows", "10", "--cols", "4", "--degrees", "3x2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["equal"]["disjoint"] and out["equal"]["complete"]
    assert len(out["equal"]["tiles"]) == 6
    assert out["equal"]["tiles"][0] == {"color": [0, 0], "lo": [0, 0], "hi": [4, 2]}
    assert out["restriction"]["complete"] and not out["restriction"]["disjoint"]


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "legionpy.cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and __version__ in proc.stdout


def test_bad_input_is_a_clear_error(capsys):
    assert main(["demo", "--rows", "2", "--degrees", "3x1"]) == 2
    err = capsys.readouterr().err
    assert "legionpy demo: error:" in err and "degree 3" in err


def test_models_lists_the_zoo_with_published_counts(capsys):
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert {"lenet", "alexnet", "vgg16", "inception_v3", "resnet101", "rnntc", "rnnlm",
            "nmt"} <= set(rows)
    assert rows["alexnet"]["parameters"] == 61_100_840
    assert rows["vgg16"]["parameters"] == 138_357_544


def test_machines_lists_presets_and_local(capsys):
    assert main(["machines", "--json"]) == 0
    specs = {r["spec"] for r in json.loads(capsys.readouterr().out)["machines"]}
    assert {"p100:NODESxGPUS", "k80:NODESxGPUS", "dgx1", "h100:NODESxGPUS", "local"} <= specs


def test_simulate_json_and_files(tmp_path, capsys):
    trace, graph = tmp_path / "sim.json", tmp_path / "tg.json"
    assert main(["simulate", "lenet", "--machine", "p100:1x4", "--strategy", "data",
                 "--json", "--trace", str(trace), "--taskgraph", str(graph)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["iteration_time_s"] > 0 and out["bytes_moved"] > 0
    assert len(out["per_device_busy_s"]) == 4
    tg = json.loads(graph.read_text())
    kinds = {t["kind"] for t in tg["tasks"]}
    assert {"compute", "collective", "update"} <= kinds  # collective sync, the default
    ids = {t["id"] for t in tg["tasks"]}
    assert all(a in ids and b in ids for a, b in tg["deps"])
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(tg["tasks"])


def test_simulate_unknown_model_or_strategy_names_it(capsys):
    assert main(["simulate", "lenet5", "--machine", "p100:1x2"]) == 2
    assert "unknown model 'lenet5'" in capsys.readouterr().err
    assert main(["simulate", "lenet", "--machine", "p100:1x2", "--strategy", "fast"]) == 2
    assert "strategy 'fast'" in capsys.readouterr().err


def test_python_dash_m_legionpy_runs_the_command():
    """`python -m legionpy` (a checkout on PYTHONPATH, no console script)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "legionpy", "machines", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert any(m["spec"] == "h100:NODESxGPUS" for m in json.loads(r.stdout)["machines"])
