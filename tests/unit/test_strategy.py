"""ParallelConfig / Strategy: constructors, validation, JSON."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simhelpers import random_graph, random_strategy

from legionpy import models
from legionpy.errors import StrategyError
from legionpy.optimizer import Machine, ParallelConfig, Strategy


def test_config_is_frozen_hashable():
    a = ParallelConfig((2, 1), (0, 1))
    assert a == ParallelConfig([2, 1], [0, 1]) and hash(a) == hash(ParallelConfig((2, 1), (0, 1)))
    with pytest.raises(AttributeError):
        a.degrees = (1, 1)
    with pytest.raises(StrategyError, match=r"2 tiles but 3 devices"):
        ParallelConfig((2, 1), (0, 1, 2))


def test_constructors():
    g = models.alexnet(batch_size=64, width=0.25, hidden=256).graph
    m = Machine.parse("p100:1x4")
    dp = Strategy.data_parallel(g, m)
    assert dp["conv1"].degrees == (4, 1, 1, 1) and dp["conv1"].devices == (0, 1, 2, 3)
    mp = Strategy.model_parallel(g, m)
    assert mp["fc6"].degrees == (1, 4) and mp["conv1"].degrees == (1, 4, 1, 1)
    owt = Strategy.owt(g, m)
    assert owt["fc6"].degrees == (1, 4) and owt["conv1"].degrees == (4, 1, 1, 1)
    for s in (dp, mp, owt):
        s.validate(g, m)
    r = models.rnnlm(batch_size=8, steps=2, hidden=8, vocab=16).graph
    m2 = Machine.parse("p100:2x2")
    ex = Strategy.rnn_expert(r, m2)
    ex.validate(r, m2)
    # layers in first-use order: embedding, lstm0, lstm1, proj -> GPUs 0, 1, 0, 1 per node
    assert ex["embed.t0"].devices == (0, 2) and ex["lstm0.t0"].devices == (1, 3)
    assert ex["lstm1.t0"].devices == (0, 2) and ex["proj"].devices == (1, 3)
    assert ex["lstm0.t1"].devices == ex["lstm0.t0"].devices


def test_batch_norm_data_parallel_splits_samples():
    # batch_norm is sample-parallel with local statistics, as in FlexFlow
    g = models.resnet101(batch_size=8, image_size=32, width=0.0625, blocks=(1, 1, 1, 1)).graph
    m = Machine.parse("p100:1x4")
    assert Strategy.data_parallel(g, m)["bn1"].degrees == (4, 1, 1, 1)


def test_validation_errors_name_the_value():
    g = models.lenet(batch_size=6).graph
    m = Machine.parse("p100:1x4")
    s = Strategy.data_parallel(g, m, num_devices=2)
    with pytest.raises(StrategyError, match=r"degree 4 does not divide dim 0 of size 6"):
        s.with_config("conv1", ParallelConfig((4, 1, 1, 1), (0, 1, 2, 3))).validate(g, m)
    with pytest.raises(StrategyError, match=r"device id 7 is outside"):
        s.with_config("fc1", ParallelConfig((1, 1), (7,))).validate(g, m)
    with pytest.raises(StrategyError, match="'ghost', which graph"):
        Strategy({**dict(s), "ghost": ParallelConfig((1,), (0,))}).validate(g, m)
    with pytest.raises(StrategyError, match="no config for op 'fc2'"):
        Strategy({k: v for k, v in s.items() if k != "fc2"}).validate(g, m)
    with pytest.raises(StrategyError, match="dim 1 is not parallelizable"):
        s.with_config("flat", ParallelConfig((1, 2), (0, 1))).validate(g, m)
    with pytest.raises(StrategyError, match="4 dims"):
        s.with_config("conv1", ParallelConfig((2,), (0, 1))).validate(g, m)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 1000))
def test_json_round_trip(tmp_path_factory, seed):
    import random
    g = random_graph(seed, 5)
    m = Machine.parse("p100:1x4")
    s = random_strategy(random.Random(seed), g, m)
    p = tmp_path_factory.mktemp("s") / "s.json"
    s.save(str(p))
    d = json.loads(p.read_text())
    assert set(d) == {"ops", "model", "machine"}
    assert Strategy.load(str(p), g) == s and Strategy.load(str(p)) == s
    assert not [f for f in os.listdir(p.parent) if f.startswith(".tmp")]


def test_bad_file_is_reported(tmp_path):
    p = tmp_path / "s.json"
    p.write_text('{"ops": {"a": {"degrees": {"0": 2}}}}')
    with pytest.raises(StrategyError, match="op 'a': bad config"):
        Strategy.load(str(p))
    p.write_text("{")
    with pytest.raises(StrategyError, match="not valid JSON"):
        Strategy.load(str(p))
