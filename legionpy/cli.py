"""The ``legionpy`` command.

Every subcommand takes ``--json`` and then prints exactly one JSON object on
stdout (progress goes to stderr), so scripts can consume the output.

    legionpy demo                       regions, partitions and tasks in a few lines
    legionpy --version

Each subcommand lives in its own module of :mod:`legionpy.commands` and
registers itself with :func:`command`; heavy imports happen inside the
command function, so ``legionpy --help`` stays fast.
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
    if result.get("quiet"):  # e.g. a non-root MPI rank: rank 0 prints
        return
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
# entry point
# --------------------------------------------------------------------------
def _load_commands() -> None:
    import importlib

    from .commands import MODULES

    for name in MODULES:
        importlib.import_module(f"legionpy.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    _load_commands()
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
