"""Inference mode (issue 14 item 4): ``fit`` normalises with batch statistics
and folds them into batch norm's running statistics with the layer's
momentum; ``predict``/``evaluate`` normalise with the running statistics and
turn dropout off, as ``module.eval()`` does; strategies that give batch norm
the same sample degree agree on all of it."""

from __future__ import annotations

import numpy as np
import pytest

import legionpy as lp
from legionpy.optimizer import Machine, ParallelConfig, Strategy

B, STEPS, MOM, EPS = 8, 3, 0.3, 1e-3
RNG = np.random.default_rng(4)
X = (RNG.standard_normal((STEPS * B, 4, 3, 3)) * 2 + 1).astype(np.float32)
Y = RNG.integers(0, 3, STEPS * B)


def build() -> lp.nn.Model:
    m = lp.nn.Model(batch_size=B, seed=2)
    t = m.input((4, 3, 3), name="x")
    t = m.batch_norm(t, momentum=MOM, eps=EPS, name="bn")
    t = m.dropout(m.flat(t, name="flat"), 0.5, seed=1, name="drop")
    m.softmax(m.dense(t, 3, name="fc"), name="softmax")
    return m


def channel_split(graph, n: int) -> Strategy:
    """Batch norm split by channels over n devices, the rest by samples."""
    cfg = {}
    for op in graph.ops:
        deg = [1] * len(op.output_shape)
        deg[1 if op.kind == "batch_norm" else 0] = n if op.kind != "softmax" else 1
        k = int(np.prod(deg))
        cfg[op.name] = ParallelConfig(tuple(deg), tuple(i % n for i in range(k)))
    return Strategy(cfg)


def run(n: int, strategy, lr: float = 1e-9) -> tuple[dict, np.ndarray, dict, dict]:
    lp.init(cpus=n)
    try:
        m = build()
        if not isinstance(strategy, str):
            strategy = strategy(m.graph, n)
        m.compile(optimizer=lp.nn.SGD(lr=lr), strategy=strategy, metrics=["accuracy"],
                  machine=Machine.local(n))
        m.fit(X, Y, verbose=0, shuffle=False)
        return m.buffers(), m.predict(X), m.evaluate(X, Y), m.parameters()
    finally:
        lp.runtime.shutdown()


def test_running_statistics_follow_pytorch_update_with_the_layers_momentum():
    bufs, _, _, _ = run(1, "data")
    rm, rv = np.zeros(4), np.ones(4)
    for s in range(STEPS):
        xb = X[s * B:(s + 1) * B].astype(np.float64)
        mean, var = xb.mean(axis=(0, 2, 3)), xb.var(axis=(0, 2, 3), ddof=1)
        rm, rv = (1 - MOM) * rm + MOM * mean, (1 - MOM) * rv + MOM * var
    np.testing.assert_allclose(bufs["bn.running_mean"], rm, rtol=1e-5)
    np.testing.assert_allclose(bufs["bn.running_var"], rv, rtol=1e-5)


def test_predict_uses_running_statistics_and_no_dropout():
    bufs, p, ev, params = run(1, "data")
    rm, rv = bufs["bn.running_mean"], bufs["bn.running_var"]
    h = (X - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + EPS)
    h = h * params["bn.gamma"][None, :, None, None] + params["bn.beta"][None, :, None, None]
    z = h.reshape(len(X), -1) @ params["fc.weight"] + params["fc.bias"]
    want = np.exp(z - z.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(p, want, rtol=1e-4, atol=1e-6)
    loss = -np.log(want[np.arange(len(Y)), Y]).mean()
    assert ev["loss"] == pytest.approx(loss, rel=1e-4)
    assert ev["accuracy"] == pytest.approx((want.argmax(1) == Y).mean())


def test_fit_trains_with_batch_statistics_and_dropout():
    """A step's loss is that of the batch-normalised, dropped-out forward:
    it differs from what evaluate reports on the same batch at a tiny lr."""
    lp.init(cpus=1)
    try:
        m = build()
        m.compile(optimizer=lp.nn.SGD(lr=1e-9), machine=Machine.local(1))
        h = m.fit(X[:B], Y[:B], verbose=0, shuffle=False)
        ev = m.evaluate(X[:B], Y[:B])
        assert h["step_loss"][0] != pytest.approx(ev["loss"], rel=1e-3)
        np.testing.assert_array_equal(m.predict(X[:B]), m.predict(X[:B]))
    finally:
        lp.runtime.shutdown()


@pytest.mark.parametrize("n", [2, 4])
def test_inference_mode_is_strategy_invariant(n):
    base = run(1, "data", lr=0.1)
    got = run(n, channel_split, lr=0.1)
    for a, b in zip(base[:1] + base[3:], got[:1] + got[3:]):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(base[1], got[1], rtol=1e-4, atol=1e-6)


def test_checkpoint_keeps_running_statistics(tmp_path):
    lp.init(cpus=1)
    try:
        m = build()
        m.compile(optimizer=lp.nn.SGD(lr=0.1), machine=Machine.local(1))
        m.fit(X, Y, verbose=0, shuffle=False)
        m.save(tmp_path / "c.npz")
        want = m.predict(X)
        m2 = build()
        m2.compile(optimizer=lp.nn.SGD(lr=0.1), machine=Machine.local(1))
        m2.load(tmp_path / "c.npz")
        np.testing.assert_allclose(m2.predict(X), want, rtol=1e-6)
    finally:
        lp.runtime.shutdown()
