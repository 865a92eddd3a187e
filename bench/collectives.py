"""Issue 24's targets: simulation at scale with collective gradient sync.

Each figure is one full simulation (``Simulator.run``: build + schedule)
in a fresh process (so its time includes the one-off geometry and its
memory is the process's peak RSS), data parallelism, analytic cost model:
"today" is ``sync="shards"`` (point-to-point copies to update shards, what
both halves ran before issue 24), "now" ``sync="collective"`` (docs/seam.md,
the default since; node-symmetric strategies simulate one node per class). A "today" run that
exceeds ``--limit`` seconds is stopped and printed as ``> limit``.

    python bench/collectives.py            # every row (minutes: the "today" runs)
    python bench/collectives.py --quick    # "now" only; "today" from issue 24's text

Prints a table (figure, today, now, ratio) and, with ``--json``, the rows.
Say whether the machine was loaded (``uptime``) when you quote it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROWS = [
    # (label, model, machine, batch, today's figure from issue 24 when not run)
    ("ResNet-101 data, h100:128x8 (1,024 GPUs), batch 2048", "resnet101", "h100:128x8", 2048,
     "> 120 s, 9.8 GB"),
    ("ResNet-101 data, h100:1024x8 (8,192 GPUs), batch 16384", "resnet101", "h100:1024x8",
     16384, "-"),
    ("Inception-v3 data, p100:16x4 (64 GPUs), batch 512", "inception_v3", "p100:16x4", 512,
     "17 s"),
    ("Inception-v3 data, h100:8x8 (64 GPUs), batch 512", "inception_v3", "h100:8x8", 512, "-"),
    ("AlexNet data, p100:4x4 (16 GPUs), batch 256", "alexnet", "p100:4x4", 256, "-"),
]

CHILD = r"""
import json, resource, sys, time
import legionpy as lp
from legionpy.optimizer import Machine, Simulator, Strategy
model, spec, batch, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
g = getattr(lp.models, model)(batch_size=batch).graph
m = Machine.parse(spec)
s = Strategy.data_parallel(g, m)
sim = Simulator(g, m, sync=sync)
t = time.perf_counter()
r = sim.run(s)
dt = time.perf_counter() - t
print(json.dumps({"sim_s": dt, "iteration_ms": r.iteration_time_s * 1e3,
                  "tasks": r.num_tasks, "scheduled": int(sim.tg.alive.sum()),
                  "classes": r.classes, "bytes_moved": r.bytes_moved,
                  "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}))
"""


def run(model: str, spec: str, batch: int, sync: str, limit: float) -> dict | None:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, model, spec, str(batch), sync],
                           capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode:
        raise SystemExit(f"{model} {spec} {sync} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(r: dict | None, limit: float) -> str:
    if r is None:
        return f"> {limit:g} s"
    return f"{r['sim_s']:.2f} s, {r['rss_gb']:.2f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the 'today' (shards) runs")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds per 'today' run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} cores")
    rows = []
    for label, model, spec, batch, quoted in ROWS:
        now = run(model, spec, batch, "collective", 600)
        today = None if a.quick else run(model, spec, batch, "shards", a.limit)
        t_today = quoted if a.quick or (today is None and quoted != "-") else fmt(today,
                                                                                 a.limit)
        ratio = (f"{today['sim_s'] / now['sim_s']:.0f}x faster" if today else
                 (f">{a.limit / now['sim_s']:.0f}x faster" if not a.quick else "-"))
        rows.append({"figure": label, "today": t_today, "now": fmt(now, 600), "ratio": ratio,
                     "iteration_ms_now": now["iteration_ms"],
                     "iteration_ms_today": today["iteration_ms"] if today else None,
                     "tasks_now": now["tasks"], "scheduled_now": now["scheduled"],
                     "classes": now["classes"]})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    w = max(len(r["figure"]) for r in rows)
    print(f"{'figure (one full simulation)':<{w}} | {'today (shards)':>16} | "
          f"{'now (collective)':>16} | ratio | simulated iteration | tasks (scheduled)")
    for r in rows:
        it = f"{r['iteration_ms_now']:.2f} ms"
        if r["iteration_ms_today"] is not None:
            it += f" (shards {r['iteration_ms_today']:.2f} ms)"
        print(f"{r['figure']:<{w}} | {r['today']:>16} | {r['now']:>16} | {r['ratio']} | {it} | "
              f"{r['tasks_now']:,} ({r['scheduled_now']:,}, {r['classes']} node classes)")


if __name__ == "__main__":
    main()
