"""Shared helpers for the optimizer tests: random graphs and configs."""

from __future__ import annotations

import itertools
import math
import random

from legionpy.optimizer import Graph, Machine, ParallelConfig


def with_memory(machine: Machine, nbytes: float) -> Machine:
    """``machine`` with every device's memory set to ``nbytes``."""
    d = machine.to_dict()
    for dev in d["devices"]:
        dev["memory"] = nbytes
    return Machine.from_dict(d)


def random_graph(seed: int, n_ops: int = 8, batch: int = 8) -> Graph:
    """A random DAG of dense / relu / add / concat / shared-weight dense ops."""
    rng = random.Random(seed)
    g = Graph(batch, name=f"rand{seed}")
    refs = [g.input((8,), name="x")]
    shared = None
    for i in range(n_ops):
        kind = rng.choice(["dense", "dense", "relu", "add", "concat", "shared"])
        a = rng.choice(refs)
        if kind == "dense":
            r = g.dense(a, rng.choice([4, 8, 12]), name=f"d{i}")
        elif kind == "relu":
            r = g.relu(a, name=f"r{i}")
        elif kind == "add":
            same = [x for x in refs if x.shape == a.shape]
            r = g.add(a, rng.choice(same), name=f"a{i}")
        elif kind == "concat":
            r = g.concat([a, rng.choice(refs)], axis=1, name=f"c{i}")
        else:
            if a.shape[1] != 8:
                a = g.dense(a, 8, name=f"p{i}")
            r = g.dense(a, 8, share=shared, name=f"s{i}")
            shared = shared or r
        refs.append(r)
    g.softmax(g.dense(refs[-1], 4, name="head"), name="loss")
    return g


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def random_config(rng: random.Random, op, n_dev: int) -> ParallelConfig:
    """A valid random config: degrees on parallelizable dims, product <= n_dev
    (or a little more, so tiles share devices), random devices."""
    shape = op.output_shape
    choices = []
    for d, n in enumerate(shape):
        choices.append(divisors(n) if op.dims[d] is not None else [1])
    combos = [c for c in itertools.product(*choices) if math.prod(c) <= 2 * n_dev]
    deg = rng.choice(combos)
    devs = tuple(rng.randrange(n_dev) for _ in range(math.prod(deg)))
    return ParallelConfig(deg, devs)


def random_strategy(rng: random.Random, graph, machine):
    from legionpy.optimizer import Strategy
    return Strategy({op.name: random_config(rng, op, machine.num_devices) for op in graph.ops},
                    graph.name, machine.name)


def tilings(op):
    """Degree tuples to try on ``op``: none, 2 and 3 along each parallel dim,
    and 2 along every parallel dim at once (the layer kernel tests)."""
    nd = len(op.output_shape)
    yield (1,) * nd
    for d in op.parallel_dims:
        for k in (2, 3):
            if k <= op.output_shape[d]:
                deg = [1] * nd
                deg[d] = k
                yield tuple(deg)
    yield tuple(2 if d in op.parallel_dims and op.output_shape[d] >= 2 else 1 for d in range(nd))
