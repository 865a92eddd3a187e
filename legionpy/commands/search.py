"""``legionpy search``: find a parallelization strategy for a zoo model and
compare it with the baselines (FlexFlow paper sections 6 and 8.2).

    legionpy search alexnet --machine p100:4x4 --budget 30 [--seed 0] [--json]
        [--out FILE] [--png FILE] [--trace FILE] [--methods data,mcmc,...]
        [--iterations N]

Progress goes to stderr (tqdm); the table (or, with ``--json``, one object
with ``search_time_s``, ``strategies: {name: {iteration_time_s,
speedup_vs_data, bytes_moved}}`` and ``best``) to stdout. The best strategy
is written to ``--out`` (default ``MODEL-SPEC.json``) atomically; an
existing file that holds a faster strategy for the same model and machine
is kept (``--force`` overwrites), and the output says what happened to it.
Ctrl-C ends the search, writes the best strategy found so far (the
baselines and every method that finished) the same way, says where, and
exits with status 130.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..cli import command
from .args import add_sync, machine_spec, nonneg_int, out_file, positive_float, positive_int


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a zoo model (legionpy models) or a .onnx file")
    p.add_argument("--machine", type=machine_spec, default="p100:1x4",
                   help="machine spec, e.g. p100:4x4")
    p.add_argument("--budget", type=positive_float, default=30.0,
                   help="search seconds (default 30)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--iterations", type=positive_int, default=None,
                   help="MCMC proposals instead of a time budget (deterministic)")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--methods", default=None,
                   help="comma-separated: data,model,expert,partitioner,elimination,"
                        "hierarchical,pipeline,mcmc,exhaustive,hybrid,megatron,even-pipeline "
                        "(default: the first eight; when one simulation takes over 15%% of "
                        "the budget: data,even-pipeline,pipeline; with --sync collective "
                        "past 256 devices: data,hybrid,mcmc)")
    p.add_argument("--out", type=out_file, default=None,
                   help="best strategy JSON (default MODEL-SPEC.json)")
    p.add_argument("--png", type=out_file, default=None, help="also draw the best strategy")
    p.add_argument("--trace", type=out_file, default=None,
                   help="simulated Chrome trace of the best")
    add_sync(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="overwrite --out even when it holds a faster strategy")


@command("search", "search a parallelization strategy and compare it with the baselines")
def _search(args) -> dict:
    from .. import models
    from ..cli import debug_enabled
    from ..errors import Interrupted, StrategyError
    from ..interrupt import deferred_interrupt
    from ..optimizer import Machine, Simulator, search
    from ..optimizer.search import DEFAULT_METHODS
    from ..optimizer.trace import plot_strategy, write_chrome_trace

    methods = args.methods.split(",") if args.methods else None
    known = list(DEFAULT_METHODS) + ["owt", "exhaustive", "hybrid", "megatron", "even-pipeline"]
    unknown = sorted(set(methods or ()) - set(known))
    if unknown:
        raise StrategyError(f"--methods: unknown search methods {unknown}; known: {known}")
    t_cmd = time.perf_counter()
    kw = {} if args.batch_size is None else {"batch_size": args.batch_size}
    graph = models.build(args.model, **kw).graph
    machine = Machine.parse(args.machine)
    out = args.out or default_out(args)
    # the budget is the command's (issue 25): building the graph and scoring
    # the strategy an existing output file holds come out of it
    previous = _previous(out, graph, machine, args.sync)
    budget = max(0.0, args.budget - (time.perf_counter() - t_cmd))
    bar = None
    if not (args.no_progress or args.json or not sys.stderr.isatty()):
        from tqdm import tqdm
        total = args.iterations or None
        bar = tqdm(total=total, desc=f"search {args.model}", file=sys.stderr, unit="prop",
                   leave=False)

    # Ctrl-C stops the search between proposals (MCMC reports progress every
    # 16) or between methods, never inside a numba kernel or its compilation
    stop = None

    def at_clean_point() -> None:
        if stop is not None and stop.requested:
            raise Interrupted("search stopped by Ctrl-C")

    def progress(done, total, best):
        at_clean_point()
        if bar is not None:
            bar.n = done
            bar.set_postfix_str(f"best {best * 1e3:.3f} ms", refresh=True)

    def stage(name):
        at_clean_point()
        if debug_enabled():
            print(f"legionpy search: {name}", file=sys.stderr, flush=True)
        if bar is not None:
            bar.set_description_str(f"search {args.model}: {name}")

    found: dict = {}
    try:
        with deferred_interrupt("search", "at the next proposal") as stop:
            rep = search.run_all(graph, machine, budget, args.seed, methods,
                                 args.iterations, progress=progress, stage=stage, found=found,
                                 sync=args.sync)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        return _interrupted(args, graph, machine, found)
    finally:
        if bar is not None:
            bar.close()
    best = rep.best_strategy
    note = write_strategy(out, best, graph, machine, args.force, args.sync,
                          new_cost=rep.rows[rep.best]["search_cost"], previous=previous)
    files = {"strategy": out}
    if args.png:
        plot_strategy(graph, best, machine, args.png)
        files["png"] = args.png
    if args.trace:
        sim = Simulator(graph, machine, sync=args.sync)
        sim.run(best)
        write_chrome_trace(sim.tasks(), args.trace)
        files["trace"] = args.trace
    res = rep.to_json()
    res["files"] = files
    res["details"] = rep.details
    res["strategy_file"] = note
    res["text"] = rep.table() + f"\n{note['message']}" + "".join(
        f"\nwrote {f}" for k, f in files.items() if k != "strategy")
    return res


def default_out(args) -> str:
    spec = args.machine.replace("/", "_").replace(":", "-")
    return f"{os.path.splitext(args.model)[0]}-{spec}.json"  # model.onnx -> model-SPEC.json


def _cost(sim, strategy) -> float:
    r = sim.run(strategy)
    return float(getattr(r, "search_cost", r.iteration_time_s))


def _previous(path: str, graph, machine, sync: str | None = None) -> tuple | None:
    """``(strategy or None, its cost or None, why not)`` of what ``path``
    holds, None when there is no such file."""
    import os

    from ..errors import LegionpyError
    from ..optimizer import Simulator, Strategy

    if not os.path.exists(path):
        return None
    try:
        old_s = Strategy.load(path, graph)
        old_s.validate(graph, machine)
        return old_s, _cost(Simulator(graph, machine, sync=sync), old_s), None
    except (LegionpyError, OSError, ValueError, KeyError) as e:
        return None, None, str(e).split("\n")[0]


def write_strategy(path: str, best, graph, machine, force: bool = False,
                   sync: str | None = None, new_cost: float | None = None,
                   previous: tuple | None = ()) -> dict:
    """Write ``best`` to ``path`` unless ``path`` already holds a strategy
    for this model and machine that simulates faster (``force`` overwrites
    anyway); returns ``{"action": "wrote"|"replaced"|"kept"|"unchanged",
    "message"}``, the message saying what happened to an existing file.
    ``new_cost`` / ``previous`` (:func:`_previous`): figures already known."""
    import os

    from ..optimizer import Simulator

    if previous == ():
        previous = _previous(path, graph, machine, sync)
    if previous is None or not os.path.exists(path):
        best.save(path)
        return {"action": "wrote", "message": f"wrote {path}"}
    new = new_cost if new_cost is not None else _cost(Simulator(graph, machine, sync=sync), best)
    old_s, old, why = previous
    if old_s is not None and old_s == best:
        return {"action": "unchanged", "message": f"{path} already holds this strategy"}
    if old is not None and old < new and not force:
        return {"action": "kept",
                "message": f"kept {path}: the strategy it holds simulates faster "
                           f"({old * 1e3:.3f} ms) than this search's best ({new * 1e3:.3f} ms); "
                           "pass --force to overwrite it, or --out FILE to write elsewhere"}
    best.save(path)
    was = (f"it held a different strategy ({old * 1e3:.3f} ms, now {new * 1e3:.3f} ms)"
           if old is not None else f"it held no strategy for this model and machine ({why})")
    return {"action": "replaced", "message": f"replaced {path}: {was}"}


def _interrupted(args, graph, machine, found: dict) -> dict:
    """Ctrl-C during the search: write the best strategy found so far."""
    from ..optimizer import Simulator

    sim = Simulator(graph, machine, sync=getattr(args, "sync", None))
    costs = {m: _cost(sim, s) for m, (s, _) in found.items()}
    if not costs:
        return {"text": "interrupted before any strategy was found; nothing written",
                "interrupted": True, "exit_status": 130}
    name = min(costs, key=costs.get)
    out = args.out or default_out(args)
    note = write_strategy(out, found[name][0], graph, machine, args.force)
    text = (f"interrupted (Ctrl-C): the best strategy so far is {name}'s "
            f"({costs[name] * 1e3:.3f} ms per iteration, of {sorted(costs)}); {note['message']}")
    print(f"legionpy search: {text}", file=sys.stderr)
    return {"text": "", "interrupted": True, "best": name, "iteration_time_s": costs[name],
            "strategies": {m: {"search_cost": c} for m, c in costs.items()},
            "strategy_file": note, "files": {"strategy": out}, "exit_status": 130}


_search.configure = _configure
