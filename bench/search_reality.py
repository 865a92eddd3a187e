"""Does the searched strategy really win, and does ``legionpy train`` predict
it? (issue 13 targets)

For each model (default lenet, alexnet, rnntc, rnnlm at their small
defaults) this trains, exactly as ``legionpy train MODEL --strategy S``
does (:func:`legionpy.models.training.train` with
:func:`legionpy.measure.train_prediction`), under the strategy the search
picks and under data, model, owt and single (every op on the first
device), ``--rounds`` times each, interleaved, and takes each strategy's
median seconds per step. It prints, per model, the measured and predicted
ms per step of every strategy, the prediction error, and the ratios

    speed ratio = best measured of (data, model, owt) / measured of search
    vs all      = best measured of (data, model, owt, single) / measured of search

When the search picks one of the named strategies (``picked`` in
``legionpy train``'s result: its judge kept data, say), the two are one
strategy and their rounds are pooled for both rows, so a ratio never
reports one step measured twice as two.

Targets: ratio >= 0.95 (the search is at most 5% slower than the best
baseline) and the searched strategy's printed prediction (at the background
load measured during the run, as ``legionpy train`` prints it; the
prediction for the machine to itself is shown too) within 20% of the
measurement (steady state: the steps after the first three).

    python bench/search_reality.py                    # 2 CPU devices in one process
    mpirun -n 2 python bench/search_reality.py        # 2 ranks, one device each
    python bench/search_reality.py --models lenet --rounds 3 --steps 30 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = ("lenet", "alexnet", "rnntc", "rnnlm")
BASELINES = ("data", "model", "owt")
#: also run, and in the stricter "vs all" ratio: more devices must beat one
EXTRA = ("single",)


def run_model(name: str, args, root: bool) -> dict:
    from legionpy.measure import train_prediction
    from legionpy.models.training import train

    strategies = ("search",) + BASELINES + EXTRA
    runs: dict[str, list[dict]] = {s: [] for s in strategies}
    for _ in range(args.rounds):
        for s in strategies:
            r = train(name, strategy=s, steps=args.steps, predict=train_prediction)
            runs[s].append(r)
    # a pick that is one of the named strategies is that strategy: its rounds
    # and the named one's are one strategy measured twice as often, and both
    # rows take them all (measured apart, alexnet's data-parallel pick under
    # mpirun -n 2 read 10.22 ms against data's 9.42: the same step, 8% apart)
    picked = runs["search"][-1].get("picked")
    if picked in runs:
        runs["search"] = runs[picked] = runs["search"] + runs[picked]
    rows = {}
    for s, rs in runs.items():
        measured = statistics.median(r["measured_iteration_s"] for r in rs)
        predicted = rs[-1]["simulated_iteration_s"]  # the same on every round (cached model)
        loaded = statistics.median(r["loaded_iteration_s"] for r in rs)
        rows[s] = {"measured_s": measured, "predicted_s": predicted, "loaded_s": loaded,
                   "background_cores": statistics.median(r["background_cores"] or 0 for r in rs),
                   "quiet_prediction_error": abs(predicted - measured) / measured,
                   "prediction_error": abs(loaded - measured) / measured,
                   "rounds_s": [r["measured_iteration_s"] for r in rs]}
    best = min(BASELINES, key=lambda s: rows[s]["measured_s"])
    ratio = rows[best]["measured_s"] / rows["search"]["measured_s"]
    best_all = min(BASELINES + EXTRA, key=lambda s: rows[s]["measured_s"])
    ratio_all = rows[best_all]["measured_s"] / rows["search"]["measured_s"]
    out = {"model": name, "picked": picked, "rows": rows, "best_baseline": best,
           "speed_ratio": ratio,
           "best_of_all": best_all, "speed_ratio_all": ratio_all,
           "search_prediction_error": rows["search"]["prediction_error"],
           "ratio_met": ratio >= 0.95,
           "prediction_met": rows["search"]["prediction_error"] <= 0.20}
    if root:
        cells = "  ".join(f"{s} {rows[s]['measured_s'] * 1e3:6.2f}/"
                          f"{rows[s]['loaded_s'] * 1e3:6.2f}/{rows[s]['predicted_s'] * 1e3:5.2f}"
                          for s in strategies)
        pick = f" (search picked {picked}: one strategy, its rounds pooled)" if picked else ""
        print(f"{name:<8} {cells}  | ratio {ratio:5.2f} vs {best:<5} "
              f"{'ok' if out['ratio_met'] else 'LOW'} ({ratio_all:.2f} vs {best_all}); "
              f"search prediction error "
              f"{out['search_prediction_error'] * 100:5.1f}% "
              f"{'ok' if out['prediction_met'] else 'OFF'} (machine to itself "
              f"{rows['search']['quiet_prediction_error'] * 100:.0f}%, other programs used "
              f"{rows['search']['background_cores']:.1f} cores){pick}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=30, help="steps per training run")
    p.add_argument("--rounds", type=int, default=3, help="runs per strategy (median)")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("LEGIONPY_SEARCH_BUDGET", "5")

    from legionpy.models.training import is_root, start_runtime
    from legionpy.optimizer import Machine

    rt = start_runtime()
    root = is_root()
    machine = Machine.local()
    if root:
        load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  machine {machine.name}, ranks "
              f"{1 + max(d.rank for d in rt.devices)}, load average {load[0]:.2f}; "
              f"{args.steps} steps x {args.rounds} rounds per strategy")
        print("per strategy: measured / predicted at the measured load / predicted for the "
              "machine to itself, ms per step")
    t0 = time.perf_counter()
    from legionpy.measure import judge_searches

    with judge_searches():  # "search" picks as `legionpy train --strategy search` does
        results = [run_model(name, args, root) for name in args.models.split(",")]
    if root:
        ok_r = sum(r["ratio_met"] for r in results)
        ok_p = sum(r["prediction_met"] for r in results)
        print(f"search >= 0.95x best baseline: {ok_r}/{len(results)} models; prediction "
              f"within 20%: {ok_p}/{len(results)}; {time.perf_counter() - t0:.0f} s; load "
              f"average now {os.getloadavg()[0]:.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
