"""Invariant 3 under mpirun (the MPI half of tests/runtime/test_mirror.py):
the records every rank traces for one steady-state iteration, merged on rank
0, equal the optimizer's task graph of ``Machine.local()`` (2 ranks, one
device each; copies between ranks included). One mpirun runs every case."""

import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


def test_trace_on_two_ranks_equals_taskgraph(tmp_path):
    out = run_mpi(2, ["tests/mpi/programs/mirror.py"], timeout=90,
                  env={"LEGIONPY_CACHE": str(tmp_path), "LEGIONPY_MPI_TIMEOUT": "20"})
    assert "DIFF" not in out.stdout, out.stdout
    assert "16 of 16 cases equal" in out.stdout, out.stdout + out.stderr[-3000:]
    for model in ("mlp", "cnn", "branchy", "rnn"):
        for strategy in ("data", "model", "hybrid", "random"):
            assert f"OK mirror {model}:{strategy} on 2 ranks" in out.stdout
