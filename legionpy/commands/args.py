"""Argument types of the ``legionpy`` subcommands: every value is checked
where it enters, while argparse parses the command line, so a bad value
ends the command at once with one line that names the argument, the value
and what to pass instead (exit status 2), before any long work starts.

>>> positive_int("3"), nonneg_float("0.5"), degrees("3x2")
(3, 0.5, (3, 2))

Each type raises :class:`argparse.ArgumentTypeError`; the parser turns it
into ``legionpy CMD: error: argument --steps: ...``. Output paths are
checked the same way (:func:`out_file`): their folder must exist and be
writable, so ``search --out missing/x.json`` fails before the search, not
after it.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from ..collectives import DEFAULT_SYNC, SYNC_MODES

__all__ = ["positive_int", "nonneg_int", "positive_float", "nonneg_float", "degrees",
           "size_pair", "machine_spec", "in_file", "out_file", "cost_spec", "check_out_path",
           "add_train_arguments", "add_sync"]

_Bad = argparse.ArgumentTypeError


def _number(text: str, kind: type, what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise _Bad(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (steps, batch size, devices, iterations)."""
    v = _number(text, int, "an integer")
    if v < 1:
        raise _Bad(f"must be an integer >= 1, got {v}")
    return v


def nonneg_int(text: str) -> int:
    """An integer >= 0 (warm-up steps, seeds)."""
    v = _number(text, int, "an integer")
    if v < 0:
        raise _Bad(f"must be an integer >= 0, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (budgets in seconds, learning rates)."""
    v = _number(text, float, "a number")
    if not (v > 0 and v != float("inf")):
        raise _Bad(f"must be a number > 0, got {text}")
    return v


def nonneg_float(text: str) -> float:
    v = _number(text, float, "a number")
    if not (v >= 0 and v != float("inf")):
        raise _Bad(f"must be a number >= 0, got {text}")
    return v


def degrees(text: str) -> tuple[int, ...]:
    """``3x2`` -> ``(3, 2)``: one positive degree per dim."""
    parts = text.lower().split("x")
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise _Bad(f"{text!r} is not degrees like 3x2 (positive integers joined by x)")
    return tuple(int(p) for p in parts)


def size_pair(text: str) -> str:
    """``KEY=VALUE`` with VALUE a number or comma-separated numbers (checked
    here; :func:`legionpy.models.training.parse_sizes` converts)."""
    from ..errors import ModelError
    from ..models.training import parse_sizes

    try:
        parse_sizes([text])
    except ModelError as exc:
        raise _Bad(str(exc)) from None
    return text


_SPEC = re.compile(r"([a-z0-9]+)(?::(\d+)(?:x(\d+))?)?")


def machine_spec(text: str) -> str:
    """A ``--machine`` SPEC: ``PRESET[:NODES[xGPUS]]``, ``local[:N]`` or an
    existing JSON file (parsed later: ``local`` calibrates this machine)."""
    from ..optimizer.machine import PRESETS

    if text.endswith(".json") or os.path.sep in text:
        return in_file(text)
    m = _SPEC.fullmatch(text.strip().lower())
    if not m:
        raise _Bad(f"{text!r} is not PRESET[:NODESxGPUS] (e.g. p100:4x4, dgx1, local:2) "
                   "or a machine JSON file")
    if m.group(1) not in PRESETS:
        raise _Bad(f"unknown machine preset {m.group(1)!r}; presets: {sorted(PRESETS)} "
                   "(`legionpy machines` lists them)")
    for n, what in ((m.group(2), "nodes"), (m.group(3), "GPUs per node")):
        if n is not None and int(n) < 1:
            raise _Bad(f"{text!r} asks for {n} {what}; use at least 1")
    return text


def in_file(text: str) -> str:
    """An existing, readable file."""
    if not os.path.exists(text):
        raise _Bad(f"no such file {text!r}; check the path")
    if os.path.isdir(text):
        raise _Bad(f"{text!r} is a folder; pass a file")
    if not os.access(text, os.R_OK):
        raise _Bad(f"{text!r} is not readable; check its permissions")
    return text


def check_out_path(path: str) -> str | None:
    """Why ``path`` cannot be written (None when it can): its folder must
    exist and be writable, and the path must not be a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path!r} is a folder; pass a file name"
    if not os.path.isdir(folder):
        return f"folder {os.path.dirname(path) or folder!r} does not exist; create it first"
    if not os.access(folder, os.W_OK):
        return f"folder {folder!r} is not writable; write somewhere else"
    return None


def out_file(text: str) -> str:
    """A file that can be written (see :func:`check_out_path`)."""
    why = check_out_path(text)
    if why:
        raise _Bad(why)
    return text


def cost_spec(text: str) -> str:
    """``analytic``, ``measured``, ``worker``, ``contended`` or an existing profile JSON."""
    if text in ("analytic", "measured", "worker", "contended"):
        return text
    if not os.path.exists(text):
        raise _Bad(f"{text!r} is not 'analytic', 'measured', 'worker', 'contended' or an "
                   "existing profile JSON (write one with `legionpy profile MODEL --out FILE`)")
    return in_file(text)


def add_train_arguments(p: Any, steps: int = 30) -> None:
    """The arguments ``legionpy train`` and ``examples/*.py`` share (their values
    go to :func:`legionpy.models.training.train_from_args`)."""
    p.add_argument("--strategy", default="data",
                   help="data, model, owt, search, or a strategy JSON file (default: data)")
    p.add_argument("--steps", type=positive_int, default=steps,
                   help=f"training steps (default {steps})")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="global batch (default: the small preset's, see models.SMALL)")
    p.add_argument("--scale", choices=("small", "full"), default="small",
                   help="small sizes for CPU runs (default) or the paper's shapes")
    p.add_argument("--size", type=size_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="override a builder size, e.g. --size hidden=128 --size steps=20")
    p.add_argument("--text", action="store_true",
                   help="RNNs: train on the stdlib-docstring corpus instead of synthetic data")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="CPU devices per process (default: the GPUs LEGIONPY_GPUS=n asks "
                        "for, else 2, or 1 per rank under mpirun)")
    p.add_argument("--lr", type=positive_float, default=None, help="Adam learning rate")
    p.add_argument("--seed", type=nonneg_int, default=0)
    add_sync(p)
    p.add_argument("--checkpoint", type=out_file, metavar="FILE", default=None,
                   help="resume from FILE when it exists; save to it every "
                        "--checkpoint-every steps, at the end and on Ctrl-C")
    p.add_argument("--checkpoint-every", type=positive_int, metavar="N", default=None,
                   help="with --checkpoint: save every N steps (default: only at the end "
                        "and on Ctrl-C)")


def add_sync(p: argparse.ArgumentParser) -> None:
    """``--sync``, the gradient synchronisation (docs/seam.md), one option
    for ``train``, ``simulate`` and ``search`` so both halves resolve it the
    same way (:func:`legionpy.collectives.resolve_sync`)."""
    p.add_argument("--sync", choices=SYNC_MODES, default=None,
                   help="gradient synchronisation: collective (per 25 MiB bucket and replica "
                        "group, one reduce-scatter of the gradients and one all-gather of the "
                        "weights; ring, hierarchical or tree) or shards (point-to-point copies "
                        "to and from each parameter tile's update shard). Default: "
                        f"LEGIONPY_SYNC, else {DEFAULT_SYNC}")
