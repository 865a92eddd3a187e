"""The ``legionpy`` command.

Every subcommand takes ``--json`` and then prints exactly one JSON object on
stdout (progress goes to stderr), so scripts can consume the output.

    legionpy demo                       regions, partitions and tasks in a few lines
    legionpy --version
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from . import __version__

_COMMANDS: dict[str, tuple[str, Callable]] = {}


def command(name: str, help: str):
    """Register ``fn(args) -> dict`` as subcommand ``name``; ``fn.configure``
    (optional) adds its arguments."""

    def wrap(fn):
        _COMMANDS[name] = (help, fn)
        return fn

    return wrap


def _emit(result: dict, as_json: bool) -> None:
    if as_json:
        payload = {k: v for k, v in result.items() if k != "text"}
        json.dump(payload, sys.stdout, default=_json_default)
        sys.stdout.write("\n")
    else:
        text = result.get("text")
        if text:
            print(text)


def _json_default(obj):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


# --------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------
def _configure_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=12, help="rows of the demo region")
    p.add_argument("--cols", type=int, default=8, help="columns of the demo region")
    p.add_argument("--degrees", default="3x2", help="equal-partition degrees, e.g. 3x2")


@command("demo", "regions and partitions in a few lines (the first thing to run)")
def _demo(args) -> dict:
    import numpy as np

    from .regions import Partition, Region

    degrees = tuple(int(d) for d in args.degrees.lower().split("x"))
    region = Region((args.rows, args.cols), {"x": np.float32, "y": np.float64}, name="demo")
    equal = Partition.equal(region, degrees)
    halo = Partition.restriction(region, (args.rows // degrees[0], args.cols), halo=(1, 0))
    lines = [
        f"region {region.name}: shape {region.shape}, fields "
        + ", ".join(f"{n}:{np.dtype(t).name}" for n, t in region.fields.items()),
        f"equal partition {degrees}: {len(equal)} tiles, disjoint={equal.is_disjoint}, "
        f"complete={equal.is_complete}",
    ]
    tiles = []
    for color in equal.colors:
        rect = equal[color].rect
        tiles.append({"color": list(color), "lo": list(rect.lo), "hi": list(rect.hi)})
        lines.append(f"  tile {color}: {rect}")
    lines.append(
        f"restriction with halo (1, 0): {len(halo)} aliased tiles, "
        f"disjoint={halo.is_disjoint}, complete={halo.is_complete}"
    )
    for color in halo.colors:
        lines.append(f"  tile {color}: {halo[color].rect}")
    return {
        "text": "\n".join(lines),
        "region": {"shape": list(region.shape), "fields": list(region.fields)},
        "equal": {"degrees": list(degrees), "tiles": tiles, "disjoint": equal.is_disjoint,
                  "complete": equal.is_complete},
        "restriction": {"tiles": len(halo), "disjoint": halo.is_disjoint,
                        "complete": halo.is_complete},
    }


_demo.configure = _configure_demo


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="legionpy",
        description="Find and run fast parallelization strategies for deep networks.",
    )
    parser.add_argument("--version", action="version", version=f"legionpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, fn) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object")
        configure = getattr(fn, "configure", None)
        if configure is not None:
            configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import LegionpyError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    _, fn = _COMMANDS[args.command]
    try:
        result = fn(args)
    except LegionpyError as exc:
        print(f"legionpy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    _emit(result, args.json)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
