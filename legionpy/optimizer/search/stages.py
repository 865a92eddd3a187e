"""Disjoint device sets for repeated layers: the placement pass after the
elimination DP (issue 18; PaSE, Cai et al., IPDPS'21, finds this for RNNLM,
and FlexFlow's Figure 14 shows it: each LSTM layer on its own GPUs, so the
layers pipeline across time steps).

The DP's additive cost sums every op's time, so it cannot see that two
layers on disjoint devices run *at the same time* (layer 1 at step ``t``
beside layer 0 at step ``t + 1``): it always spreads every op over all
devices, from device 0. This pass proposes the alternative and lets the
full simulator judge:

- the *repeated groups* are the tied groups of :func:`.elimination.tied_groups`
  with more than one member (the cells of an LSTM layer, the per-step
  embeddings), in graph order;
- for ``k`` stages (``k`` divides the device count, ``2 <= k <=`` the number
  of groups) the groups are cut into ``k`` contiguous runs of about equal
  work (the DP's compute seconds); stage ``j`` gets the aligned block of
  ``D / k`` devices starting at ``j * D / k``;
- every member of a stage gets a config of at most ``D / k`` tiles on its
  block, in two shapes: the DP's degrees halved (largest first) until they
  fit, and the sample dim alone split ``D / k`` ways (PaSE's RNNLM choice).
  Ops outside the repeated groups keep the DP's config.

:func:`legionpy.optimizer.search.run_all` simulates every candidate (until
the DP's share of the budget is spent) and reports the fastest of them and
the DP's own strategy as the ``elimination`` row, so the row is never worse
than the DP's strategy under the simulator.
"""

from __future__ import annotations

import math

from ..strategy import ParallelConfig, Strategy
from .costs import AdditiveCosts
from .elimination import tied_groups

__all__ = ["staged_candidates", "fit_config"]


def fit_config(op, cfg: ParallelConfig, start: int, size: int,
               sample_only: bool = False) -> ParallelConfig:
    """``cfg`` shrunk to at most ``size`` tiles (halving its largest degree
    first), placed from device ``start``; or, with ``sample_only``, the
    sample dim split by the largest divisor of its size that is ``<= size``."""
    nd = len(op.output_shape)
    if sample_only and "sample" in op.dims:
        d = op.dims.index("sample")
        k = max(j for j in range(1, size + 1) if op.output_shape[d] % j == 0)
        return ParallelConfig.along(nd, d, k, range(start, start + k))
    degs = list(cfg.degrees)
    while math.prod(degs) > size:
        d = max(range(nd), key=lambda i: (degs[i], -i))
        k = degs[d]
        degs[d] = max(j for j in range(1, k) if k % j == 0 and op.output_shape[d] % j == 0)
    n = math.prod(degs)
    return ParallelConfig(tuple(degs), tuple(range(start, start + n)))


def _stages(work: list[float], k: int) -> list[int]:
    """Cut ``work`` (per group, in order) into ``k`` contiguous runs of about
    equal sum; returns the stage of every group."""
    total = sum(work) or 1.0
    out, acc = [], 0.0
    for w in work:
        out.append(min(k - 1, int((acc + 0.5 * w) / total * k)))
        acc += w
    for j in range(1, len(out)):  # no empty stage in the middle: keep runs monotone
        out[j] = max(out[j], out[j - 1])
    return out


def staged_candidates(graph, machine, strategy: Strategy,
                      costs: AdditiveCosts | None = None) -> dict[str, Strategy]:
    """``{"stages=K/fit" | "stages=K/sample": Strategy}`` (see the module doc);
    empty when the graph has fewer than two repeated groups."""
    group = tied_groups(graph)
    members: dict[int, list] = {}
    for op in graph.ops:
        members.setdefault(group[op.index], []).append(op)
    rep = [g for g, ops in members.items() if len(ops) > 1]
    D = machine.num_devices
    if len(rep) < 2 or D < 2:
        return {}
    costs = costs or AdditiveCosts(graph, machine)
    work = [sum(costs.compute(op, strategy[op.name]) for op in members[g]) for g in rep]
    out = {}
    for k in range(2, min(len(rep), D) + 1):
        if D % k:
            continue
        size = D // k
        stage = _stages(work, k)
        if len(set(stage)) < 2:
            continue
        for mode in ("fit", "sample"):
            cfgs = dict(strategy)
            for g, j in zip(rep, stage):
                for op in members[g]:
                    cfgs[op.name] = fit_config(op, strategy[op.name], j * size, size,
                                               mode == "sample")
            out[f"stages={k}/{mode}"] = Strategy(cfgs, graph.name, machine.name)
    return out
