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
    if result.get("quiet") or _env_rank() != 0:  # under mpirun rank 0 prints the one report
        return
    if as_json:
        payload = {k: v for k, v in result.items() if k != "text"}
        json.dump(payload, sys.stdout, default=_json_default)
        sys.stdout.write("\n")
    else:
        text = result.get("text")
        if text:
            print(text)


def _env_rank() -> int:
    """This process's MPI rank from the launcher's variables (0 outside MPI)."""
    import os

    from .progress import RANK_VARS

    for v in RANK_VARS:
        if os.environ.get(v, "").isdigit():
            return int(os.environ[v])
    return 0


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


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (what is wrong, and where to look), status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the "
                     "arguments)\n")


def build_parser() -> argparse.ArgumentParser:
    _load_commands()
    parser = _Parser(
        prog="legionpy",
        description="Find and run fast parallelization strategies for deep networks.",
    )
    parser.add_argument("--version", action="version", version=f"legionpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_text, fn) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object")
        configure = getattr(fn, "configure", None)
        if configure is not None:
            configure(p)
    return parser


INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""


def debug_enabled() -> bool:
    """True when ``LEGIONPY_DEBUG`` asks for debug output (full tracebacks)."""
    import os

    return os.environ.get("LEGIONPY_DEBUG", "0") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status: 0, 2 for a bad input
    (one line on stderr saying what to change), 1 for an unexpected error,
    130 after Ctrl-C. ``LEGIONPY_DEBUG=1`` adds the traceback."""
    from .errors import LegionpyError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 0
    _, fn = _COMMANDS[args.command]
    where = f"legionpy {args.command}"
    try:
        result = fn(args)
    except KeyboardInterrupt as exc:  # legionpy.errors.Interrupted says what was saved
        if _env_rank() == 0:  # under mpirun every rank stops at the same step: say it once
            _report(where, f"interrupted (Ctrl-C){': ' + str(exc) if str(exc) else ''}", None)
        return INTERRUPTED
    except LegionpyError as exc:
        _report(where, f"error: {exc}", exc)
        return 2
    except OSError as exc:  # a file that cannot be read or written
        name = f" {exc.filename!r}" if exc.filename else ""
        _report(where, f"error: {exc.strerror or exc}{name}; check the path and its "
                       "permissions", exc)
        return 2
    except Exception as exc:
        _report(where, f"internal error: {type(exc).__name__}: {exc} (a bug in legionpy; "
                       "run again with LEGIONPY_DEBUG=1 for the traceback and report it)", exc)
        return 1
    try:
        _emit(result, args.json)
        sys.stdout.flush()
    except BrokenPipeError:  # `legionpy ... | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = result.get("exit_status", 0)
    return int(code)


def _report(where: str, message: str, exc: BaseException | None) -> None:
    """One line on stderr; the traceback too under ``LEGIONPY_DEBUG``."""
    if exc is not None and debug_enabled():
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    sys.stdout.flush()
    print(f"{where}: {message}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    # ``python -m legionpy.cli``: the subcommands register with legionpy.cli,
    # not with this __main__ copy of it
    from legionpy.cli import main as _main

    sys.exit(_main())
