"""CUDA IPC under ``mpirun -n 2`` (one GPU per rank, one node): handles are
opened once per peer instance, not per copy, and all of them are closed at
shutdown. On emulated GPUs in CI; on CuPy where a GPU is visible (skipped
otherwise; it passed on an H100 on 26 Nov 2026, two ranks on one GPU)."""

import ast

import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


def _gpu_visible() -> bool:
    from legionpy.runtime.gpu import visible_gpus

    return visible_gpus() > 0


@pytest.mark.parametrize("backend", ["emulated", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_ipc_handles_opened_once_per_instance_and_closed_at_shutdown(backend, monkeypatch):
    if backend == "cupy":
        pytest.importorskip("cupy")
        monkeypatch.delenv("LEGIONPY_GPU_BACKEND", raising=False)
        if not _gpu_visible():
            pytest.skip("no CUDA device visible")
    out = run_mpi(2, ["tests/mpi/programs/ipc.py"], timeout=120,
                  env={"LEGIONPY_GPU_BACKEND": backend, "LEGIONPY_GPUS": "1"})
    assert "OK ipc" in out.stdout
    line = next(s for s in out.stdout.splitlines() if s.startswith("COUNTS"))
    counts = ast.literal_eval(line.split(" ", 1)[1])
    for exported, opened, closed in counts:
        # 3 halo exchanges each way; each peer instance is made, then grown once
        # to hold its halo (a new allocation, a new handle): at most 2 opens
        assert 1 <= opened <= 2 and closed == opened
        assert 1 <= exported <= 2
