"""``fit`` under mpirun: its steps' results exchanged every step against
once every ``MPI_RESULTS_EVERY`` steps (issue 26; README "Many processes:
`mpirun`").

Run: ``mpirun -n 2 python bench/mpi_results.py`` (and ``-n 4``). For each
``--models`` entry (``MODEL:STRATEGY``, the zoo's small shapes, the model's
default optimizer, as ``legionpy train`` builds it), one compiled model
trains ``--steps`` steps per ``fit`` call with the exchange made every step
(``legionpy.nn.execution.MPI_RESULTS_EVERY = 1``, the code before) and
every 16 steps (the default), alternating ``--repeat`` times after a
warm-up ``fit``. A fit's step time is the median spacing of
``History.step_finished`` over its last two thirds (when each step
finished on the rank; max over ranks); each setting keeps its median over
the repeats (the fits continue training one model; that the batched
results equal the per-step ones is tests/mpi's
``test_fit_exchanges_its_results_in_batches_with_the_same_values``).
Prints ms per step for both, their ratio, and the load average at the start
and end: on a shared 2-core machine state it with the figures.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from mpi4py import MPI

import legionpy as lp
from legionpy import data as D
from legionpy import models
from legionpy.models.training import default_optimizer, start_runtime
from legionpy.nn import execution


def step_ms(hist: lp.nn.model.History) -> float:
    """Median spacing of the fit's step stamps over its last two thirds,
    the slowest rank's."""
    t = [s for s, _ in hist.step_finished]
    t = t[len(t) // 3:]
    mine = float(np.median(np.diff(t))) * 1e3 if len(t) > 1 else float("nan")
    return max(MPI.COMM_WORLD.allgather(mine))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet:data,rnnlm:data,alexnet:single,rnntc:owt")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rt = start_runtime(None)
    rank = MPI.COMM_WORLD.Get_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"mpi_results: {MPI.COMM_WORLD.Get_size()} ranks, {len(rt.devices)} devices, "
        f"load {os.getloadavg()[0]:.2f}; per-step exchange vs every "
        f"{execution.MPI_RESULTS_EVERY} steps")
    default = execution.MPI_RESULTS_EVERY
    say(f"{'model':10} {'strategy':9} {'every step ms':>14} {'batched ms':>11} {'ratio':>6}")
    for spec in args.models.split(","):
        name, strategy = spec.split(":")
        m = models.build(name, scale="small")
        m.compile(optimizer=default_optimizer(name), loss="sparse_categorical_crossentropy",
                  strategy=strategy)
        b = m.batch_size
        xs, y = D.for_model(m, args.steps * b, seed=0)
        m.fit([x[:4 * b] for x in xs], y[:4 * b], verbose=0, shuffle=False)  # record, replay
        got: dict[int, list] = {1: [], default: []}
        for _ in range(args.repeat):
            for every in (1, default):
                execution.MPI_RESULTS_EVERY = every
                h = m.fit(xs, y, verbose=0, shuffle=False)
                got[every].append(step_ms(h))
        execution.MPI_RESULTS_EVERY = default
        a, z = float(np.median(got[1])), float(np.median(got[default]))
        say(f"{name:10} {strategy:9} {a:14.2f} {z:11.2f} {z / a:6.2f}")
    lp.fence()
    say(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
