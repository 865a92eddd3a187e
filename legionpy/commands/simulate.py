"""``legionpy simulate``: simulate one iteration of a model under a strategy."""

from __future__ import annotations

from ..cli import command


def add_model_arguments(p) -> None:
    """Arguments shared by the commands that build a zoo model on a machine."""
    p.add_argument("model", help="a zoo model (see `legionpy models`)")
    p.add_argument("--machine", default="local",
                   help="SPEC: p100:NODESxGPUS, k80:NxG, dgx1, h100:NxG, local, or a JSON file")
    p.add_argument("--batch-size", type=int, default=None, help="default: the paper's")
    p.add_argument("--scale", choices=("full", "small"), default="full",
                   help="zoo sizes: the paper's (default) or small (as `legionpy profile`)")
    p.add_argument("--size", action="append", default=[], metavar="KEY=VALUE",
                   help="override a zoo size, e.g. --size hidden=256 (repeatable)")


def build_model_and_machine(args):
    """(graph, machine) from ``add_model_arguments``' values."""
    from ..errors import ModelError
    from ..models import MODELS
    from ..optimizer import Machine

    if args.model not in MODELS:
        raise ModelError(f"unknown model {args.model!r}; the zoo has {sorted(MODELS)} "
                         f"(`legionpy models` lists them)")
    from ..models import graph
    from ..models.training import parse_sizes

    sizes = parse_sizes(getattr(args, "size", None) or [])
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    zoo = graph(args.model, scale=getattr(args, "scale", "full"), **sizes)
    return zoo.graph, Machine.parse(args.machine)


def _configure(p) -> None:
    add_model_arguments(p)
    p.add_argument("--strategy", default="data",
                   help="data, model, owt, expert, or a strategy JSON file")
    p.add_argument("--trace", metavar="FILE", help="write the simulated timeline (Perfetto JSON)")
    p.add_argument("--taskgraph", metavar="FILE",
                   help="write the iteration task graph the simulator scheduled (JSON)")
    p.add_argument("--png", metavar="FILE", help="draw the strategy (one row per op)")
    p.add_argument("--cost", default="analytic", metavar="analytic|measured|FILE",
                   help="cost model: analytic roofline (default), measured (real kernels on "
                        "this machine, cached), or a profile JSON from `legionpy profile`")


@command("simulate", "simulate one training iteration of a model under a strategy")
def _simulate(args) -> dict:
    from ..optimizer import Simulator, Strategy, plot_strategy, write_chrome_trace
    from ..optimizer.strategy import atomic_write_json

    graph, machine = build_model_and_machine(args)
    strategy = Strategy.resolve(args.strategy, graph, machine)
    from ..optimizer.costmodel import cost_model_from_spec

    sim = Simulator(graph, machine, cost_model_from_spec(args.cost))
    result = sim.run(strategy)
    out = result.to_dict()
    out.update({"model": args.model, "machine": machine.name, "strategy": str(args.strategy),
                "cost_model": args.cost})
    if args.trace:
        write_chrome_trace(sim.tasks(), args.trace)
    if args.taskgraph:
        atomic_write_json(args.taskgraph, sim.tg.to_json(include_times=False))
    if args.png:
        plot_strategy(graph, strategy, machine, args.png)
    busiest = max(result.per_device_busy_s.items(), key=lambda kv: kv[1], default=("-", 0.0))
    lines = [
        f"{args.model} on {machine.name} under {args.strategy}: "
        f"{result.iteration_time_s * 1e3:.3f} ms per iteration"
        + ("" if result.feasible else
           f"  (INFEASIBLE: out of memory on {', '.join(map(str, result.infeasible_devices))})"),
        f"  tasks {result.num_tasks}, bytes moved {result.bytes_moved / 1e6:.2f} MB, "
        f"busiest device {busiest[0]} {busiest[1] * 1e3:.3f} ms",
    ]
    return {"text": "\n".join(lines), **out}


_simulate.configure = _configure
