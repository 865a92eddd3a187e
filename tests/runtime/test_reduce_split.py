"""Issue 18 item 3: reduction-dimension splits (ParallelConfig.reduce) in
both halves -- the op rules give each point a slice of the reduction dim,
the output is a Reduce("+") of the partial results, the runtime runs it,
the trace equals the task graph, and training gives the same parameters as
data parallelism. Megatron-LM's MLP (column split, then row split)."""

from __future__ import annotations

import numpy as np
import pytest
from test_mirror import mirror
from test_nn_invariance import train
from tiny_models import BATCH, cnn, megatron, megatron_mlp

import legionpy as lp
from legionpy.errors import StrategyError
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy
from legionpy.optimizer.mirror import compare

STEPS = 3
X = np.random.default_rng(2).standard_normal((STEPS * BATCH, 8)).astype(np.float32)


@pytest.mark.parametrize("n", [2, 4])
def test_megatron_mlp_trace_equals_taskgraph(n):
    a, b = mirror(megatron_mlp, n, megatron)
    diff = compare(a, b)
    assert not diff, "\n".join(diff)
    # slice r of ff2 reads ff1's column tile r on its own device: no activation copies
    assert not [c for c in b.copies.values() if c[0].startswith("F:ff2")]
    # the partial sums of ff2 are folded for the head's reads
    assert [c for c in b.copies.values() if c[0].startswith("F:head")]
    assert sum(t.startswith("F:ff2[") for t in b.tasks) == n


def test_reduce_split_trains_like_data_parallelism():
    ref = train(megatron_mlp, X, 2, "data")
    for n in (2, 4):
        got = train(megatron_mlp, X, n, megatron)
        for name, value in ref.items():
            np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=1e-6, err_msg=name)


def test_reduce_split_with_sample_split_mirrors():
    def hybrid(graph, n):
        s = dict(megatron(graph, n))
        s["ff2"] = ParallelConfig((2, 1), (0, 1, 1, 0), reduce=2)
        return Strategy(s)

    a, b = mirror(megatron_mlp, 2, hybrid)
    assert not compare(a, b)


def conv_split(graph, n):
    """conv2 (no fused activation) split over its 4 input channels on top of
    a 2-way sample split; the rest data parallel."""
    s = dict(Strategy.data_parallel(graph, Machine.local(n)))
    s["conv2"] = ParallelConfig((2, 1, 1, 1), tuple(i % n for i in range(4)), reduce=2)
    return Strategy(s)


def test_conv_input_channel_split_mirrors_and_trains_like_data():
    from test_nn_invariance import X_IMG

    a, b = mirror(cnn, 2, conv_split)
    assert not compare(a, b)
    assert sum(t.startswith("F:conv2[") for t in b.tasks) == 4
    ref = train(cnn, X_IMG, 2, "data")
    got = train(cnn, X_IMG, 2, conv_split)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=1e-6, err_msg=name)


def vocab_split(graph, n):
    """Every step's embedding split over the vocabulary (2 slices), the
    slices on different devices; the rest data parallel."""
    s = dict(Strategy.data_parallel(graph, Machine.local(n)))
    for op in graph.ops:
        if op.kind == "embedding":
            s[op.name] = ParallelConfig((1,) * len(op.output_shape), (1 % n, 0), reduce=2)
    return Strategy(s)


def test_embedding_vocabulary_split_mirrors_and_trains_like_data():
    from test_mirror import data_for, rnn

    a, b = mirror(rnn, 2, vocab_split)
    assert not compare(a, b)
    xs, y = data_for(rnn())
    params = {}
    for spec in ("data", vocab_split):
        lp.init(cpus=2)
        try:
            m = rnn()
            m.compile(optimizer=lp.nn.SGD(lr=0.1), strategy=spec if spec == "data" else
                      spec(m.graph, 2))
            m.fit(xs[0], y, epochs=2, verbose=0, shuffle=False)
            params[str(spec)] = m.parameters()
        finally:
            lp.runtime.shutdown()
    ref, got = params.values()
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=1e-6, err_msg=name)


def test_reduce_configs_are_validated_and_saved():
    g = megatron_mlp().graph
    m = Machine.local(2)
    with pytest.raises(StrategyError, match="no reduction dim"):
        ParallelConfig((1, 1), (0, 1), reduce=2).validate(g.op("ff1"), m)  # gelu fused
    with pytest.raises(StrategyError, match="does not divide"):
        ParallelConfig((1, 1), (0, 1, 0), reduce=3).validate(g.op("ff2"), m)
    s = megatron(g, 2)
    again = Strategy.from_dict(s.to_dict(), g)
    assert again == s and again["ff2"].reduce == 2
    assert "reduce" not in s.to_dict()["ops"]["ff1"]
    t = Simulator(g, m).simulate(s)
    assert 0 < t < float("inf")


def test_megatron_strategy_runs_the_zoo_transformer():
    """The named "megatron" strategy on the (small) zoo Transformer: every
    encoder MLP column-split then row-split; it simulates, compiles by name,
    trains, and gives data parallelism's parameters."""
    from legionpy import models

    g = models.transformer(scale="small").graph
    s = Strategy.megatron(g, Machine.local(2))
    assert s["enc0.ff1"].degrees[-1] == 2 and s["enc0.ff2"].reduce == 2
    assert s["enc1.ff2"].devices == (0, 1)
    assert 0 < Simulator(g, Machine.local(2)).simulate(s) < float("inf")
    rng = np.random.default_rng(3)
    x = rng.integers(0, 32, (8, 8)).astype(np.int32)
    y = rng.integers(0, 32, (8, 8))
    params = {}
    for spec in ("data", "megatron"):
        lp.init(cpus=2)
        try:
            m = models.transformer(scale="small", seed=0)
            m.compile(optimizer=lp.nn.SGD(lr=0.1), strategy=spec)
            assert m.strategy["enc0.ff2"].reduce == (2 if spec == "megatron" else 1)
            m.fit(x, y, epochs=2, verbose=0, shuffle=False)
            params[spec] = m.parameters()
        finally:
            lp.runtime.shutdown()
    for name, value in params["data"].items():
        np.testing.assert_allclose(params["megatron"][name], value, rtol=2e-4, atol=1e-6,
                                   err_msg=name)
