"""The calibration's second pass (legionpy/measure/calibration.py): rows
whose fits all ran while the host ran Python slowly are measured again
against the whole calibration's quiet figure."""

from __future__ import annotations

import pytest

from legionpy.measure import calibration
from legionpy.measure.calibration import _row_figures, _second_pass


def _fit(period: float, probe: float) -> dict:
    return {"measured_time_s": period, "measured_control_cpu_s": period / 4,
            "measured_host_probe_s": probe, "measured_per_device_busy_s": {"cpu0": period}}


def _row(name: str, fits: list[dict]) -> tuple[dict, tuple, list[int]]:
    """A first-pass row of ``fits[0]`` and, for the second pass, a fresh
    model's measure whose attempt k returns ``fits[k + 1]``."""
    calls: list[int] = []

    def measure(k: int) -> dict:
        calls.append(k)
        return fits[k + 1]
    row = {"model": name, "strategy": "data", "tasks": 4}
    figs = _row_figures(row, fits[:1], 0, None, 0.0, {"tasks": []}, {})
    return figs, (lambda: measure, row, 0.0, {"tasks": []}, {}), calls


def test_a_row_measured_on_a_busy_host_is_measured_again_and_kept_when_quieter():
    quiet, q_later, q_calls = _row("quiet", [_fit(1e-3, 1.0)])
    busy, b_later, b_calls = _row("busy", [_fit(2e-3, 1.5), _fit(1.9e-3, 1.45),
                                           _fit(1.1e-3, 1.0), _fit(1.2e-3, 1.05)])
    rows = [quiet, busy]
    _second_pass(rows, [q_later, b_later], reference=1.0, repeats=2)
    assert q_calls == [] and rows[0] is quiet  # within QUIET_SLOWDOWN: not again
    # a fresh model's attempts (compiled at the first); a slow one is retaken
    assert b_calls == [0, 1, 2]
    assert rows[1]["second_pass"] and rows[1]["host_probe_s"] == pytest.approx(1.025)
    assert rows[1]["period_s"] == pytest.approx(1.15e-3)  # the two quiet fits
    assert rows[1]["retakes"] == 0 + 2 + 1 and rows[1]["model"] == "busy"


def test_a_second_measurement_no_quieter_is_not_kept():
    busy, later, calls = _row("busy", [_fit(2e-3, 1.3), _fit(2.5e-3, 1.6), _fit(2.6e-3, 1.7),
                                       _fit(2.7e-3, 1.8), _fit(2.8e-3, 1.9), _fit(3e-3, 2.0),
                                       _fit(3e-3, 2.1)])
    rows = [busy]
    _second_pass(rows, [later], reference=1.0, repeats=2)
    assert calls == [0, 1, 2, 3, 4, 5]  # 2 fits and SECOND_PASS_EXTRA more, all slow
    assert rows[0] is busy and "second_pass" not in rows[0]


def test_the_second_pass_stops_at_its_budget(monkeypatch):
    monkeypatch.setattr(calibration, "SECOND_PASS_BUDGET_S", -1.0)
    busy, later, calls = _row("busy", [_fit(2e-3, 1.5), _fit(1e-3, 1.0), _fit(1e-3, 1.0)])
    rows = [busy]
    _second_pass(rows, [later], reference=1.0, repeats=2)
    assert calls == [] and rows[0] is busy
