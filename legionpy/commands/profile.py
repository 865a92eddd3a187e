"""``legionpy profile MODEL``: measure the operator costs of a model's tiles
on this machine's devices (DESIGN.md section 3; issue 9 item 3).

    legionpy profile alexnet --scale small --out alexnet-cpu.json
    legionpy simulate alexnet --scale small --cost alexnet-cpu.json

For each tile the strategy needs (default ``data``; ``--strategy`` takes the
names of :meth:`Strategy.resolve` or a strategy file, repeatable, and
``--all`` adds data, model and owt) it runs the real forward and backward
kernels on one local device of each kind (numpy on a CPU, CuPy on a GPU),
2 warm-up + 5 timed runs, median, through
:meth:`MeasuredCostModel.local` (so measurements are cached in
``$LEGIONPY_CACHE/costs.json`` and a second run is instant). ``--out``
writes the table with its metadata; :meth:`TableCostModel.from_json` (and
``legionpy simulate --cost FILE``) loads it on any other machine.

``--json`` prints ``{"model", "machine", "device_kinds", "strategies",
"tiles", "profile_time_s", "total_forward_s", "total_backward_s", "costs":
{cost_key: [forward_s, backward_s]}}``.

``--zoo`` records the GPU profiles presets ship with
(:mod:`legionpy.measure.record_profiles`): every zoo model (or ``--models
a,b``) at the paper's shapes (``--scale full``, the default there), the
tiles of data, model and expert on 1-16 devices (``--devices``), measured on
this machine's GPU, written as ``DIR/PRESET-MODEL.json`` (``--out DIR``,
``--preset`` default from the GPU's name)::

    legionpy profile --zoo --out legionpy/data/profiles
"""

from __future__ import annotations

import argparse
import os
import time

from ..cli import command
from .args import machine_spec, out_file, positive_int, size_pair


def _configure(p) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="a zoo model (see `legionpy models`) or a .onnx file; omit with --zoo")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--scale", choices=("small", "full"), default=None,
                   help="zoo sizes: small (default, seconds on a CPU) or the paper's "
                        "(the default with --zoo)")
    p.add_argument("--size", type=size_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="override a zoo size, e.g. --size hidden=256 (repeatable)")
    p.add_argument("--machine", type=machine_spec, default="local",
                   help="local (default: this process's devices) or local:N")
    p.add_argument("--strategy", action="append", default=None,
                   help="data (default), model, owt, expert or a strategy file (repeatable)")
    p.add_argument("--all", action="store_true", help="also profile data, model and owt tiles")
    p.add_argument("--cache", type=out_file, metavar="FILE", default=None,
                   help="measurement cache (default $LEGIONPY_CACHE/costs.json)")
    p.add_argument("--out", type=out_target, metavar="FILE|DIR",
                   help="write the cost table (TableCostModel JSON); with --zoo the folder "
                        "of the PRESET-MODEL.json profiles")
    p.add_argument("--zoo", action="store_true",
                   help="record the GPU profile of every zoo model for a preset (see "
                        "`legionpy machines`) into --out DIR")
    p.add_argument("--models", type=model_list, default=None, metavar="A,B",
                   help="--zoo: these zoo models only (default: all)")
    p.add_argument("--preset", default=None,
                   help="--zoo: the preset the profile is for (default: from the GPU's name)")
    p.add_argument("--devices", type=count_list, default=None, metavar="1,2,4",
                   help="--zoo: device counts whose strategies' tiles are measured "
                        "(default 1,2,4,8,16)")


def out_target(text: str) -> str:
    """An existing folder (``--zoo``) or a file that can be written."""
    return text if os.path.isdir(text) else out_file(text)


def model_list(text: str) -> list[str]:
    """``alexnet,resnet101``: zoo model names."""
    from ..models import MODELS

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown zoo models {bad}; the zoo has "
                                         f"{sorted(MODELS)}")
    return names


def count_list(text: str) -> list[int]:
    """``1,2,4,8``: positive device counts."""
    return [positive_int(n) for n in text.split(",")]


def build_graph(args):
    """The zoo graph of ``args.model`` with ``--scale``/``--size``/``--batch-size``."""
    from ..models import check_model, graph
    from ..models.training import parse_sizes

    check_model(args.model)
    sizes = parse_sizes(args.size)
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    return graph(args.model, scale=args.scale, **sizes).graph


def local_machine(spec: str):
    """``local`` with the runtime's devices, or ``local:N`` CPU devices."""
    from ..optimizer import Machine

    if spec == "local":
        from ..runtime import get_runtime

        get_runtime()
    return Machine.parse(spec)


@command("profile", "measure the op costs of a model's tiles on this machine's devices")
def _profile(args) -> dict:
    from ..errors import GraphError

    if args.zoo:
        return _zoo(args)
    if args.model is None:
        raise GraphError("legionpy profile needs a MODEL (a zoo name or a .onnx file), or "
                         "--zoo to record the GPU profiles of the whole zoo")
    if args.out and os.path.isdir(args.out):
        raise GraphError(f"--out {args.out!r} is a folder; pass a file name (a folder is "
                         "for --zoo)")
    args.scale = args.scale or "small"
    from ..optimizer import Strategy
    from ..optimizer.costmodel import COSTS_FORMAT, MeasuredCostModel, cost_key
    from ..optimizer.kernel_timing import profile_model
    from ..optimizer.strategy import atomic_write_json

    g = build_graph(args)
    machine = local_machine(args.machine)
    names = list(args.strategy or ["data"])
    if args.all:
        names += [n for n in ("data", "model", "owt") if n not in names]
    strategies = [Strategy.resolve(n, g, machine) for n in names]
    cm = MeasuredCostModel.local(args.cache)
    from ..progress import bar

    t0 = time.perf_counter()
    pbar = bar(args.json, desc=f"profile {args.model}", unit="tile", leave=False)

    def progress(i: int, n: int, op: str) -> None:
        if pbar is not None:
            pbar.total = n
            pbar.set_postfix_str(op, refresh=False)
            pbar.update(i - pbar.n)

    try:
        table = profile_model(g, machine, strategies, cm, progress=progress)
    finally:
        if pbar is not None:
            pbar.close()
    took = time.perf_counter() - t0
    kinds = sorted({d.kind for d in machine.devices})
    out = {"model": args.model, "machine": machine.name, "device_kinds": kinds,
           "strategies": names, "tiles": len(table), "profile_time_s": took,
           "total_forward_s": sum(v[0] for v in table.values()),
           "total_backward_s": sum(v[1] for v in table.values()), "costs": table}
    if args.out:
        meta = {k: v for k, v in out.items() if k != "costs"}
        atomic_write_json(args.out, {"format": COSTS_FORMAT, **meta, "costs": table})
    by_op: dict[str, list[float]] = {}
    for op in g.ops:
        for k in kinds:
            for tile in op.output_rect.split(strategies[0][op.name].degrees):
                v = table.get(cost_key(op, tile, k))
                if v is not None:
                    acc = by_op.setdefault(f"{op.name} [{k}]", [0.0, 0.0])
                    acc[0] += v[0]
                    acc[1] += v[1]
    lines = [f"{args.model} on {machine.name}: {len(table)} tile costs measured "
             f"({', '.join(kinds)}) for {', '.join(names)} in {took:.2f} s"]
    lines.append(f"  {'op [kind]':<32} {'forward ms':>11} {'backward ms':>12}  "
                 f"(sum over {names[0]}'s tiles)")
    for name, (f, b) in by_op.items():
        lines.append(f"  {name:<32} {f * 1e3:>11.3f} {b * 1e3:>12.3f}")
    if args.out:
        lines.append(f"  wrote {args.out} (use: legionpy simulate ... --cost {args.out})")
    return {"text": "\n".join(lines), **out}


def _zoo(args) -> dict:
    """``profile --zoo``: :func:`legionpy.measure.record_profiles.record_profile`."""
    from ..errors import GraphError
    from ..measure.record_profiles import DEFAULT_COUNTS, device_identity, record_profile
    from ..models import MODELS
    from ..progress import bar

    if args.model is not None:
        raise GraphError(f"--zoo profiles zoo models by --models, not MODEL {args.model!r}; "
                         f"use --zoo --models {args.model}")
    if not args.out or not os.path.isdir(args.out):
        raise GraphError(f"--zoo writes PRESET-MODEL.json files into a folder: pass --out DIR "
                         f"(an existing folder), got {args.out!r}")
    models = args.models or list(MODELS)
    pbar = bar(args.json, desc="profile", unit="tile", leave=False)

    def progress(model: str, i: int, n: int, op: str) -> None:
        if pbar is not None:
            if pbar.total != n or i == 1:
                pbar.reset(total=n)
            pbar.set_description_str(f"profile {model}", refresh=False)
            pbar.set_postfix_str(op, refresh=False)
            pbar.update(i - pbar.n)

    try:
        done = record_profile(models, args.out, args.preset, args.scale or "full",
                              args.devices or DEFAULT_COUNTS, args.cache, progress)
    finally:
        if pbar is not None:
            pbar.close()
    dev = device_identity()
    lines = [f"recorded on {dev['name']} (backend {dev['backend']})"
             + (": EMULATED timings, which no preset loads" if dev["emulated"] else ":")]
    lines += [f"  {d['model']:<14} {d['tiles']:>5} tiles {d['seconds']:>8.1f} s  -> {d['file']}"
              for d in done]
    lines.append("`legionpy machines` shows which preset they back (LEGIONPY_PROFILES=DIR to "
                 "load them from a folder other than the packaged one)")
    return {"text": "\n".join(lines), "device": dev, "profiles": done}


_profile.configure = _configure
