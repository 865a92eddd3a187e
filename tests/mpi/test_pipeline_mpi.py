"""Pipelines under mpirun (issue 25): one device per rank, stages on
different ranks (activations and gradients between stages are MPI
messages), losses and weights equal the unpipelined run on every rank."""

import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_pipelined_training_equals_unpipelined_under_mpirun(n):
    out = run_mpi(n, ["tests/mpi/programs/pipeline.py"], timeout=180,
                  env={"LEGIONPY_CPUS": "1", "LEGIONPY_MPI_TIMEOUT": "60"})
    assert out.stdout.count("OK pipeline training rank") == n, out.stdout + out.stderr
