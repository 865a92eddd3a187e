"""Replay order: fixed (simulated or recorded) vs readiness, measured.

A replayed step (runtime/tracing.py) runs every device's and link's ops in
one fixed order: the optimizer's simulated schedule (what ``fit`` passes),
or the order the recording's own run took; ``LEGIONPY_REPLAY_ORDER=ready``
instead runs each queue in order of readiness, as untraced launches do.
For zoo models at their small defaults on 2 CPU devices, under data and
model parallelism, this prints the best step time of each (ms) and the
ratios to readiness order.

    python bench/replay_order.py [--models lenet,alexnet,rnnlm] [--steps 8]
"""

from __future__ import annotations

import argparse
import os
import time

import legionpy as lp
from legionpy import data as D
from legionpy import models


def step_ms(name: str, strategy: str, order: str, steps: int) -> float:
    os.environ["LEGIONPY_REPLAY_ORDER"] = "ready" if order == "ready" else "fixed"
    lp.init(cpus=2)
    try:
        m = models.build(name, scale="small", seed=0)
        xs, y = D.for_model(m, m.batch_size, seed=0)
        m.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9), strategy=strategy)
        if order == "recorded":
            m._ex.machine = None  # no simulated schedule: the recorded run's order
        best = float("inf")
        for i in range(steps + 2):
            t0 = time.perf_counter()
            m.fit(xs, y, verbose=0, shuffle=False)
            lp.fence()
            if i >= 2:
                best = min(best, time.perf_counter() - t0)
        return best * 1e3
    finally:
        lp.runtime.shutdown()
        os.environ.pop("LEGIONPY_REPLAY_ORDER", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet,alexnet,rnnlm")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    print("replayed step on 2 devices, best of", a.steps, "(ms; ratio to readiness order)")
    print(f"  {'model':8s} {'strategy':8s} {'simulated':>10s} {'recorded':>10s} {'ready':>8s}")
    for name in a.models.split(","):
        for strategy in ("data", "model"):
            t = {o: step_ms(name, strategy, o, a.steps) for o in ("simulated", "recorded",
                                                                  "ready")}
            r = t["ready"]
            print(f"  {name:8s} {strategy:8s} {t['simulated']:7.2f} x{t['simulated'] / r:.2f}"
                  f" {t['recorded']:7.2f} x{t['recorded'] / r:.2f} {r:8.2f}")


if __name__ == "__main__":
    main()
