import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


def test_machine_local_describes_the_job(tmp_path):
    out = run_mpi(2, ["tests/mpi/programs/machine_local.py"], timeout=120,
                  env={"LEGIONPY_CACHE": str(tmp_path)})
    assert "OK local machine local:2r2 with 2 links" in out.stdout
