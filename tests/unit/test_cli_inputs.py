"""Every subcommand rejects bad inputs where they enter: one line on stderr
that names the argument and says what to pass, exit status 2, no traceback,
and nothing written (issue 15 item 1). Runs ``legionpy.cli.main`` in-process."""

from __future__ import annotations

import json

import pytest

from legionpy.cli import main

# (argv, words the one-line message must contain)
BAD = [
    # the 13 command lines of issue 15
    (["train", "lenet", "--steps", "-5"], ["--steps", "-5", ">= 1"]),
    (["train", "lenet", "--size", "hidden=abc"], ["--size", "'abc'", "hidden=128"]),
    (["demo", "--degrees", "abc"], ["--degrees", "'abc'", "3x2"]),
    (["simulate", "alexnet", "--machine", "missing.json"], ["--machine", "missing.json"]),
    (["simulate", "lenet", "--machine", "p100:1x2", "--cost", "measured"],
     ["--cost measured", "CuPy", "--cost analytic"]),
    (["simulate", "lenet", "--machine", "p100:1x2", "--cost", "worker"],
     ["--cost worker", "CuPy", "--cost analytic"]),
    (["search", "lenet", "--out", "no/such/folder/x.json"], ["--out", "does not exist"]),
    (["simulate", "lenet", "--machine", "p100:4x0"], ["p100:4x0", "0 GPUs", "at least 1"]),
    (["simulate", "lenet", "--batch-size", "0"], ["--batch-size", ">= 1", "got 0"]),
    (["search", "lenet", "--budget", "-3"], ["--budget", "> 0", "-3"]),
    (["search", "lenet", "--iterations", "-3"], ["--iterations", ">= 1"]),
    (["train", "nomodel"], ["unknown model", "lenet"]),
    (["simulate", "lenet", "--strategy", "nofile.json"], ["nofile.json"]),
    (["search", "lenet", "--methods", "data,foo"], ["--methods", "foo", "mcmc"]),
    # every other subcommand
    (["demo", "--rows", "0"], ["--rows", ">= 1"]),
    (["demo", "--degrees", "3x0"], ["--degrees", "3x0"]),
    (["machines", "--nodes", "0"], ["--nodes", ">= 1"]),
    (["search", "lenet", "--machine", "tpu:4"], ["--machine", "unknown machine preset 'tpu'"]),
    (["search", "lenet", "--seed", "-1"], ["--seed", ">= 0"]),
    (["search", "lenet", "--budget", "abc"], ["--budget", "not a number"]),
    (["search", "nomodel", "--machine", "p100:1x2"], ["unknown model 'nomodel'"]),
    (["simulate", "lenet", "--machine", "p100:0x2"], ["0 nodes"]),
    (["simulate", "lenet", "--machine", "p100:1x2", "--size", "=3"], ["--size", "KEY"]),
    (["simulate", "lenet", "--machine", "p100:1x2", "--size", "foo=3"], ["foo", "image_size"]),
    (["simulate", "lenet", "--cost", "nofile.json"], ["--cost", "analytic", "profile"]),
    (["simulate", "lenet", "--trace", "no/such/t.json"], ["--trace", "does not exist"]),
    (["simulate", "lenet", "--compare", "--steps", "0"], ["--steps", ">= 1"]),
    (["simulate", "lenet", "--compare", "--warmup", "-1"], ["--warmup", ">= 0"]),
    (["train", "lenet", "--devices", "0"], ["--devices", ">= 1"]),
    (["train", "lenet", "--lr", "-1"], ["--lr", "> 0"]),
    (["train", "lenet", "--batch-size", "x"], ["--batch-size", "not an integer"]),
    (["train", "lenet", "--checkpoint-every", "0"], ["--checkpoint-every", ">= 1"]),
    (["train", "lenet", "--checkpoint", "no/such/ck.npz"], ["--checkpoint", "does not exist"]),
    (["profile", "nomodel"], ["unknown model"]),
    (["profile", "lenet", "--out", "no/such/p.json"], ["--out", "does not exist"]),
    (["profile", "lenet", "--batch-size", "-2"], ["--batch-size", ">= 1"]),
    (["compare-traces", "a.json", "b.json"], ["argument sim", "a.json"]),
    (["models", "--bogus"], ["unrecognized arguments", "--bogus"]),
    (["nosuchcommand"], ["invalid choice", "nosuchcommand"]),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_status_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LEGIONPY_DEBUG", raising=False)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip() and "prop/s" not in ln]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "error" in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_compare_traces_bad_window_and_not_a_trace(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"traceEvents": []}))
    b.write_text("not json")
    assert main(["compare-traces", str(a), str(a), "--window", "5:1"]) == 2
    assert "START_MS < END_MS" in capsys.readouterr().err
    assert main(["compare-traces", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "not a JSON trace" in err and "Traceback" not in err


def test_debug_shows_the_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LEGIONPY_DEBUG", "1")
    assert main(["simulate", "lenet", "--machine", "p100:1x2", "--size", "foo=3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("legionpy simulate:")


def test_unexpected_error_is_one_line_with_a_hint(capsys, monkeypatch):
    from legionpy import cli

    monkeypatch.delenv("LEGIONPY_DEBUG", raising=False)

    def boom(args):
        raise ZeroDivisionError("division by zero")

    cli.build_parser()
    monkeypatch.setitem(cli._COMMANDS, "demo", ("demo", boom))
    assert main(["demo"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ZeroDivisionError" in err and "LEGIONPY_DEBUG=1" in err


def test_machine_parse_rejects_zero_and_missing_files():
    from legionpy.errors import MachineError
    from legionpy.optimizer import Machine

    with pytest.raises(MachineError, match="at least 1"):
        Machine.parse("p100:4x0")
    with pytest.raises(MachineError, match="no machine file 'missing.json'"):
        Machine.parse("missing.json")
