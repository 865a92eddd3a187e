"""Does `legionpy search` keep its budget? (issue 25, item 6)

Runs the command as a user would (a fresh process, default methods) on the
zoo and on PaSE's benchmark graphs (bench/search_peers.py sizes) from 16 to
1,024 GPUs and prints its wall time against the target, 1.1 x the budget +
2 s (the 2 s: interpreter start, imports, building the graph). Past 256
GPUs the search runs with `--sync collective` (the at-scale path; the
point-to-point update graph does not simulate there in any budget).

    python bench/search_budget.py                  # budget 10 s, 16 and 64 GPUs
    python bench/search_budget.py --budget 20 --scale   # + 1,024 GPUs (budget 60)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

#: (label, model, extra arguments)
ZOO = [("alexnet", "alexnet", []), ("inception_v3", "inception_v3", ["--batch-size", "64"]),
       ("resnet101", "resnet101", ["--batch-size", "64"]), ("rnntc", "rnntc", []),
       ("rnnlm", "rnnlm", []), ("transformer", "transformer", [])]
SCALE = [("resnet101 @1024", "resnet101", ["--batch-size", "2048", "--sync", "collective"]),
         ("transformer @1024", "transformer", ["--batch-size", "1024", "--sync",
                                               "collective"])]


def run(model: str, machine: str, budget: float, extra: list[str]) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "legionpy", "search", model, "--machine", machine,
               "--budget", str(budget), "--out", os.path.join(tmp, "s.json"), *extra]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if p.returncode:
        return wall, "FAILED: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    best = next((ln for ln in p.stdout.splitlines() if ln.startswith("best:")), "")
    return wall, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--machines", default="p100:4x4,p100:16x4")
    ap.add_argument("--scale", action="store_true", help="also h100:128x8 (budget 60 s)")
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    rows = [(label, model, m, a.budget, extra) for m in a.machines.split(",")
            for label, model, extra in ZOO]
    if a.scale:
        rows += [(label, model, "h100:128x8", 60.0, extra) for label, model, extra in SCALE]
    print(f"{'case':<22} {'machine':<11} {'budget':>7} {'wall':>7} {'target':>7} {'ok':>3}  best")
    worst = 0.0
    for label, model, machine, budget, extra in rows:
        wall, best = run(model, machine, budget, extra)
        target = 1.1 * budget + 2
        worst = max(worst, wall / target)
        print(f"{label:<22} {machine:<11} {budget:>6.0f}s {wall:>6.1f}s {target:>6.1f}s "
              f"{'yes' if wall <= target else 'NO':>3}  {best}", flush=True)
    print(f"worst wall / target: {worst:.2f}; load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
