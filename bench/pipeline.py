"""Pipelines (issue 25): the figures of its targets table.

1. `legionpy search gpt3-6.7b --machine h100:8x8 --batch-size 1024 --budget 60`
   and gpt3-13b on h100:16x8: the command's wall time against 1.1 x budget
   + 2 s, whether its pick fits in memory, and the pick's simulated time
   against data parallelism, Megatron (tensor) and the even-cut pipeline
   baseline (each simulated here, after the search).
2. The simulated 1F1B bubble on equal stages against (p - 1) / (m + p - 1).
3. `legionpy train gpt2 --scale small --strategy pipeline --steps 20` on 2
   CPU devices against `--strategy data`: the largest loss difference and
   the printed prediction error.

    python bench/pipeline.py                 # everything (~11 minutes on 2 cores)
    python bench/pipeline.py --skip-13b      # without the 128-GPU search
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def search(model: str, machine: str, budget: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "s.json")
        cmd = [sys.executable, "-m", "legionpy", "search", model, "--machine", machine,
               "--batch-size", "1024", "--budget", str(budget), "--out", out, "--json"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode:
            return {"wall": wall, "error": p.stderr.strip().splitlines()[-1:]}
        rep = json.loads(p.stdout)
        with open(out) as f:
            pick = json.load(f)
    return {"wall": wall, "report": rep, "pick": pick}


def baselines(model: str, machine: str, pick: dict) -> dict:
    from legionpy import models
    from legionpy.optimizer import Machine, Simulator, Strategy

    g = models.graph(model, batch_size=1024).graph
    m = Machine.parse(machine)
    out = {}
    for name, s in (("pick", Strategy.from_dict(pick, g)),
                    ("data", Strategy.data_parallel(g, m)),
                    ("megatron", Strategy.megatron(g, m)),
                    ("even-cut pipeline", Strategy.pipeline(g, m))):
        t0 = time.perf_counter()
        r = Simulator(g, m).run(s)
        out[name] = (r.iteration_time_s, r.feasible, max(r.peak_memory.values()),
                     time.perf_counter() - t0)
    return out


def bubbles() -> list[tuple]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "unit"))
    from test_pipeline import chain, on_stages

    from legionpy.optimizer import Machine, Simulator
    from legionpy.pipeline import bubble_fraction

    rows = []
    for p, m in ((2, 4), (4, 8), (4, 16), (8, 8), (8, 32)):
        g, stages = chain(p)
        r = Simulator(g, Machine.parse(f"p100:1x{p}")).run(on_stages(g, stages, m))
        it = r.iteration_time_s
        got = float(np.mean([1 - b / it for b in r.per_device_busy_s.values()]))
        rows.append((p, m, got, bubble_fraction(p, m)))
    return rows


def train(strategy: str) -> dict:
    cmd = [sys.executable, "-m", "legionpy", "train", "gpt2", "--scale", "small", "--strategy",
           strategy, "--steps", "20", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-13b", action="store_true")
    ap.add_argument("--budget", type=float, default=60.0)
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    cases = [("gpt3-6.7b", "h100:8x8")] + ([] if a.skip_13b else [("gpt3-13b", "h100:16x8")])
    for model, machine in cases:
        r = search(model, machine, a.budget)
        target = 1.1 * a.budget + 2
        print(f"legionpy search {model} --machine {machine} --batch-size 1024 --budget "
              f"{a.budget:g}: {r['wall']:.1f} s (target <= {target:.0f} s: "
              f"{'met' if r['wall'] <= target else 'MISSED'})")
        if "error" in r:
            print("  failed:", r["error"])
            continue
        pipe = r["pick"].get("pipeline")
        if pipe:
            print(f"  pick: {len(pipe['stages'])} stages of {len(pipe['devices'][0])} GPUs, "
                  f"{pipe['microbatches']} micro-batches, {pipe['schedule']}, recompute "
                  f"{len(pipe['recompute'])} stages")
        for name, (t, ok, peak, sim_s) in baselines(model, machine, r["pick"]).items():
            print(f"  {name:<18} {t * 1e3:>12.1f} ms  {'fits' if ok else 'OUT OF MEMORY':<13} "
                  f"peak {peak / 1e9:7.1f} GB  (simulated in {sim_s:.1f} s)")
    print("\nsimulated 1F1B bubble on equal stages (idle share of each device)")
    for p, m, got, want in bubbles():
        print(f"  p={p:<2} m={m:<3} simulated {got:.3f}  (p-1)/(m+p-1) {want:.3f}  "
              f"diff {abs(got - want):.3f}")
    print("\nlegionpy train gpt2 --scale small --steps 20 on 2 CPU devices")
    d, p = train("data"), train("pipeline")
    diff = max(abs(x - y) for x, y in zip(d["losses"], p["losses"]))
    print(f"  largest loss difference pipeline vs data: {diff:.2e}")
    for name, r in (("data", d), ("pipeline", p)):
        pred = r.get("loaded_iteration_s") or r.get("simulated_iteration_s")
        meas = r["measured_iteration_s"]
        print(f"  {name:<9} measured {meas * 1e3:.2f} ms per step, predicted "
              f"{pred * 1e3:.2f} ms (error {r['prediction_error']:.0%}; on an idle machine "
              f"{r['simulated_iteration_s'] * 1e3:.2f} ms, background {r['background_cores']:.1f}"
              " cores)")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
