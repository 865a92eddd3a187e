"""Pipeline parallelism: the one rule both halves share (docs/pipeline.md).

A pipelined strategy cuts the operator graph into ``p`` stages (contiguous
ranges of graph order, so every edge runs forward: a topological split),
puts stage ``s`` on its own device block (with its own data/tensor degrees
inside: the per-op configs of the strategy), splits the batch into ``m``
micro-batches along the sample dim and runs each stage's micro-batch units
in a schedule's order:

- ``gpipe`` (Huang et al., "GPipe", NeurIPS 2019): every forward, then every
  backward;
- ``1f1b`` (PipeDream-flush: Narayanan et al., "Memory-Efficient Pipeline-
  Parallel DNN Training", ICML 2021; Megatron-LM's
  ``forward_backward_pipelining_without_interleaving``): stage ``s`` runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
  backward, then drains the backwards; at most ``p - s`` micro-batches of
  activations are alive on stage ``s``.

Micro-batches are tiles. An op's config ``(degrees, devices)`` with sample
degree ``d`` becomes, pipelined, ``degrees`` with sample degree ``d * m``
and the devices repeated (:func:`expand_config`), in one of two layouts,
whichever keeps every micro-batch the same samples in every op:

- *device-major* when every op splits its samples the same ``d`` ways (the
  baseline and the search's strategies): fine sample coordinate ``f = i m
  + j`` is micro-batch ``j`` on the device of coarse coordinate ``i``, so a
  device's micro-batch tiles are contiguous and its instance is its coarse
  tile, as unpipelined; micro-batch ``j`` is the ``j``-th slice of every
  device's samples;
- *micro-batch-major* otherwise: ``f = j d + i``, micro-batch ``j`` is
  samples ``[j B / m, (j + 1) B / m)`` whatever ``d``; a device's tiles are
  then strided and its instance their bounding box. Everything else (regions, copies, reductions of
weight gradients, which accumulate over the micro-batches on each device,
the one update per step) is what both halves already do for tiles. What
the schedule adds is the order: :func:`device_chains` lists, per device,
its forward/backward points in schedule order -- the simulator chains them
(so the bubble is simulated, not assumed) and the runtime replays that
order; :func:`launch_order` is the program order the runtime issues the
micro-batch launches in.

This module is a leaf of the layer table (imports only ``errors`` and
``geometry``); graphs and configs are duck-typed (``graph.ops``,
``op.dims``, ``op.output_shape``, ``cfg.degrees / devices / reduce``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import StrategyError

__all__ = ["Pipeline", "SCHEDULES", "stage_order", "launch_order", "expand_config",
           "micro_of", "device_major", "stage_index", "device_chains", "in_flight", "launches",
           "bubble_fraction", "even_cuts", "segment_cuts", "cut_points", "recomputes",
           "NO_RECOMPUTE", "MAX_POINT_TASKS", "max_microbatches"]

SCHEDULES = ("gpipe", "1f1b")

#: most forward + backward point tasks a default or searched pipeline gives
#: one step (micro-batches x block size x 2 x ops): a GPT-3-13B-sized graph
#: then simulates in 20-50 s on one core (the simulator's cost is per task)
MAX_POINT_TASKS = 2_000_000


def max_microbatches(graph: Any, per: int) -> int:
    """The most micro-batches :data:`MAX_POINT_TASKS` allows with blocks of
    ``per`` devices (at least 1)."""
    return max(1, MAX_POINT_TASKS // (2 * len(graph.ops) * max(1, per)))


@dataclass(frozen=True)
class Pipeline:
    """The pipeline of a strategy (``Strategy.pipeline``; JSON field
    ``"pipeline"``): ``stages`` as ``(first op, last op)`` names in graph
    order, ``devices[s]`` the device block of stage ``s``, ``microbatches``
    ``m``, the ``schedule`` name and the stages that ``recompute`` their
    activations in backward (indices)."""

    stages: tuple[tuple[str, str], ...]
    devices: tuple[tuple[int, ...], ...]
    microbatches: int
    schedule: str = "1f1b"
    recompute: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple((str(a), str(b)) for a, b in self.stages))
        object.__setattr__(self, "devices", tuple(tuple(int(d) for d in ds)
                                                  for ds in self.devices))
        object.__setattr__(self, "microbatches", int(self.microbatches))
        object.__setattr__(self, "recompute", tuple(sorted({int(s) for s in self.recompute})))

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def to_dict(self) -> dict:
        return {"stages": [list(s) for s in self.stages],
                "devices": [list(d) for d in self.devices],
                "microbatches": self.microbatches, "schedule": self.schedule,
                "recompute": list(self.recompute)}

    @classmethod
    def from_dict(cls, d: Any) -> Pipeline:
        try:
            return cls(tuple(tuple(s) for s in d["stages"]), tuple(d["devices"]),
                       d["microbatches"], d.get("schedule", "1f1b"), d.get("recompute", ()))
        except (KeyError, TypeError, ValueError) as e:
            raise StrategyError(
                f'bad "pipeline" {d!r} ({e}); expected {{"stages": [[first op, last op], ...], '
                '"devices": [[ids], ...], "microbatches": m, "schedule": "1f1b", '
                '"recompute": [stage, ...]}') from None

    def stage_of(self, graph: Any) -> list[int]:
        """The stage of every op (by op index); raises :class:`StrategyError`
        unless the stages are contiguous ranges covering graph order."""
        return stage_index(graph, self.stages)

    def validate(self, graph: Any, configs: Mapping, num_devices: int | None = None) -> None:
        """Every bad value named before any work: stage cuts that are not a
        topological split, ``m`` that does not divide the batch, an unknown
        schedule, overlapping device blocks, an op placed outside its
        stage's block, an op without a sample dim."""
        if self.schedule not in SCHEDULES:
            raise StrategyError(f"pipeline schedule {self.schedule!r} does not exist; use one "
                                f"of {', '.join(SCHEDULES)}")
        m, batch = self.microbatches, graph.batch_size
        if m < 1 or batch % m:
            raise StrategyError(f"pipeline microbatches {m} does not divide the batch "
                                f"{batch}; use a divisor of {batch}")
        if len(self.devices) != len(self.stages):
            raise StrategyError(f"the pipeline has {len(self.stages)} stages but "
                                f"{len(self.devices)} device blocks")
        seen: dict[int, int] = {}
        for s, ds in enumerate(self.devices):
            if not ds:
                raise StrategyError(f"pipeline stage {s} has no devices")
            for d in ds:
                if num_devices is not None and not 0 <= d < num_devices:
                    raise StrategyError(f"pipeline stage {s}: device {d} is not on the "
                                        f"machine (devices 0..{num_devices - 1})")
                if d in seen and seen[d] != s:
                    raise StrategyError(f"pipeline stages {seen[d]} and {s} overlap on device "
                                        f"{d}; every stage needs its own device block")
                seen[d] = s
        bad = [s for s in self.recompute if not 0 <= s < len(self.stages)]
        if bad:
            raise StrategyError(f"pipeline recompute names stages {bad}, but there are "
                                f"{len(self.stages)} (0..{len(self.stages) - 1})")
        stage = self.stage_of(graph)
        for op in graph.ops:
            cfg = configs[op.name]
            block = set(self.devices[stage[op.index]])
            out = sorted(set(cfg.devices) - block)
            if out:
                raise StrategyError(f"op {op.name!r} is in pipeline stage {stage[op.index]} "
                                    f"(devices {sorted(block)}) but its config places tiles "
                                    f"on {out}")
            if len(set(cfg.devices)) != len(cfg.devices):
                raise StrategyError(f"op {op.name!r} is pipelined but its config puts two "
                                    f"tiles on one device ({list(cfg.devices)}); give each "
                                    "tile its own device of the stage")
            d = cfg.degrees[sample_dim(op)]
            if (op.output_shape[sample_dim(op)] // m) < d:
                raise StrategyError(f"op {op.name!r}: sample degree {d} exceeds the "
                                    f"micro-batch of {batch // m} samples")


def sample_dim(op: Any) -> int:
    """The index of ``op``'s sample dim; every pipelined op needs one."""
    try:
        return list(op.dims).index("sample")
    except ValueError:
        raise StrategyError(f"op {op.name!r} has no sample dim (dims {tuple(op.dims)}): it "
                            "cannot be split into micro-batches") from None


def stage_index(graph: Any, stages: Sequence[tuple[str, str]]) -> list[int]:
    """Stage per op index for ``(first, last)`` name ranges: they must be
    contiguous, in graph order, and cover every op (a topological split)."""
    ops = graph.ops
    pos = {op.name: op.index for op in ops}
    out = [-1] * len(ops)
    nxt = 0
    for s, (a, b) in enumerate(stages):
        for n in (a, b):
            if n not in pos:
                raise StrategyError(f"pipeline stage {s}: no op named {n!r} in the graph")
        if pos[a] != nxt or pos[b] < pos[a]:
            raise StrategyError(
                f"pipeline stages are not a topological split: stage {s} is {a!r}..{b!r} "
                f"(ops {pos[a]}..{pos[b]}) but must start at op {nxt} "
                f"({ops[nxt].name if nxt < len(ops) else 'end'!r}); stages are contiguous "
                "ranges of graph order, in order")
        for i in range(pos[a], pos[b] + 1):
            out[i] = s
        nxt = pos[b] + 1
    if nxt != len(ops):
        raise StrategyError(f"pipeline stages end at op {nxt - 1} but the graph has "
                            f"{len(ops)} ops; the last stage must end at {ops[-1].name!r}")
    return out


# -- schedules ---------------------------------------------------------------------------------
def stage_order(s: int, p: int, m: int, schedule: str) -> list[tuple[str, int]]:
    """``("F" | "B", micro-batch)`` units of stage ``s`` of ``p`` in order."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    if schedule == "1f1b":
        w = min(p - s - 1, m)
        out = [("F", j) for j in range(w)]
        for i in range(m - w):
            out += [("F", w + i), ("B", i)]
        return out + [("B", j) for j in range(m - w, m)]
    raise StrategyError(f"pipeline schedule {schedule!r} does not exist; use one of "
                        f"{', '.join(SCHEDULES)}")


def in_flight(s: int, p: int, m: int, schedule: str) -> int:
    """Most micro-batches whose activations stage ``s`` holds at once."""
    live = peak = 0
    for what, _ in stage_order(s, p, m, schedule):
        live += 1 if what == "F" else -1
        peak = max(peak, live)
    return peak


def bubble_fraction(p: int, m: int) -> float:
    """The idle fraction of a uniform pipeline, ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def launch_order(p: int, m: int, schedule: str) -> list[tuple[int, str, int]]:
    """``(stage, "F" | "B", j)`` in one program order that respects every
    stage's schedule and the data flow (``F(s, j)`` after ``F(s - 1, j)``,
    ``B(s, j)`` after ``B(s + 1, j)`` and ``F(s, j)``): the order the runtime
    issues the micro-batch launches in."""
    seqs = [stage_order(s, p, m, schedule) for s in range(p)]
    pos = [0] * p
    done: set = set()
    out: list[tuple[int, str, int]] = []
    while len(out) < sum(len(q) for q in seqs):
        moved = False
        for s in range(p):
            while pos[s] < len(seqs[s]):
                what, j = seqs[s][pos[s]]
                if what == "F":
                    ok = s == 0 or (s - 1, "F", j) in done
                else:
                    ok = (s, "F", j) in done and (s == p - 1 or (s + 1, "B", j) in done)
                if not ok:
                    break
                done.add((s, what, j))
                out.append((s, what, j))
                pos[s] += 1
                moved = True
        if not moved:
            raise StrategyError(f"internal: pipeline schedule {schedule!r} deadlocks "
                                f"({p} stages, {m} micro-batches)")
    return out


def launches(graph: Any, pipe: Pipeline) -> list[tuple[int, int, int]]:
    """``(role, op index, micro-batch)`` of every pipelined launch in program
    order (role 0 forward, 1 backward): :func:`launch_order`'s units, a
    forward unit's ops in graph order, a backward unit's ops with a backward
    in reverse. The runtime issues its launches in this order and the
    simulator numbers its keys and chains its devices by it."""
    stage = pipe.stage_of(graph)
    by_stage: list[list[Any]] = [[] for _ in range(pipe.num_stages)]
    for op in graph.ops:
        by_stage[stage[op.index]].append(op)
    out = []
    for s, what, j in launch_order(pipe.num_stages, pipe.microbatches, pipe.schedule):
        if what == "F":
            out += [(0, op.index, j) for op in by_stage[s]]
        else:
            out += [(1, op.index, j) for op in reversed(by_stage[s]) if op.has_backward]
    return out


# -- micro-batches as tiles ----------------------------------------------------------------------
def device_major(graph: Any, configs: Mapping) -> bool:
    """The layout of a pipelined strategy: device-major when every op splits
    its sample dim the same number of ways (see the module docstring)."""
    return len({configs[op.name].degrees[sample_dim(op)] for op in graph.ops}) == 1


def expand_config(op: Any, cfg: Any, m: int,
                  major: bool = False) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(degrees, devices, reduce)`` of ``cfg`` with ``m`` micro-batches:
    the sample degree times ``m``; fine point ``(f, ..., r)`` on the device of
    coarse point ``(i, ..., r)`` with ``f = i m + j`` (``major``: device-major)
    or ``f = j d + i`` (micro-batch ``j``)."""
    s = sample_dim(op)
    degs = list(cfg.degrees)
    d = degs[s]
    red = cfg.reduce
    fine = list(degs)
    fine[s] = d * m
    n = math.prod(fine)
    devices = []
    for k in range(n):
        coords = _unravel(k, fine)
        coords[s] = coords[s] // m if major else coords[s] % d
        for r in range(red):
            devices.append(cfg.devices[_ravel(coords, degs) * red + r])
    return tuple(fine), tuple(devices), red


def micro_of(op: Any, coarse_degrees: Sequence[int], fine_degrees: Sequence[int],
             point: int, red: int = 1, major: bool = False) -> int:
    """The micro-batch of fine point ``point`` (``major``: device-major)."""
    s = sample_dim(op)
    f = _unravel(point // red, list(fine_degrees))[s]
    return f % (fine_degrees[s] // coarse_degrees[s]) if major else f // coarse_degrees[s]


def _unravel(k: int, shape: list[int]) -> list[int]:
    out = [0] * len(shape)
    for i in range(len(shape) - 1, -1, -1):
        k, out[i] = divmod(k, shape[i])
    return out


def _ravel(coords: list[int], shape: Sequence[int]) -> int:
    k = 0
    for c, n in zip(coords, shape):
        k = k * n + c
    return k


def device_chains(graph: Any, pipe: Pipeline, coarse: Mapping,
                  fine: Mapping) -> dict[int, list[tuple[int, int, int]]]:
    """Per device, ``(role, op index, fine point)`` (role 0 forward, 1
    backward) of every pipelined point in schedule order: the launches of
    :func:`launches`, each one's points on the device in point order.
    ``coarse`` / ``fine``: configs by op name before and after
    :func:`expand_config`."""
    major = device_major(graph, coarse)
    pts: dict = {}  # (op, micro-batch) -> [(device, point)], in point order
    for op in graph.ops:
        c, f = coarse[op.name], fine[op.name]
        for k, dev in enumerate(f.devices):
            pts.setdefault((op.index, micro_of(op, c.degrees, f.degrees, k, f.reduce, major)),
                           []).append((dev, k))
    out: dict[int, list[tuple[int, int, int]]] = {}
    for role, o, j in launches(graph, pipe):
        for dev, k in pts.get((o, j), ()):
            out.setdefault(dev, []).append((role, o, k))
    return out


#: ops whose forward state is never recomputed: the state is a random mask
#: (dropout: re-drawing it needs the step's seed in backward) or statistics
#: returned to the host (batch norm)
NO_RECOMPUTE = ("input", "dropout", "batch_norm")


def recomputes(graph: Any, pipe: Pipeline) -> list[bool]:
    """Per op index: does its backward recompute its forward (activation
    recomputation, Chen et al. 2016 / GPipe section 2.2)? The ops of a stage
    in ``pipe.recompute`` except its last op (the stage boundary, whose
    output the next stage reads) and :data:`NO_RECOMPUTE` kinds."""
    stage = pipe.stage_of(graph)
    last = {stage[op.index]: op.index for op in graph.ops}
    return [stage[op.index] in pipe.recompute and op.index != last[stage[op.index]]
            and op.kind not in NO_RECOMPUTE for op in graph.ops]


def cut_points(graph: Any) -> list[int]:
    """Positions ``i`` of graph order where a stage may start: where at most
    one op's output crosses the cut (a transformer's residual stream between
    blocks, a CNN's trunk between modules), so a stage boundary moves one
    tensor per micro-batch and never an attention matrix; every position
    when fewer than 8 qualify."""
    ops = graph.ops
    n = len(ops)
    last = [op.index for op in ops]
    for op in ops:
        for r in op.inputs:
            last[r.op.index] = max(last[r.op.index], op.index)
    crossing = [0] * (n + 1)
    for p in range(n):
        if last[p] > p:
            crossing[p + 1] += 1
            crossing[last[p] + 1] -= 1
    pts, acc = [], 0
    for i in range(n):
        acc += crossing[i]  # ops before i whose output is read at i or later
        if i >= 1 and acc <= 1:
            pts.append(i)
    return pts if len(pts) >= 8 else list(range(1, n))


def segment_cuts(weights: Sequence[float], stages: int,
                 starts: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """:func:`even_cuts` restricted to stages starting at ``starts`` (e.g.
    :func:`cut_points`): the ops between two allowed starts move together."""
    n = len(weights)
    bounds = [0] + sorted(s for s in (starts or range(1, n)) if 0 < s < n) + [n]
    segs = list(zip(bounds, bounds[1:]))
    if len(segs) < stages:
        segs = [(i, i + 1) for i in range(n)]
    w = [float(sum(weights[a:b])) for a, b in segs]
    return [(segs[a][0], segs[b][1] - 1) for a, b in even_cuts(w, stages)]


def even_cuts(weights: Sequence[float], stages: int) -> list[tuple[int, int]]:
    """``stages`` contiguous ``(first, last)`` index ranges of ``weights``
    (each at least one item) whose largest sum is as small as possible (the
    linear partition problem: bisection on the bottleneck, a greedy pack per
    guess), the slowest stage being what bounds a pipeline's rate."""
    n = len(weights)
    if not 1 <= stages <= n:
        raise StrategyError(f"cannot cut {n} ops into {stages} pipeline stages")
    w = [max(0.0, float(x)) for x in weights]

    def pack(limit: float) -> list[tuple[int, int]] | None:
        out, first, acc = [], 0, 0.0
        for i, x in enumerate(w):
            left = stages - len(out) - 1  # stages still to open after this one
            if i > first and (acc + x > limit or n - i == left):
                out.append((first, i - 1))
                first, acc = i, 0.0
            acc += x
        out.append((first, n - 1))
        return out if len(out) == stages and all(
            sum(w[a:b + 1]) <= limit * (1 + 1e-12) for a, b in out) else None

    lo, hi = max(w), sum(w)
    best = pack(hi) or [(i, i) for i in range(stages - 1)] + [(stages - 1, n - 1)]
    for _ in range(60):
        mid = (lo + hi) / 2
        got = pack(mid)
        if got is None:
            lo = mid
        else:
            best, hi = got, mid
        if hi - lo <= 1e-9 * max(hi, 1e-30):
            break
    return best
