import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_build_identical_partitions(n):
    out = run_mpi(n, ["tests/mpi/programs/replicated_regions.py"], timeout=120)
    assert f"OK {n} ranks agree" in out.stdout
