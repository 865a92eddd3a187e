"""The layer API end to end: learning, checkpoints, traces, and misuse errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import legionpy as lp
from legionpy.errors import MappingError, ModelError, StrategyError
from legionpy.optimizer import ParallelConfig, Strategy


@pytest.fixture
def rt2():
    rt = lp.init(cpus=2)
    yield rt
    lp.runtime.shutdown()


def lenet8(batch: int = 32, seed: int = 0) -> lp.nn.Model:
    """LeNet adapted to 8x8 digits."""
    m = lp.nn.Model(batch_size=batch, seed=seed)
    t = m.input((1, 8, 8), name="image")
    t = m.conv2d(t, 8, 3, padding=1, activation="relu", name="conv1")
    t = m.pool2d(t, 2, name="pool1")
    t = m.conv2d(t, 16, 3, padding=1, activation="relu", name="conv2")
    t = m.pool2d(t, 2, name="pool2")
    t = m.flat(t, name="flat")
    t = m.dense(t, 64, activation="relu", name="fc1")
    t = m.dense(t, 10, name="fc2")
    m.softmax(t, name="softmax")
    return m


def tiny(batch: int = 4) -> lp.nn.Model:
    m = lp.nn.Model(batch_size=batch)
    m.softmax(m.dense(m.input((3,), name="x"), 2, name="fc"), name="softmax")
    return m


def test_lenet_learns_digits(rt2):
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(0).permutation(len(x))
    tr, te = order[:1350], order[1350:]
    m = lenet8()
    m.compile(optimizer=lp.nn.Adam(lr=0.01), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"], strategy="data")
    hist = m.fit(x[tr], d.target[tr], epochs=8, verbose=0)
    assert hist["loss"][-1] < hist["loss"][0]
    res = m.evaluate(x[te], d.target[te])
    assert res["accuracy"] >= 0.95, res
    p = m.predict(x[te[:5]])
    assert p.shape == (5, 10) and np.allclose(p.sum(axis=1), 1, atol=1e-5)


def test_trace_names_and_placement_follow_the_strategy():
    rt = lp.init(cpus=2, executor="serial")
    try:
        m = tiny()
        s = Strategy({"x": ParallelConfig((2, 1), (1, 0)), "fc": ParallelConfig((1, 2), (0, 1)),
                      "softmax": ParallelConfig((2, 1), (1, 0))})
        m.compile(strategy=s, sync="shards")  # an update per parameter tile
        x = np.ones((4, 3), np.float32)
        m.fit(x, np.zeros(4, np.int64), verbose=0)
        rt.trace.start()
        m.fit(x, np.zeros(4, np.int64), verbose=0)
        lp.fence()
        recs = [r for r in rt.trace.stop() if r["kind"] in ("compute", "update")]
    finally:
        lp.runtime.shutdown()
    got = [(r["name"], r["launch"], r["device"]) for r in recs]
    assert got == [("F(x)", 0, 1), ("F(x)", 1, 0), ("F(fc)", 0, 0), ("F(fc)", 1, 1),
                   ("F(softmax)", 0, 1), ("F(softmax)", 1, 0), ("B(softmax)", 0, 1),
                   ("B(softmax)", 1, 0), ("B(fc)", 0, 0), ("B(fc)", 1, 1),
                   ("U(fc.weight)", 0, 0), ("U(fc.weight)", 1, 1), ("U(fc.bias)", 0, 0),
                   ("U(fc.bias)", 1, 1)]
    assert all(r["kind"] == "update" for r in recs if r["name"].startswith("U("))


def test_save_load_roundtrip_and_crash_mid_save(rt2, tmp_path, monkeypatch):
    m = tiny().compile(strategy="model")
    x, y = np.random.default_rng(0).standard_normal((8, 3)), np.array([0, 1] * 4)
    m.fit(x, y, verbose=0)
    path = tmp_path / "ckpt.npz"
    m.save(path)
    before = m.parameters()
    m.fit(x, y, verbose=0)

    def crash(f, **arrays):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        m.save(path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt.npz"]
    m.load(path)
    for k, v in m.parameters().items():
        np.testing.assert_array_equal(v, before[k])
    m2 = tiny().compile(strategy="data")
    m2.load(path)
    assert all(np.array_equal(m2.parameters()[k], before[k]) for k in before)
    assert m.num_parameters() == 8


def test_strategy_file_and_seeded_init(rt2, tmp_path):
    m = tiny().compile(strategy="owt")
    m.strategy.save(tmp_path / "s.json")
    m2 = tiny().compile(strategy=str(tmp_path / "s.json"))
    assert m2.strategy == m.strategy
    p1, p2 = m.parameters(), m2.parameters()
    assert all(np.array_equal(p1[k], p2[k]) for k in p1)


def test_mse_and_categorical_losses(rt2):
    m = lp.nn.Model(batch_size=4)
    m.dense(m.input((3,)), 2, name="out")
    m.compile(optimizer=lp.nn.SGD(lr=0.1), loss="mse", metrics=["mae", "mse"], strategy="model")
    x = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    y = x[:, :2] * 2
    h = m.fit(x, y, epochs=5, verbose=0)
    assert h["loss"][-1] < h["loss"][0] and h["mse"][-1] == pytest.approx(h["loss"][-1], 0.2)
    c = tiny().compile(loss="categorical_crossentropy", metrics=["accuracy", "crossentropy"])
    res = c.fit(np.ones((4, 3)), np.eye(2)[[0, 1, 0, 1]], verbose=0)
    assert res["crossentropy"][0] == pytest.approx(res["loss"][0], rel=1e-5)


def test_errors_name_the_value_and_the_fix(rt2):
    m = tiny()
    with pytest.raises(ModelError, match="before compile"):
        m.fit(np.ones((4, 3)), np.zeros(4))
    with pytest.raises(ModelError, match="unknown loss 'hinge'"):
        m.compile(loss="hinge")
    with pytest.raises(ModelError, match="unknown metric 'f1'"):
        m.compile(metrics=["f1"])
    with pytest.raises(ModelError, match="unknown strategy 'fastest'"):
        m.compile(strategy="fastest")
    m.compile()
    with pytest.raises(ModelError, match=r"shape \(N, 3\), got \(4, 5\)"):
        m.fit(np.ones((4, 5)), np.zeros(4))
    with pytest.raises(ModelError, match="targets"):
        m.fit(np.ones((4, 3)), np.zeros(5))
    with pytest.raises(ModelError, match="batch_size=8"):
        m.fit(np.ones((4, 3)), np.zeros(4), batch_size=8)
    bad = Strategy({n: ParallelConfig((1, 1), (5,)) for n in ("x", "fc", "softmax")})
    with pytest.raises((ModelError, StrategyError, MappingError), match="device"):
        tiny().compile(strategy=bad)
    with pytest.raises(ModelError, match="end with model.softmax"):
        mm = lp.nn.Model(4)
        mm.dense(mm.input((3,)), 2)
        mm.compile(loss="sparse_categorical_crossentropy")


def test_compile_search_finds_caches_and_trains(rt2, tmp_path, monkeypatch):
    """strategy="search": search on the local machine, cache, run -- one step."""
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path))
    monkeypatch.setenv("LEGIONPY_SEARCH_ITERATIONS", "30")
    x = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    m = tiny().compile(optimizer=lp.nn.SGD(lr=0.5), strategy="search")
    first = m.strategy
    assert set(first) == {op.name for op in m.graph.ops}
    assert list(tmp_path.glob("strategy-*.json")), "the searched strategy is cached"
    h = m.fit(x, y, epochs=3, verbose=0)
    assert h["loss"][-1] < h["loss"][0]
    again = tiny().compile(optimizer=lp.nn.SGD(lr=0.5), strategy="search")
    assert again.strategy == first          # from the cache, same model and machine
    ref = tiny().compile(optimizer=lp.nn.SGD(lr=0.5), strategy="data")
    ref.fit(x, y, epochs=3, verbose=0)
    for name, value in ref.parameters().items():
        np.testing.assert_allclose(m.parameters()[name], value, rtol=1e-4, atol=1e-6)


def test_compile_installs_a_mapper_that_consults_the_optimizer(rt2):
    """issue 9 item 1: compile's mapper asks the optimizer and answers
    select_parallel_config and the placement of every point from the strategy."""
    from legionpy.mapper.consult import ConsultingMapper
    from legionpy.optimizer import Machine

    m = lenet8(batch=8).compile(strategy="model")
    mapper = lp.runtime().mapper
    assert isinstance(mapper, ConsultingMapper) and mapper.specs[m.id] == "model"
    machine = Machine.local(2)
    for op in m.graph.ops:
        assert mapper.select_parallel_config(op, m.graph, machine) == m.strategy[op.name]
    lp.runtime().trace.start()
    m.fit(np.zeros((8, 1, 8, 8), np.float32), np.zeros(8, np.int64), verbose=0)
    lp.fence()
    records = lp.runtime().trace.stop()
    placed = [(r["name"], r["launch"], r["device"]) for r in records
              if r["kind"] == "compute" and r["name"].startswith("F(conv1")]
    assert placed and all(d == m.strategy["conv1"].devices[k] for _, k, d in placed)


def test_a_search_judge_can_overrule_the_pick(rt2, tmp_path, monkeypatch):
    """legionpy/mapper/resolve.py: a judge installed from above (legionpy
    train's: the local machine model) keeps the search's pick only if it
    times it JUDGE_MARGIN faster than data, model, owt and one device, else
    the fastest of those; a judge answering None
    (another machine) leaves it; with no judge the pick stands."""
    from legionpy.mapper import resolve
    from legionpy.optimizer import Machine, Strategy

    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path))
    monkeypatch.setenv("LEGIONPY_SEARCH_ITERATIONS", "30")
    g = tiny().graph
    machine = Machine.local(2)
    plain = resolve.search_strategy(g, machine)
    model = Strategy.resolve("model", g, machine)
    assert plain != model  # the search's own pick on this tiny model
    seen = []

    def judge(graph, s, m):
        seen.append(s)
        return 0.5 if s == model else 1.0  # model parallelism times fastest

    monkeypatch.setattr(resolve, "_judge", None)
    resolve.set_search_judge(judge)
    try:
        assert resolve.search_strategy(g, machine) == model
        assert len(seen) == 5  # the pick, then data, model, owt and single
        single = Strategy.resolve("single", g, machine)
        assert all(c.degrees == (1,) * len(c.degrees) and c.devices == (0,)
                   for c in single.values())
        resolve.set_search_judge(lambda graph, s, m: 0.1 if s == single else 1.0)
        assert resolve.search_strategy(g, machine) == single  # one device beats two
        # what `legionpy train --strategy search` prints as the pick
        assert single.named_as(g, machine) == "single" and model.named_as(g, machine) == "model"
        # the pick (judged first) stands only when judged JUDGE_MARGIN faster
        # than every baseline; else the fastest baseline (data here) runs
        data = Strategy.resolve("data", g, machine)
        for gain, kept in ((0.5 * resolve.JUDGE_MARGIN, data), (2 * resolve.JUDGE_MARGIN, plain)):
            calls = []

            def judge(graph, s, m, gain=gain, calls=calls):
                calls.append(s)
                return 1.0 - gain if len(calls) == 1 else 1.0 + 0.1 * (s != data)

            resolve.set_search_judge(judge)
            assert resolve.search_strategy(g, machine) == kept, gain
        resolve.set_search_judge(lambda graph, s, m: None)
        assert resolve.search_strategy(g, machine) == plain
    finally:
        resolve.set_search_judge(None)
    assert resolve.search_strategy(g, machine) == plain


def test_single_device_trains_as_data_parallel_does_and_keeps_device_1_idle():
    """``strategy="single"`` (the judge's one-device baseline): every task on
    device 0, and the same training as data parallelism (to float rounding)."""
    x = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    y = np.array([0, 1] * 8)
    losses, placed = {}, {}
    for strategy in ("single", "data"):
        rt = lp.init(cpus=2, executor="threads")
        try:
            m = tiny().compile(optimizer=lp.nn.SGD(lr=0.1), strategy=strategy)
            m.fit(x, y, verbose=0, shuffle=False)
            rt.trace.start()
            losses[strategy] = m.fit(x, y, verbose=0, shuffle=False)["step_loss"]
            lp.fence()
            placed[strategy] = {r["device"] for r in rt.trace.stop()
                                if r["kind"] in ("compute", "update")}
        finally:
            lp.runtime.shutdown()
    assert placed["single"] == {0} and placed["data"] == {0, 1}
    np.testing.assert_allclose(losses["single"], losses["data"], rtol=1e-5)
