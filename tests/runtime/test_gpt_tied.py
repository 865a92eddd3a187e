"""Issue 25 item 1: the GPT decoders of the zoo and their tied embedding /
output head (``tied_dense``): one Parameter used by two ops of different
tilings. The tied gradient is the sum of both uses (against a numpy
reference), training is strategy-invariant (data, model, owt, megatron and
splits of the head's vocabulary, plain and reduce-split), the runtime's trace
equals the simulator's task graph, and the small gpt2 learns."""

from __future__ import annotations

import numpy as np
import pytest
from test_mirror import train_traced

import legionpy as lp
from legionpy import models
from legionpy.nn.init import initial_value
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy
from legionpy.optimizer.mirror import compare, taskgraph_form, traced_taskgraph

N, S, V, D = 4, 3, 16, 8
RNG = np.random.default_rng(25)
IDS = RNG.integers(0, V, (N, S)).astype(np.int32)
LABELS = RNG.integers(0, V, (N, S))


def tied():
    """ids -> embedding E (V, D) -> LayerNorm -> x @ E^T -> softmax."""
    m = lp.nn.Model(batch_size=N, seed=3, name="tied")
    e = m.embedding(m.input((S,), dtype="int32", name="ids"), V, D, name="emb")
    h = m.layer_norm(e, name="ln")
    m.softmax(m.tied_dense(h, e, name="head"), name="softmax")
    return m


def reference_gradient(w: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """d(mean cross-entropy)/dE of :func:`tied` in float64: the head's use
    ``dlogits^T h`` plus the embedding's scatter of ``dx``."""
    w = w.astype(np.float64)
    x = w[IDS]                                   # (N, S, D)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    xh = (x - mu) / np.sqrt(var + 1e-5)
    h = xh * gamma + beta
    z = h @ w.T
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dz = p.copy()
    np.put_along_axis(dz, LABELS[..., None], p[np.arange(N)[:, None], np.arange(S), LABELS][
        ..., None] - 1, -1)
    dz /= N * S
    g_head = dz.reshape(-1, V).T @ h.reshape(-1, D)
    dh = dz @ w
    dxh = dh * gamma
    dx = (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True)) \
        / np.sqrt(var + 1e-5)
    g_emb = np.zeros_like(w)
    np.add.at(g_emb, IDS.reshape(-1), dx.reshape(-1, D))
    return g_head + g_emb


def head_split(graph, n):
    """The head split over the vocabulary n ways, the embedding over D."""
    s = dict(Strategy.data_parallel(graph, Machine.local(n)))
    s["head"] = ParallelConfig((1, 1, n), tuple(range(n)))
    s["emb"] = ParallelConfig((1, 1, n), tuple(reversed(range(n))))
    return Strategy(s)


def head_reduce(graph, n):
    """The head's reduction dim (D) split n ways on top of a 2-way sample split."""
    s = dict(Strategy.data_parallel(graph, Machine.local(n)))
    s["head"] = ParallelConfig((2, 1, 1), tuple(i % n for i in range(2 * n)), reduce=n)
    return Strategy(s)


def step_gradient(strategy, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(E before, gradient of E) from one plain SGD step (lr 1) of :func:`tied`."""
    lp.init(cpus=n)
    try:
        m = tied()
        w0 = initial_value(m.graph.parameters()["emb.weight"], m.seed).copy()
        m.compile(optimizer=lp.nn.SGD(lr=1.0), strategy=strategy if isinstance(strategy, str)
                  else strategy(m.graph, n), machine=Machine.local(n))
        m.fit([IDS], LABELS, epochs=1, verbose=0, shuffle=False)
        return w0, w0 - m.parameters()["emb.weight"]
    finally:
        lp.runtime.shutdown()


def test_tied_parameter_is_one_parameter():
    g = tied().graph
    assert g.op("head").params["weight"] is g.op("emb").params["weight"]
    assert g.num_parameters() == V * D + 2 * D
    with pytest.raises(lp.errors.GraphError, match="shares parameter 'emb.weight'"):
        m = tied()
        m.tied_dense(m.input((S, D + 1)), m.graph.op("emb"))


@pytest.mark.parametrize("strategy,n", [("data", 1), ("model", 2), (head_split, 2),
                                        (head_reduce, 2)])
def test_tied_gradient_is_the_sum_of_both_uses(strategy, n):
    w0, g = step_gradient(strategy, n)
    ref = reference_gradient(w0, np.ones(D), np.zeros(D))
    # (dropping the head's dW, or the embedding's, is off by ~0.3 here)
    np.testing.assert_allclose(g, ref, rtol=1e-3, atol=2e-7)


@pytest.mark.parametrize("strategy", [head_split, head_reduce])
def test_tied_trace_equals_taskgraph(strategy):
    rt = lp.init(cpus=2)
    try:
        m = tied()
        mach = Machine.local(2)
        m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9),
                  strategy=strategy(m.graph, 2), machine=mach)
        recs = train_traced(rt, m, [IDS], LABELS, 3)
        sim = Simulator(m.graph, mach)
        sim.run(m.strategy)
        form = taskgraph_form(sim.tg)
        diff = compare(traced_taskgraph(recs), form)
        assert not diff, "\n".join(diff)
        # one parameter, one update: the head has no weight of its own
        assert sorted(sim.tg.params[w].name for b in sim.tg.buckets for w in b) == [
            "emb.weight", "ln.beta", "ln.gamma"]
        assert all(k.startswith("U:b") for k in form.tasks if k.startswith("U:"))
    finally:
        lp.runtime.shutdown()


def gpt_losses(strategy, n: int = 2, steps: int = 3) -> tuple[list, dict]:
    rng = np.random.default_rng(4)
    x = rng.integers(0, 32, (steps * 8, 8)).astype(np.int32)
    y = rng.integers(0, 32, (steps * 8, 8))
    lp.init(cpus=n)
    try:
        m = models.gpt2(scale="small")
        mach = Machine.local(n)
        spec = getattr(Strategy, strategy)(m.graph, mach) if strategy in ("owt", "megatron") \
            else strategy
        m.compile(optimizer=lp.nn.SGD(lr=0.1, momentum=0.9), strategy=spec, machine=mach)
        h = m.fit(x, y, epochs=1, verbose=0, shuffle=False)
        losses = list(h["step_loss"])
        return losses, m.parameters()
    finally:
        lp.runtime.shutdown()


def test_small_gpt2_is_strategy_invariant():
    ref, pref = gpt_losses("data")
    for name in ("model", "owt", "megatron"):
        got, p = gpt_losses(name)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5, err_msg=name)
        for k, v in pref.items():
            np.testing.assert_allclose(p[k], v, rtol=2e-4, atol=1e-6, err_msg=f"{name}: {k}")
