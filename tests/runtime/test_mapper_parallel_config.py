"""Issue 18 item 4: compile asks the runtime's mapper select_parallel_config
for every op; the default mapper answers from the optimizer; a user's
mapper keeps its answers and is never replaced."""

from __future__ import annotations

import numpy as np
import pytest
from test_nn_model import lenet8

import legionpy as lp
from legionpy.errors import StrategyError
from legionpy.mapper import DefaultMapper, Mapper, StrategyMapper
from legionpy.mapper.consult import ConsultingMapper
from legionpy.optimizer import Machine, ParallelConfig, Strategy


@pytest.fixture
def rt2():
    rt = lp.init(cpus=2)
    yield rt
    lp.runtime.shutdown()


class FcOnDevice1(DefaultMapper):
    """Answers for the dense layers only (whole, on device 1); records calls."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def select_parallel_config(self, op, graph, machine):
        self.asked.append(op.name)
        if op.kind == "dense":
            return ParallelConfig.single(len(op.output_shape), 1)
        return None


class PlacingFc(StrategyMapper):
    def select_parallel_config(self, op, graph, machine):
        if op.kind == "dense":
            return ParallelConfig.single(len(op.output_shape), 1)
        return super().select_parallel_config(op, graph, machine)


def _fit_trace(m):
    lp.runtime().trace.start()
    m.fit(np.zeros((8, 1, 8, 8), np.float32), np.zeros(8, np.int64), verbose=0)
    lp.fence()
    return lp.runtime().trace.stop()


def test_default_mapper_answers_from_the_optimizer(rt2):
    assert type(lp.runtime().mapper) is DefaultMapper
    m = lenet8(batch=8).compile(strategy="model")
    mapper = lp.runtime().mapper
    assert isinstance(mapper, ConsultingMapper)
    machine = Machine.local(2)
    assert m.strategy == Strategy.model_parallel(m.graph, machine)
    for op in m.graph.ops:
        assert mapper.select_parallel_config(op, m.graph, machine) == m.strategy[op.name]


def test_user_mapper_is_asked_kept_and_its_answers_kept(rt2):
    user = FcOnDevice1()
    lp.runtime().set_mapper(user)
    m = lenet8(batch=8).compile(strategy="data")
    assert lp.runtime().mapper is user                     # never replaced
    assert user.asked == [op.name for op in m.graph.ops]   # asked for every op
    data = Strategy.data_parallel(m.graph, Machine.local(2))
    for op in m.graph.ops:
        want = ParallelConfig.single(2, 1) if op.kind == "dense" else data[op.name]
        assert m.strategy[op.name] == want
    recs = _fit_trace(m)
    assert any(r["name"].startswith("F(fc1") for r in recs)
    assert lp.runtime().mapper is user                     # still there after fit


def test_user_strategy_mapper_places_points_by_its_answers(rt2):
    user = PlacingFc()
    lp.runtime().set_mapper(user)
    m = lenet8(batch=8).compile(strategy="data")
    assert lp.runtime().mapper is user
    assert m.strategy["fc1"] == ParallelConfig.single(2, 1)
    assert m.strategy["conv1"].devices == (0, 1)
    placed = [r["device"] for r in _fit_trace(m)
              if r["kind"] == "compute" and r["name"].startswith("F(fc1")]
    assert placed and set(placed) == {1}


def test_a_bad_answer_names_the_mapper(rt2):
    class Bad(Mapper):
        def select_parallel_config(self, op, graph, machine):
            return ParallelConfig((3,) + (1,) * (len(op.output_shape) - 1), (0, 1, 0))

    lp.runtime().set_mapper(Bad())
    with pytest.raises(StrategyError, match="Bad.select_parallel_config"):
        lenet8(batch=8).compile(strategy="data")
