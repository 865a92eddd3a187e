"""``legionpy simulate``: simulate one iteration of a model under a strategy.

``--compare`` (``--machine local`` only; ``--scale small`` by default, as
``legionpy train``, so both print one prediction for one configuration:
:func:`legionpy.measure.predict_model`) then runs the same strategy for real
on this process's devices (``LEGIONPY_CPUS``) or every rank of an ``mpirun``
job (:func:`legionpy.measure.compare`: ``--warmup`` untimed and
``--steps`` timed training steps with the trace on) and reports simulated vs
measured iteration time, ``relative_error = |sim - real| / real``, the busy
time of every device in both halves, and where an iteration goes per device
and kind (compute, copy/collective, update, fill/reduce, control thread,
idle; ``terms`` and ``worst_term`` in ``--json``,
:mod:`legionpy.optimizer.breakdown`), simulated vs measured. With
``--compare`` the simulated figures include the runtime's measured per-task overhead
(:class:`~legionpy.optimizer.fidelity.RuntimeOverhead`) unless
``--no-overhead``; ``kernel_time_s`` is the plain simulator's figure. It
also says how fast the host ran Python while it measured, against the
calibration (``host_slowdown``, :mod:`legionpy.probe.hostspeed`), and takes
the measurement again, up to twice and within 10 s, while that is over
:data:`~legionpy.probe.hostspeed.QUIET_SLOWDOWN` (``host_retakes``). Under
MPI every rank runs and rank 0 prints.
"""

from __future__ import annotations

from ..cli import command
from .args import add_sync, cost_spec, machine_spec, nonneg_int, out_file, positive_int, size_pair


def add_model_arguments(p) -> None:
    """Arguments shared by the commands that build a zoo model on a machine."""
    p.add_argument("model", help="a zoo model (see `legionpy models`) or a .onnx file")
    p.add_argument("--machine", type=machine_spec, default="local",
                   help="SPEC: p100:NODESxGPUS, k80:NxG, dgx1, h100:NxG, local, or a JSON file")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: the paper's")
    p.add_argument("--scale", choices=("full", "small"), default=None,
                   help="zoo sizes: the paper's (default) or small (as `legionpy profile`; "
                        "the default of `simulate --compare`, as `legionpy train`)")
    p.add_argument("--size", type=size_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="override a zoo size, e.g. --size hidden=256 (repeatable)")


def build_model_and_machine(args):
    """(graph, machine) from ``add_model_arguments``' values."""
    from ..models import check_model
    from ..optimizer import Machine

    check_model(args.model)
    from ..models import graph
    from ..models.training import parse_sizes

    sizes = parse_sizes(getattr(args, "size", None) or [])
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    zoo = graph(args.model, scale=getattr(args, "scale", None) or "full", **sizes)
    return zoo.graph, Machine.parse(args.machine)


def check_cost_model(cost: str, machine) -> None:
    """``--cost measured`` times real kernels on this machine's devices of
    each kind the machine model has: a GPU model needs CuPy and a GPU here."""
    from ..errors import MachineError

    if cost not in ("measured", "worker", "contended") \
            or not any(d.kind == "gpu" for d in machine.devices):
        return
    try:
        import cupy

        ok = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, or no CUDA device
        ok = False
    if not ok:
        raise MachineError(f"--cost {cost} times kernels on this machine's GPUs, but "
                           f"{machine.name} has GPUs and this machine has no CuPy GPU; use "
                           "--cost analytic, or a profile JSON measured on a GPU machine "
                           "(`legionpy profile MODEL --out FILE` there)")


def _configure(p) -> None:
    add_model_arguments(p)
    p.add_argument("--strategy", default="data",
                   help="data, model, owt, expert, megatron, hybrid (data across nodes, tensor "
                        "inside), single (every op on the first device), or a strategy JSON "
                        "file")
    p.add_argument("--trace", type=out_file, metavar="FILE",
                   help="write the simulated timeline (Perfetto JSON; with --compare, where the "
                        "runtime model places each task: compare it with a real run's "
                        "LEGIONPY_TRACE in `legionpy compare-traces`)")
    p.add_argument("--taskgraph", type=out_file, metavar="FILE",
                   help="write the iteration task graph the simulator scheduled (JSON)")
    p.add_argument("--png", type=out_file, metavar="FILE",
                   help="draw the strategy (one row per op)")
    p.add_argument("--cost", type=cost_spec, default=None,
                   metavar="analytic|measured|worker|contended|FILE",
                   help="cost model: the preset's packaged GPU profile when `legionpy machines` "
                        "lists one, else the analytic roofline (default); analytic; measured "
                        "(real kernels on "
                        "this machine, cached), worker (measured as a device's worker runs "
                        "them: alone, one BLAS thread, CPU seconds; the default with "
                        "--compare, as `legionpy train` predicts), contended (measured with "
                        "every device busy), or a profile JSON from `legionpy profile`")
    add_sync(p)
    p.add_argument("--compare", action="store_true",
                   help="also run the strategy for real here (--machine local) and report "
                        "simulated vs measured iteration time and per-device busy time")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="--compare: timed steps (default 5)")
    p.add_argument("--warmup", type=nonneg_int, default=2,
                   help="--compare: untimed steps (default 2)")
    p.add_argument("--no-overhead", action="store_true",
                   help="--compare: simulate kernels only, without the runtime's measured "
                        "per-task overhead")


@command("simulate", "simulate one training iteration of a model under a strategy")
def _simulate(args) -> dict:
    if getattr(args, "compare", False):
        return _compare(args)
    from ..optimizer import Simulator, Strategy, plot_strategy, write_chrome_trace
    from ..optimizer.strategy import atomic_write_json

    graph, machine = build_model_and_machine(args)
    check_cost_model(args.cost, machine)
    strategy = Strategy.resolve(args.strategy, graph, machine)
    from ..optimizer.costmodel import cost_model_from_spec
    from ..optimizer.search import cost_model_summary
    from ..progress import Stages

    cm = cost_model_from_spec(args.cost, len(machine.devices), machine)
    with Stages(["task graph", "schedule"], f"simulate {args.model}", args.json) as stages:
        sim = Simulator(graph, machine, cm, sync=getattr(args, "sync", None))
        sim.on_stage = stages
        result = sim.run(strategy)
        sim.on_stage = None
    out = result.to_dict()
    summary = cost_model_summary(cm)
    out.update({"model": args.model, "machine": machine.name, "strategy": str(args.strategy),
                "sync": sim.sync, "symmetry_classes": result.classes,
                "cost_model": args.cost or ("profile" if "tiles" in summary else "analytic")})
    if "tiles" in summary:
        out["cost_tiles"] = summary["tiles"]
        out["cost_source"] = summary["name"]
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
    if "tiles" in summary:
        t = summary["tiles"]
        lines.append(f"  costs: {summary['name']}: {t['table']} of {t['table'] + t['analytic']} "
                     f"tiles from the table, {t['analytic']} analytic"
                     + (f" ({t['scaled']} scaled by their op's measured efficiency)"
                        if t.get("scaled") else ""))
    else:
        lines.append(f"  costs: {out['cost_model']}")
    return {"text": "\n".join(lines), **out}


def _compare(args) -> dict:
    """``simulate --compare``: simulate, run for real, compare (see module doc)."""
    from ..errors import MachineError, ModelError
    from ..measure import judge_searches
    from ..measure.calibration import note_faster_run
    from ..measure.fidelity import LOCAL_COST, compare
    from ..models import check_model
    from ..models.training import parse_sizes, start_runtime
    from ..probe.hostspeed import host_speed_text

    if args.machine.split(":")[0].lower() != "local":
        raise MachineError(f"--compare runs the strategy for real, and only the local machine "
                           f"can be run: use --machine local (got --machine {args.machine}); "
                           "simulate other machines without --compare")
    check_model(args.model)
    if args.steps < 1 or args.warmup < 0:
        raise ModelError(f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, "
                         f"{args.warmup}")
    spec = args.machine.split(":")
    rt = start_runtime(int(spec[1]) if len(spec) > 1 and spec[1].isdigit() else None)
    sizes = parse_sizes(args.size)
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    # the same configuration `legionpy train MODEL` runs by default: small sizes
    with judge_searches():  # --strategy search is picked as `legionpy train` picks it
        r = compare(args.model, args.strategy, scale=args.scale or "small", sizes=sizes,
                    cost=args.cost or LOCAL_COST,
                    steps=args.steps, warmup=args.warmup, overhead=not args.no_overhead,
                    sync=getattr(args, "sync", None), trace=args.trace, quiet=True)
    out = r.to_dict()
    sim = out.pop("simulation")
    out.update({k: sim[k] for k in ("bytes_moved", "per_link_busy_s", "feasible")
                if k in sim})
    out["control_busy_s"] = sim.get("control_busy_s")
    lines = [
        f"{args.model} on {r.machine} under {args.strategy} (cost {r.cost_model}"
        f"{'' if args.no_overhead else ' + runtime overhead'}, {r.steps} timed steps):",
        f"  simulated {r.iteration_time_s * 1e3:9.3f} ms per iteration"
        f"  (kernels only {r.kernel_time_s * 1e3:.3f} ms)",
        f"  measured  {r.measured_time_s * 1e3:9.3f} ms per iteration (median)",
        f"  relative error {r.relative_error * 100:.1f}%  (kernels only "
        f"{r.kernel_relative_error * 100:.1f}%)",
        f"  {'device':<10} {'sim busy ms':>12} {'real busy ms':>13}",
    ]
    if r.host_slowdown is not None:
        # a calibration taken in a busy spell: taken again next run
        again = not args.no_overhead and note_faster_run(r.machine, r.host_slowdown)
        lines.insert(4, "  " + host_speed_text(r.host_slowdown, retake=again)
                     + (f" (took the measurement {r.host_retakes} more time(s) while the "
                        "host was busy)" if r.host_retakes else ""))
    for d in sorted(set(r.per_device_busy_s) | set(r.measured_per_device_busy_s)):
        lines.append(f"  {d:<10} {r.per_device_busy_s.get(d, 0.0) * 1e3:>12.3f} "
                     f"{r.measured_per_device_busy_s.get(d, 0.0) * 1e3:>13.3f}")
    if r.terms.get("sim") and r.terms.get("real"):
        from ..optimizer.breakdown import format_breakdown

        lines.append("  where an iteration goes (ms; --json: terms):")
        lines.append(format_breakdown(r.terms["sim"], r.terms["real"], ("sim", "real")))
    out["text"] = "\n".join(lines)
    if rt.rank != 0:
        out["quiet"] = True
    return out


_simulate.configure = _configure
