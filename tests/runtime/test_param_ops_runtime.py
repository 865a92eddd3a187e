"""``concat_param`` (ViT's class token), ``layer_scale`` (ConvNeXt's layer
scale) and dilated ``conv2d`` in training (issue 27): one SGD step gives the
same parameters under random strategies that split every dim of these ops
(the class token's rows, the scale's channels) as on one device, the
parameters of both ops train, the runtime's traced task graph equals the
simulator's (the DESIGN.md mirror), and emulated GPUs give the CPU's step."""

from __future__ import annotations

import numpy as np
import pytest
from test_mirror import random_strategy, train_traced

import legionpy as lp
from legionpy.optimizer import Machine, ParallelConfig, Simulator, Strategy
from legionpy.optimizer.mirror import compare, taskgraph_form, traced_taskgraph

N = 4
RNG = np.random.default_rng(27)
X = RNG.standard_normal((N, 2, 8, 8)).astype(np.float32)
Y = RNG.integers(0, 3, N)


def tiny_vit():
    """dilated conv, layer scale, patches -> tokens, class token, positions,
    a layer-scaled residual MLP, mean over the tokens -> classes."""
    m = lp.nn.Model(batch_size=N, seed=2, name="tinyvit")
    x = m.input((2, 8, 8), name="image")
    c = m.conv2d(x, 4, 3, padding=2, dilation=2, name="dconv")          # (4, 8, 8)
    c = m.layer_scale(c, (4, 1, 1), init=0.5, name="ls_conv")
    p = m.conv2d(c, 6, 4, stride=4, name="patch")                        # (6, 2, 2)
    t = m.transpose(m.reshape(p, (6, 4), name="flat"), (0, 2, 1), name="tokens")  # (4, 6)
    t = m.concat_param(t, 2, axis=1, name="cls")  # (6, 6): two class rows (a distilled ViT)
    t = m.add_bias(t, ndim=2, name="pos")
    h = m.layer_scale(m.dense(t, 6, activation="relu", name="mlp"), (6,), name="ls")
    t = m.add(t, h, name="res")
    t = m.reduce(t, [1], "mean", keepdims=False, name="pool")
    m.softmax(m.dense(t, 3, name="head"), name="softmax")
    return m


def step(strategy, n, gpus=False):
    lp.init() if gpus else lp.init(cpus=n)
    try:
        m = tiny_vit()
        m.compile(optimizer=lp.nn.SGD(lr=0.5), machine=None if gpus else Machine.local(n),
                  strategy=strategy if isinstance(strategy, str) else strategy(m.graph, n))
        before = m.parameters()
        m.fit(X, Y, epochs=1, verbose=0, shuffle=False)
        return before, m.parameters()
    finally:
        lp.runtime.shutdown()


def split_new_ops(graph, n):
    """The class token's sequence dim, the scales' channels split n ways."""
    s = dict(Strategy.data_parallel(graph, Machine.local(n)))
    s["cls"] = ParallelConfig((1, n, 1), tuple(range(n)))
    s["ls_conv"] = ParallelConfig((1, 2, 1, 2), tuple(i % n for i in range(4)))
    s["ls"] = ParallelConfig((2, 1, n), tuple(reversed(range(n))) * 2)
    s["dconv"] = ParallelConfig((1, 1, 2, 1), (1, 0))
    return Strategy(s)


def test_new_ops_train_and_are_strategy_invariant():
    before, ref = step("data", 1)
    for k in ("cls.value", "ls.gamma", "ls_conv.gamma", "dconv.weight"):
        assert np.abs(ref[k] - before[k]).max() > 1e-4, k  # trained: a gradient reached it
    np.testing.assert_array_equal(before["ls_conv.gamma"], np.full((4, 1, 1), 0.5, np.float32))
    for strat in (split_new_ops, lambda g, n: random_strategy(g, n, 3),
                  lambda g, n: random_strategy(g, n, 8)):
        _, got = step(strat, 2)
        for k, v in ref.items():
            np.testing.assert_allclose(got[k], v, rtol=2e-5, atol=2e-6, err_msg=k)


@pytest.mark.parametrize("seed", [0, 5])
def test_trace_equals_taskgraph(seed):
    rt = lp.init(cpus=2)
    try:
        m = tiny_vit()
        mach = Machine.local(2)
        strat = split_new_ops(m.graph, 2) if seed == 0 else random_strategy(m.graph, 2, seed)
        m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9), strategy=strat, machine=mach)
        recs = train_traced(rt, m, [X], Y, 3)
        sim = Simulator(m.graph, mach)
        sim.run(m.strategy)
        diff = compare(traced_taskgraph(recs), taskgraph_form(sim.tg))
        assert not diff, "\n".join(diff)
        assert sim.simulate(m.strategy) > 0
    finally:
        lp.runtime.shutdown()


def test_emulated_gpus_equal_cpu(monkeypatch):
    """The new kernels run on device arrays (the GPU code path, emulated:
    runtime/emugpu.py), the class rows and scaled channels split over 2 GPUs."""
    _, ref = step("data", 1)
    monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
    monkeypatch.setenv("LEGIONPY_GPUS", "2")
    _, got = step(split_new_ops, 2, gpus=True)
    for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, rtol=2e-5, atol=2e-6, err_msg=k)
