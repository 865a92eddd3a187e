"""Run a Python program under ``mpirun`` from a test, never hanging CI.

The ``mpirun`` used is the one installed beside this interpreter (the
``mpich`` wheel puts it in the virtual environment's ``bin``), falling back
to the one on PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from legionpy.runtime.mpi import mpirun_path

REPO = Path(__file__).resolve().parents[2]


def run_mpi(n: int, args: list[str], timeout: float = 120, env: dict | None = None,
            check: bool = True, mpi_args: tuple = ()) -> subprocess.CompletedProcess:
    """Run ``mpirun MPI_ARGS -n N python ARGS...``; kill the whole job after
    ``timeout`` seconds and fail the test (instead of hanging)."""
    exe = mpirun_path()
    if exe is None:
        pytest.skip("mpirun not found (install the mpich wheel: pip install mpich)")
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                     "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                     # an Open MPI mpirun refuses root (containers, the lent GPU machines)
                     "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    cmd = [exe, *mpi_args, "-n", str(n), sys.executable, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=str(REPO), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"mpirun -n {n} {' '.join(args)} hung for {timeout}s\n"
                    f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and proc.returncode != 0:
        pytest.fail(f"mpirun -n {n} {' '.join(args)} exited {proc.returncode}\n"
                    f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    return result
