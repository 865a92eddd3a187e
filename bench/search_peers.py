"""legionpy's search on PaSE's benchmark graphs, side by side with the DP
peer (PaSE, Cai et al., IPDPS'21; figures in ../shared/REFERENCE.md and
issue 18).

For each graph and device count: ``run_all`` under a wall-clock budget
(search time, whether a method stopped on the budget), the best strategy's
simulated iteration time and its speedup over data parallelism (the
baseline, simulated in the same run by the same simulator). For RNNLM the
strategy PaSE finds -- each LSTM layer on its own half of the GPUs, the
batch split 8 ways, the rest data parallel -- is built here and simulated
by the same simulator, so the two searches are compared on one cost.

    python bench/search_peers.py                        # 8 and 16 GPUs, budget 10 s
    python bench/search_peers.py --devices 8,16,64 --budget 30
    python bench/search_peers.py --models rnnlm --steps 256
"""

from __future__ import annotations

import argparse
import time

from legionpy import models
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy
from legionpy.optimizer.search import run_all

#: PaSE's search times (seconds, Xeon) from REFERENCE.md, by (model, devices)
PASE_SEARCH_S = {("inception_v3", 8): 6.6, ("inception_v3", 16): 12.7,
                 ("inception_v3", 64): 92.0, ("resnet101", 8): 33.0, ("resnet101", 16): 67.0,
                 ("alexnet", 8): 0.5, ("alexnet", 16): 0.5, ("alexnet", 64): 0.5,
                 ("rnnlm", 16): 0.65}

SIZES = {"rnnlm": dict(batch_size=128, vocab=100000, hidden=2048, layers=2),
         "transformer": dict(batch_size=64), "alexnet": dict(batch_size=256),
         "inception_v3": dict(batch_size=64), "resnet101": dict(batch_size=64)}


def pase_rnnlm(graph, machine) -> Strategy:
    """PaSE's RNNLM strategy: layer l's cells on block l of D/2 devices, batch
    split D/2 ways there; every other op data parallel."""
    s = dict(Strategy.data_parallel(graph, machine))
    half = machine.num_devices // 2
    for op in graph.ops:
        if op.kind == "lstm":
            layer = int(op.name.split(".")[0][len("lstm"):])
            start = (layer % 2) * half
            s[op.name] = ParallelConfig.along(len(op.output_shape), 0, half,
                                              range(start, start + half))
    return Strategy(s, graph.name, machine.name)


def machine_for(n: int) -> Machine:
    return Machine.parse(f"p100:{max(1, n // 4)}x{min(4, n)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="alexnet,inception_v3,resnet101,rnnlm,transformer")
    ap.add_argument("--devices", default="8,16")
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=40, help="RNNLM unrolled steps")
    a = ap.parse_args()
    rows = []
    for n in [int(x) for x in a.devices.split(",")]:
        m = machine_for(n)
        for name in a.models.split(","):
            kw = dict(SIZES.get(name, {}))
            if name == "rnnlm":
                kw["steps"] = a.steps
            g = models.graph(name, **kw).graph
            t = time.perf_counter()
            rep = run_all(g, m, budget_s=a.budget, seed=0)
            wall = time.perf_counter() - t
            print(rep.table(), flush=True)
            best = rep.rows[rep.best]
            b = rep.details["budget"]
            peer = ""
            if name == "rnnlm":
                pt = Simulator(g, m).simulate(pase_rnnlm(g, m))
                peer = f"PaSE strategy {pt * 1e3:.1f} ms"
                print(f"  PaSE's RNNLM strategy simulated: {pt * 1e3:.1f} ms; legionpy "
                      f"best {best['iteration_time_s'] * 1e3:.1f} ms "
                      f"({pt / best['iteration_time_s']:.2f}x)\n", flush=True)
            rows.append((name, n, b["search_s"], b["scoring_s"], wall, rep.best,
                         best["iteration_time_s"], best["speedup_vs_data"],
                         PASE_SEARCH_S.get((name, n)), peer))
    print(f"{'model':<13} {'GPUs':>4} {'search s':>8} {'scoring s':>9} {'best':<12} "
          f"{'iter ms':>9} {'vs data':>7} {'PaSE search s':>13}  peer strategy")
    for name, n, ss, sc, _, bn, it, sp, ps, peer in rows:
        pss = f"{ps:g}" if ps is not None else "-"
        print(f"{name:<13} {n:>4} {ss:>8.1f} {sc:>9.1f} {bn:<12} {it * 1e3:>9.1f} "
              f"{sp:>6.2f}x {pss:>13}  {peer}")


if __name__ == "__main__":
    main()
