"""The lock shares' control: a tile kernel's twin in another process
(legionpy/optimizer/twinproc.py, used by optimizer/lockshare.py)."""

from __future__ import annotations

import time

import pytest

from legionpy.optimizer import Graph, Machine
from legionpy.optimizer.twinproc import TwinProcess


@pytest.fixture
def twin():
    t = TwinProcess()
    yield t
    t.close()


def _dense_tile():
    g = Graph(16)
    y = g.dense(g.input((64,)), 64)
    return y.op, y.op.output_rect, Machine.local(2).devices[0]


def test_the_twin_runs_the_kernel_for_the_block_and_reports_its_cpu(twin):
    """The helper builds the tile's kernel, runs it while the block lasts
    and stops when the block ends; its CPU seconds in all come back with
    every answer, its start's included (a measurement that took them for
    another program's load threw its lock shares away: lenet's, in CI)."""
    op, rect, dev = _dense_tile()
    started = twin.cpu_s
    assert started > 0  # its imports: counted, so no other program is blamed for them
    with twin.running(op, rect, dev, 0):
        t0 = time.perf_counter()
        time.sleep(0.3)
        wall = time.perf_counter() - t0
    first = twin.cpu_s
    assert first - started >= 0.3 * wall  # a busy loop, not a sleeping process
    time.sleep(0.2)  # stopped: no more CPU after the block
    with twin.running(op, rect, dev, 1):  # the backward, same helper
        time.sleep(0.1)
    assert first < twin.cpu_s < first + 0.1 + 0.2 + 0.15
    twin.close()
    assert twin._proc.poll() is not None


def test_a_kernel_the_twin_cannot_build_raises_and_the_twin_lives_on(twin):
    """A tile the helper cannot run is the caller's error, said plainly; the
    helper takes the next kernel."""
    op, rect, dev = _dense_tile()
    with pytest.raises(RuntimeError, match="twin process could not run the kernel"):
        with twin.running("not an op", rect, dev, 0):
            pass
    with twin.running(op, rect, dev, 0):
        time.sleep(0.05)
    assert twin.cpu_s > 0


def test_the_twin_is_no_rank_of_an_mpi_job(monkeypatch):
    """Started from an ``mpirun`` rank, the helper does not inherit the
    launcher's variables (it would take itself for a rank)."""
    from legionpy.optimizer.twinproc import child_env

    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("HYDRA_CONTROL_FD", "7")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    env = child_env()
    assert not [k for k in env if k.startswith(("PMI_", "HYDRA_", "OMPI_"))]
    assert env["OPENBLAS_NUM_THREADS"] == "1"


def test_the_twins_cpu_is_not_another_programs(monkeypatch):
    """measure_shares keeps shares only when other programs left the cores
    alone; the helper's CPU seconds are the measurement's own."""
    import contextlib

    from legionpy.optimizer import lockshare

    op, rect, dev = _dense_tile()
    clock = iter([(0.0, 0.0, 0.0), (1.0, 2.0, 1.0)])  # 1 s: machine 2 CPU-s, this process 1

    class FakeTwin:
        cpu_s = 0.0

        def running(self, *a):
            FakeTwin.cpu_s += 0.45  # two phases: 0.9 CPU-s of the 1 other busy
            return contextlib.nullcontext()

    monkeypatch.setattr(lockshare, "_LOADED", set())
    monkeypatch.setattr(lockshare, "cpu_clock", lambda: next(clock))
    monkeypatch.setattr(lockshare, "lock_share", lambda fn, twin, apart: (apart(), 0.0)[1])
    table: dict = {}
    assert lockshare.measure_shares(table, lambda *a: (lambda: None, lambda: None),
                                    [(op, rect)], dev, apart=FakeTwin)
    assert list(table.values()) == [[0.0, 0.0]]
    clock = iter([(0.0, 0.0, 0.0), (1.0, 2.0, 1.0)])
    table = {}
    FakeTwin.running = lambda self, *a: contextlib.nullcontext()  # the other core: not its
    assert not lockshare.measure_shares(table, lambda *a: (lambda: None, lambda: None),
                                        [(op, rect)], dev, apart=FakeTwin)


def test_without_a_helper_the_shares_are_measured_and_the_user_told(monkeypatch, capsys):
    """Where the helper process cannot start (or dies), the shares are
    measured beside the thread twin alone, and stderr says what that costs."""
    from legionpy.optimizer import lockshare

    op, rect, dev = _dense_tile()
    monkeypatch.setattr(lockshare, "_LOADED", set())
    monkeypatch.setattr(lockshare, "BUSY_CORES", 2.0)
    seen = []
    monkeypatch.setattr(lockshare, "lock_share",
                        lambda fn, twin, apart=None: (seen.append(apart), 0.25)[1])

    def cannot_start():
        raise OSError("no processes here")

    table: dict = {}
    assert lockshare.measure_shares(table, lambda *a: (lambda: None, lambda: None),
                                    [(op, rect)], dev, apart=cannot_start)
    assert list(table.values()) == [[0.25, 0.25]] and seen == [None, None]
    assert "without their control" in capsys.readouterr().err
