"""``Model``: the layer API (DESIGN.md section 3; FlexFlow's FFModel).

Building a model only builds an operator graph (:class:`legionpy.optimizer.Graph`;
the layer methods are the graph's, same names and signatures), so a model at
full size allocates nothing. ``compile`` fixes the loss, metrics, optimizer
and a parallelization strategy, creates the regions, writes the seeded
initial parameters and installs the StrategyMapper; ``fit`` / ``evaluate`` /
``predict`` then run steps through :class:`legionpy.nn.execution.Executor`.

>>> import numpy as np, legionpy as lp
>>> m = lp.nn.Model(batch_size=4)
>>> y = m.softmax(m.dense(m.input((3,)), 2))
>>> m.num_parameters()
8
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import time
from typing import Any

import numpy as np

from .. import progress
from ..errors import ModelError, StrategyError
from ..mapper.resolve import resolve_strategy
from ..optimizer import Graph, Machine, Strategy
from ..probe.hostspeed import speed_probe
from ..runtime import gather_maps
from . import execution
from .data import DataLoader, shard
from .execution import Executor
from .losses import check_loss, check_metrics
from .optimizers import SGD, as_optimizer

__all__ = ["Model", "History", "LAYERS"]

LAYERS = ("input", "conv2d", "pool2d", "dense", "flat", "reshape", "relu", "sigmoid", "tanh",
          "gelu", "batch_norm", "dropout", "concat", "add", "multiply", "softmax", "embedding",
          "batch_matmul", "lstm", "attention", "layer_norm", "transpose", "slice", "scale",
          "add_bias", "layer_scale", "concat_param", "positional_encoding",
          "multihead_attention", "unary", "binary", "reduce", "pad", "cast", "gather", "tied_dense")
_ids = itertools.count()


class History(dict):
    """``{"loss": [per epoch], metric: [...], "samples_per_s": [...]}``; also
    ``.history`` (Keras). ``step_finished``: for each step, in order, when
    ``fit`` saw it finish on this rank, as ``(time.perf_counter(),
    time.thread_time())`` of the calling (control) thread: the steady-state
    step time is their spacing. While the runtime counts its tasks' CPU
    time (:meth:`~legionpy.runtime.core.Runtime.count_span_cpu`, as
    :func:`legionpy.measure.measure_runtime` does; else both stay empty):
    ``device_cpu``, at the same moments, the CPU seconds each of this rank's
    device workers had used (``{device id: seconds}``,
    :meth:`legionpy.runtime.core.Runtime.worker_cpu`: a worker's wall time
    less its CPU time is what it waited for a core or the interpreter lock),
    and ``device_span_cpu``, the same of their tasks' bodies alone; and
    ``host_probe``, after each step's stamp, the CPU seconds of a fixed piece
    of interpreter work (:func:`legionpy.probe.hostspeed.speed_probe`: how
    fast the host ran Python then; also while ``Model.probe_host`` is set).
    Under ``mpirun`` a step's results (and ``on_step``) arrive later, in
    batches (``MPI_RESULTS_EVERY``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_finished: list[tuple[float, float]] = []
        self.device_cpu: list[dict[int, float]] = []
        self.device_span_cpu: list[dict[int, float]] = []
        self.host_probe: list[float] = []

    @property
    def history(self) -> dict:
        return self


class Model:
    """``Model(batch_size, seed=0, name="model")``; see the module docstring."""

    def __init__(self, batch_size: int, seed: int = 0, name: str = "model") -> None:
        for what, v, low in (("batch_size", batch_size, 1), ("seed", seed, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ModelError(f"Model({what}={v!r}): {what} must be an integer >= {low}")
        self.graph = Graph(batch_size, name=name)
        self.seed = int(seed)
        self.id = next(_ids)
        self.strategy = None
        self._ex: Executor | None = None
        self._step = 0
        self._epoch = 0  # completed epochs
        self._batch = 0  # batches done in the epoch fit is in
        #: run the host-speed probe after every step (``History.host_probe``),
        #: as while ``measure_runtime`` measures; ``legionpy train`` sets it
        self.probe_host = False

    @property
    def batch_size(self) -> int:
        return self.graph.batch_size

    @property
    def step(self) -> int:
        """Training steps run since compile (or as restored by :meth:`load`)."""
        return self._step

    @property
    def epoch(self) -> int:
        """Completed epochs since compile (or as restored by :meth:`load`); a
        ``fit`` stopped mid-epoch finishes that epoch first when called again."""
        return self._epoch

    def num_parameters(self) -> int:
        return self.graph.num_parameters()

    def summary(self) -> str:
        return self.graph.summary()

    # -- compile ----------------------------------------------------------------------
    def compile(self, optimizer: Any = None, loss: str = "sparse_categorical_crossentropy",
                metrics: Any = (), strategy: Any = "data", machine: Any = None,
                sync: str | None = None) -> Model:
        """Fix optimizer, loss, metrics and strategy ("data" | "model" | "owt" |
        "search" | Strategy | JSON path) for ``machine`` (default: this runtime's
        devices, ``Machine.local``). Creates the regions and initial parameters.
        ``sync``: gradient synchronisation, ``"collective"`` or ``"shards"``
        (default: the strategy's ``sync``, else ``LEGIONPY_SYNC``, else
        collective; README "Many processes / collectives")."""
        from .. import runtime as lr

        if not self.graph.ops:
            raise ModelError("compile: the model has no layers; add model.input(...) and layers")
        last = self.graph.ops[-1]
        self.loss = check_loss(loss, last)
        self.metrics = check_metrics(metrics, self.loss, last)
        self.optimizer = as_optimizer(optimizer if optimizer is not None else SGD())
        rt = lr.get_runtime()
        machine = machine or Machine.local(len(rt.devices))
        self.strategy = self._consult(rt, machine, strategy)
        if {"accuracy", "crossentropy"} & set(self.metrics) and \
                self.strategy[last.name].degrees[-1] > 1:
            raise ModelError(f"metrics {self.metrics} need whole output rows but the strategy "
                             f"splits the last dim of {last.name!r}")
        # replayed steps run in the machine's simulated order
        self._ex = Executor(self.graph, self.strategy, self.optimizer, self.loss, self.metrics,
                            self.seed, self.id, sync=sync, machine=machine)
        self._nops = len(self.graph.ops)
        self._step = self._epoch = self._batch = 0
        return self

    def _consult(self, rt: Any, machine: Any, spec: Any) -> Any:
        """The strategy, op by op, from the runtime's mapper (DESIGN.md section
        3): ``select_parallel_config(op, graph, machine)`` for every op. An
        answer is kept; ``None`` (the default) leaves the op to the optimizer:
        ``spec`` -- search (cached), a named baseline, a file or a Strategy.
        The runtime's own DefaultMapper becomes a ConsultingMapper (the same
        policy for other launches, plus the optimizer's answers); a mapper the
        user installed stays installed. A StrategyMapper (the consulting and
        adaptive ones, or a user's subclass) then places every point by the
        strategy; any other user mapper places the points itself."""
        from ..mapper import DefaultMapper, StrategyMapper
        from ..mapper.consult import ConsultingMapper
        from ..optimizer import ParallelConfig

        mapper = rt.mapper
        if type(mapper) is DefaultMapper:
            mapper = ConsultingMapper()
            rt.set_mapper(mapper)
        planned = None
        if isinstance(mapper, StrategyMapper):
            planned = mapper.consult(self, machine, spec, model_id=self.id)
        configs, answered = {}, []
        for op in self.graph.ops:
            c = mapper.select_parallel_config(op, self.graph, machine)
            if c is None:
                if planned is None:
                    planned = resolve_strategy(spec, self.graph, machine)
                c = planned[op.name]
            elif not isinstance(c, ParallelConfig):
                raise ModelError(f"{type(mapper).__name__}.select_parallel_config returned "
                                 f"{c!r} for op {op.name!r}; return a ParallelConfig, or None "
                                 "to let the optimizer decide")
            elif planned is None or c != planned[op.name]:
                answered.append(op.name)
            configs[op.name] = c
        # the planned strategy's pipeline (stages, micro-batches) stays with its configs
        s = Strategy(configs, self.graph.name, machine.name,
                     getattr(planned, "pipeline", None))
        if planned is not None and s == planned:
            return planned
        try:
            s = resolve_strategy(s, self.graph, machine)
        except StrategyError as e:
            raise StrategyError(f"{type(mapper).__name__}.select_parallel_config answered "
                                f"ops {answered[:5]}: {e}") from None
        if isinstance(mapper, StrategyMapper):
            mapper.add(self.id, self.graph, s)
        return s

    def set_strategy(self, strategy: Any, machine: Any = None) -> None:
        """Change the strategy of a compiled model between steps: the next
        launches use the new partitions and placements, the data (parameters,
        optimizer state) stays in its regions and moves where the new tiles
        need it, so training continues with the same numbers."""
        from .. import runtime as lr

        ex = self._exec("set_strategy")
        machine = machine or Machine.local(len(lr.get_runtime().devices))
        self.strategy = resolve_strategy(strategy, self.graph, machine)
        ex.set_strategy(self.strategy)

    def _exec(self, what: str) -> Executor:
        if self._ex is None:
            raise ModelError(f"{what} before compile: call model.compile(optimizer=..., "
                             "loss=..., strategy=...) first")
        if len(self.graph.ops) != self._nops:
            raise ModelError(f"{what}: layers were added after compile; call compile again")
        self._ex.check_runtime()
        return self._ex

    # -- data ---------------------------------------------------------------------------
    def _inputs(self, x: Any, what: str) -> list[np.ndarray]:
        ins = [op for op in self.graph.ops if op.kind == "input"]
        xs = list(x) if isinstance(x, (list, tuple)) else [x]
        if len(xs) != len(ins):
            raise ModelError(f"{what}: the model has {len(ins)} input(s) "
                             f"{[o.name for o in ins]} but got {len(xs)} array(s)")
        out = []
        for a, op in zip(xs, ins):
            a = np.asarray(a)
            want = op.output_shape[1:]
            if a.ndim != len(want) + 1 or a.shape[1:] != want:
                raise ModelError(f"{what}: input {op.name!r} takes arrays of shape (N, "
                                 f"{', '.join(map(str, want))}), got {a.shape}; reshape the "
                                 "data or change model.input(...)")
            out.append(a.astype(op.dtype, copy=False))
        n = {len(a) for a in out}
        if len(n) != 1:
            raise ModelError(f"{what}: input arrays have different sample counts {sorted(n)}")
        return out

    def _targets(self, y: Any, n: int, what: str) -> np.ndarray:
        y = np.asarray(y)
        last = self.graph.ops[-1]
        if self.loss == "sparse_categorical_crossentropy" and len(last.output_shape) > 2:
            want_s = last.output_shape[1:-1]  # sequence output: one label per position
            ok = y.shape[1:] == want_s
            y = y.astype(np.int64) if ok else y
            want = f"(N, {', '.join(map(str, want_s))}) integer labels"
        elif self.loss == "sparse_categorical_crossentropy":
            ok = y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)
            y = y.reshape(-1).astype(np.int64) if ok else y
            want = "(N,) integer class labels"
        else:
            ok = y.shape[1:] == last.output_shape[1:]
            y = y.astype(last.dtype, copy=False)
            want = f"(N, {', '.join(map(str, last.output_shape[1:]))})"
        if not ok or len(y) != n:
            raise ModelError(f"{what}: targets for loss {self.loss!r} must have shape {want} "
                             f"with N = {n}, got {y.shape}")
        return y

    def _shards(self, xs: list[np.ndarray]) -> list[dict]:
        ex = self._ex
        return [shard(x, pl.tiles) for x, pl in
                zip(xs, [p for p in ex.plans if p.op.kind == "input"])]

    # -- training -------------------------------------------------------------------------
    def fit(self, x: Any, y: Any, epochs: int = 1, batch_size: int | None = None,
            verbose: int = 1, shuffle: bool = True, on_step: Any = None,
            checkpoint: str | os.PathLike | None = None,
            checkpoint_every: int | None = None) -> History:
        """Train ``epochs`` passes over ``(x, y)`` in batches of the model's
        batch size (the last partial batch is dropped); a model stopped or
        restored mid-epoch finishes that epoch as the first of them. Shows a
        tqdm bar with samples/s, loss and metrics when ``verbose`` and stderr
        is a terminal. Returns a History whose ``step_loss`` lists every
        step's loss; ``on_step(step, logs)`` is called as each step's results
        arrive (one step behind the launches; under ``mpirun``, in batches of
        :data:`~legionpy.nn.execution.MPI_RESULTS_EVERY` steps, each batch one
        exchange between the ranks).

        ``checkpoint``: a file :meth:`save` writes every ``checkpoint_every``
        steps (if given), at the end and on Ctrl-C. Ctrl-C stops at the next
        step boundary (on every MPI rank at the same step) and raises
        :class:`~legionpy.errors.Interrupted`; ``load`` then ``fit`` continues
        the run exactly."""
        from ..errors import Interrupted
        from ..interrupt import deferred_interrupt

        ex = self._exec("fit")
        self._check_batch(batch_size)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ModelError(f"fit: epochs must be an integer >= 1, got {epochs!r}")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int)
                                             or checkpoint_every < 1):
            raise ModelError(f"fit: checkpoint_every must be an integer >= 1, got "
                             f"{checkpoint_every!r}")
        if checkpoint_every is not None and checkpoint is None:
            raise ModelError("fit: checkpoint_every needs checkpoint=PATH")
        xs = self._inputs(x, "fit")
        y = self._targets(y, len(xs[0]), "fit")
        loader = DataLoader(xs, y, self.batch_size, shuffle, self.seed)
        if len(loader) == 0:
            raise ModelError(f"fit: {len(y)} samples make no batch of {self.batch_size}")
        if self._batch >= len(loader):  # restored at the end of an epoch of other data
            self._epoch, self._batch = self._epoch + 1, 0
        hist = History()
        with deferred_interrupt("fit") as stop, _old_objects_frozen():
            for e in range(epochs):
                loader.epoch, loader.skip = self._epoch, self._batch
                bar = None
                if verbose:
                    bar = progress.bar(total=(len(loader) - self._batch) * self.batch_size,
                                       unit="sample", desc=f"epoch {e + 1}/{epochs}",
                                       leave=True)
                sums, seen, t0 = self._fit_epoch(ex, loader, bar, hist, on_step, stop,
                                                 checkpoint, checkpoint_every)
                means = self._means(sums, seen, t0)
                for k, v in means.items():
                    hist.setdefault(k, []).append(v)
                if bar is not None:
                    bar.set_postfix({k: v for k, v in means.items() if k != "samples_per_s"})
                    bar.close()
                if self._batch == len(loader):
                    self._epoch, self._batch = self._epoch + 1, 0
                if stop.stopped:
                    break
        if checkpoint is not None:
            self.save(checkpoint)
        if stop.stopped:
            where = f"; saved {os.fspath(checkpoint)}" if checkpoint is not None else ""
            raise Interrupted(f"fit stopped after step {self._step} (epoch {self._epoch}, "
                              f"batch {self._batch}){where}")
        return hist

    def _fit_epoch(self, ex: Any, loader: Any, bar: Any, hist: History, on_step: Any,
                   stop: Any, checkpoint: Any, every: int | None
                   ) -> tuple[dict[str, float], int, float]:
        """One pass over ``loader``: (summed results, steps, start time).

        Step i+1 is launched before step i's results are waited for, so the
        launching thread's analysis overlaps the devices' work (the runtime
        orders the steps by their region dependences). A mapper with an
        ``after_step`` hook sees every step synchronously instead. Between
        steps: a checkpoint every ``every`` steps, and a stop on Ctrl-C
        (``stop.stopped`` is then set)."""
        sums: dict[str, float] = {}
        t0, seen = time.perf_counter(), 0

        def consume(results: list) -> None:
            nonlocal seen
            step: dict[str, float] = {}
            for r in results:
                for k, v in r.items():
                    step[k] = step.get(k, 0.0) + v
            for k, v in step.items():
                sums[k] = sums.get(k, 0.0) + v
            hist.setdefault("step_loss", []).append(step.get("loss", 0.0))
            if on_step is not None:
                on_step(len(hist["step_loss"]) - 1, step)
            seen += 1
            if bar is not None:
                bar.update(self.batch_size)
                post = self._means(sums, seen, t0)
                post.pop("samples_per_s")  # tqdm shows the rate itself
                bar.set_postfix(post, refresh=False)

        # under mpirun a step's results are an exchange between the ranks
        # (FutureMap.collective): the finished steps wait here, and one
        # exchange every MPI_RESULTS_EVERY steps brings them all; in one
        # process each step's results are taken as it finishes
        unsent: list = []

        def finished(fm: Any, now: bool = False) -> None:
            fm.wait()  # this rank's points: the launches stay one step ahead
            hist.step_finished.append((time.perf_counter(), time.thread_time()))
            if ex.rt.counting_span_cpu:  # measuring (measure_runtime): kept per step
                hist.device_cpu.append(ex.rt.worker_cpu())
                hist.device_span_cpu.append(ex.rt.worker_span_cpu())
            if ex.rt.counting_span_cpu or self.probe_host:
                hist.host_probe.append(speed_probe())
            unsent.append(fm)
            if now or not fm.collective or len(unsent) >= execution.MPI_RESULTS_EVERY:
                flush()

        def flush() -> None:
            for results in gather_maps(unsent):
                consume(results)
            unsent.clear()

        pending = None
        for xb, yb, _ in loader:
            fm = ex.train_step(self._shards(xb), yb, self._step)
            self._step += 1
            self._batch += 1
            hook = getattr(ex.rt.mapper, "after_step", None)
            if pending is not None:
                finished(pending)
                pending = None
            if hook is not None:  # e.g. AdaptiveMapper: sees this step's trace
                finished(fm, now=True)
                hook(self)  # may call set_strategy
            else:
                pending = fm
            if stop.agreed():
                stop.stopped = True
                break
            if every is not None and self._step % every == 0:
                flush()  # the history is complete up to the checkpoint
                self.save(checkpoint)
        if pending is not None:
            finished(pending)
        flush()
        return sums, seen, t0

    def _means(self, sums: dict, steps: int, t0: float) -> dict[str, float]:
        out = {"loss": sums.get("loss", 0.0) / max(steps, 1)}
        for m in self.metrics:
            out[m] = sums.get(m, 0.0) / max(steps * self.batch_size, 1)
        out["samples_per_s"] = steps * self.batch_size / max(time.perf_counter() - t0, 1e-9)
        return out

    def _check_batch(self, batch_size: int | None) -> None:
        if batch_size is not None and int(batch_size) != self.batch_size:
            raise ModelError(f"batch_size={batch_size} differs from the model's batch size "
                             f"{self.batch_size} (fixed by Model(batch_size=...), which the "
                             "strategy partitions); build the model with that batch size")

    def predict(self, x: Any, batch_size: int | None = None) -> np.ndarray:
        """Outputs of the last op for every sample of ``x`` (forward only)."""
        ex = self._exec("predict")
        self._check_batch(batch_size)
        xs = self._inputs(x, "predict")
        outs = []
        for xb, _, real in DataLoader(xs, None, self.batch_size, pad=True):
            ex.forward(self._shards(xb), self._step, False)
            outs.append(ex.output()[:real])
        return np.concatenate(outs)

    def evaluate(self, x: Any, y: Any, batch_size: int | None = None,
                 verbose: int = 0) -> dict[str, float]:
        """``{"loss": mean loss, metric: value}`` over every sample (forward only)."""
        from ..ops.execute import loss_gradient
        from .losses import metric_sums

        p = self.predict(x, batch_size)
        y = self._targets(y, len(p), "evaluate")
        last = self.graph.ops[-1]
        sparse = self.loss == "sparse_categorical_crossentropy"
        loss = loss_gradient(self.loss, last, last.output_rect, p, y, len(p))[0]
        feats = int(np.prod(last.output_shape[1:]))
        out = {"loss": loss}
        for k, v in metric_sums(self.metrics, p, y, sparse, feats).items():
            out[k] = v / len(p)
        if verbose:
            print(" - ".join(f"{k}: {v:.4f}" for k, v in out.items()))
        return out

    # -- parameters and checkpoints ---------------------------------------------------------
    def parameters(self) -> dict[str, np.ndarray]:
        """``{name: array}`` of every parameter, gathered with Region.read."""
        ex = self._exec("parameters()")
        return {n: r.read("w") for n, r in ex.pregions.items()}

    def buffers(self) -> dict[str, np.ndarray]:
        """``{"op.running_mean": array, "op.running_var": array}`` of every
        batch norm: the running statistics ``predict``/``evaluate`` use,
        updated by every ``fit`` step with the layer's momentum."""
        ex = self._exec("buffers()")
        ex.fold_running_stats()
        return {f"{op}.{k}": v.copy() for op, b in ex.buffers.items() for k, v in b.items()}

    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint to ``path`` (.npz) atomically: parameters,
        optimizer state, step, epoch and strategy, everything ``load`` then
        ``fit`` needs to continue the run exactly (:mod:`legionpy.nn.checkpoint`).
        A crash mid-save leaves the previous file intact."""
        from . import checkpoint

        checkpoint.save(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by :meth:`save` into this compiled
        model (same layers); the next ``fit`` continues where the saved run
        stopped. Raises :class:`~legionpy.errors.CheckpointError` naming the
        file when it is missing, corrupt or another model's."""
        from . import checkpoint

        checkpoint.load(self, path)


def _delegate(name: str):
    meth = getattr(Graph, name)

    @functools.wraps(meth)
    def layer(self: Model, *args: Any, **kwargs: Any) -> Any:
        if self._ex is not None:
            self._nops = -1  # force a new compile
        return meth(self.graph, *args, **kwargs)

    return layer


for _name in LAYERS:
    setattr(Model, _name, _delegate(_name))


@contextlib.contextmanager
def _old_objects_frozen() -> Any:
    """Keep the cyclic garbage collector off the objects that exist when
    training starts (the model, its regions and plans, the runtime's state):
    ``gc.freeze()`` until the end of ``fit``.
    Without it a full (generation 2) collection scans all of them: 30-80 ms
    pauses in a 5-10 ms step were measured in a process that had trained
    several models (issue 26), time no step needs; the garbage each step
    makes is still collected, young. ``gc.unfreeze()`` after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
