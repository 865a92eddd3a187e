"""Train a zoo model on generated data: the engine of ``legionpy train`` and
of ``examples/``.

:func:`train` builds ``models.NAME`` (``scale="small"`` by default), makes
``min(steps, DATA_BATCHES)`` batches with :func:`legionpy.data.for_model`
(step ``k`` trains on batch ``k % DATA_BATCHES``: a long run's memory does
not grow with its steps), compiles it with the strategy given (``data``,
``model``, ``owt``, ``search``, a JSON file or a Strategy) on this
runtime's devices and runs one ``fit`` step per batch. It returns a plain
dict (what ``--json`` prints):

``{"model", "strategy", "steps", "batch_size", "devices", "ranks",
"parameters", "first_loss", "final_loss", "losses", "samples_per_s",
"seconds", "measured_iteration_s", "background_cores", "cuda_graphs",
"picked"}``; ``picked``: with ``strategy="search"``, the named strategy the
search (and its judge) chose, e.g. ``"single"``, or None for one of its own;
``cuda_graphs``: the CUDA graph counters of runtime/graphs.py (segments
``captured``, graph ``launched``, op bodies ``replaced`` by launches; all 0
on CPU devices or with ``LEGIONPY_CUDA_GRAPHS=0``; ``off_because``: why
the GPU backend cannot use them, as with CuPy 14, which refuses cuBLAS
calls during a capture, else None);
``samples_per_s`` counts the steps after the first (which pays for first-touch
allocation), or all of them when there is one step; ``measured_iteration_s``
is the steady-state seconds per step (after the first three: the traced loop
records its first two);
``background_cores``: the cores other programs kept busy meanwhile
(:func:`legionpy.probe.overhead.background_cores`).

Every MPI rank runs the same calls (control replication) and gets the same
losses; :func:`is_root` tells which rank should print.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["train", "train_from_args", "parse_sizes",
           "default_optimizer", "is_root", "start_runtime", "DATA_BATCHES"]

#: generated batches a run cycles through: step k trains on batch
#: k % DATA_BATCHES. Generating one batch per step made `train alexnet
#: --steps 2500` allocate 2 GB per rank (20 s of page faults before the
#: first step), and a long run would run out of memory.
DATA_BATCHES = 64

_LR = {"lenet": 3e-3, "alexnet": 1e-3, "vgg16": 1e-3, "inception_v3": 2e-3,
       "resnet101": 2e-3, "rnntc": 1e-2, "rnnlm": 1e-2, "nmt": 1e-2, "transformer": 3e-3}


def default_optimizer(name: str) -> Any:
    """Adam with a learning rate that makes the small model learn in tens of steps."""
    from ..nn import Adam

    return Adam(lr=_LR.get(name, 1e-3))


def start_runtime(devices: int | None = None) -> Any:
    """``lp.init`` with ``devices`` CPU devices per process; by default 2 in
    one process and 1 per rank under ``mpirun`` (so ``python X.py`` and
    ``mpirun -n 2 python X.py`` use the same total device count). With GPUs
    asked for (``LEGIONPY_GPUS=n``, or ``LEGIONPY_GPU_BACKEND=emulated``) and
    ``devices`` None, the runtime's GPU devices (runtime/gpu.py)."""
    import os

    from .. import runtime as lr
    from ..runtime.mpi import launched_under_mpi

    gpus = os.environ.get("LEGIONPY_GPUS", "").strip()
    if devices is None and (gpus not in ("", "0") or (
            gpus != "0" and os.environ.get("LEGIONPY_GPU_BACKEND") == "emulated")):
        return lr.init()
    if devices is None and not launched_under_mpi():
        devices = 2
    return lr.init(cpus=devices)


def is_root() -> bool:
    """True on MPI rank 0 (and always in one process)."""
    from .. import runtime as lr

    return lr.get_runtime().rank == 0


def train(name: str, strategy: Any = "data", steps: int = 20, batch_size: int | None = None,
          scale: str = "small", text: bool = False, seed: int = 0, optimizer: Any = None,
          log: Callable[[int, float], None] | None = None,
          predict: Callable[..., dict] | None = None, checkpoint: str | None = None,
          checkpoint_every: int | None = None, progress: bool = False,
          sync: str | None = None, **sizes: Any) -> dict[str, Any]:
    """Train zoo model ``name`` for ``steps`` steps; see the module docstring.
    ``log(step, loss)`` is called after every step (on every rank).
    ``predict(model, measured seconds per step, background cores) -> dict``:
    merged into the
    result (``legionpy train`` passes :func:`legionpy.measure.train_prediction`,
    the local machine model's prediction next to the measurement).

    ``checkpoint``: resume from this file when it exists (the run continues
    at the saved step, exactly; pass the same arguments as the first run)
    and save to it every ``checkpoint_every`` steps, at the end and on
    Ctrl-C (which raises :class:`~legionpy.errors.Interrupted` after the
    step in flight). ``progress``: a tqdm bar on rank 0 (when stderr is a
    terminal). ``sync``: gradient synchronisation, ``"collective"`` or
    ``"shards"`` (None: ``LEGIONPY_SYNC``, else collective; README "Many
    processes / collectives")."""
    import os

    import numpy as np

    from .. import data as D
    from .. import runtime as lr
    from ..optimizer import Machine
    from ..probe.overhead import background_cores, cpu_clock
    from ..runtime.mpi import allgather
    from . import build

    model = build(name, batch_size=batch_size, scale=scale, seed=seed, **sizes)
    b = model.batch_size
    pool = max(1, min(steps, DATA_BATCHES))
    xs, y = D.for_model(model, pool * b, seed=seed, text=text)
    model.compile(optimizer=optimizer or default_optimizer(name),
                  loss="sparse_categorical_crossentropy", strategy=strategy, sync=sync)
    if checkpoint is not None and os.path.exists(checkpoint):
        model.load(checkpoint)
    start = model.step
    losses: list[float] = []
    stamps: list[float] = []  # when each step finished here (History.step_finished)
    probes: list[float] = []  # the host-speed probe after each (probe/hostspeed.py)
    model.probe_host = True

    def on_step(step: int, logs: dict) -> None:
        losses.append(float(logs.get("loss", 0.0)))
        if log is not None:
            log(start + len(losses) - 1, losses[-1])

    ck = {"checkpoint": checkpoint, "checkpoint_every": checkpoint_every}
    verbose = int(progress and lr.get_runtime().rank == 0)

    def run(first: int, count: int, **kw: Any) -> None:
        """Steps ``first .. first + count - 1``, step k on batch k % pool:
        full passes over the pool (rotated to start at ``first``) as one
        fit's epochs, the rest as one more fit."""
        k = (first % pool) * b
        rx = [np.concatenate([x[k:], x[:k]]) if k else x for x in xs]
        ry = np.concatenate([y[k:], y[:k]]) if k else y
        passes, rest = divmod(count, pool)
        for epochs, n in ((passes, pool), (1 if rest else 0, rest)):
            if epochs:
                model._batch = 0  # the batches are sliced here
                h = model.fit([x[:n * b] for x in rx], ry[:n * b], epochs=epochs,
                              shuffle=False, on_step=on_step, **ck, **kw)
                stamps.extend(t for t, _ in h.step_finished)
                probes.extend(h.host_probe)

    # The first step alone (it pays for first-touch allocation), then the
    # rest in as few fit calls as the pool allows (one, up to DATA_BATCHES
    # steps) so each step's launch overlaps the previous one.
    from ..interrupt import deferred_interrupt

    with deferred_interrupt("train"):  # Ctrl-C between the fits stops the next one
        t0 = time.perf_counter()
        if start == 0:
            run(0, 1, verbose=0)
        t1 = time.perf_counter()
        c1 = cpu_clock()
        done = max(start, 1)
        if steps > done:
            run(done, steps - done, verbose=verbose)
    lr.fence()
    end = time.perf_counter()
    bg = background_cores(c1, cpu_clock())
    ran = len(losses)
    timed, span = (ran - 1, end - t1) if start == 0 and ran > 1 else (ran, end - t0)
    rt = lr.get_runtime()
    # the steady state: the period of the steps after the first three (the first
    # touches memory, the traced loop records its first two steps), as
    # measure_runtime times it; all of them when the run is shorter
    k = 3 if len(stamps) > 5 else 0
    steady = ((stamps[-1] - stamps[k]) / (len(stamps) - 1 - k) if len(stamps) > k + 1
              else span / max(timed, 1))
    model.probe_host = False
    # how fast the host ran Python over those steps (the slowest rank's)
    window = probes[k + 1:] if len(probes) > k + 1 else probes
    host = max((p for p in allgather(sum(window) / len(window) if window else None)
                if p is not None), default=None)
    sim = predict(model, steady, bg) if predict is not None else {}
    picked = model.strategy.named_as(model.graph, Machine.local()) \
        if strategy == "search" else None
    return {**sim, "model": name, "strategy": strategy if isinstance(strategy, str) else "given",
            "picked": picked,
            "steps": steps, "batch_size": b, "devices": len(rt.devices),
            "ranks": 1 + max(d.rank for d in rt.devices), "parameters": model.num_parameters(),
            "resumed_from_step": start, "checkpoint": checkpoint,
            "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None, "losses": losses,
            "samples_per_s": timed * b / max(span, 1e-9), "seconds": end - t0,
            "measured_iteration_s": steady, "background_cores": bg, "host_probe_s": host,
            "cuda_graphs": {**{k: rt.tracer.graphs.stats[k]
                               for k in ("captured", "launched", "replaced")},
                            "off_because": rt.tracer.graphs.why_off}}


def parse_sizes(pairs: list[str]) -> dict[str, Any]:
    """``["hidden=128", "width=0.5", "blocks=1,1,1,1"]`` -> typed keyword sizes."""
    from ..errors import ModelError

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep:
            raise ModelError(f"--size takes KEY=VALUE, got {pair!r}")
        try:
            vals = [float(v) if "." in v or "e" in v.lower() else int(v)
                    for v in val.split(",")]
        except ValueError:
            raise ModelError(f"size {pair!r}: {val!r} is not a number or comma-separated "
                             "numbers; pass e.g. hidden=128 or blocks=1,1,1,1") from None
        if not key.strip():
            raise ModelError(f"--size {pair!r} has no KEY; pass KEY=VALUE, e.g. hidden=128")
        out[key.replace("-", "_")] = tuple(vals) if "," in val else vals[0]
    return out


def train_from_args(name: str, args: Any, log: Callable[[int, float], None] | None = None,
                    predict: Callable[..., dict] | None = None,
                    progress: bool = False) -> dict[str, Any]:
    """:func:`train` with :func:`legionpy.commands.args.add_train_arguments`' values."""
    from ..nn import Adam

    opt = Adam(lr=args.lr) if args.lr else None
    return train(name, strategy=args.strategy, steps=args.steps, batch_size=args.batch_size,
                 scale=args.scale, text=args.text, seed=args.seed, optimizer=opt, log=log,
                 checkpoint=getattr(args, "checkpoint", None),
                 checkpoint_every=getattr(args, "checkpoint_every", None),
                 predict=predict, progress=progress, sync=getattr(args, "sync", None),
                 **parse_sizes(args.size))
