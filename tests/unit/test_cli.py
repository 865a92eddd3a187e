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
