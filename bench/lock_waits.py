"""How long a thread wanting the interpreter lock waits while a tile kernel
runs (issue 26): the figure the local machine model lacks for a copy between
ranks that becomes ready while its rank's worker runs a kernel
(docs/decisions.md, 28 Nov).

For each tile of a strategy (forward and backward, kernels of at least
``--min-us``), the kernel runs in a loop on one thread while this thread
sleeps 0.2-0.6 ms at random and measures how late it wakes; the figure is
that lateness less the same with no kernel running (the baseline, in the
same process), so it is the wait for the lock. The kernel's time per call
is printed beside it::

    python bench/lock_waits.py alexnet --strategy model

Measured on the project's 2-core machine (28 Nov, quiet): alexnet's
convolutions of 0.16-2.2 ms kept a waking thread waiting a mean 6-44 us
(p90 28-121 us), where the model lets a copy wait for the whole kernel when
the calibration fits ``gil_kernel_s`` at 1 s.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import legionpy as lp  # noqa: E402
from legionpy import models as zoo  # noqa: E402
from legionpy.mapper.resolve import resolve_strategy  # noqa: E402
from legionpy.optimizer import Machine  # noqa: E402
from legionpy.optimizer.kernel_timing import required_tiles, tile_runner  # noqa: E402


def lateness(wakes: int) -> list[float]:
    """Seconds each of ``wakes`` random naps (0.2-0.6 ms) overslept."""
    out = []
    for _ in range(wakes):
        nap = random.uniform(2e-4, 6e-4)
        t0 = time.perf_counter()
        time.sleep(nap)
        out.append(time.perf_counter() - t0 - nap)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--strategy", default="model")
    p.add_argument("--wakes", type=int, default=200, help="naps per kernel phase")
    p.add_argument("--min-us", type=float, default=100.0, help="shortest kernel shown")
    args = p.parse_args()
    from threadpoolctl import threadpool_limits

    rt = lp.init()
    machine = Machine.local()
    m = zoo.build(args.model, scale="small", seed=0)
    strategy = resolve_strategy(args.strategy, m.graph, machine)
    dev = rt.devices[0]
    with threadpool_limits(1):
        base = statistics.median(lateness(args.wakes))
        print(f"{args.model} {args.strategy}: a nap oversleeps {base * 1e6:.0f} us with no "
              "kernel running (subtracted below)")
        for op, rect in required_tiles(m.graph, [strategy]):
            if op.kind == "input":
                continue
            for phase, fn in zip("FB", tile_runner(op, rect, dev)):
                t0 = time.perf_counter()
                fn()
                fn()
                kernel = (time.perf_counter() - t0) / 2
                if kernel * 1e6 < args.min_us:
                    continue
                stop = threading.Event()

                def loop(fn=fn, stop=stop) -> None:
                    while not stop.is_set():
                        fn()

                th = threading.Thread(target=loop, daemon=True)
                th.start()
                time.sleep(0.002)
                waits = sorted(x - base for x in lateness(args.wakes))
                stop.set()
                th.join()
                print(f"{op.name:<10} {phase} kernel {kernel * 1e6:7.0f} us   wait for the lock: "
                      f"mean {statistics.mean(waits) * 1e6:5.0f} us, p90 "
                      f"{waits[int(0.9 * len(waits))] * 1e6:5.0f} us "
                      f"(mean / kernel {statistics.mean(waits) / kernel:.2f})", flush=True)
    lp.runtime.shutdown()


if __name__ == "__main__":
    main()
