"""Tiny models and the random-degree picker shared by the runtime invariance
tests (test_mirror.py, test_nn_invariance.py and, through test_mirror, the MPI
program tests/mpi/programs/mirror.py)."""

from __future__ import annotations

import math

import legionpy as lp

BATCH = 8


def mlp() -> lp.nn.Model:
    m = lp.nn.Model(batch_size=BATCH, seed=7)
    t = m.input((7,), name="x")
    t = m.dense(t, 12, activation="relu", name="fc1")
    t = m.dense(t, 6, activation="tanh", name="fc2")
    t = m.dense(t, 3, name="fc3")
    m.softmax(t, name="softmax")
    return m


def cnn(extra: bool = False) -> lp.nn.Model:
    """Convolutions and pooling with halos (``extra``: also batch norm and dropout)."""
    m = lp.nn.Model(batch_size=BATCH, seed=3)
    t = m.input((2, 12, 12), name="image")
    t = m.conv2d(t, 4, 3, padding=1, activation="relu", name="conv1")
    if extra:
        t = m.batch_norm(t, relu=True, name="bn1")
    t = m.pool2d(t, 2, name="pool1")
    t = m.conv2d(t, 6, 3, stride=1, padding=1, name="conv2")
    t = m.relu(t, name="relu2")
    t = m.flat(t, name="flat")
    if extra:
        t = m.dropout(t, 0.3, seed=5, name="drop")
    t = m.dense(t, 12, activation="relu", name="fc1")
    t = m.dense(t, 3, name="fc2")
    m.softmax(t, name="softmax")
    return m


def random_degrees(op, n: int, rng) -> list[int]:
    """Random degrees (1 to 4, at most max(n, 2) tiles) on ``op``'s parallel
    dims; grouped convolutions keep their channels whole."""
    deg = [1] * len(op.output_shape)
    for d in op.parallel_dims:
        opts = [k for k in (1, 2, 3, 4)
                if op.output_shape[d] % k == 0 and math.prod(deg) * k <= max(n, 2)]
        deg[d] = rng.choice(opts)
    if op.kind == "conv2d" and op.attrs["groups"] % deg[1]:
        deg[1] = 1
    return deg


def megatron_mlp() -> lp.nn.Model:
    """A Transformer MLP block (dense + gelu, then a dense without
    activation) and a classifier: Megatron-LM splits the first by columns,
    the second by rows (a reduction split, ParallelConfig.reduce)."""
    m = lp.nn.Model(batch_size=BATCH, seed=11)
    t = m.input((8,), name="x")
    t = m.dense(t, 16, activation="gelu", name="ff1")
    t = m.dense(t, 8, name="ff2")
    t = m.dense(t, 3, name="head")
    m.softmax(t, name="softmax")
    return m


def megatron(graph, n: int):
    """ff1 column-split over the n devices, ff2 row-split (reduce n) on the
    same devices, so slice r of ff2 reads ff1's tile r where it lives; the
    rest data parallel."""
    from legionpy.optimizer import Machine, ParallelConfig, Strategy

    s = dict(Strategy.data_parallel(graph, Machine.local(n)))
    s["ff1"] = ParallelConfig((1, n), tuple(range(n)))
    s["ff2"] = ParallelConfig((1, 1), tuple(range(n)), reduce=n)
    return Strategy(s)
