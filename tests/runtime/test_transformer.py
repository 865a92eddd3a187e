"""The zoo Transformer (issue 14 item 6) trains, and splitting attention
heads across devices gives the same numbers as data parallelism."""

from __future__ import annotations

import numpy as np

import legionpy as lp
from legionpy import models
from legionpy.optimizer import Machine, ParallelConfig, Strategy

SIZES = {"batch_size": 4, "seq": 6, "d_model": 16, "heads": 4, "ff": 32, "layers": 1,
         "vocab": 11}
RNG = np.random.default_rng(0)
X = RNG.integers(0, 11, (8, 6))
Y = (X + 1) % 11


def head_split(graph, n: int) -> Strategy:
    """Ops with a head dim (dim 1 of 4-d outputs) split it n ways; the rest
    run whole on device 0."""
    cfg = {}
    for op in graph.ops:
        deg = [1] * len(op.output_shape)
        if len(deg) == 4 and op.dims[1] == "attribute" and op.output_shape[1] == 4:
            deg[1] = n
        k = int(np.prod(deg))
        cfg[op.name] = ParallelConfig(tuple(deg), tuple(range(k)))
    return Strategy(cfg)


def train(n: int, strategy) -> tuple[dict, list]:
    lp.init(cpus=n)
    try:
        m = models.transformer(**SIZES)
        if not isinstance(strategy, str):
            strategy = strategy(m.graph, n)
        m.compile(optimizer=lp.nn.Adam(lr=0.01), strategy=strategy, machine=Machine.local(n))
        h = m.fit(X, Y, epochs=3, verbose=0, shuffle=False)
        return m.parameters(), h["step_loss"]
    finally:
        lp.runtime.shutdown()


def test_head_split_equals_data_parallel_and_learns():
    base, losses = train(1, "data")
    assert losses[-1] < losses[0]
    split, _ = train(4, head_split)
    for k in base:
        np.testing.assert_allclose(split[k], base[k], rtol=1e-4, atol=1e-6, err_msg=k)
