"""Failure cases, one per run: ``failures.py raise|kill|mismatch|hang|gather``.

raise: a task on rank 1 raises; every rank must print the same message and
the job must end (MPI_Abort). kill: rank 1 SIGKILLs itself while rank 0
waits for its result. mismatch: rank 1 launches another task; the fence
raises RankMismatchError. hang: rank 0 launches a task that needs data from
rank 1 that rank 1 never launches; the receive times out
(LEGIONPY_MPI_TIMEOUT) instead of hanging. gather: rank 0 gathers a
FutureMap that rank 1 never gathers; the wait times out and names the call."""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import legionpy as lp

mode = sys.argv[1]
rank = MPI.COMM_WORLD.rank
n = len(lp.runtime().devices)


@lp.task
def boom(k):
    if MPI.COMM_WORLD.rank == 1:
        raise ValueError(f"boom at {k}")
    return k


@lp.task
def slow(k):
    if MPI.COMM_WORLD.rank == 1 and k == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    return k


@lp.task(privileges=[lp.WD("x")])
def fill_tile(r):
    r.x[...] = 1


@lp.task(privileges=[lp.R("x")])
def total(r):
    return float(r.x.sum())


@lp.task
def other(k):
    return k


t0 = time.time()
if mode == "raise":
    fm = lp.index_launch(boom, range(n), 5)
    print(f"rank {rank} got", fm.get(), flush=True)
    lp.fence()
elif mode == "kill":
    fm = lp.index_launch(slow, range(n), "die")
    print(f"rank {rank} got", fm.get(), flush=True)
elif mode == "mismatch":
    lp.index_launch(other if rank == 1 else boom, range(n), 0)
    lp.index_launch(other, range(n), 1)
    lp.fence()
elif mode == "hang":
    R = lp.Region((4 * n, 4), {"x": np.float64}, name="R")
    P = lp.Partition.equal(R, (n, 1))
    lp.index_launch(fill_tile, P.colors, P)
    if rank == 0:
        print("rank 0 total", total(R).get(), flush=True)  # needs rank 1's tile
    lp.fence()
elif mode == "gather":  # FutureMap.gather is a collective: rank 1 does not call it
    fm = lp.index_launch(other, range(n), 2)
    if rank == 0:
        print("rank 0 gathered", fm.gather(), flush=True)
    else:
        # rank 1's fence would time out as rank 0's gather does, and either
        # could report first (CI saw the fence's): rank 1 gets there later
        time.sleep(1.0)
    lp.fence()
print(f"rank {rank} finished {mode} after {time.time() - t0:.1f} s", flush=True)
