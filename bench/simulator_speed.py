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
"""

from __future__ import annotations

import argparse
import random
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="AlexNet and Inception, 4/16 GPUs")
    ap.add_argument("--proposals", type=int, default=None)
    args = ap.parse_args(argv)
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
