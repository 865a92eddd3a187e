"""Operator graph builders and the zoo's parameter counts."""

from __future__ import annotations

import pytest

from legionpy import models
from legionpy.errors import GraphError
from legionpy.optimizer import Graph


def test_builder_topology_and_consumers():
    g = Graph(4, name="g")
    x = g.input((3, 8, 8), name="x")
    a = g.conv2d(x, 4, 3, padding=1, name="a")
    b = g.conv2d(x, 4, 1, name="b")
    c = g.add(a, b, name="c")
    assert [o.name for o in g.ops] == ["x", "a", "b", "c"]
    assert [(o.name, i) for o, i in g.consumers("x")] == [("a", 0), ("b", 0)]
    assert g.edges() == [(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 3, 1)]
    assert g.edge_bytes(g.edges()[0]) == 4 * 3 * 8 * 8 * 4
    assert c.shape == (4, 4, 8, 8)
    assert g.num_parameters() == 4 * 3 * 9 + 4 + 4 * 3 + 4


def test_duplicate_and_foreign_names_rejected():
    g = Graph(2)
    x = g.input((3,), name="x")
    with pytest.raises(GraphError, match="duplicate operator name 'x'"):
        g.input((3,), name="x")
    other = Graph(2)
    y = other.input((3,), name="y")
    with pytest.raises(GraphError, match="not in this graph"):
        g.dense(y, 2)
    assert g.dense(x, 2).shape == (2, 2)


@pytest.mark.parametrize("name,count", [
    ("alexnet", 61_100_840), ("vgg16", 138_357_544), ("resnet101", 44_549_160),
    ("inception_v3", 23_834_568)])
def test_published_parameter_counts(name, count):
    assert models.build(name).num_parameters() == count


def test_rnn_models_share_weights_across_steps():
    m = models.rnnlm()
    # 2 layers of 2048 with input 2048: 2 x 4 x 2048 x (2048 + 2048 + 1) + embedding + proj
    lstm = 2 * 4 * 2048 * (2048 + 2048 + 1)
    assert m.num_parameters() == lstm + 10000 * 2048 + 2048 * 10000 + 10000
    assert len([o for o in m.graph.ops if o.kind == "lstm"]) == 80
    nmt = models.nmt(steps=4, hidden=16, vocab=50)
    assert len([o for o in nmt.graph.ops if o.kind == "attention"]) == 4
    assert models.rnntc(steps=5, hidden=8, vocab=20).graph.ops[-1].output_shape == (64, 2)
    assert models.transformer(seq=8, d_model=16, ff=32, layers=2, vocab=30).graph.ops[-1] \
        .output_shape == (64, 8, 30)


def test_every_zoo_model_builds_small():
    for name in models.MODELS:
        kw = {"batch_size": 2}
        if name in ("alexnet", "vgg16", "inception_v3", "resnet101"):
            kw["width"] = 0.125
        m = models.build(name, **kw)
        assert m.graph.num_parameters() > 0 and len(m.graph) > 5
    with pytest.raises(GraphError, match="unknown model"):
        models.build("nope")
