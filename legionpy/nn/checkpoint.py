"""Checkpoints that resume a run exactly (:meth:`Model.save` / :meth:`Model.load`).

A checkpoint is one ``.npz`` file (numpy's zip of arrays, read without
pickle) holding everything the next step depends on:

- ``param/NAME``: every parameter (``w`` of its region);
- ``state/NAME/FIELD``: the optimizer's state fields (momentum ``m``,
  Adam's ``m`` and ``v``), so the next update is the one the uninterrupted
  run makes;
- ``buffer/OP.KEY``: batch-norm running statistics;
- ``__meta__``: JSON (as bytes): format and version, the model's name,
  seed and parameter shapes, ``step`` (steps run: the next update's Adam bias
  correction and the next dropout mask, both functions of the step),
  ``epoch`` (completed epochs: the next shuffle order is drawn from
  ``(seed, epoch)``) and ``batch`` (batches done in the epoch ``fit`` was
  in), the optimizer (class and settings) and the strategy.

That is the whole random state: legionpy draws every random number from
the model's seed and the step or epoch (dropout masks from ``(op seed,
step)``, shuffles from ``(seed, epoch)``), never from a global generator,
so ``load`` then ``fit`` gives the losses of the uninterrupted run bit for
bit. ``load`` restores the saved strategy when it fits this machine (a
different strategy computes the same numbers up to the order of float
sums); files written before these fields existed load their parameters only.

Files are written atomically (:func:`legionpy.atomic.atomic_write`), by MPI
rank 0 only (every rank reads the regions). A file that is not a legionpy
checkpoint raises :class:`~legionpy.errors.CheckpointError` naming it.
"""

from __future__ import annotations

import json
import os
import warnings
import zipfile
import zlib
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..errors import CheckpointError

__all__ = ["save", "load", "read_meta", "FORMAT"]

FORMAT = "legionpy-checkpoint"
VERSION = 1


def _optimizer_meta(opt: Any) -> dict:
    from dataclasses import asdict, is_dataclass

    return {"class": type(opt).__name__, **(asdict(opt) if is_dataclass(opt) else {})}


def save(model: Any, path: str | os.PathLike) -> None:
    """Write ``model``'s checkpoint to ``path`` (see the module docstring)."""
    from .. import runtime as lr

    ex = model._exec("save")
    arrays: dict[str, np.ndarray] = {}
    for name, r in ex.pregions.items():
        arrays[f"param/{name}"] = r.read("w")
        for f in model.optimizer.fields:
            arrays[f"state/{name}/{f}"] = r.read(f)
    ex.fold_running_stats()  # batch norm statistics of the steps still in flight
    for pl in ex.plans:
        for k, v in pl.buffers.items():
            arrays[f"buffer/{pl.op.name}.{k}"] = np.array(v, copy=True)
    meta = {"format": FORMAT, "version": VERSION, "model": model.graph.name,
            "seed": model.seed, "step": model.step, "epoch": model.epoch,
            "batch": model._batch, "optimizer": _optimizer_meta(model.optimizer),
            "parameters": {n: list(r.shape) for n, r in ex.pregions.items()},
            "strategy": model.strategy.to_dict() if model.strategy is not None else None}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    if lr.get_runtime().rank != 0:
        return
    atomic_write(path, lambda f: np.savez(f, **arrays), binary=True)


def _read(path: str) -> dict[str, np.ndarray]:
    """Every array of the file, or a CheckpointError naming it."""
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path!r}; check the path (model.save(path) "
                              "writes one)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        kind = type(e).__name__
        raise CheckpointError(f"{path!r} is not a readable legionpy checkpoint (truncated or "
                              f"corrupt: {kind}); use an earlier checkpoint, or delete it to "
                              "start from scratch") from None


def read_meta(path: str | os.PathLike) -> dict:
    """The ``__meta__`` of a checkpoint (``{}`` for a parameters-only file)."""
    return _meta(_read(os.fspath(path)), os.fspath(path))


def _meta(z: dict, path: str) -> dict:
    if "__meta__" not in z:
        return {}
    try:
        meta = json.loads(z["__meta__"].tobytes().decode())
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path!r}: its __meta__ record is corrupt; use an earlier "
                              "checkpoint") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a legionpy checkpoint (format "
                              f"{meta.get('format')!r})")
    return meta


def load(model: Any, path: str | os.PathLike) -> dict:
    """Restore ``model`` from ``path``; returns the file's meta."""
    path = os.fspath(path)
    ex = model._exec("load")
    z = _read(path)
    meta = _meta(z, path)
    prefix = "param/" if meta else ""
    missing = [n for n in ex.pregions if prefix + n not in z]
    if missing:
        raise CheckpointError(f"checkpoint {path!r} lacks parameters {missing}: it was saved "
                              f"from another model ({meta.get('model', 'unknown')!r}); load it "
                              "into the model it was saved from")
    for n, r in ex.pregions.items():
        if z[prefix + n].shape != r.shape:
            raise CheckpointError(f"checkpoint {path!r}: parameter {n!r} has shape "
                                  f"{z[prefix + n].shape}, the model's is {r.shape}; load it "
                                  "into the model it was saved from")
    if meta:
        _restore_strategy(model, meta, path)
    for n, r in ex.pregions.items():
        r.write("w", z[prefix + n].astype(r.fields["w"]))
    fields = model.optimizer.fields
    if meta:
        absent = [f for f in fields if any(f"state/{n}/{f}" not in z for n in ex.pregions)]
        if absent or meta.get("optimizer") != _optimizer_meta(model.optimizer):
            warnings.warn(f"checkpoint {path!r} was saved with optimizer {meta.get('optimizer')}"
                          f", the model has {_optimizer_meta(model.optimizer)}; "
                          + (f"state {absent} starts from zero, so " if absent else "")
                          + "the run does not continue exactly", stacklevel=3)
        for n, r in ex.pregions.items():
            for f in fields:
                if f"state/{n}/{f}" in z:
                    r.write(f, z[f"state/{n}/{f}"].astype(r.fields[f]))
        if meta.get("seed") != model.seed:
            warnings.warn(f"checkpoint {path!r} was saved by a model with seed "
                          f"{meta.get('seed')}, this one has seed {model.seed}: shuffles "
                          "differ from the saved run's", stacklevel=3)
        model._step, model._epoch, model._batch = (int(meta["step"]), int(meta["epoch"]),
                                                   int(meta["batch"]))
    ex.fold_running_stats()
    for pl in ex.plans:
        names = list(pl.buffers) or (("running_mean", "running_var")
                                     if pl.op.kind == "batch_norm" else ())
        for k in names:
            key = f"buffer/{pl.op.name}.{k}" if meta else f"{pl.op.name}.{k}"
            if key in z:
                pl.buffers[k] = z[key].copy()
    return meta


def _restore_strategy(model: Any, meta: dict, path: str) -> None:
    """Switch to the saved strategy when it differs and fits this machine."""
    from ..errors import LegionpyError
    from ..optimizer import Strategy

    saved = meta.get("strategy")
    if not saved:
        return
    try:
        s = Strategy.from_dict(saved, model.graph)
        if dict(s) == dict(model.strategy):
            return
        model.set_strategy(s)
    except LegionpyError as e:
        warnings.warn(f"checkpoint {path!r}: its strategy does not fit this machine ({e}); "
                      "training continues under the compiled strategy, which computes the "
                      "same numbers up to the order of float sums", stacklevel=4)
