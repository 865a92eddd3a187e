"""Full vs delta simulation speed (paper Table 4 / section 5.3).

For AlexNet, ResNet-101, Inception-v3, RNNLM and NMT at the paper's shapes
on p100 presets with 4, 16 and 64 GPUs: a sequence of MCMC-like proposals
(one op re-drawn: a random parallelizable dim, a power-of-two degree, a
contiguous device block) starting from data parallelism. Each proposal is
simulated in full (Algorithm 1: build the task graph + schedule) and by delta
(Algorithm 2 from the previous timeline). Costs and tile geometry are cached
across proposals in both cases (as FlexFlow caches measured task times).
Prints simulations per second and the delta speed-up.

    python bench/simulator_speed.py            # full table
    python bench/simulator_speed.py --quick    # a few seconds
    python bench/simulator_speed.py --scale    # full simulations from scratch at scale

``--scale``: one full simulation from scratch (a new ``Simulator``: empty
caches, as every fresh search, ``simulate`` call and mapper decision pays)
of ResNet-101 data parallel on H100 machines from 64 to 1,024 GPUs (2 samples
per GPU: batch 2,048 at 1,024) and Inception-v3 under a random strategy on
64 GPUs, with the vectorised task-graph build and with the baseline (every
block replayed through the coherence state machine), each in a subprocess
with a time limit; seconds, peak RSS, tasks and the ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time

from legionpy import models
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy
from legionpy.optimizer.strategy import largest_divisor

MODELS = {
    "alexnet": lambda: models.alexnet(),
    "resnet101": lambda: models.resnet101(),
    "inception_v3": lambda: models.inception_v3(),
    "rnnlm": lambda: models.rnnlm(),
    "nmt": lambda: models.nmt(),
}
MACHINES = {4: "p100:1x4", 16: "p100:4x4", 64: "p100:16x4"}


def proposal(rng: random.Random, graph, n: int):
    op = rng.choice(graph.ops)
    dims = op.parallel_dims
    deg = [1] * len(op.output_shape)
    if dims:
        d = rng.choice(dims)
        want = rng.choice([k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n])
        deg[d] = largest_divisor(op.output_shape[d], want)
    k = 1
    for x in deg:
        k *= x
    off = rng.randrange(n)
    devs = tuple((off + i) % n for i in range(k))
    return op.name, ParallelConfig(tuple(deg), devs)


def bench(name: str, n: int, n_props: int, seed: int = 0) -> dict:
    graph = MODELS[name]().graph
    machine = Machine.parse(MACHINES[n])
    rng = random.Random(seed)
    props = [proposal(rng, graph, n) for _ in range(n_props)]
    s0 = Strategy.data_parallel(graph, machine)
    seq, s = [], s0
    for op, cfg in props:
        s = s.with_config(op, cfg)
        seq.append(s)
    sim = Simulator(graph, machine)
    for s in [s0] + seq:  # warm the cost and geometry caches and numba
        sim.run(s)
    sim.run(s0)
    sim.delta(*props[0])
    t = time.perf_counter()
    for s in seq:
        sim.run(s)
    full = (time.perf_counter() - t) / len(seq)
    sim.run(s0)
    t = time.perf_counter()
    fell_back = 0
    for op, cfg in props:
        sim.delta(op, cfg)
        fell_back += sim.last_delta_pops < 0
    delta = (time.perf_counter() - t) / len(props)
    return {
        "model": name,
        "devices": n,
        "tasks": int(sim.tg.alive.sum()),
        "full_ms": full * 1e3,
        "delta_ms": delta * 1e3,
        "ratio": full / delta,
        "fallback": fell_back / len(props),
    }


def from_scratch(model: str, spec: str, batch: int, strategy: str, vectorised: bool) -> dict:
    """One full simulation in a fresh Simulator (run in a subprocess)."""
    from legionpy.optimizer.search.space import ConfigSpace

    graph = models.build(model, batch_size=batch).graph
    machine = Machine.parse(spec)
    if strategy == "data":
        s = Strategy.data_parallel(graph, machine)
    else:
        s = ConfigSpace().random_strategy(graph, machine, random.Random(0))
    # numba kernels compiled and loaded outside the timing (a one-off per process)
    g0 = models.lenet(batch_size=8).graph
    m0 = Machine.parse("p100:1x2")
    Simulator(g0, m0).run(Strategy.data_parallel(g0, m0))
    t = time.perf_counter()
    sim = Simulator(graph, machine)
    sim.tg.vectorised = vectorised
    r = sim.run(s)
    dt = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"s": dt, "rss": rss, "tasks": r.num_tasks, "iter_ms": r.iteration_time_s * 1e3}


SCALE_CASES = [("resnet101", "h100:8x8", 128, "data"), ("resnet101", "h100:16x8", 256, "data"),
               ("resnet101", "h100:32x8", 512, "data"),
               ("resnet101", "h100:128x8", 2048, "data"),
               ("inception_v3", "p100:16x4", 64, "random")]


def scale(limit_s: float) -> None:
    print(f"{'model':<13}{'machine':>12}{'batch':>6}{'strategy':>9}{'tasks':>10}"
          f"{'new s':>8}{'new MB':>8}{'base s':>9}{'base MB':>9}{'ratio':>7}")
    for model, spec, batch, strat in SCALE_CASES:
        out = {}
        for vec in (True, False):
            code = (f"import json,sys; sys.path.insert(0, 'bench'); import simulator_speed as b;"
                    f"print(json.dumps(b.from_scratch({model!r}, {spec!r}, {batch}, "
                    f"{strat!r}, {vec})))")
            try:
                p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                   text=True, timeout=limit_s)
                out[vec] = json.loads(p.stdout.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError):
                out[vec] = None
        new, base = out[True], out[False]

        def f(r, k, scale=1.0, w=8):
            return f"{r[k] * scale:>{w}.2f}" if r else f"{'>' + str(int(limit_s)):>{w}}"
        tasks = (new or base or {}).get("tasks", 0)
        ratio = f"{base['s'] / new['s']:>7.1f}" if new and base else f"{'-':>7}"
        print(f"{model:<13}{spec:>12}{batch:>6}{strat:>9}{tasks:>10}{f(new, 's')}"
              f"{f(new, 'rss', 1e-6)}{f(base, 's', w=9)}{f(base, 'rss', 1e-6, 9)}{ratio}",
              flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="AlexNet and Inception, 4/16 GPUs")
    ap.add_argument("--proposals", type=int, default=None)
    ap.add_argument("--scale", action="store_true",
                    help="full simulations from scratch at 64 to 1,024 GPUs")
    ap.add_argument("--limit", type=float, default=300.0,
                    help="seconds per simulation under --scale (default 300)")
    args = ap.parse_args(argv)
    if args.scale:
        scale(args.limit)
        return
    names = ["alexnet", "inception_v3"] if args.quick else list(MODELS)
    sizes = [4, 16] if args.quick else [4, 16, 64]
    n_props = args.proposals or (10 if args.quick else 30)
    print(
        f"{'model':<14}{'GPUs':>5}{'tasks':>8}{'full/s':>9}{'delta/s':>9}{'full ms':>9}"
        f"{'delta ms':>10}{'ratio':>7}{'resched':>8}"
    )
    for name in names:
        for n in sizes:
            r = bench(name, n, n_props)
            print(
                f"{name:<14}{n:>5}{r['tasks']:>8}{1e3 / r['full_ms']:>9.1f}"
                f"{1e3 / r['delta_ms']:>9.1f}{r['full_ms']:>9.2f}{r['delta_ms']:>10.2f}"
                f"{r['ratio']:>7.1f}{r['fallback']:>8.0%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
