"""Strategy search benchmark (FlexFlow paper 8.2 and Table 4 shape; figures
to compare with are in ../shared/REFERENCE.md).

For each zoo model at full size and each machine: the ``legionpy search``
table (data, model, OWT/expert, partitioner, elimination DP, MCMC:
simulated iteration time, speedup over data parallelism, bytes moved,
search time), then MCMC's proposals per second with delta simulation
against full simulation.

    python bench/search.py                 # all models, p100:1x4 p100:4x4 k80:16x4
    python bench/search.py --quick         # alexnet, vgg16, lenet, rnntc on p100:1x4/4x4
    python bench/search.py --models nmt --machines k80:16x4 --budget 600
"""

from __future__ import annotations

import argparse
import time

from legionpy import models
from legionpy.optimizer import Machine
from legionpy.optimizer.search import run_all, run_mcmc

ALL = ["alexnet", "vgg16", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt", "lenet"]


def delta_vs_full(graph, machine, iters: int) -> tuple[float, float]:
    """Seconds per MCMC proposal with delta and with full simulation."""
    out = []
    for use_delta in (True, False):
        t = time.perf_counter()
        r = run_mcmc(graph, machine, iterations=iters, seed=0, use_delta=use_delta,
                     elimination=False, polish_limit=0)
        out.append((time.perf_counter() - t) / max(1, r.iterations + len(r.initial_costs)))
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None)
    ap.add_argument("--machines", default=None)
    ap.add_argument("--budget", type=float, default=None, help="seconds per search")
    ap.add_argument("--delta-iters", type=int, default=None)
    a = ap.parse_args()
    names = a.models.split(",") if a.models else (
        ["alexnet", "vgg16", "lenet", "rnntc"] if a.quick else ALL)
    specs = a.machines.split(",") if a.machines else (
        ["p100:1x4", "p100:4x4"] if a.quick else ["p100:1x4", "p100:4x4", "k80:16x4"])
    budget = a.budget or (10.0 if a.quick else 60.0)
    diters = a.delta_iters or (10 if a.quick else 30)
    summary = []
    for spec in specs:
        m = Machine.parse(spec)
        for name in names:
            g = models.build(name).graph
            rep = run_all(g, m, budget_s=budget, seed=0)
            print(rep.table(), flush=True)
            d, f = delta_vs_full(g, m, diters)
            print(f"  per proposal: delta {d * 1e3:.1f} ms, full {f * 1e3:.1f} ms "
                  f"({f / d:.1f}x)\n", flush=True)
            r = rep.rows
            summary.append((name, spec, r["mcmc"]["speedup_vs_data"],
                            max(v["speedup_vs_data"] for v in r.values()), rep.best,
                            rep.search_time_s, f / d))
    print(f"{'model':<13} {'machine':<9} {'mcmc/data':>9} {'best/data':>9} {'best':<12} "
          f"{'search s':>8} {'full/delta':>10}")
    for n, s, sp, bsp, best, t, fd in summary:
        print(f"{n:<13} {s:<9} {sp:>8.2f}x {bsp:>8.2f}x {best:<12} {t:>8.1f} {fd:>9.1f}x")


if __name__ == "__main__":
    main()
