"""The host-speed probe and the retaking of measurements taken while the host
ran Python slowly (legionpy/probe/hostspeed.py)."""

from __future__ import annotations

import pytest

from legionpy.probe.hostspeed import (
    QUIET_SLOWDOWN,
    median_probe,
    quiet_reference,
    retake,
    slowdown,
    speed_probe,
)


def _fits(probes: list[float]):
    """A ``measure`` whose k-th call returns the k-th probe (and its index)."""
    calls = []

    def measure(k: int) -> dict:
        assert k == len(calls)  # the attempt's index
        calls.append(k)
        return {"measured_host_probe_s": probes[k], "k": k}
    return measure, calls


def test_speed_probe_is_positive_and_grows_with_the_work() -> None:
    small = min(speed_probe(100) for _ in range(20))
    large = min(speed_probe(10_000) for _ in range(20))
    assert 0 < small < large


def test_quiet_reference_is_the_lower_quartile() -> None:
    assert quiet_reference([]) is None
    assert quiet_reference([None, None]) is None
    assert quiet_reference([3.0]) == 3.0
    assert quiet_reference([4.0, 1.0, 2.0, 3.0, 9.0]) == 2.0
    assert quiet_reference(iter([2.0, 1.0])) == 1.0


def test_slowdown() -> None:
    assert slowdown(2.0, 1.0) == 2.0
    assert slowdown(None, 1.0) is None and slowdown(1.0, None) is None


def test_quiet_fits_are_not_taken_again() -> None:
    measure, calls = _fits([1.0, 1.05, 1.1])
    runs, again = retake(measure, 1.0, 3)
    assert again == 0 and len(calls) == 3
    assert [r["k"] for r in runs] == [0, 1, 2]


def test_a_slow_fit_is_taken_again_and_the_quietest_kept_in_order() -> None:
    measure, calls = _fits([1.0, 2.0, 1.1, 1.05])
    runs, again = retake(measure, 1.0, 3)
    assert again == 1 and len(calls) == 4
    assert [r["k"] for r in runs] == [0, 2, 3]  # the slow one dropped, order kept


def test_at_most_extra_fits_when_the_host_stays_busy() -> None:
    measure, calls = _fits([2.0] * 10)
    runs, again = retake(measure, 1.0, 2, extra=2)
    assert again == 2 and len(calls) == 4 and len(runs) == 2


def test_without_a_reference_the_quietest_fit_so_far_is_one() -> None:
    measure, calls = _fits([2.0, 1.0, 1.1])
    runs, again = retake(measure, None, 2)
    # after two fits the reference is 1.0: the first (x2) is slow, so one more
    assert again == 1 and [r["k"] for r in runs] == [1, 2]


def test_fits_without_a_probe_count_as_quiet() -> None:
    calls = []

    def measure(k: int) -> dict:
        calls.append(k)
        return {"measured_host_probe_s": None}
    runs, again = retake(measure, 1.0, 2)
    assert again == 0 and len(runs) == 2
    assert median_probe(runs) is None


def test_median_probe() -> None:
    assert median_probe([{"measured_host_probe_s": v} for v in (3.0, 1.0, 2.0)]) == 2.0


@pytest.mark.parametrize("slow", [QUIET_SLOWDOWN * 0.99, QUIET_SLOWDOWN * 1.01])
def test_the_limit(slow: float) -> None:
    measure, calls = _fits([slow, 1.0, 1.0])
    _, again = retake(measure, 1.0, 1)
    assert again == (0 if slow <= QUIET_SLOWDOWN else 1)


def test_a_spent_budget_takes_no_more_fits() -> None:
    measure, calls = _fits([2.0] * 5)
    runs, again = retake(measure, 1.0, 1, budget_s=0.0)
    assert again == 0 and len(calls) == 1


def test_the_budget_is_rank_0_s(monkeypatch) -> None:
    """Under MPI each rank's clock differs; the measurements are collective,
    so rank 0's verdict on the budget is every rank's (bcast_root)."""
    from legionpy.probe import hostspeed

    verdicts = []
    monkeypatch.setattr(hostspeed, "bcast_root", lambda v: verdicts.append(v) or True)
    measure, calls = _fits([2.0] * 5)
    _, again = retake(measure, 1.0, 1, budget_s=3600.0)  # not spent here, spent on rank 0
    assert verdicts == [False] and again == 0 and len(calls) == 1
