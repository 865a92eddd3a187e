"""Elimination DP (DeePa, "Exploring Hidden Dimensions in Parallelizing
Convolutional Neural Networks", section 4 and appendix; the same algorithm
OptCNN uses).

Under the *additive* cost of :mod:`.costs` (node costs ``N_v[c]`` plus edge
costs ``E_uv[c_u, c_v]``) the optimum over a graph can be found by shrinking
the graph without losing optimality:

- **edge elimination**: two parallel edges between ``u`` and ``v`` become one
  whose table is their sum;
- **node elimination**: a node ``v`` with exactly two incident edges
  ``(u, v)`` and ``(v, w)`` (DeePa: one in-edge and one out-edge; the cost is
  symmetric, so direction does not matter) becomes the edge ``(u, w)`` with
  ``E'[c_u, c_w] = min_c (E_uv[c_u, c] + N_v[c] + E_vw[c, c_w])``; the argmin
  table is kept to recover ``v``'s config later;
- **leaf elimination** (the degenerate case DeePa's two-node end state
  covers): a node ``v`` with one edge to ``u`` folds
  ``min_c (E_uv[c_u, c] + N_v[c])`` into ``N_u``.

Repeating these until one node is left is exact. Chains (AlexNet, VGG-16)
and trees always reduce fully. Graphs that do not (unrolled RNN grids,
Inception's blocks after the easy reductions) use the **fallback**: fix the
remaining node with the most edges to its best config given optimal
neighbours (``N_v[c] + sum_u min_cu (E_vu[c, c_u] + N_u[c_u])``), fold its
edges into the neighbours' node costs, and continue eliminating. The result
is then exact on the rest of the graph given the fixed nodes;
:attr:`EliminationResult.exact` says whether any node was fixed.

Configs come from a :class:`~.space.ConfigSpace`, by default
``ConfigSpace.dp_default()`` (tile counts a power of two up to the machine,
at most two split dims, device blocks starting at 0), which keeps the
``|C_u| x |C_v|`` edge tables small (<= ~70 x 70 for a convolution on 16
devices).

Unwinding: after the last node takes its argmin, eliminated nodes are
visited in reverse order of elimination; each one's argmin table is indexed
by its (already chosen) neighbours' configs.

>>> from legionpy import models
>>> from legionpy.optimizer import Machine
>>> g = models.alexnet(batch_size=64, image_size=67, width=0.25, hidden=256).graph
>>> res = eliminate(g, Machine.parse("p100:1x4"))
>>> res.exact, len(res.strategy) == len(g.ops)
(True, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..strategy import Strategy
from .costs import AdditiveCosts
from .space import ConfigSpace

__all__ = ["eliminate", "EliminationResult"]


@dataclass
class EliminationResult:
    """The DP's strategy, its additive cost (seconds) and statistics."""

    strategy: Strategy
    additive_cost_s: float
    exact: bool
    node_eliminations: int = 0
    edge_eliminations: int = 0
    leaf_eliminations: int = 0
    fixed_nodes: list = field(default_factory=list)
    search_time_s: float = 0.0


class _Reducer:
    def __init__(self, n: int) -> None:
        self.node: dict[int, np.ndarray] = {}
        self.adj: dict[int, dict[int, np.ndarray]] = {v: {} for v in range(n)}
        self.stack: list = []
        self.stats = {"node": 0, "edge": 0, "leaf": 0}

    def add_edge(self, a: int, b: int, m: np.ndarray) -> None:
        """Add table ``m[c_a, c_b]``, merging with an existing a-b edge."""
        if a == b:
            raise ValueError("self edge")
        if b in self.adj[a]:
            self.stats["edge"] += 1
            self.adj[a][b] = self.adj[a][b] + m
            self.adj[b][a] = self.adj[a][b].T
        else:
            self.adj[a][b] = m
            self.adj[b][a] = m.T

    def remove(self, v: int) -> None:
        for u in self.adj.pop(v):
            del self.adj[u][v]
        del self.node[v]

    def eliminate_leaf(self, v: int) -> None:
        (u, m), = self.adj[v].items()      # m[c_v, c_u]
        t = m + self.node[v][:, None]
        arg = t.argmin(axis=0)
        self.node[u] = self.node[u] + t.min(axis=0)
        self.stack.append(("leaf", v, u, arg))
        self.remove(v)
        self.stats["leaf"] += 1

    def eliminate_node(self, v: int) -> None:
        (u, mu), (w, mw) = sorted(self.adj[v].items())    # mu[c_v, c_u], mw[c_v, c_w]
        t = mu.T[:, :, None] + self.node[v][None, :, None] + mw[None, :, :]
        arg = t.argmin(axis=1)
        new = t.min(axis=1)
        self.stack.append(("node", v, (u, w), arg))
        self.remove(v)
        self.add_edge(u, w, new)
        self.stats["node"] += 1

    def fix(self, v: int) -> int:
        score = self.node[v].copy()
        for u, m in self.adj[v].items():
            score += (m + self.node[u][None, :]).min(axis=1)
        c = int(score.argmin())
        for u, m in self.adj[v].items():
            self.node[u] = self.node[u] + m[c]
        self.stack.append(("fixed", v, None, c))
        self.remove(v)
        return c

    def run(self) -> list[int]:
        fixed = []
        while len(self.node) > 1:
            progress = True
            while progress and len(self.node) > 1:
                progress = False
                for v in sorted(self.node):
                    if v not in self.node or len(self.node) <= 1:
                        continue
                    deg = len(self.adj[v])
                    if deg == 0:
                        self.stack.append(("fixed", v, None, int(self.node[v].argmin())))
                        self.remove(v)
                        progress = True
                    elif deg == 1:
                        self.eliminate_leaf(v)
                        progress = True
                    elif deg == 2:
                        self.eliminate_node(v)
                        progress = True
            if len(self.node) > 1:
                v = max(sorted(self.node), key=lambda x: len(self.adj[x]))
                self.fix(v)
                fixed.append(v)
        (last,) = self.node
        self.stack.append(("fixed", last, None, int(self.node[last].argmin())))
        return fixed

    def unwind(self, n: int) -> list[int]:
        choice = [-1] * n
        for kind, v, nb, arg in reversed(self.stack):
            if kind == "fixed":
                choice[v] = arg
            elif kind == "leaf":
                choice[v] = int(arg[choice[nb]])
            else:
                u, w = nb
                choice[v] = int(arg[choice[u], choice[w]])
        return choice


def eliminate(graph, machine, space: ConfigSpace | None = None, cost_model=None,
              costs: AdditiveCosts | None = None) -> EliminationResult:
    """Run the elimination DP; returns the strategy minimising the additive cost
    (exactly when ``result.exact``)."""
    t0 = time.perf_counter()
    space = space or ConfigSpace.dp_default()
    costs = costs or AdditiveCosts(graph, machine, cost_model)
    table = space.table(graph, machine)
    ops = graph.ops
    red = _Reducer(len(ops))
    for op in ops:
        red.node[op.index] = np.array([costs.node(op, c) for c in table[op.name]])
    for op in ops:
        for i, ref in enumerate(op.inputs):
            p = ref.op
            m = costs.edge_matrix(op, i, table[p.name], table[op.name])
            red.add_edge(p.index, op.index, m)
    fixed = red.run()
    choice = red.unwind(len(ops))
    strategy = Strategy({op.name: table[op.name][choice[op.index]] for op in ops},
                        graph.name, machine.name)
    return EliminationResult(
        strategy=strategy, additive_cost_s=costs.total(strategy), exact=not fixed,
        node_eliminations=red.stats["node"], edge_eliminations=red.stats["edge"],
        leaf_eliminations=red.stats["leaf"], fixed_nodes=[ops[v].name for v in fixed],
        search_time_s=time.perf_counter() - t0)
