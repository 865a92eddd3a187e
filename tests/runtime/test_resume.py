"""Exact resume (issue 15 item 3): Ctrl-C stops ``fit`` at a step boundary
and saves the checkpoint; ``load`` then ``fit`` gives the uninterrupted
run's losses bit for bit (Adam, momentum SGD, dropout, shuffling)."""

from __future__ import annotations

import os
import signal
import warnings

import numpy as np
import pytest

import legionpy as lp
from legionpy.errors import CheckpointError, Interrupted, ModelError


@pytest.fixture
def rt2():
    rt = lp.init(cpus=2)
    yield rt
    lp.runtime.shutdown()


def mlp(seed: int = 0) -> lp.nn.Model:
    m = lp.nn.Model(batch_size=8, seed=seed)
    t = m.dense(m.input((6,), name="x"), 16, activation="relu", name="fc1")
    t = m.dropout(t, 0.3, name="drop")
    m.softmax(m.dense(t, 3, name="fc2"), name="softmax")
    return m


def data(n: int = 48):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)


OPTIMIZERS = {"adam": lambda: lp.nn.Adam(lr=0.01),
              "momentum": lambda: lp.nn.SGD(lr=0.05, momentum=0.9)}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_ctrl_c_then_load_and_fit_is_bit_identical(rt2, tmp_path, opt):
    x, y = data()
    full: list[float] = []
    m1 = mlp().compile(optimizer=OPTIMIZERS[opt](), strategy="data")
    m1.fit(x, y, epochs=3, verbose=0, on_step=lambda s, logs: full.append(logs["loss"]))
    assert len(full) == 18

    ck = tmp_path / "run.npz"
    first: list[float] = []

    def ctrl_c_at_step_7(step, logs):
        first.append(logs["loss"])
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    m2 = mlp().compile(optimizer=OPTIMIZERS[opt](), strategy="data")
    with pytest.raises(Interrupted, match=f"saved {ck}"):
        m2.fit(x, y, epochs=3, verbose=0, on_step=ctrl_c_at_step_7, checkpoint=ck)
    assert 8 <= m2.step < 18 and len(first) == m2.step  # stopped at a step boundary
    assert (m2.epoch, m2.step - 6 * m2.epoch) == (m2.step // 6, m2.step % 6)

    rest: list[float] = []
    m3 = mlp().compile(optimizer=OPTIMIZERS[opt](), strategy="model")
    m3.load(ck)
    assert (m3.step, m3.epoch) == (m2.step, m2.epoch)
    assert m3.strategy == m2.strategy  # the saved strategy is restored
    m3.fit(x, y, epochs=3 - m3.epoch, verbose=0,
           on_step=lambda s, logs: rest.append(logs["loss"]))
    assert first + rest == full  # bit-identical
    for k, v in m1.parameters().items():
        np.testing.assert_array_equal(m3.parameters()[k], v)


def test_checkpoint_every_saves_at_step_boundaries(rt2, tmp_path):
    from legionpy.nn.checkpoint import read_meta

    x, y = data()
    ck = tmp_path / "every.npz"
    m = mlp().compile(optimizer=lp.nn.Adam(lr=0.01))
    seen = []

    def look(step, logs):
        if ck.exists():
            seen.append(read_meta(ck)["step"])

    m.fit(x, y, epochs=2, verbose=0, checkpoint=ck, checkpoint_every=4, on_step=look)
    assert set(seen) <= {4, 8, 12} and {4, 8} <= set(seen)
    assert read_meta(ck)["step"] == 12 and read_meta(ck)["epoch"] == 2
    assert sorted(os.listdir(tmp_path)) == ["every.npz"]


def test_corrupt_or_foreign_checkpoint_names_the_file(rt2, tmp_path):
    m = mlp().compile()
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError) as e:
        m.load(bad)
    assert str(bad) in str(e.value) and "pickle" not in str(e.value)
    text = tmp_path / "t.npz"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="t.npz") as e:
        m.load(text)
    assert "pickle" not in str(e.value)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        m.load(tmp_path / "missing.npz")
    other = lp.nn.Model(batch_size=8)
    other.softmax(other.dense(other.input((6,), name="x"), 3, name="out"), name="softmax")
    other.compile()
    other.save(tmp_path / "other.npz")
    with pytest.raises(CheckpointError, match="lacks parameters"):
        m.load(tmp_path / "other.npz")


def test_fit_rejects_bad_arguments(rt2, tmp_path):
    x, y = data()
    m = mlp().compile()
    with pytest.raises(ModelError, match="epochs must be an integer >= 1"):
        m.fit(x, y, epochs=0, verbose=0)
    with pytest.raises(ModelError, match="checkpoint_every needs checkpoint"):
        m.fit(x, y, checkpoint_every=2, verbose=0)


def test_a_different_optimizer_warns(rt2, tmp_path):
    x, y = data()
    m = mlp().compile(optimizer=lp.nn.SGD(lr=0.05))
    m.fit(x, y, verbose=0)
    m.save(tmp_path / "c.npz")
    m2 = mlp().compile(optimizer=lp.nn.Adam())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m2.load(tmp_path / "c.npz")
    assert any("starts from zero" in str(x.message) for x in w)


def test_model_arguments_are_checked():
    for kw in ({"batch_size": 0}, {"batch_size": "8"}, {"batch_size": 8, "seed": -1}):
        with pytest.raises(ModelError, match="must be an integer"):
            lp.nn.Model(**kw)
