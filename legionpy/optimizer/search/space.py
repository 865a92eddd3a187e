"""The search space: the valid parallel configs of one operator (FlexFlow
paper section 4 and section 6 "we only consider configurations whose
degrees ... divide the tensor sizes").

A config of op ``o`` on machine ``M`` (``D = M.num_devices``) is

- *degrees*: one degree per output dim; a dim labelled ``None`` keeps degree
  1; every other degree divides the dim's size; the product of the degrees
  (the number of tiles ``n``) is at most ``D``;
- *devices*: a contiguous block of ``n`` device ids. By default the block is
  *aligned*: it starts at a multiple of ``n`` (``0, n, 2n, ...`` while it
  fits), which keeps the space small and matches how the machine's nodes are
  laid out (a block of 4 on ``p100:4x4`` is one node). Tile ``k`` runs on
  ``start + k``.

:class:`ConfigSpace` restricts this further, and every search method takes
one, so two methods compared on "the same space" really are:

==================  ========================================================
``labels``          dim labels that may be split (default: all three)
``max_split_dims``  at most this many dims with degree > 1 (default: any)
``pow2``            the number of tiles is a power of two
``degrees``         allowed tile counts (e.g. ``(1, 4)``); default any
``placement``       ``"aligned"`` (default), ``"zero"`` (block starts at 0)
                    or ``"any"`` (every start ``0 .. D - n``)
``max_devices``     at most this many tiles (default ``D``)
``reduce``          also split the op's reduction dim (``ParallelConfig.reduce``,
                    a dense layer without a fused activation): ``r`` points per
                    tile, ``r`` dividing the dim, ``n * r`` within the limits
                    above, the split counting as one more split dim (default on)
==================  ========================================================

The elimination DP uses ``ConfigSpace.dp_default()`` (powers of two, at
most two split dims, blocks starting at 0, no reduction splits), DeePa's
own restriction; the
exhaustive tests use tiny spaces (``degrees=(1, 4)``) so that every strategy
can be enumerated.

>>> from legionpy import models
>>> from legionpy.optimizer import Machine
>>> g = models.lenet(batch_size=16).graph
>>> sp = ConfigSpace(degrees=(1, 4), placement="zero", labels=("sample", "parameter"))
>>> [c.degrees for c in sp.configs(g.op("fc1"), Machine.parse("p100:1x4"))]
[(1, 1), (1, 4), (2, 2), (4, 1)]
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..strategy import ParallelConfig, Strategy

__all__ = ["ConfigSpace", "divisors", "neighbours", "space_size", "symmetric_table"]


def divisors(n: int, at_most: int) -> list[int]:
    """Divisors of ``n`` that are ``<= at_most``, ascending."""
    return [k for k in range(1, min(n, at_most) + 1) if n % k == 0]


@dataclass(frozen=True)
class ConfigSpace:
    """A restriction of the config space (see the module docstring)."""

    labels: tuple[str, ...] = ("sample", "attribute", "parameter")
    max_split_dims: int | None = None
    pow2: bool = False
    degrees: tuple[int, ...] | None = None
    placement: str = "aligned"
    max_devices: int | None = None
    reduce: bool = True

    @classmethod
    def dp_default(cls) -> ConfigSpace:
        """The elimination DP's space: powers of two, <= 2 split dims, blocks at
        0, no reduction splits (under the additive cost they look cheaper than
        the simulator finds them: ResNet-101 on 8 GPUs, 127 ms with them vs 88
        ms without; MCMC, which the simulator judges, has them)."""
        return cls(max_split_dims=2, pow2=True, placement="zero", reduce=False)

    def key(self) -> tuple:
        return (self.labels, self.max_split_dims, self.pow2, self.degrees, self.placement,
                self.max_devices, self.reduce)

    def degree_tuples(self, op, num_devices: int) -> list[tuple[int, ...]]:
        """Every allowed degree tuple of ``op``, in a fixed order."""
        cap = min(num_devices, self.max_devices or num_devices)
        shape = op.output_shape
        choices = []
        for d, lab in enumerate(op.dims):
            choices.append(divisors(shape[d], cap) if lab in self.labels else [1])
        out = []
        for degs in itertools.product(*choices):
            n = math.prod(degs)
            if n > cap:
                continue
            if self.pow2 and n & (n - 1):
                continue
            if self.degrees is not None and n not in self.degrees:
                continue
            if self.max_split_dims is not None and \
                    sum(k > 1 for k in degs) > self.max_split_dims:
                continue
            out.append(tuple(degs))
        return out

    def starts(self, n: int, num_devices: int) -> list[int]:
        """First device of every allowed block of ``n`` devices."""
        if self.placement == "zero":
            return [0]
        if self.placement == "any":
            return list(range(0, num_devices - n + 1))
        if self.placement == "aligned":
            return list(range(0, num_devices - n + 1, n))
        raise ValueError(f"placement must be 'aligned', 'zero' or 'any', got "
                         f"{self.placement!r}")

    def reduce_degrees(self, op, degs: tuple[int, ...], num_devices: int) -> list[int]:
        """The reduction-dim degrees allowed with ``degs`` (1 always)."""
        ext = op.reduce_extent() if self.reduce else 0
        n = math.prod(degs)
        cap = min(num_devices, self.max_devices or num_devices) // n
        if not ext or cap < 2 or (self.max_split_dims is not None and
                                  sum(k > 1 for k in degs) >= self.max_split_dims):
            return [1]
        return [1] + [r for r in divisors(ext, cap) if r > 1
                      and not (self.pow2 and (n * r) & (n * r - 1))
                      and (self.degrees is None or n * r in self.degrees)]

    def configs(self, op, machine) -> list[ParallelConfig]:
        """Every config of ``op`` in this space (never empty: the whole op on
        device 0 is always in it)."""
        D = machine.num_devices
        out = []
        for degs in self.degree_tuples(op, D):
            n = math.prod(degs)
            for red in self.reduce_degrees(op, degs, D):
                for s in self.starts(n * red, D):
                    out.append(ParallelConfig(degs, tuple(range(s, s + n * red)), red))
        if not out:
            out.append(ParallelConfig.single(len(op.output_shape), 0))
        return out

    def table(self, graph, machine) -> dict[str, list[ParallelConfig]]:
        """``{op name: configs}`` for every op of ``graph`` (shared by shape)."""
        memo: dict = {}
        out = {}
        for op in graph.ops:
            k = (op.output_shape, op.dims, op.reduce_extent() if self.reduce else 0)
            if k not in memo:
                memo[k] = self.configs(op, machine)
            out[op.name] = memo[k]
        return out

    def contains(self, op, config: ParallelConfig, machine) -> bool:
        return config in self.configs(op, machine)

    def random_strategy(self, graph, machine, rng) -> Strategy:
        """A uniformly random config per op (``rng``: ``random.Random``)."""
        table = self.table(graph, machine)
        return Strategy({n: rng.choice(c) for n, c in table.items()}, graph.name, machine.name)


def symmetric_table(graph, machine, space: ConfigSpace | None = None
                    ) -> dict[str, list[ParallelConfig]]:
    """``{op name: configs}`` of node-symmetric configs only (issue 24; the
    strategies :mod:`legionpy.optimizer.symmetry` simulates one node of):
    a config of one node (``space`` over ``G`` devices, no reduction splits,
    every split dim after the sample dim) repeated on every node by
    multiplying its sample degree by the node count ``N``; node ``m`` runs
    the node config on its devices ``m G + l``. Data parallelism and
    :meth:`Strategy.hybrid` are in it. Where an op has none (its sample dim
    does not divide), its data-parallel config is its only one."""
    N = machine.num_nodes
    G = machine.num_devices // max(1, N)
    space = space or ConfigSpace()
    local = ConfigSpace(space.labels, space.max_split_dims, space.pow2, space.degrees,
                        "zero", G, False)
    memo: dict = {}
    out = {}
    for op in graph.ops:
        k = (op.output_shape, op.dims)
        if k not in memo:
            cfgs = []
            s = op.dims.index("sample") if "sample" in op.dims else None
            for degs in (local.degree_tuples(op, G) if s is not None else []):
                if any(d < s and x > 1 for d, x in enumerate(degs)):
                    continue  # a split before the sample dim interleaves the nodes
                if op.output_shape[s] % (degs[s] * N):
                    continue
                n = math.prod(degs)
                full = tuple(x * N if d == s else x for d, x in enumerate(degs))
                devs = tuple(m * G + j for m in range(N) for j in range(n))
                cfgs.append(ParallelConfig(full, devs))
            if not cfgs:
                cfgs = [Strategy.data_parallel(_One(op), machine)[op.name]]
            memo[k] = cfgs
        out[op.name] = memo[k]
    return out


class _One:
    """A one-op graph view for :meth:`Strategy.data_parallel`."""

    def __init__(self, op) -> None:
        self.ops, self.name = [op], "op"


def space_size(table: dict[str, list]) -> float:
    """Number of strategies in a config table (a float: it overflows quickly)."""
    return float(math.prod(len(c) for c in table.values()))


def neighbours(strategy: Strategy, table: dict[str, list]):
    """Every ``(op name, config)`` single-op change of ``strategy`` within ``table``."""
    for name, cfgs in table.items():
        cur = strategy[name]
        for c in cfgs:
            if c != cur:
                yield name, c
