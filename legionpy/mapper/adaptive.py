"""AdaptiveMapper: the hardware scheduling assistants of Intel's "Automatic
Model Parallelism for Deep Neural Networks with Compiler and Hardware
Support" (section 3, "Hardware Support: Scheduling Assistants"), in software.

The paper's compiler tags each dataflow node *compute-bound*, *memory-bound*
or *network-bound*; at run time an assistant per device watches its
utilisation and, when a device stays above a threshold theta (95% in the
paper) it puts one of its nodes of the matching tag in an *out-box*, which a
device below gamma (50%) acquires. Here:

The cost analysis (tags, modelled busy time, the choice of moves) is pure
and lives in :mod:`legionpy.optimizer.rebalance`; this module observes the
running job and installs the moves.

- **tags** (:func:`~legionpy.optimizer.rebalance.op_tags`, the compiler's
  part): for every operator, from the cost model and the machine model,
  the seconds its tiles would spend on arithmetic (``flops / peak``), on
  memory traffic (``bytes / mem_bw``) and on the network (bytes of the
  input pieces and weight replicas that must cross devices under the
  current strategy, over the slowest link of the machine); the largest
  names the bound.
- **observation** (:meth:`AdaptiveMapper.observe`): after every training step
  (``Model.fit`` calls :meth:`AdaptiveMapper.after_step`), the runtime trace
  of that step gives each device's busy seconds (compute and update tasks)
  and the step's span; utilisation = busy / span. Under MPI every rank's
  figures are merged (allgather), so every rank decides the same.
- **migration** (:meth:`AdaptiveMapper.propose`, a pure function:
  :func:`~legionpy.optimizer.rebalance.propose_moves`): when for
  ``patience`` consecutive steps one device is above ``high`` while another
  is below ``low``, the busiest device's out-box is the tiles it runs of the
  ops whose tag dominates its modelled time (network-bound ops last: moving
  them adds traffic); the idlest device takes the tile that best evens the
  pair, predicted with each device's observed slowness (observed busy /
  modelled busy), and only if the busier of the two gets faster by at least
  ``min_gain``. No tile moves onto a device that a move relieved in the last
  ``cooldown`` steps: measured busy times are noisy (a loaded machine), and
  without this a later decision can take a move back (a ping-pong). Up to
  ``max_moves`` tiles per decision; then the observation window restarts.
- **effect**: a move is a new :class:`~legionpy.optimizer.Strategy` (same
  degrees, one tile on another device), installed with
  ``Model.set_strategy``: the nn layer re-partitions and re-places, the
  StrategyMapper (this class's base) maps the next step's points by it and
  the coherence machinery moves the data. The numbers are those of any
  strategy: the same as the static run up to float summation order.

Example::

    lp.init(cpus=4)
    mapper = AdaptiveMapper(high=0.9, low=0.5)
    lp.runtime().set_mapper(mapper)
    model.compile(optimizer=..., strategy="data")
    model.fit(x, y, epochs=3)           # rebalances between steps
    mapper.history[-1]["util"], mapper.moves
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..optimizer.costmodel import AnalyticCostModel, CostModel
from ..optimizer.rebalance import BOUNDS, Move, modelled_busy, op_tags, propose_moves
from ..optimizer.strategy import Strategy
from .strategy import StrategyMapper

# Move, op_tags, modelled_busy and BOUNDS are defined in optimizer/rebalance.py
__all__ = ["AdaptiveMapper", "Move", "op_tags", "modelled_busy", "BOUNDS"]

class AdaptiveMapper(StrategyMapper):
    """A StrategyMapper that re-balances tiles between training steps.

    ``machine``: the optimizer's model of the runtime's devices (default
    ``Machine.local(n)`` on first use); ``cost``: the cost model for tags and
    predictions (default analytic; :meth:`MeasuredCostModel.local` for
    measured tiles); ``high``/``low``: the paper's theta and gamma as
    fractions of the step's span (defaults 0.9 and 0.5: a traced step
    includes waits, so 95% is rarely reached in software); ``patience``:
    consecutive steps the condition must hold; ``max_moves``: tiles moved per
    decision; ``min_gain``: the least relative gain of a move; ``cooldown``:
    steps after a move during which nothing moves onto the device it relieved;
    ``enabled``: False observes only (the static baseline with the same overhead).

    ``history``: one dict per observed step ``{"step", "busy", "util",
    "span", "moved"}``; ``moves``: every :class:`Move`."""

    def __init__(self, machine: Any = None, cost: CostModel | None = None, high: float = 0.9,
                 low: float = 0.5, patience: int = 2, max_moves: int = 1,
                 min_gain: float = 0.02, cooldown: int = 20, enabled: bool = True) -> None:
        super().__init__()
        if not 0 < low < high:
            raise ValueError(f"AdaptiveMapper needs 0 < low < high, got low={low}, "
                             f"high={high}")
        self.machine = machine
        self.cost = cost or AnalyticCostModel()
        self.high, self.low = float(high), float(low)
        self.patience, self.max_moves = max(1, int(patience)), max(1, int(max_moves))
        self.min_gain, self.enabled = float(min_gain), bool(enabled)
        self.cooldown = max(0, int(cooldown))
        self._relieved: dict[int, int] = {}  # device -> the step a move last relieved it
        self.history: list[dict] = []
        self.moves: list[Move] = []
        self._window: list[dict] = []
        self._tap: Any = None  # this mapper's own trace (never the user's)
        self._step = 0

    # -- observation ---------------------------------------------------------------------
    def observe(self, records: list[dict], num_devices: int) -> dict:
        """``{"busy": {dev: s}, "span": s, "util": {dev: busy / span}}`` of one
        step's trace records (compute and update tasks count as busy; fills
        and untimed ops are ignored; copies only widen the span)."""
        busy = {d: 0.0 for d in range(num_devices)}
        lo, hi = math.inf, -math.inf
        for r in records:
            if r.get("failed") or (r.get("device") is None and r.get("link") is None):
                continue
            lo, hi = min(lo, r["start"]), max(hi, r["end"])
            if r.get("device") is not None and r.get("kind") in ("compute", "update"):
                busy[r["device"]] = busy.get(r["device"], 0.0) + r["end"] - r["start"]
        busy = _merge_ranks(busy)
        span = _merge_span(hi - lo if hi > lo else 0.0)
        util = {d: (b / span if span > 0 else 0.0) for d, b in busy.items()}
        return {"busy": busy, "span": span, "util": util}

    def _records(self, rt: Any) -> list[dict]:
        """The records of the ops finished since the last call, from this
        mapper's tap on the runtime's trace (a Trace of its own: the user's
        ``LEGIONPY_TRACE`` / ``rt.trace`` is neither started nor cleared)."""
        from ..runtime.trace import Trace

        tap = self._tap
        if tap is None or tap not in rt.trace.taps:
            tap = self._tap = Trace(rt.trace.t0, rt.trace.rank)
            tap.start()
            rt.trace.taps.append(tap)
            return []
        recs = tap.records()
        tap.clear()
        return recs

    # -- decision ------------------------------------------------------------------------
    def propose(self, graph: Any, strategy: Strategy, busy: dict[int, float], span: float,
                step: int = 0, avoid: Any = ()) -> tuple[Strategy, list[Move]]:
        """The strategy after this step's migrations (``strategy`` itself and
        no moves when the thresholds do not call for one); no tile moves onto
        a device in ``avoid`` (the devices recently relieved). Pure: a
        function of its arguments and the mapper's settings."""
        return propose_moves(graph, strategy, self._machine(), self.cost, busy, span,
                             high=self.high, low=self.low, max_moves=self.max_moves,
                             min_gain=self.min_gain, step=step, avoid=avoid)

    def after_step(self, model: Any) -> list[Move]:
        """Called by ``Model.fit`` after each step: fence, read the step's
        trace, and (when enabled and the thresholds call for it) install the
        re-balanced strategy with ``model.set_strategy``."""
        from ..runtime import get_runtime

        rt = get_runtime()
        rt.fence()
        step, self._step = self._step, self._step + 1
        recs = self._records(rt)
        if not recs:
            return []
        obs = self.observe(recs, len(rt.devices))
        obs.update(step=step, moved=[])
        self.history.append(obs)
        self._window.append(obs)
        self._window = self._window[-self.patience:]
        if not self.enabled or len(self._window) < self.patience:
            return []
        if not all(any(u > self.high for u in o["util"].values())
                   and any(u < self.low for u in o["util"].values()) for o in self._window):
            return []
        busy = {d: statistics.fmean(o["busy"][d] for o in self._window) for d in obs["busy"]}
        span = statistics.fmean(o["span"] for o in self._window)
        avoid = {d for d, at in self._relieved.items() if step - at < self.cooldown}
        new, moves = self.propose(model.graph, model.strategy, busy, span, step, avoid)
        for mv in moves:
            self._relieved[mv.src] = step
        if moves:
            model.set_strategy(new, self._machine())
            self.moves.extend(moves)
            obs["moved"] = moves
            self._window = []
        return moves

    def _machine(self) -> Any:
        if self.machine is None:
            from ..optimizer import Machine

            self.machine = Machine.local(len(self.devices))
        return self.machine


def _merge_ranks(busy: dict[int, float]) -> dict[int, float]:
    """Sum per-device busy seconds over MPI ranks (each traces its own)."""
    from ..runtime.mpi import allgather

    out: dict[int, float] = {}
    for part in allgather(busy):
        for d, b in part.items():
            out[d] = out.get(d, 0.0) + b
    return out


def _merge_span(span: float) -> float:
    from ..runtime.mpi import allgather

    return max(allgather(span))
