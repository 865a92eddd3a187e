"""Rebalancing tiles between devices: the pure cost analysis of the
AdaptiveMapper (Intel's "Automatic Model Parallelism for Deep Neural
Networks with Compiler and Hardware Support", section 3, scheduling
assistants; the method is in :mod:`legionpy.mapper.adaptive`'s module doc).

* :func:`op_tags`: every operator's bound (compute, memory or network) from
  the cost model and the machine model, the compiler's part;
* :func:`modelled_busy`: the busy seconds per device, and per (op, tile),
  the cost model predicts for one iteration;
* :func:`propose_moves`: given observed busy seconds and the step's span,
  the tiles to move from the busiest device to the idlest (a new Strategy
  and the :class:`Move` list). A pure function of its arguments.

The mapper (:class:`legionpy.mapper.adaptive.AdaptiveMapper`) observes the
running job and installs the moves; nothing here runs a task.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ..placement import update_points, weight_tiles
from .costmodel import CostModel
from .strategy import ParallelConfig, Strategy

__all__ = ["BOUNDS", "Move", "network_bytes", "op_tags", "modelled_busy", "propose_moves"]

BOUNDS = ("compute", "memory", "network")


@dataclass(frozen=True)
class Move:
    """Tile ``tile`` of op ``op`` moved from device ``src`` to ``dst`` after
    step ``step``; ``tag``: the op's bound; ``predicted``: (busy of src, busy
    of dst) in seconds expected after the move."""

    step: int
    op: str
    tile: int
    src: int
    dst: int
    tag: str
    predicted: tuple[float, float]


def network_bytes(graph: Any, strategy: Strategy, op: Any, k: int, tile: Any) -> float:
    """Bytes tile ``k`` of ``op`` receives from other devices per iteration
    (input pieces, and twice a replicated weight tile: broadcast + gradient)."""
    dev = strategy[op.name].devices[k]
    total = 0.0
    for i, ref in enumerate(op.inputs):
        need = ref.to_base(op.input_rect(i, tile))
        pcfg = strategy[ref.op.name]
        item = 4 if ref.op.dtype.endswith("32") else 8
        for j, ptile in enumerate(ref.op.output_rect.split(pcfg.degrees)):
            if pcfg.devices[j] != dev:
                total += (need & ptile).volume * item
    if op.params:
        cfg = strategy[op.name]
        homes: dict = {}
        for kk, t in enumerate(op.output_rect.split(cfg.degrees)):
            for pname in op.params:
                homes.setdefault((pname, op.weight_rect(pname, t)), cfg.devices[kk])
        for pname in op.params:
            if homes[(pname, op.weight_rect(pname, tile))] != dev:
                total += 2.0 * op.weight_rect(pname, tile).volume * 4
    return total


def op_tags(graph: Any, strategy: Strategy, machine: Any) -> dict[str, str]:
    """``{op name: "compute" | "memory" | "network"}``: the largest of the
    op's arithmetic, memory and network seconds summed over its tiles (see
    the module docstring). Input operators are tagged "memory"."""
    link_bw = min((ln.bandwidth for ln in machine.links), default=math.inf)
    tags = {}
    for op in graph.ops:
        cfg = strategy[op.name]
        c = m = n = 0.0
        for k, tile in enumerate(op.output_rect.split(cfg.degrees)):
            d = machine.devices[cfg.devices[k]]
            ff, fb = op.flops(tile)
            bf, bb = op.bytes(tile)
            c += (ff + fb) / d.flops
            m += (bf + bb) / d.mem_bw
            n += network_bytes(graph, strategy, op, k, tile) / link_bw
        tags[op.name] = "memory" if op.kind == "input" else BOUNDS[max(range(3),
                                                                     key=(c, m, n).__getitem__)]
    return tags


def modelled_busy(graph: Any, strategy: Strategy, machine: Any,
                  cost: CostModel) -> tuple[dict[int, float], dict[tuple[str, int], float]]:
    """``(busy per device, seconds per (op, tile))`` the cost model predicts
    for the compute and update tasks of one iteration (no waiting)."""
    busy = {d.id: 0.0 for d in machine.devices}
    tiles: dict[tuple[str, int], float] = {}
    for op in graph.ops:
        if op.kind == "input":
            continue
        cfg = strategy[op.name]
        for k, tile in enumerate(op.output_rect.split(cfg.degrees)):
            dev = cfg.devices[k]
            f, b = cost.op_time(op, tile, machine.devices[dev])
            tiles[(op.name, k)] = f + b
            busy[dev] += f + b
    params = graph.parameters()
    for pname, wts in weight_tiles(graph, strategy).items():
        for rect, home in update_points(wts):
            busy[home] += cost.update_time(params[pname], rect, machine.devices[home])
    return busy, tiles


def propose_moves(graph: Any, strategy: Strategy, machine: Any, cost: CostModel,
                  busy: dict[int, float], span: float, *, high: float, low: float,
                  max_moves: int = 1, min_gain: float = 0.02, step: int = 0,
                  avoid: Any = ()) -> tuple[Strategy, list[Move]]:
    """The strategy after one decision's migrations, and the moves (the
    ``strategy`` itself and none when no device is above ``high`` while
    another is below ``low``, as fractions of ``span``). Each device's
    observed slowness (observed busy / modelled busy) scales the predicted
    effect of a move; a move must make the busier device faster by at least
    ``min_gain``; no tile moves onto a device in ``avoid``."""
    if span <= 0:
        return strategy, []
    model, tile_cost = modelled_busy(graph, strategy, machine, cost)
    known = [busy[d] / model[d] for d in busy if model.get(d, 0) > 0 and busy[d] > 0]
    r_default = statistics.median(known) if known else 1.0
    slow = {d: (busy[d] / model[d] if model.get(d, 0) > 0 and busy[d] > 0 else r_default)
            for d in busy}
    tags = op_tags(graph, strategy, machine)
    pred = dict(busy)
    moves: list[Move] = []
    for _ in range(max_moves):
        hot = [d for d in pred if pred[d] / span > high]
        cold = [d for d in pred if pred[d] / span < low and d not in avoid]
        if not hot or not cold:
            break
        src = max(hot, key=lambda d: (pred[d], -d))
        dst = min(cold, key=lambda d: (pred[d], d))
        share = {t: 0.0 for t in BOUNDS}
        for (name, k), c in tile_cost.items():
            if strategy[name].devices[k] == src:
                share[tags[name]] += c
        order = sorted(("compute", "memory"), key=lambda t: -share[t]) + ["network"]
        best = None
        for tag in order:  # the out-box of the dominant bound first
            for op in graph.ops:
                if tags[op.name] != tag or op.kind == "input":
                    continue
                for k, dev in enumerate(strategy[op.name].devices):
                    if dev != src:
                        continue
                    c = tile_cost[(op.name, k)]
                    new_src, new_dst = pred[src] - slow[src] * c, pred[dst] + slow[dst] * c
                    score = max(new_src, new_dst)
                    if best is None or score < best[0]:
                        best = (score, op.name, k, tag, new_src, new_dst)
            if best is not None and best[0] < pred[src] * (1 - min_gain):
                break
            best = None
        if best is None:
            break
        _, name, k, tag, new_src, new_dst = best
        cfg = strategy[name]
        devs = list(cfg.devices)
        devs[k] = dst
        strategy = strategy.with_config(name, ParallelConfig(cfg.degrees, tuple(devs)))
        pred[src], pred[dst] = new_src, new_dst
        moves.append(Move(step, name, k, src, dst, tag, (new_src, new_dst)))
    return strategy, moves
