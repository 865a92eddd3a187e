"""Progress bars only for a person at a terminal (issue 15 item 6)."""

from __future__ import annotations

import io

from legionpy import progress
from legionpy.cli import main


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_on_a_terminal_without_json_on_rank_0(monkeypatch):
    monkeypatch.delenv("PMI_RANK", raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not progress.enabled()
    monkeypatch.setattr("sys.stderr", _Tty())
    assert progress.enabled() and not progress.enabled(as_json=True)
    monkeypatch.setenv("PMI_RANK", "1")
    assert not progress.enabled()


def test_simulate_draws_its_stages_on_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv("PMI_RANK", raising=False)
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    assert main(["simulate", "lenet", "--machine", "p100:1x2"]) == 0
    assert "simulate lenet: task graph" in err.getvalue()
    assert "simulate lenet: schedule" in err.getvalue()
    err2 = _Tty()
    monkeypatch.setattr("sys.stderr", err2)
    assert main(["simulate", "lenet", "--machine", "p100:1x2", "--json"]) == 0
    assert err2.getvalue() == ""
