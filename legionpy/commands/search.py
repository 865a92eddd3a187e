"""``legionpy search``: find a parallelization strategy for a zoo model and
compare it with the baselines (FlexFlow paper sections 6 and 8.2).

    legionpy search alexnet --machine p100:4x4 --budget 30 [--seed 0] [--json]
        [--out FILE] [--png FILE] [--trace FILE] [--methods data,mcmc,...]
        [--iterations N]

Progress goes to stderr (tqdm); the table (or, with ``--json``, one object
with ``search_time_s``, ``strategies: {name: {iteration_time_s,
speedup_vs_data, bytes_moved}}`` and ``best``) to stdout. The best strategy
is written to ``--out`` (default ``MODEL-SPEC.json``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..cli import command
from .args import machine_spec, nonneg_int, out_file, positive_float, positive_int


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo model name (legionpy models)")
    p.add_argument("--machine", type=machine_spec, default="p100:1x4",
                   help="machine spec, e.g. p100:4x4")
    p.add_argument("--budget", type=positive_float, default=30.0,
                   help="search seconds (default 30)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--iterations", type=positive_int, default=None,
                   help="MCMC proposals instead of a time budget (deterministic)")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--methods", default=None,
                   help="comma-separated: data,model,expert,partitioner,elimination,mcmc,"
                        "exhaustive")
    p.add_argument("--out", type=out_file, default=None,
                   help="best strategy JSON (default MODEL-SPEC.json)")
    p.add_argument("--png", type=out_file, default=None, help="also draw the best strategy")
    p.add_argument("--trace", type=out_file, default=None,
                   help="simulated Chrome trace of the best")
    p.add_argument("--no-progress", action="store_true")


@command("search", "search a parallelization strategy and compare it with the baselines")
def _search(args) -> dict:
    from .. import models
    from ..errors import StrategyError
    from ..optimizer import Machine, Simulator, search
    from ..optimizer.search import DEFAULT_METHODS
    from ..optimizer.trace import plot_strategy, write_chrome_trace

    methods = args.methods.split(",") if args.methods else None
    known = list(DEFAULT_METHODS) + ["owt", "exhaustive"]
    unknown = sorted(set(methods or ()) - set(known))
    if unknown:
        raise StrategyError(f"--methods: unknown search methods {unknown}; known: {known}")
    kw = {} if args.batch_size is None else {"batch_size": args.batch_size}
    graph = models.build(args.model, **kw).graph
    machine = Machine.parse(args.machine)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm
        total = args.iterations or None
        bar = tqdm(total=total, desc=f"search {args.model}", file=sys.stderr, unit="prop",
                   leave=False)

    def progress(done, total, best):
        if bar is not None:
            bar.n = done
            bar.set_postfix_str(f"best {best * 1e3:.3f} ms", refresh=True)

    def stage(name):
        if bar is not None:
            bar.set_description_str(f"search {args.model}: {name}")

    try:
        rep = search.run_all(graph, machine, args.budget, args.seed, methods,
                             args.iterations, progress=progress, stage=stage)
    finally:
        if bar is not None:
            bar.close()
    best = rep.best_strategy
    spec = args.machine.replace("/", "_").replace(":", "-")
    out = args.out or f"{os.path.splitext(args.model)[0]}-{spec}.json"
    best.save(out)
    files = {"strategy": out}
    if args.png:
        plot_strategy(graph, best, machine, args.png)
        files["png"] = args.png
    if args.trace:
        sim = Simulator(graph, machine)
        sim.run(best)
        write_chrome_trace(sim.tasks(), args.trace)
        files["trace"] = args.trace
    res = rep.to_json()
    res["files"] = files
    res["details"] = rep.details
    res["text"] = rep.table() + f"\nwrote {', '.join(files.values())}"
    return res


_search.configure = _configure
