"""Collectives under mpirun (issue 24, runtime/collectives.py): the MPI
transport's results, strategy invariance of ``sync="collective"`` against
``sync="shards"`` on 2 and 4 ranks, and a rank that dies around a
collective ends the job with an error naming the collective and the rank,
in under 15 s, never a hang."""

import time

import pytest

from .mpirun import run_mpi

pytestmark = pytest.mark.mpi
FAST = {"LEGIONPY_MPI_TIMEOUT": "5", "LEGIONPY_MPI_GRACE": "1"}
PROG = "tests/mpi/programs/collectives.py"


@pytest.mark.parametrize("n,cpus", [(2, 1), (4, 1), (2, 2)])
def test_collective_ops(n, cpus):
    out = run_mpi(n, [PROG, "ops"], timeout=60, env={**FAST, "LEGIONPY_CPUS": str(cpus)})
    assert out.stdout.count("OK collective ops rank") == n, out.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_training_collective_equals_shards(n):
    out = run_mpi(n, [PROG, "train"], timeout=150,
                  env={"LEGIONPY_CPUS": "1", "LEGIONPY_MPI_TIMEOUT": "60"})
    assert out.stdout.count("OK collective training rank") == n, out.stdout


def test_training_over_nccl_on_emulated_gpus():
    """One emulated GPU per rank: the collectives run on NCCL (its
    emulation, runtime/emunccl.py) with the unique id broadcast over MPI,
    and train the same parameters as shards (data, hybrid and random
    strategies, under the race detector: the random strategy's received
    activations raced with a local reader until ghosts carried their
    dependences' events, runtime/streams.py)."""
    out = run_mpi(2, [PROG, "train"], timeout=150,
                  env={"LEGIONPY_GPU_BACKEND": "emulated", "LEGIONPY_GPUS": "1",
                       "LEGIONPY_EMU_VISIBLE": "2", "LEGIONPY_MPI_TIMEOUT": "60"})
    assert out.stdout.count("OK collective training rank") == 2, out.stdout
    assert out.stdout.count("TRANSPORTS rank") == 2
    assert all("['nccl']" in line for line in out.stdout.splitlines()
               if line.startswith("TRANSPORTS")), out.stdout


def test_ranks_sharing_a_gpu_use_mpi():
    """Two ranks on one GPU (the IPC tests' one-GPU setup): NCCL would refuse
    the communicator; every rank sees it and the group takes MPI."""
    out = run_mpi(2, [PROG, "train"], timeout=150,
                  env={"LEGIONPY_GPU_BACKEND": "emulated", "LEGIONPY_GPUS": "1",
                       "LEGIONPY_EMU_VISIBLE": "1", "LEGIONPY_MPI_TIMEOUT": "60"})
    assert out.stdout.count("OK collective training rank") == 2, out.stdout
    assert all("['mpi']" in line for line in out.stdout.splitlines()
               if line.startswith("TRANSPORTS")), out.stdout


def test_gather_keeps_a_result_that_arrives_before_its_ghost_finishes():
    """FutureMap.gather on emulated GPUs: rank 1's ghost of rank 0's point
    waits for a slow local reader; the result rank 0 sends arrives first and
    must survive the ghost's stream marker (it came back None, and fit's
    loss with it, in 1 CI run of 6)."""
    out = run_mpi(2, [PROG, "gather"], timeout=60,
                  env={**FAST, "LEGIONPY_GPU_BACKEND": "emulated", "LEGIONPY_GPUS": "1",
                       "LEGIONPY_EMU_VISIBLE": "1"})
    assert out.stdout.count("OK gather rank") == 2, out.stdout + out.stderr


def test_dead_rank_inside_an_nccl_collective_is_named():
    """The NCCL communicator exists (a first all-reduce ran on it), then
    rank 1 dies: rank 0's NCCL all-reduce never completes; it aborts the
    communicator and names the collective, NCCL and the rank."""
    t0 = time.monotonic()
    out = run_mpi(2, [PROG, "die", "after"], timeout=30, check=False,
                  env={**FAST, "LEGIONPY_GPU_BACKEND": "emulated", "LEGIONPY_GPUS": "1",
                       "LEGIONPY_EMU_VISIBLE": "2", "ROW": "14"},
                  mpi_args=("-disable-auto-cleanup",))
    assert out.returncode != 0, out.stdout + out.stderr
    assert time.monotonic() - t0 < 15
    assert "[legionpy rank 0] error: collective AR(die) (all_reduce over devices [0, 1], " \
        "NCCL)" in out.stderr, out.stderr
    assert "ranks [1]" in out.stderr, out.stderr
    assert "got" not in out.stdout


@pytest.mark.parametrize("when", [[], ["after"]])
def test_dead_rank_in_a_collective_is_named(when):
    """The launcher keeps the survivors alive (``-disable-auto-cleanup``):
    rank 0 waits at most LEGIONPY_MPI_TIMEOUT for rank 1, then names the
    collective and the rank it waited for."""
    t0 = time.monotonic()
    out = run_mpi(2, [PROG, "die", *when], timeout=30, check=False,
                  env={**FAST, "LEGIONPY_CPUS": "1"}, mpi_args=("-disable-auto-cleanup",))
    took = time.monotonic() - t0
    assert out.returncode != 0, out.stdout + out.stderr
    assert took < 15, took
    assert "[legionpy rank 0] error: collective AR(die) (all_reduce over devices [0, 1])" \
        in out.stderr, out.stderr
    assert "ranks [1]" in out.stderr, out.stderr
    assert "got" not in out.stdout


def test_dead_rank_default_launcher_ends_the_job():
    t0 = time.monotonic()
    out = run_mpi(2, [PROG, "die", "after"], timeout=30, check=False,
                  env={**FAST, "LEGIONPY_CPUS": "1"})
    assert out.returncode != 0 and time.monotonic() - t0 < 15
    assert "got" not in out.stdout
