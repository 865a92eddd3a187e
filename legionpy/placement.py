"""Placement rules both halves share: which device owns which piece of a
parameter, and which points a parameter's update launch has.

The optimizer's task-graph builder (``optimizer/taskgraph.py``) and the
runtime's StrategyMapper / layer API (``mapper/``, ``nn/execution.py``) call
these same functions, so the simulated and the real task graph agree by
construction (DESIGN.md section 2, docs/taskgraph.md "Sharded weight
updates"). This module sits below both halves: it depends only on
:mod:`legionpy.geometry` and numpy, and on duck-typed graphs and strategies
(``graph.ops``, ``op.params``, ``op.output_rect``, ``op.weight_rect``,
``strategy[name].degrees / .devices``).

- Forward/backward point ``k`` of op ``o`` (row-major in the degree grid of
  ``strategy[o]``) runs on ``strategy[o].devices[k]``.
- :func:`weight_tiles` / :func:`param_tiles`: the distinct weight tiles of a
  parameter and the devices that use them, first-use order over (op order, k).
- :func:`update_shards`: a tile used by devices ``U`` is cut into
  ``min(|U|, extent, bytes // SHARD_MIN_BYTES)`` shards along its largest dim,
  shard ``c`` homed on ``U[c]``; an unsharded tile rotates its home over ``U``
  by the parameter's position.
- :func:`update_points`: the points of a parameter's update launch, one per
  shard, in order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .geometry import Rect, block_bound

__all__ = ["weight_tiles", "WeightTile", "update_shards", "param_tiles", "update_points",
           "SHARD_MIN_BYTES", "uniform_weight_rect"]


class WeightTile(NamedTuple):
    """One distinct weight tile of a parameter: its ``rect``, the devices
    that use it (``users``, in first-use order over (op order, tile k)) and
    its update ``shards``: ``(shard rect, home device)`` pairs."""

    rect: Rect
    users: tuple[int, ...]
    shards: tuple[tuple[Rect, int], ...]


SHARD_MIN_BYTES = 16 << 10
"""Smallest update shard worth its copies (bytes): a weight tile of ``b``
bytes is split into at most ``b // SHARD_MIN_BYTES`` shards, so small
parameters (biases, batch-norm scales) keep ONE update on one home instead
of ``O(users^2)`` tiny copies and update tasks. 16 KiB: Inception-v3 data
parallel on p100:4x4 simulates at 58 ms with 159k tasks (no minimum: 67.5
ms, 475k tasks; 64 KiB: 70 ms, 116k; 1 MiB: 110 ms, 39k -- its sub-MiB
convolution weights then go back to a single home each)."""


def update_shards(rect: Rect, users: tuple[int, ...], itemsize: int = 4,
                  rotate: int = 0) -> tuple[tuple[Rect, int], ...]:
    """Sharded weight update (docs/taskgraph.md): ``rect`` used by the devices
    ``users`` is cut into ``s = min(len(users), extent, max(1, bytes //
    SHARD_MIN_BYTES))`` shards along its largest dim (the first on ties;
    ``numpy.array_split`` bounds), shard ``c`` homed on ``users[c]``. An
    unsharded tile (``s = 1``) is homed on ``users[rotate % len(users)]``, so
    the small parameters of a model spread over their users (``rotate``: the
    parameter's position, see :func:`param_tiles`)."""
    shape = rect.shape
    d = max(range(len(shape)), key=lambda i: (shape[i], -i)) if shape else 0
    nbytes = rect.volume * itemsize
    s = max(1, min(len(users), shape[d] if shape else 1, nbytes // SHARD_MIN_BYTES))
    if s == 1:
        return ((rect, users[rotate % len(users)]),)
    degrees = tuple(s if i == d else 1 for i in range(len(shape)))
    return tuple(zip(rect.split(degrees), users[:s]))


def param_tiles(name: str, uses: Any) -> list[WeightTile]:
    """The weight tiles of one parameter from ``uses``: ``(op, pname, config)``
    of every op using it, in op order. The one rule both halves use.
    Overlapping weight rects (a shared parameter whose users have different
    configs) are merged into their bounding box, users in first-use order.
    Unsharded tiles rotate their home by the parameter's position: the index
    of its first user op plus its position among that op's parameters (a
    pure function of ``uses``, so both halves agree)."""
    tiles: dict[Rect, list[int]] = {}
    itemsize, rotate = 4, 0
    for op, pnames, cfg in _grouped(uses):
        if not tiles:
            itemsize = np.dtype(op.params[pnames[0]].dtype).itemsize
            rotate = op.index + list(op.params).index(pnames[0])
        red = getattr(cfg, "reduce", 1)
        same = [uniform_weight_rect(op, pn, cfg) for pn in pnames]
        if all(wr is not None for wr in same):
            # every point reads the same weight rects: the loop below would
            # find one tile per pname, used by the devices in point order
            for wr in same:
                if wr.empty:
                    continue
                users = tiles.setdefault(wr, [])
                seen = set(users)
                users.extend(d for d in dict.fromkeys(cfg.devices) if d not in seen)
            continue
        for k, tile in enumerate(op.output_rect.split(cfg.degrees)):
            for r in range(red):  # points (k, r) of a reduction split
                dev = cfg.devices[k * red + r]
                for pname in pnames:
                    wr = op.part_weight_rect(pname, tile, r, red)
                    if wr.empty:
                        continue
                    users = tiles.setdefault(wr, [])
                    if dev not in users:
                        users.append(dev)
    items = list(tiles.items())
    merged = True
    while merged:  # overlapping tiles (a shared parameter under different configs)
        merged = False
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, ua), (b, ub) = items[i], items[j]
                if (a & b).volume:
                    items[i] = (a.bounding(b), ua + [d for d in ub if d not in ua])
                    del items[j]
                    merged = True
                    break
            if merged:
                break
    return [WeightTile(r, tuple(u), update_shards(r, tuple(u), itemsize, rotate + j))
            for j, (r, u) in enumerate(items)]


def corner_tiles(rect: Rect, degrees: tuple) -> tuple[Rect, Rect]:
    """The first and the last tile of ``rect.split(degrees)`` (without the
    others)."""
    first = [block_bound(lo, hi, k, 0) for lo, hi, k in zip(rect.lo, rect.hi, degrees)]
    last = [block_bound(lo, hi, k, k - 1) for lo, hi, k in zip(rect.lo, rect.hi, degrees)]
    return (Rect(tuple(x[0] for x in first), tuple(x[1] for x in first)),
            Rect(tuple(x[0] for x in last), tuple(x[1] for x in last)))


def uniform_weight_rect(op: Any, pname: str, cfg: Any) -> Rect | None:
    """The weight rect of ``pname`` that EVERY point of ``cfg`` reads, when
    ``cfg`` splits sample dims only (SOAP: weights do not depend on the
    sample dim; checked on the first and last tile) and no reduction dim;
    else None (points may differ: look at each)."""
    if getattr(cfg, "reduce", 1) != 1:
        return None
    if not all(k == 1 or lab == "sample" for k, lab in zip(cfg.degrees, op.dims)):
        return None
    wr = op.weight_rect(pname, op.output_rect)
    for c in corner_tiles(op.output_rect, cfg.degrees):
        if op.weight_rect(pname, c) != wr:
            return None
    return wr


def _grouped(uses: Any) -> list:
    out: list = []
    for op, pname, cfg in uses:
        if out and out[-1][0] is op:
            out[-1][1].append(pname)
        else:
            out.append((op, [pname], cfg))
    return out


def weight_tiles(graph: Any, strategy: Any) -> dict[str, list[WeightTile]]:
    """``{parameter name: [WeightTile, ...]}``: the distinct weight tiles of
    every parameter (parameters and tiles in first-use order over (op order,
    tile k)) with their users and update shards (:func:`update_shards`).
    Partially overlapping tiles of one parameter (shared parameters under
    different configs) are merged into their bounding box."""
    uses: dict[str, list] = {}
    for op in graph.ops:
        for pname, p in op.params.items():
            uses.setdefault(p.name, []).append((op, pname, strategy[op.name]))
    return {name: param_tiles(name, u) for name, u in uses.items()}


def update_points(tiles: list[WeightTile]) -> list[tuple[Rect, int]]:
    """The points of a parameter's update launch: ``(shard rect, home)`` of
    every shard of every tile, in order (point index = position)."""
    return [sh for t in tiles for sh in t.shards]
