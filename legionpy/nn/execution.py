"""Execution of a compiled model: regions, partitions and index launches,
exactly as DESIGN.md section 2 describes the iteration task graph.

Regions (created once, at compile):

- one per operator output tensor, fields ``val`` and ``grad`` (input
  operators: ``val`` only);
- one per parameter, fields ``w``, ``g`` and the optimizer's state fields
  (``m``, ``v``).

Partitions, for operator ``o`` with config ``c`` (tile ``k`` = color ``k`` of
the row-major degree grid, on ``c.devices[k]``):

- output: ``Partition.equal(region(o), c.degrees)``;
- input ``i`` from producer ``p``: ``Partition.by_rects(region(p),
  {color_k: op.input_rect(i, tile_k)})`` (aliased, halos included; a view's
  rect is mapped to the producer's coordinates);
- parameter ``w``: ``Partition.by_rects(region(w), {color_k:
  op.weight_rect(w, tile_k)})`` (aliased: replicas);
- updates: ``Partition.by_rects(region(w), {(t,): shard_t})`` over the
  update shards of the distinct weight tiles (disjoint; a tile used by the
  devices ``U`` is cut into ``min(|U|, extent)`` shards along its largest
  dim, shard ``c`` homed on ``U[c]``), from
  :func:`legionpy.mapper.weight_tiles` / ``update_points``.

One training step launches, in this order (every launch an index launch
with ``LaunchOptions(name, kind, tag=(name, phase, model id))`` so the
StrategyMapper puts point ``k`` on ``c.devices[k]`` and the trace names each
point task by (phase, op or parameter, point index)):

0. ``lp.fill(region(o), "grad", 0)`` for every non-input operator (lazy: no
   task runs, the zeros materialise in the first reader's prologue);
1. ``F(o)`` for every operator in graph order: ``WD(val)`` on its output
   tile, ``R(val)`` on each input rect, ``R(w)`` on each weight rect. An
   input operator's F writes its shard of the host batch, passed by value;
2. ``B(o)`` for every non-input operator in reverse graph order:
   ``R(val, grad)`` on its output tile (the last operator: ``R(val)`` and the
   targets by value; it computes the loss, returned as the task's result
   with the metric sums), ``R(val) + Reduce("+", grad)`` on each input rect
   and ``R(w) + Reduce("+", g)`` on each weight rect;
3. ``U(w)`` for every parameter in first-use order: ``RW`` on ``w``, ``g``
   and the optimizer state over each update shard, on its home (so the
   replicas' gradients are reduce-scattered to the shard homes and the
   updated shards all-gathered by the next forward's reads).
   Embedding tables are updated SPARSELY: U applies the optimizer only to
   the rows whose summed gradient is nonzero (the ids of this batch), so
   the update's work is proportional to the tokens used, not the vocabulary
   (PyTorch's ``sparse=True`` + SparseAdam semantics: momentum/Adam state of
   unused rows is left untouched; plain SGD is identical to a dense update).
   The row set is the union of the batch's ids whatever the strategy, so
   strategy invariance holds. The gradient itself still travels as the
   dense ``g`` tile (a region field), exactly as the simulator counts it.

The runtime's dependence and coherence analysis then yields the section 2
graph (docs/taskgraph.md): copies of producer tiles into halos and of
weight shards from their homes to the other users; per-task reduction
buffers (folded by the readers) for overlapping input gradients and for
weight gradients, copied to the shard homes before U.

Per-tile state between F and B (see :mod:`legionpy.ops.execute`) is kept in
``OpPlan.cache[k]``; F(o,k) and B(o,k) run on one device, in that order.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np

from .. import runtime as lr
from ..collectives import SYNC_MODES, resolve_sync
from ..errors import ModelError, StrategyError
from ..geometry import Rect
from ..mapper import StrategyMapper, update_points, weight_tiles
from ..ops.execute import Tile, check_tiling, loss_gradient, tile_backward, tile_forward
from ..ops.kernels.common import like
from ..optimizer.graph import sparse_params
from ..pipeline import device_major, launches, micro_of, recomputes
from ..regions import RW, WD, Partition, R, Reduce, Region
from ..runtime import FutureMap, LaunchOptions, TaskFunction
from .init import initial_value
from .losses import metric_sums

__all__ = ["Executor", "OpPlan", "SLOW_DEVICES", "SYNC_MODES", "sparse_params",
           "MPI_RESULTS_EVERY"]

#: under ``mpirun`` the results of training steps (``fit``'s loss and
#: metrics, batch norm's batch statistics) are an exchange between the ranks
#: (``FutureMap.collective``), made once every this many steps, not every
#: step: a per-step exchange kept each rank's control thread polling beside
#: its worker on the rank's bound core (lenet data on ``mpirun -n 2``:
#: 4.2-4.5 ms a step, 3.4-3.5 ms without; issue 26), and it is a collective
#: over every rank of the job. ``on_step``, the history and the bar see the
#: results when they arrive. Read at each step (bench/mpi_results.py sets 1,
#: the exchange every step, as its baseline).
MPI_RESULTS_EVERY = 16



def _parse_slow(spec: str) -> dict[int, float]:
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        dev, _, factor = part.partition("=")
        try:
            out[int(dev)] = float(factor)
        except ValueError:
            raise ModelError(f"LEGIONPY_SLOW_DEVICES: {part!r} is not DEVICE=FACTOR "
                             "(e.g. LEGIONPY_SLOW_DEVICES=3=4.0)") from None
    return out


#: Test/benchmark hook, ``{device id: factor}``: every forward/backward tile
#: task placed on that device sleeps ``(factor - 1)`` times its own compute
#: time after computing, as if the device ran ``factor`` times slower (a
#: throttled GPU, a co-located job). The sleep is inside the task, so the
#: runtime trace shows the longer task on that device. Read from
#: ``LEGIONPY_SLOW_DEVICES="3=4,1=2"`` at import; tests set it directly.
SLOW_DEVICES: dict[int, float] = _parse_slow(os.environ.get("LEGIONPY_SLOW_DEVICES", ""))


def _throttle(device: int, t0: float) -> None:
    f = SLOW_DEVICES.get(device)
    if f and f > 1:
        time.sleep((f - 1.0) * (time.perf_counter() - t0))


def _stand_in(ex: Any, name: str) -> None:
    time.sleep(ex.standin.get(name, 0.0))


def initial_buffers(op: Any) -> dict[str, np.ndarray]:
    """Batch norm's running statistics before training: ``op.initial_state``
    when a front end imported them, else zeros and ones (PyTorch)."""
    c = op.output_shape[1]
    init = getattr(op, "initial_state", None) or {}
    return {"running_mean": np.array(init.get("running_mean", np.zeros(c)), np.float32),
            "running_var": np.array(init.get("running_var", np.ones(c)), np.float32)}


def _drop_axis(a: Any, view: tuple[int, int] | None) -> Any:
    """The array of a view input (its fixed axis has extent 1 in the rect)."""
    if view is None:
        return a
    return a[(slice(None),) * view[0] + (0,)]


class OpPlan:
    """Partitions, tasks and per-tile state of one operator."""

    def __init__(self, ex: Executor, op: Any, cfg: Any) -> None:
        self.op, self.cfg = op, cfg
        check_tiling(op, cfg.degrees)
        #: points (output tile, reduction slice r of ``red``); ``red > 1``: the
        #: points of a tile write partial sums with Reduce("+") (ParallelConfig.reduce)
        self.red = red = cfg.reduce
        pts = cfg.points(op)
        self.tiles, self.parts = [t for t, _ in pts], [r for _, r in pts]
        if red == 1:
            self.out = Partition.equal(ex.regions[op.name], cfg.degrees)
        else:
            self.out = Partition.by_rects(ex.regions[op.name],
                                          {(m,): t for m, t in enumerate(self.tiles)})
        self.colors = self.out.colors
        self.index = {c: k for k, c in enumerate(self.colors)}
        self.ins = []
        for i, ref in enumerate(op.inputs):
            rects = {c: ref.to_base(op.part_input_rect(i, t, r, red))
                     for c, (t, r) in zip(self.colors, pts)}
            self.ins.append(Partition.by_rects(ex.regions[ref.op.name], rects))
        self.pnames = list(op.params)
        cs = ex.csync
        #: collective sync: per parameter, per point, how the point's flat
        #: slice is viewed as its weight rect (nn/sync.py); None: shards
        self.wviews: list | None = None
        if cs is None:
            self.ws = [Partition.by_rects(ex._pregions[op.params[n].name],
                                          {c: op.part_weight_rect(n, t, r, red)
                                           for c, (t, r) in zip(self.colors, pts)})
                       for n in self.pnames]
        else:
            self.ws, self.wviews = [], []
            for n in self.pnames:
                pn = op.params[n].name
                got = [cs.weight_rect(pn, op.part_weight_rect(n, t, r, red), cfg.devices[k])
                       for k, (t, r) in enumerate(pts)]
                reg = cs.regions[cs.where[(pn, cs.tiles[pn][0].rect)][0].b]
                self.ws.append(Partition.by_rects(reg, {c: fr for c, (fr, _) in
                                                        zip(self.colors, got)}))
                self.wviews.append([v for _, v in got])
        self.need = [ref.op.has_backward for ref in op.inputs]
        self.views = [ref.view for ref in op.inputs]
        self.cache: dict[int, dict] = {}
        self.buffers: dict = {}
        self.is_last = op is ex.graph.ops[-1]
        #: pipelined (docs/pipeline.md): the colors of each micro-batch's points
        self.micro: list[list] = []
        #: per micro-batch: (F options, B options) naming each point by its
        #: index in the op's config (the trace's ``launch``: ``F:op[k]``)
        self.micro_opts: list[tuple] = []
        pipe = ex.pipe
        #: backward recomputes the forward's state (a recomputing stage)
        self.recompute = pipe is not None and recomputes(ex.graph, pipe)[op.index]
        if pipe is not None:
            coarse = ex.strategy[op.name]
            self.micro = [[] for _ in range(pipe.microbatches)]
            for k, c in enumerate(self.colors):
                self.micro[micro_of(op, coarse.degrees, cfg.degrees, k, red,
                                    ex.pipe_major)].append(c)
        n = op.name
        self.f_opts = LaunchOptions(f"F({n})", "compute", (n, "F", ex.model_id))
        self.b_opts = LaunchOptions(f"B({n})", "compute", (n, "B", ex.model_id))
        for cs in self.micro:
            ks = tuple(self.index[c] for c in cs)
            self.micro_opts.append((LaunchOptions(f"F({n})", "compute", (n, "F", ex.model_id), ks),
                                    LaunchOptions(f"B({n})", "compute", (n, "B", ex.model_id), ks)))
        outw = WD("val") if red == 1 else Reduce("+", "val")
        #: pipelined: every point also writes its device's element of the
        #: schedule token, so each device's points depend on one another in
        #: the schedule's order (the simulator's chain, docs/pipeline.md)
        self.tok = None
        tok = []
        if pipe is not None:
            self.tok = Partition.by_rects(ex.token, {c: Rect((d,), (d + 1,)) for c, d in
                                                     zip(self.colors, cfg.devices)})
            tok = [RW("t")]
        self.f_task = TaskFunction(self._forward, [outw] + [R("val")] * len(op.inputs)
                                   + [R("w")] * len(self.pnames) + tok, name=f"F({n})")
        if op.has_backward:
            outp = R("val") if self.is_last else R("val", "grad") if red == 1 else R("grad")
            inp = [R("val") + Reduce("+", "grad") if nd else R("val") for nd in self.need]
            wp = [R("w") + Reduce("+", "g")] * len(self.pnames)
            self.b_task = TaskFunction(self._backward, [outp] + inp + wp + tok, name=f"B({n})")
        self.ex = ex

    def args(self) -> list:
        return [self.out, *self.ins, *self.ws] + ([self.tok] if self.tok is not None else [])

    def _tile(self, out: Any, views: tuple, k: int, fresh: bool, **kw: Any) -> Tile:
        nin = len(self.ins)
        xs = [_drop_axis(v.val, vw) for v, vw in zip(views[:nin], self.views)]
        ws = {n: self._weight(i, k, v.w) for i, (n, v) in enumerate(zip(self.pnames,
                                                                          views[nin:]))}
        if fresh:
            self.cache[k] = {}
        return Tile(self.tiles[k], xs, ws, need_dx=self.need, cache=self.cache[k],
                    buffers=self.buffers, part=(self.parts[k], self.red), **kw)

    def _forward(self, out: Any, *views: Any, step: int, training: bool,
                 data: dict | None = None) -> None:
        k = self.index[self._color(out)]
        if self.ex.standin is not None:
            return _stand_in(self.ex, f"F:{self.op.name}[{k}]")
        if data is not None:
            out.val[...] = like(data[out.rect.lo[0]], out.val)
            return
        t0 = time.perf_counter()
        t = self._tile(out, views, k, True, training=training, step=step)
        if self.red == 1:
            out.val[...] = tile_forward(self.op, t)
        else:  # a partial sum into the zero-filled output
            out.val[...] += tile_forward(self.op, t)
        if self.recompute and training:
            t.cache.clear()  # backward recomputes it: only the output stays
        _throttle(self.cfg.devices[k], t0)
        return t.cache.pop("running", None)  # batch norm's batch statistics, if any

    def _weight(self, i: int, k: int, a: Any) -> Any:
        """Parameter ``i``'s array of point ``k``: the region view (shards),
        or its flat slice viewed as the weight rect (collective sync)."""
        if self.wviews is None:
            return a
        shape, sl = self.wviews[i][k]
        return a.reshape(shape) if sl is None else a.reshape(shape)[sl]

    def _color(self, view: Any) -> tuple:
        return view.region.color

    def _backward(self, out: Any, *views: Any, step: int, target: Any = None) -> Any:
        k = self.index[self._color(out)]
        if self.ex.standin is not None:
            _stand_in(self.ex, f"B:{self.op.name}[{k}]")
            return {"loss": 0.0} if self.is_last else None
        t0 = time.perf_counter()
        op, nin = self.op, len(self.ins)
        if self.recompute:  # the forward again, for the state backward reads
            tile_forward(op, self._tile(out, views, k, True, training=True, step=step))
        t = self._tile(out, views, k, False, step=step)
        y = out.val if self.red == 1 else None  # a reduce-split op never needs y
        result = None
        if self.is_last:
            ex = self.ex
            tt = target[t.out.to_slices()[:-1]] if ex.sparse else target[t.out.to_slices()]
            tt = like(tt, y)  # host targets to the tile's device
            loss, g, of_input = loss_gradient(ex.loss, op, t.out, y, tt, ex.batch)
            result = {"loss": loss, **metric_sums(ex.metrics, y, tt, ex.sparse, ex.features)}
            if of_input:
                dxs, dws = [g], {}
            else:
                dxs, dws = tile_backward(op, t, y, g)
        else:
            dxs, dws = tile_backward(op, t, y, out.grad)
        for i, dx in enumerate(dxs):
            if self.need[i] and dx is not None and views[i].rect.volume:
                _drop_axis(views[i].grad, self.views[i])[...] += dx
        for i, (n, v) in enumerate(zip(self.pnames, views[nin:])):
            if self.wviews is None:
                v.g[...] += dws[n]
            else:
                self._weight(i, k, v.g)[...] += dws[n]
        # the cache stays until the next F of this tile replaces it: a CUDA graph
        # that launches F runs no Python, and a live B then reads F's arrays
        _throttle(self.cfg.devices[k], t0)
        return result


class Executor:
    """Regions, plans and launches of one compiled model (see module docstring)."""

    def __init__(self, graph: Any, strategy: Any, optimizer: Any, loss: str,
                 metrics: tuple[str, ...], seed: int, model_id: int,
                 sync: str | None = None, machine: Any = None) -> None:
        self.rt = lr.get_runtime()
        #: gradient synchronisation (docs/seam.md section 2): ``"shards"``
        #: (update shards, copies, folds) or ``"collective"`` (nn/sync.py);
        #: from ``sync``, else the strategy's ``sync``, else LEGIONPY_SYNC
        try:
            self.sync = resolve_sync(sync or getattr(strategy, "sync", None))
        except StrategyError as e:
            raise ModelError(f"{e} (model.compile(sync=...), Strategy.sync)") from None
        self.csync: Any = None
        self._flat_stale = False  # collective sync: parameter regions newer than the flat ones
        self.graph, self.strategy, self.opt = graph, strategy, optimizer
        self.loss, self.metrics, self.model_id = loss, metrics, model_id
        self.batch = graph.batch_size
        last = graph.ops[-1]
        self.sparse = loss == "sparse_categorical_crossentropy"
        self.features = int(np.prod(last.output_shape[1:]))
        ndev = len(self.rt.devices)
        for op in graph.ops:
            for d in strategy[op.name].devices:
                if not 0 <= d < ndev:
                    raise ModelError(f"op {op.name!r}: the strategy places a tile on device "
                                     f"{d}, but the runtime has {ndev} device(s) "
                                     f"(0..{ndev - 1}); use lp.init(cpus={d + 1}) or a "
                                     "strategy for this machine")
        self.regions = {}
        for op in graph.ops:
            dt = np.dtype(op.dtype)
            fields = {"val": dt} if op.kind == "input" else {"val": dt, "grad": dt}
            self.regions[op.name] = Region(op.output_shape, fields, name=op.name)
        self.params = graph.parameters()
        self._pregions = {}
        for name, p in self.params.items():
            fields = {f: np.dtype(p.dtype) for f in ("w", "g", *optimizer.fields)}
            self._pregions[name] = Region(p.shape, fields, name=name)
            self._pregions[name].write("w", initial_value(p, seed))
        self.plans: list[OpPlan] = []
        #: Batch norm running statistics, ``{op name: {"running_mean",
        #: "running_var"}}`` (host arrays, the same on every rank), and the
        #: F FutureMaps of training steps whose statistics are not folded in.
        self.buffers: dict[str, dict] = {op.name: initial_buffers(op) for op in graph.ops
                                         if op.kind == "batch_norm"}
        self.token: Region | None = None  # pipelines: the schedule token (OpPlan.tok)
        self.input_pos = {op.name: j for j, op in
                          enumerate(o for o in graph.ops if o.kind == "input")}
        self._stats: list[list] = []
        #: Stand-in mode (invariant 3, docs/taskgraph.md): ``{task name
        #: ("F:op[k]", "B:op[k]", "U:param[t]"): seconds}``; when set, each
        #: task sleeps its duration instead of running its kernel (regions
        #: are still accessed, so the runtime makes the same copies). See
        #: :func:`legionpy.optimizer.mirror.install_standins`.
        self.standin: dict[str, float] | None = None
        #: the machine and cost model of the replay order (None: recorded order)
        #: and of the collectives' algorithm choice (None: ring)
        self.machine: Any = machine
        self.cost_model: Any = None
        self.set_strategy(strategy)

    def set_strategy(self, strategy: Any) -> None:
        """Re-partition and re-place every operator per ``strategy`` (for the
        next launches; the regions, hence parameters, optimizer state and
        values, stay and move where the new tiles need them). Batch-norm
        running statistics carry over. Used by compile and by mappers that
        change the strategy between iterations (AdaptiveMapper)."""
        graph, model_id = self.graph, self.model_id
        self._store_flat()  # the previous strategy's flat replicas, if any
        self.strategy = strategy
        #: a pipelined strategy runs its micro-batches as tiles (``run``) in
        #: its schedule's launch order (docs/pipeline.md)
        self.pipe = getattr(strategy, "pipeline", None)
        run = self.run = strategy.micro(graph) if self.pipe is not None else strategy
        self.pipe_major = self.pipe is not None and device_major(graph, strategy)
        if self.pipe is not None and self.token is None:
            self.token = Region((len(self.rt.devices),), {"t": np.int8}, name="pipeline-order")
            self.token.write("t", np.zeros(len(self.rt.devices), np.int8))
        self.rt.invalidate_traces()  # new launches: the steps are recorded again
        self.csync = None
        if self.sync == "collective":
            from .sync import CollectiveSync

            self.csync = CollectiveSync(self, run)
            self._flat_stale = True
        self.plans = [OpPlan(self, op, run[op.name]) for op in graph.ops]
        #: pipelined: ``(role, op index, micro-batch)`` of every launch, in the
        #: program order both halves use (legionpy.pipeline.launches)
        self.pipe_launches = [] if self.pipe is None else launches(graph, self.pipe)
        for pl in self.plans:
            pl.buffers = self.buffers.get(pl.op.name, {})
        self.updates = []
        u_fields = ("w", "g", *self.opt.fields)
        sparse = sparse_params(graph)
        for name, tiles in ({} if self.csync else weight_tiles(graph, run)).items():
            part = Partition.by_rects(self._pregions[name], {(t,): r for t, (r, _) in
                                                            enumerate(update_points(tiles))})
            task = TaskFunction(self._update, [RW(*u_fields)], name=f"U({name})", kind="update")
            self.updates.append((part, task, LaunchOptions(f"U({name})", "update",
                                                           (name, "U", model_id)),
                                 name in sparse))
        self.install_mapper()

    # -- mapper ------------------------------------------------------------------------
    def install_mapper(self) -> None:
        """Register the strategy with a StrategyMapper; any other mapper (a
        user's, installed on purpose) is kept and places the points itself."""
        m = self.check_runtime().mapper
        if not isinstance(m, StrategyMapper):
            return
        if m.strategies.get(self.model_id, (None, None))[1] is not self.run:
            m.add(self.model_id, self.graph, self.run)
            self.rt.invalidate_traces()
        if self.csync is not None:  # U(b.g) point p on group position p
            m.table.update(self.csync.table)

    # -- parameter values (collective sync keeps them in flat regions) --------------------
    @property
    def pregions(self) -> dict[str, Region]:
        """``{parameter name: Region}`` (fields ``w``, ``g``, optimizer state),
        up to date. Under collective sync the training steps update flat
        replicas (nn/sync.py): they are written back here first, and read
        again before the next step (a caller may write these regions)."""
        self._store_flat()
        if self.csync is not None:
            self._flat_stale = True
        return self._pregions

    def _store_flat(self) -> None:
        if self.csync is not None and not self._flat_stale:
            self.csync.store(self._pregions, ("w", *self.opt.fields))

    def _load_flat(self) -> None:
        if self.csync is not None and self._flat_stale:
            self.csync.load(self._pregions, ("w", *self.opt.fields))
            self._flat_stale = False

    def check_runtime(self) -> Any:
        rt = lr.get_runtime()
        if rt is not self.rt:
            raise ModelError("the legionpy runtime was restarted (lp.init/shutdown) after "
                             "model.compile; the model's data lived in the old one: call "
                             "compile again (and load a checkpoint)")
        return rt

    # -- steps ---------------------------------------------------------------------------
    def _order(self) -> Any:
        """The replay order of a traced step: the simulated schedule (None:
        the recorded run's order), see nn/schedule.py."""
        if self.machine is None:
            return None
        from .schedule import simulated_order

        return simulated_order(self.graph, self.strategy, self.machine, self.cost_model,
                               self.sync)

    def traced(self, what: str) -> Any:
        """``with ex.traced("train"):`` one step as a trace (recorded the first
        times, replayed after); ``LEGIONPY_TRACE_STEPS=0`` runs steps untraced."""
        if os.environ.get("LEGIONPY_TRACE_STEPS", "1") == "0":
            return contextlib.nullcontext()
        return lr.trace(f"{what}:{self.model_id}", order=self._order(),
                        keep_buffers=self._kept_regions())

    def _kept_regions(self) -> list:
        """The regions whose reduction buffers a step's replays keep: the
        weights' gradients (the parameters', or under collective sync the
        buckets'), which wait for the updates that end the step anyway
        (docs/memory.md), so the peak is the same. A backward task rebuilt
        every view cut from a step's new buffers (39-51 us a task); keeping
        the weights' took rnnlm's one-device step from 5.6-6.3 to 5.1-5.7
        ms. Not for a pipeline: there one micro-batch's buffers are alive
        at a time."""
        if self.pipe is not None:
            return []
        if self.csync is not None:
            return list(self.csync.regions)
        return list(self._pregions.values())

    def forward(self, inputs: list[dict], step: int, training: bool) -> None:
        """Launch F of every op (one traced step); ``inputs[j]`` shards of the
        j-th input op's batch. Inference folds every pending batch-norm
        statistic into the running statistics first."""
        self.install_mapper()
        self._load_flat()
        if not training:
            self.fold_running_stats()
        with self.traced("forward"):
            self._forward(inputs, step, training)

    def _forward(self, inputs: list[dict], step: int, training: bool) -> None:
        """F launches; in training, batch norm's F results (its batch
        statistics) are kept for :meth:`fold_running_stats`. A pipeline's
        forward alone (inference) runs micro-batch by micro-batch."""
        self._fill_partial()
        stats: list = []
        if self.pipe is None:
            for pl in self.plans:
                self._launch_f(pl, None, inputs, step, training, stats)
        else:
            for role, o, j in self.pipe_launches:
                if role == 0:
                    self._launch_f(self.plans[o], j, inputs, step, training, stats)
        if stats:
            self._stats.append(stats)

    def _fill_partial(self) -> None:
        for pl in self.plans:
            if pl.red > 1:  # partial sums (a split reduction dim) accumulate from zero
                lr.fill(self.regions[pl.op.name], "val", 0.0)

    def _launch_f(self, pl: OpPlan, j: int | None, inputs: list[dict], step: int,
                  training: bool, stats: list) -> None:
        """F of op ``pl`` (micro-batch ``j`` of a pipeline; None: every point)."""
        # the step seeds dropout only: other tasks get a constant, so a CUDA
        # graph that captured them stays valid (runtime/graphs.py)
        kw: dict = {"step": step if pl.op.kind == "dropout" else 0, "training": training}
        if pl.op.kind == "input":
            kw["data"] = inputs[self.input_pos[pl.op.name]]
        colors, opts = (pl.colors, pl.f_opts) if j is None else (pl.micro[j], pl.micro_opts[j][0])
        fm = lr.index_launch(pl.f_task, colors, *pl.args(), launch_options=opts, **kw)
        if training and pl.op.kind == "batch_norm":
            stats.append((pl.op, fm))

    def _launch_b(self, pl: OpPlan, j: int | None, target: np.ndarray) -> Any:
        """B of op ``pl`` (micro-batch ``j`` of a pipeline; None: every point)."""
        kw: dict = {"step": 0}  # B reads dropout's mask from F's cache, not the step
        if pl.is_last:
            kw["target"] = target
        colors, opts = (pl.colors, pl.b_opts) if j is None else (pl.micro[j], pl.micro_opts[j][1])
        return lr.index_launch(pl.b_task, colors, *pl.args(), launch_options=opts, **kw)

    def fold_running_stats(self, keep: int = 0) -> None:
        """Update batch norm's running statistics with the batch statistics of
        every training step launched so far but the last ``keep``, in step
        order, with each op's momentum (PyTorch's update, unbiased variance).
        Futures make it rank-independent: every rank folds the same values."""
        from ..ops.kernels import batch_norm_update_running

        if len(self._stats) <= keep:
            return
        steps = self._stats[:len(self._stats) - keep]
        del self._stats[:len(steps)]
        # every rank folds every step: under MPI one exchange for them all
        pairs = [pair for stats in steps for pair in stats]
        for (op, _), got in zip(pairs, lr.gather_maps([fm for _, fm in pairs])):
            buf, mom = self.buffers[op.name], op.attrs.get("momentum", 0.1)
            for r in got:
                if r is None:
                    continue
                c0, c1, mean, var, n = r
                rm, rv = buf["running_mean"], buf["running_var"]
                rm[c0:c1], rv[c0:c1] = batch_norm_update_running(
                    rm[c0:c1], rv[c0:c1], mean, var, n, mom)

    def train_step(self, inputs: list[dict], target: np.ndarray, step: int) -> Any:
        """One iteration, as a trace; returns the FutureMap of the last op's B
        (loss, metrics)."""
        self.install_mapper()
        self._load_flat()
        with self.traced("train"):
            fm = self._train_step(inputs, target, step)
        # steps before the previous one have finished; under MPI their
        # statistics are an exchange between the ranks, made in batches
        batch = MPI_RESULTS_EVERY if fm is not None and fm.collective else 1
        if len(self._stats) >= 2 + batch:
            self.fold_running_stats(keep=2)
        return fm

    def _train_step(self, inputs: list[dict], target: np.ndarray, step: int) -> Any:
        for pl in self.plans:
            if pl.op.kind != "input":
                lr.fill(self.regions[pl.op.name], "grad", 0.0)
        if self.pipe is None:
            self._forward(inputs, step, True)
            fm = None
            for pl in reversed(self.plans):
                if pl.op.has_backward:
                    f = self._launch_b(pl, None, target)
                    if pl.is_last:
                        fm = f
        else:  # docs/pipeline.md: units in the schedule's launch order
            self._fill_partial()
            stats: list = []
            losses = []
            for role, o, j in self.pipe_launches:
                pl = self.plans[o]
                if role == 0:
                    self._launch_f(pl, j, inputs, step, True, stats)
                    continue
                f = self._launch_b(pl, j, target)
                if pl.is_last:
                    losses.append(f)
            if stats:
                self._stats.append(stats)
            fm = FutureMap([c for f in losses for c in f.colors],
                           [f[c] for f in losses for c in f.colors]) if losses else None
        t = step + 1 if self.opt.uses_step else 1  # SGD: graph-capturable updates
        for part, task, opts, sparse in self.updates:
            lr.index_launch(task, part.colors, part, t, sparse, opts.tag[0],
                            launch_options=opts)
        if self.csync is not None:  # per bucket and group: RS -> U of each chunk -> AG
            steps = self.csync.steps
            for what, i, p in self.csync.order:
                g, rs, (parts, task, opts, sparse), ag = steps[i]
                if what == "RS":
                    rs()
                elif what == "AG":
                    ag()
                else:
                    lr.index_launch(task, opts[p][1], *parts, t, sparse, g.name,
                                    launch_options=opts[p][0])
        return fm

    def _cupdate(self, v: Any, *args: Any) -> None:
        """U of one chunk of a group's flat buffer (collective sync), ``v``
        its weights and gradients, then (an optimizer with state) ``o`` its
        state, ``step``, ``sparse``, ``name``: the optimizer on the chunk;
        embedding tables' elements only where their gradient is nonzero (the
        rows this batch touched)."""
        o, (step, sparse, name) = (args[0], args[1:]) if self.opt.fields else (None, args)
        p = v.region.color[0]
        if self.standin is not None:
            return _stand_in(self, f"U:{name}[{p}]")
        state = {f: o[f] for f in self.opt.fields}
        chunk_update(self.opt, v.w, v.g, state, step, sparse.get(p))

    def _update(self, v: Any, step: int, sparse: bool = False, name: str = "") -> None:
        if self.standin is not None:
            return _stand_in(self, f"U:{name}[{v.region.color[0]}]")
        if not sparse:
            self.opt.update(v.w, v.g, {f: v[f] for f in self.opt.fields}, step)
            return
        rows = np.flatnonzero((v.g != 0).any(axis=1))  # the rows this batch touched
        if not rows.size:
            return
        w, g = v.w[rows], v.g[rows]
        state = {f: v[f][rows] for f in self.opt.fields}
        self.opt.update(w, g, state, step)
        v.w[rows] = w
        v.g[rows] = 0
        for f, a in state.items():
            v[f][rows] = a

    def output(self) -> np.ndarray:
        return self.regions[self.graph.ops[-1].name].read("val")


def chunk_update(opt: Any, w: Any, g: Any, state: dict, step: int,
                 sparse: list[tuple[int, int]] | None = None) -> None:
    """The optimizer on one flat chunk ``w``, ``g`` (and its ``state``
    arrays), in place: the dense runs as contiguous views, each embedding
    table's segment ``[lo, hi)`` of ``sparse`` only where its gradient is
    nonzero (the rows this batch touched; SparseAdam's semantics, as the
    shards mode updates them). Gathering the touched elements of the whole
    chunk instead cost rnnlm's one-device step 1.07 ms of fancy indexing
    for a 70 K element update that takes 0.09 ms (issue 26: the trace's
    update term was 5x the model's)."""
    if not sparse:
        opt.update(w, g, state, step)
        return
    n = w.shape[0]
    pos = 0
    for lo, hi in sorted(sparse) + [(n, n)]:
        if pos < lo:  # a dense run: views, updated in place
            opt.update(w[pos:lo], g[pos:lo], {f: a[pos:lo] for f, a in state.items()}, step)
        if lo < hi:
            seg = g[lo:hi]
            idx = np.flatnonzero(seg) + lo
            if idx.size:
                ws, gs = w[idx], g[idx]
                st = {f: a[idx] for f, a in state.items()}
                opt.update(ws, gs, st, step)
                w[idx] = ws
                for f, a in st.items():
                    state[f][idx] = a
            seg[...] = 0
        pos = max(pos, hi)
