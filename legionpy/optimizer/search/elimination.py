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

**Tied groups** (issue 18, for unrolled RNNs): ops that share a parameter
(the cells of one LSTM layer, the per-step embeddings) form one DP node
with one config for the whole group (``tie=True``, the default), the way
PaSE and FlexFlow's RNN experts treat a layer. The group's node cost is the
sum of its members' (a shared parameter is synchronised once), edges inside
the group fold into it (both ends share the config) and edges between two
groups add up. With the cost tables cached by structural signature
(:class:`~.costs.AdditiveCosts`), RNNLM unrolled over 256 steps reduces to
a short chain -- tokens, embeddings, layer 0, layer 1, projection -- and
solves exactly in about a second instead of half a minute with two nodes
fixed. ``tie=False`` keeps one node per op.

``deadline`` (a ``time.perf_counter()`` value): building the tables and
reducing check it; past it the DP stops and returns data parallelism with
``stopped_on_budget=True``.

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
    stopped_on_budget: bool = False
    groups: int = 0


class _OutOfTime(Exception):
    pass


class _Reducer:
    def __init__(self, n: int, deadline: float | None = None) -> None:
        self.deadline = deadline
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
            if self.deadline is not None and time.perf_counter() > self.deadline:
                raise _OutOfTime
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


def tied_groups(graph) -> list[int]:
    """Group id of every op: ops sharing a parameter are one group (union
    find over parameters); group ids are dense, in first-op order."""
    parent = list(range(len(graph.ops)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[int, int] = {}
    for op in graph.ops:
        for p in op.params.values():
            j = first.setdefault(id(p), op.index)
            a, b = find(j), find(op.index)
            if a != b:
                parent[max(a, b)] = min(a, b)
    ids: dict[int, int] = {}
    return [ids.setdefault(find(op.index), len(ids)) for op in graph.ops]


def _leads(group: list[int]) -> list[int]:
    """The first op of every group."""
    lead = [-1] * (max(group) + 1)
    for i, g in enumerate(group):
        if lead[g] < 0:
            lead[g] = i
    return lead


def eliminate(graph, machine, space: ConfigSpace | None = None, cost_model=None,
              costs: AdditiveCosts | None = None, tie: bool = True,
              deadline: float | None = None) -> EliminationResult:
    """Run the elimination DP; returns the strategy minimising the additive cost
    (exactly when ``result.exact``) over ``space``, with ops sharing a
    parameter tied to one config when ``tie``. ``deadline``: see the module
    docstring."""
    t0 = time.perf_counter()
    space = space or ConfigSpace.dp_default()
    costs = costs or AdditiveCosts(graph, machine, cost_model)
    table = space.table(graph, machine)
    ops = graph.ops
    group = tied_groups(graph) if tie else list(range(len(ops)))
    lead = _leads(group)
    if any(table[op.name] != table[ops[lead[group[op.index]]].name] for op in ops):
        group = list(range(len(ops)))  # members of different shapes: no tying
        lead = group
    n = len(lead)
    red = _Reducer(n, deadline)

    def check() -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise _OutOfTime

    try:
        node_memo: dict = {}
        for g in range(n):
            red.node[g] = np.zeros(len(table[ops[lead[g]].name]))
        for op in ops:
            k = (costs.signature(op, False), id(table[op.name]))
            v = node_memo.get(k)
            if v is None:
                check()
                v = node_memo[k] = np.array([costs.node(op, c) for c in table[op.name]])
            red.node[group[op.index]] = red.node[group[op.index]] + v
        for op in ops:
            for i, ref in enumerate(op.inputs):
                check()
                m = costs.edge_matrix(op, i, table[ref.op.name], table[op.name])
                a, b = group[ref.op.index], group[op.index]
                if a == b:
                    red.node[a] = red.node[a] + np.diag(m)
                else:
                    red.add_edge(a, b, m)
        fixed = red.run()
    except _OutOfTime:
        return EliminationResult(strategy=Strategy.data_parallel(graph, machine),
                                 additive_cost_s=float("nan"), exact=False,
                                 search_time_s=time.perf_counter() - t0,
                                 stopped_on_budget=True, groups=n)
    choice = red.unwind(n)
    strategy = Strategy({op.name: table[op.name][choice[group[op.index]]] for op in ops},
                        graph.name, machine.name)
    return EliminationResult(
        strategy=strategy, additive_cost_s=costs.total(strategy), exact=not fixed,
        node_eliminations=red.stats["node"], edge_eliminations=red.stats["edge"],
        leaf_eliminations=red.stats["leaf"], fixed_nodes=[ops[lead[v]].name for v in fixed],
        search_time_s=time.perf_counter() - t0, groups=n)
