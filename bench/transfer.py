"""Region copy between two ranks against raw mpi4py Send/Recv.

Run: ``mpirun -n 2 python bench/transfer.py [--reps N]``. For 8 B, 1 MiB and
64 MiB: a task on rank 0 writes a tile (WD), a task on rank 1 reads it (R),
so the runtime moves the tile over MPI on the link rank0 -> rank1; timed is
the whole round (two launches, the copy, a fence) per iteration, and raw is
a numpy Send on rank 0 + Recv on rank 1 (buffer protocol) of the same
bytes, plus a barrier. The copy's cost is the round minus the same round
without a copy (both tasks on rank 0). Prints ms, the ratio copy/raw and
the per-copy overhead (copy - raw) in microseconds; then the same rounds
replayed from a trace, whose copy is a persistent MPI request.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import legionpy as lp
from legionpy.mapper import Mapper, TaskOptions

comm = MPI.COMM_WORLD


@lp.task(privileges=[lp.WD("x")])
def produce(r):
    r.x[0] = 1  # touch: the data is whatever is in the instance


@lp.task(privileges=[lp.R("x")])
def consume(r):
    return None


def raw(nbytes: int, reps: int) -> float:
    buf = np.zeros(nbytes, np.uint8)
    comm.Barrier()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, dest=1, tag=5)
        else:
            comm.Recv(buf, source=0, tag=5)
        comm.Barrier()
        best.append(time.perf_counter() - t0)
    return float(np.median(best))


class ByTag(Mapper):
    """Single launches run on device ``tag``."""

    def select_task_options(self, task):
        return TaskOptions(self.devices[task.tag])


ON0, ON1 = lp.LaunchOptions(tag=0), lp.LaunchOptions(tag=1)


def region(nbytes: int, reps: int, copy: bool = True) -> float:
    R = lp.Region((max(nbytes // 8, 1),), {"x": np.float64}, name=f"R{nbytes}")
    rounds = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        produce(R, launch_options=ON0)                  # valid on rank 0's device
        consume(R, launch_options=ON1 if copy else ON0)  # copy rank 0 -> rank 1
        lp.fence()
        rounds.append(time.perf_counter() - t0)
    return float(np.median(rounds[2:]))


def traced(nbytes: int, reps: int, copy: bool = True) -> float:
    """``region`` with the two launches in a replayed trace (the copy a
    persistent MPI request started by the replay)."""
    R = lp.Region((max(nbytes // 8, 1),), {"x": np.float64}, name=f"T{nbytes}")
    rounds = []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        with lp.trace(f"t{nbytes}{copy}"):
            produce(R, launch_options=ON0)
            consume(R, launch_options=ON1 if copy else ON0)
        lp.fence()
        rounds.append(time.perf_counter() - t0)
    return float(np.median(rounds[3:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    assert comm.size == 2, "run with mpirun -n 2"
    lp.runtime().set_mapper(ByTag())
    rows = []
    base = region(8, a.reps, copy=False)  # the same round (2 launches + fence), no copy
    for nbytes in (8, 1 << 20, 64 << 20):
        reps = a.reps if nbytes < (64 << 20) else max(a.reps // 4, 3)
        r = raw(nbytes, reps)
        g = region(nbytes, reps)
        rows.append((nbytes, r, g))
    tbase = traced(8, a.reps, copy=False)
    trows = []
    for nbytes in (8, 1 << 20, 64 << 20):
        reps = a.reps if nbytes < (64 << 20) else max(a.reps // 4, 3)
        trows.append((nbytes, dict((n, r) for n, r, _ in rows)[nbytes], traced(nbytes, reps)))
    if comm.rank == 0:
        print(f"round without a copy (2 launches + fence): {base * 1e3:.3f} ms")
        print(f"{'bytes':>10} {'raw ms':>9} {'round ms':>9} {'copy ms':>8} {'ratio':>6} "
              f"{'overhead us':>12}")
        for nbytes, r, g in rows:
            c = g - base  # the copy's share of the round
            print(f"{nbytes:>10} {r * 1e3:9.3f} {g * 1e3:9.3f} {c * 1e3:8.3f} {c / r:6.2f} "
                  f"{(c - r) * 1e6:12.1f}")
        print(f"replayed trace (persistent requests); round without a copy: "
              f"{tbase * 1e3:.3f} ms  (target: copy <= 1.5x raw at 1 MiB, <= 3x at 8 B)")
        for nbytes, r, g in trows:
            c = g - tbase
            print(f"{nbytes:>10} {r * 1e3:9.3f} {g * 1e3:9.3f} {c * 1e3:8.3f} {c / r:6.2f} "
                  f"{(c - r) * 1e6:12.1f}")


if __name__ == "__main__":
    main()
