"""Control replication under mpirun (2 and 4 ranks, oversubscribed is fine).

Each test runs one program under ``mpirun`` (start-up ~1 s, so programs
batch several checks); ``run_mpi`` fails the test instead of hanging.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from .mpirun import REPO, run_mpi

pytestmark = pytest.mark.mpi
FAST = {"LEGIONPY_MPI_TIMEOUT": "5", "LEGIONPY_MPI_GRACE": "1"}


@pytest.mark.parametrize("n,examples", [(2, 25), (4, 12)])
def test_sequential_semantics_on_ranks(n, examples):
    out = run_mpi(n, ["tests/mpi/programs/sequential.py", str(examples)], timeout=150,
                  env={"LEGIONPY_MPI_TIMEOUT": "20"})
    assert out.stdout.count(f"programs on {n} ranks") == n, out.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_reductions_reads_futures_calibration(n, tmp_path):
    out = run_mpi(n, ["tests/mpi/programs/features.py"], timeout=90,
                  env={**FAST, "LEGIONPY_CACHE": str(tmp_path)})
    assert out.stdout.count("OK features rank") == n, out.stdout
    assert len(list(tmp_path.glob("machine-*.json"))) == 1


def test_a_model_fitted_again_after_many_others(tmp_path):
    """Ten models fitted model-parallel, then each again. The ninth's
    replay hung (4 runs of 5, 28 Nov): the copy of its input waited for
    nothing inside the trace, so rank 1 started the next replay's receive
    before this replay's last one, while rank 0 sent in the other order
    (tracing.py: such ops now wait for the begin marker; the one-process
    check is test_tracing.py::test_a_replay_starts_after_everything_before_it)."""
    out = run_mpi(2, ["tests/mpi/programs/revisit.py"], timeout=90, check=False,
                  env={**FAST, "LEGIONPY_CACHE": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.count("OK revisit rank") == 2, out.stderr[-2000:]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("example", ["hello_tasks.py", "partitions.py"])
def test_examples_same_output(example, n):
    env = dict(os.environ, LEGIONPY_CPUS=str(n), PYTHONPATH=str(REPO))
    one = subprocess.run([sys.executable, f"examples/{example}"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    # buffered stdout: each rank writes whole lines
    out = run_mpi(n, [f"examples/{example}"], timeout=60, env={"PYTHONUNBUFFERED": ""})
    want = sorted(one.stdout.splitlines() * n)
    assert sorted(out.stdout.splitlines()) == want


def _fails(mode, n=2, env=None, limit=30):
    t0 = time.monotonic()
    out = run_mpi(n, ["tests/mpi/programs/failures.py", mode], timeout=limit,
                  env={**FAST, **(env or {})}, check=False)
    assert out.returncode != 0, out.stdout + out.stderr
    return out, time.monotonic() - t0


def test_task_failure_stops_every_rank_with_the_same_message():
    out, _ = _fails("raise")
    msg = "compute 'boom' (op 1 point (1,) rank 1) raised ValueError: boom at 5"
    for r in range(2):
        assert f"[legionpy rank {r}] error: {msg}" in out.stderr, out.stderr
    assert "got" not in out.stdout


def test_killed_rank_ends_the_job():
    out, took = _fails("kill")
    assert "finished" not in out.stdout


def test_mismatched_programs_are_reported_at_the_fence():
    out, _ = _fails("mismatch")
    # each rank's one-line report (one write each: the ranks' tracebacks, written
    # piecewise, can interleave in the shared stderr pipe)
    for r in range(2):
        assert (f"[legionpy rank {r}] error: uncaught RankMismatchError on rank {r}: MPI ranks "
                "ran different programs: launch #0") in out.stderr, out.stderr
    assert "index boom" in out.stderr and "index other" in out.stderr


def test_mismatch_before_a_fence_times_out_instead_of_hanging():
    out, _ = _fails("hang", env={"LEGIONPY_MPI_TIMEOUT": "2"})
    assert "waited 2 s" in out.stderr, out.stderr
    assert "finished" not in out.stdout


def test_a_gather_one_rank_skips_times_out_and_names_the_call():
    out, _ = _fails("gather", env={"LEGIONPY_MPI_TIMEOUT": "2"})
    assert "waited 2 s for the other ranks at FutureMap.gather of 2 points" in out.stderr, \
        out.stderr
    assert "gathered" not in out.stdout


@pytest.mark.parametrize("strategy", ["data", "model"])
def test_tile_sized_instances_on_two_ranks_with_replays(strategy):
    """Instances cover their tiles under mpirun too (issue 16 item 1), with
    traced replays (persistent requests bound to tile-sized instances slice
    them from the instance origin, not the root origin)."""
    out = run_mpi(2, ["tests/mpi/programs/tiles.py", strategy], timeout=120,
                  env={"LEGIONPY_MPI_TIMEOUT": "20"})
    assert out.stdout.count("OK tiles rank") == 2, out.stdout + out.stderr


EXIT_PROGRAM = """
import legionpy.runtime as lr
from legionpy.runtime import mpi
lr.init(cpus=1)
cl = mpi.cluster()
assert cl._thread.is_alive()
cl._at_exit()
print(f"watchdog alive after exit handler: {cl._thread.is_alive()}", flush=True)
"""


def test_the_exit_handler_stops_the_watchdog_before_mpi_finalizes():
    """MPI_Finalize, which mpi4py runs after the exit handlers, must not
    find the watchdog thread inside an Iprobe or a reply: the exit handler
    stops it and joins it."""
    out = run_mpi(2, ["-c", EXIT_PROGRAM], timeout=60)
    assert out.stdout.count("watchdog alive after exit handler: False") == 2, out.stdout


def test_fit_exchanges_its_results_in_batches_with_the_same_values(tmp_path):
    """Under mpirun fit gathers the steps' losses and batch norm's batch
    statistics once every MPI_RESULTS_EVERY steps (issue 26: the per-step
    exchange cost lenet data 20% of its step on mpirun -n 2); on_step still
    sees every step in order, with a one-process run's values."""
    import json

    env = dict(os.environ, LEGIONPY_CPUS="2", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               LEGIONPY_CACHE=str(tmp_path))
    one = subprocess.run([sys.executable, "tests/mpi/programs/results.py"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    want = json.loads(one.stdout.strip().splitlines()[-1])
    out = run_mpi(2, ["tests/mpi/programs/results.py"], timeout=120,
                  env={"LEGIONPY_CACHE": str(tmp_path)})
    got = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert sorted(g["rank"] for g in got) == [0, 1]
    for g in got:
        assert 0 < g["exchanges"] <= 7
        for k in ("losses", "mean", "var"):
            np.testing.assert_allclose(g[k], want[k], rtol=1e-5, err_msg=k)
