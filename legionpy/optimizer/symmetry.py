"""Symmetric simulation: one representative node instead of all of them
(issue 24 item 4; docs/seam.md section 4).

When a strategy gives every node the same work, the schedules of the nodes
are translations of each other: node ``m``'s tasks start and end exactly
when node 0's do. Then the task graph needs only node 0's tasks (and the
collectives, whose durations come from the whole group): ``N`` times fewer
tasks on ``N`` nodes. This is what lets ResNet-101 data parallel on 8,192
simulated GPUs build and schedule in seconds (ASTRA-sim and Echo simulate
one rank per symmetric class the same way).

Conditions, all checked (else the full graph is built):

1. the machine is node-symmetric (:func:`node_classes`): ``N >= 2`` nodes of
   ``G`` devices each, device ``d`` is local device ``d % G`` of node ``d //
   G``, and every node's devices have the same specs;
2. every op's points come in ``N`` contiguous blocks (point order), block
   ``m`` on node ``m`` at the same local devices as block 0, and its tiles
   split evenly (every degree divides its extent: equal shapes);
3. (checked while building, :meth:`TaskGraph._tensor_block`) no activation
   read or gradient reduction crosses a block: every consumer point of a
   block reads only producer tiles of the same block;
4. gradient synchronisation is collective (``sync="collective"``): the
   point-to-point shard homes are the first users of each weight, which no
   two nodes share.

Per-device figures of node ``m`` are node 0's (device ``d`` reads device
``d % G``); link figures are node 0's links and the communicators;
``SimResult.classes = N`` scales ``bytes_moved``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["node_classes", "symmetric_blocks", "Asymmetric"]


class Asymmetric(Exception):
    """Internal: the strategy turned out not to be symmetric while building."""


def node_classes(machine) -> tuple[int, int] | None:
    """``(N, G)`` when ``machine`` is node-symmetric (condition 1), else None."""
    devs = machine.devices
    nodes = machine.num_nodes
    if nodes < 2 or len(devs) % nodes:
        return None
    G = len(devs) // nodes
    for d in devs:
        if d.node != d.id // G:
            return None
        r = devs[d.id % G]
        if (d.kind, d.flops, d.mem_bw, d.memory, d.host_bw) != (r.kind, r.flops, r.mem_bw,
                                                                 r.memory, r.host_bw):
            return None
    return nodes, G


def symmetric_blocks(graph, strategy, N: int, G: int) -> bool:
    """Condition 2 for every op of ``graph`` under ``strategy``."""
    shift = np.arange(N)[:, None] * G
    seen: set = set()
    for op in graph.ops:
        cfg = strategy[op.name]
        devs = cfg.devices
        if devs in seen:
            continue
        n = len(devs)
        if n % N:
            return False
        a = np.asarray(devs).reshape(N, n // N)
        if (a[0] >= G).any() or not (a - a[0] == shift).all():
            return False
        seen.add(devs)
    return True  # tiles split evenly: ParallelConfig.validate requires it
