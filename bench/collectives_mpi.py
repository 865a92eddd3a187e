"""AlexNet data-parallel training step under mpirun: collective gradient
sync vs update shards (issue 24, README "Many processes / collectives").

Run: ``mpirun -n 2 python bench/collectives_mpi.py`` (and ``-n 4``). Each
rank has ``LEGIONPY_CPUS`` devices (default 1); the model is the zoo's
AlexNet at ``--width`` of its channels and ``--hidden`` dense units (the
dense layers hold most parameters, so ``--hidden`` sets the bytes each step
synchronises), batch ``--batch`` (split over every device). For each sync
mode, one ``fit`` of ``--steps`` steps after two warm-up steps (the first
records the step's trace, the second replays it); timed is the median of
``--steps`` single-step ``fit`` calls, each followed by a fence (wall clock);
the modes alternate ``--repeat`` times and each keeps its best median.
Prints ms per step for ``shards`` and ``collective``, their ratio, the
parameter bytes, and the machine load (``os.getloadavg``) at the start and
end: on a shared 2-core machine the ranks' compute competes with everything
else, so state it with the figures.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import legionpy as lp
from legionpy import models

comm = MPI.COMM_WORLD


def step_times(sync: str, args: argparse.Namespace) -> tuple[list[float], int]:
    lp.init()
    try:
        m = models.alexnet(batch_size=args.batch, image_size=args.image, width=args.width,
                           hidden=args.hidden, num_classes=10)
        m.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9), strategy="data", sync=sync)
        n = (args.steps + 2) * args.batch
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, 3, args.image, args.image)).astype(np.float32)
        y = rng.integers(0, 10, n)
        w = 2 * args.batch
        m.fit(x[:w], y[:w], epochs=1, verbose=0, shuffle=False)  # records, then replays
        lp.fence()
        times = []
        for s in range(args.steps):
            lo = w + s * args.batch
            comm.Barrier()
            t0 = time.perf_counter()
            m.fit(x[lo:lo + args.batch], y[lo:lo + args.batch], epochs=1, verbose=0,
                  shuffle=False)
            lp.fence()
            times.append(time.perf_counter() - t0)
        nbytes = sum(p.size * 4 for p in m.graph.parameters().values())
        args.devices = len(lp.runtime.get_runtime().devices)
        return times, nbytes
    finally:
        lp.runtime.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=67)
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2,
                    help="alternate the two modes this many times; keep each one's best median")
    args = ap.parse_args()
    load0 = os.getloadavg()
    res: dict[str, float] = {}
    for _ in range(args.repeat):
        for sync in ("shards", "collective"):
            t, nbytes = step_times(sync, args)
            res[sync] = min(res.get(sync, np.inf), float(np.median(t)))
    if comm.rank == 0:
        print(f"AlexNet data parallel, {comm.size} ranks, {args.devices} devices, "
              f"batch {args.batch}, "
              f"{nbytes / 2**20:.1f} MiB of parameters, best of {args.repeat} medians of "
              f"{args.steps} steps")
        for sync, t in res.items():
            print(f"  sync={sync:<10} {t * 1e3:9.1f} ms/step")
        print(f"  ratio collective/shards: {res['collective'] / res['shards']:.2f}")
        load1 = os.getloadavg()
        print(f"  machine load (1-min average) at start {load0[0]:.1f}, at end {load1[0]:.1f}, "
              f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
