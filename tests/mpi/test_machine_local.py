import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


def test_machine_local_describes_the_job(tmp_path):
    out = run_mpi(2, ["tests/mpi/programs/machine_local.py"], timeout=120,
                  env={"LEGIONPY_CACHE": str(tmp_path)})
    assert "OK local machine local:2r2 with 2 links" in out.stdout


def test_ranks_are_bound_to_their_own_cores(tmp_path):
    out = run_mpi(2, ["tests/mpi/programs/affinity.py"], timeout=120,
                  env={"LEGIONPY_CACHE": str(tmp_path)})
    assert out.stdout.count("OK rank") == 2, out.stdout


def test_legionpy_bind_0_leaves_the_ranks_alone(tmp_path):
    out = run_mpi(2, ["tests/mpi/programs/affinity.py"], timeout=120,
                  env={"LEGIONPY_CACHE": str(tmp_path), "LEGIONPY_BIND": "0"})
    assert out.stdout.count("not bound") == 2, out.stdout
