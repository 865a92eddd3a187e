"""Batch norm running statistics and inference mode across MPI ranks."""

from __future__ import annotations

import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_running_statistics_and_predict_agree_on_every_rank(n):
    env = {"LEGIONPY_MPI_TIMEOUT": "20"}
    out = run_mpi(n, ["tests/mpi/programs/inference.py"], timeout=120, env=env)
    assert out.stdout.count("OK inference rank") == n, out.stdout + out.stderr
