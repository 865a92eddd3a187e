"""The GPT zoo entries (models/gpt.py) and the tied output projection
(ops ``tied_dense``): parameter counts, one shared table, the kernel's
gradients over every tiling against numpy, and the table counted once."""

from __future__ import annotations

import numpy as np
import pytest

from legionpy import models
from legionpy.models.gpt import CONFIGS, gpt_parameters
from legionpy.ops.execute import Tile, tile_backward, tile_forward
from legionpy.optimizer import Graph, Machine, Simulator, Strategy

#: the figures of the GPT-2 paper (124M, as Hugging Face counts it) and of
#: GPT-3's Table 2.1, at the precision they are printed
PAPER = {"gpt2": (124e6, 1e6), "gpt3-1.3b": (1.3e9, 0.05e9), "gpt3-2.7b": (2.7e9, 0.05e9),
         "gpt3-6.7b": (6.7e9, 0.05e9), "gpt3-13b": (13e9, 0.5e9)}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_counts_match_the_papers(name):
    layers, d, heads, seq = CONFIGS[name]
    g = models.graph(name).graph  # shapes only: nothing is allocated
    n = g.num_parameters()
    assert n == gpt_parameters(layers, d, seq)
    figure, half_unit = PAPER[name]
    assert abs(n - figure) <= half_unit, (name, n)
    assert d % heads == 0 and d // heads in (64, 80, 128)
    assert g.batch_size == 8 and g.ops[0].output_shape == (8, seq)


def test_gpt2_is_hugging_faces_124m():
    assert models.graph("gpt2").graph.num_parameters() == 124_439_808


def test_the_output_projection_shares_the_embedding_table():
    g = models.graph("gpt2", scale="small").graph
    wte, head = g.op("wte"), g.op("lm_head")
    assert head.kind == "tied_dense" and head.params["weight"] is wte.params["weight"]
    assert "lm_head.weight" not in g.parameters() and "wte.weight" in g.parameters()
    assert head.dims[-1] == "parameter"  # the vocabulary splits like a dense layer's units


def test_tied_dense_gradients_on_every_tiling():
    """y = x @ W.T: forward, dx and dW assembled from tiles (vocabulary,
    sample and sequence splits) equal numpy's whole-tensor result."""
    rng = np.random.default_rng(0)
    g = Graph(4)
    x = g.input((3, 5), name="x")
    emb_in = g.input((3,), dtype="int32", name="ids")
    e = g.embedding(emb_in, 7, 5, name="emb")
    op = g.tied_dense(x, e, name="head").op
    xs = rng.standard_normal((4, 3, 5))
    w = rng.standard_normal((7, 5))
    dy = rng.standard_normal((4, 3, 7))
    want_y, want_dx = xs @ w.T, dy @ w
    want_dw = np.einsum("nsv,nsd->vd", dy, xs)
    for degrees in [(1, 1, 1), (1, 1, 2), (1, 1, 3), (2, 1, 1), (2, 3, 1), (2, 1, 7)]:
        y, dx, dw = np.zeros_like(want_y), np.zeros_like(xs), np.zeros_like(w)
        for out in op.output_rect.split(degrees):
            rin, rw = op.input_rect(0, out), op.weight_rect("weight", out)
            t = Tile(out, [xs[rin.to_slices()]], {"weight": w[rw.to_slices()]})
            yt = tile_forward(op, t)
            y[out.to_slices()] = yt
            (gx,), gw = tile_backward(op, t, yt, dy[out.to_slices()])
            dx[rin.to_slices()] += gx
            dw[rw.to_slices()] += gw["weight"]
        np.testing.assert_allclose(y, want_y, atol=1e-12, err_msg=str(degrees))
        np.testing.assert_allclose(dx, want_dx, atol=1e-12, err_msg=str(degrees))
        np.testing.assert_allclose(dw, want_dw, atol=1e-12, err_msg=str(degrees))


def test_the_simulator_holds_the_tied_table_once():
    """One parameter: one update per shard, not two; memory of one table."""
    g = models.graph("gpt2", scale="small", vocab=4096).graph
    m = Machine.parse("p100:1x2")
    sim = Simulator(g, m, sync="shards")
    sim.run(Strategy.data_parallel(g, m))
    names = [sim.tg.task_name(int(s)) for s in np.flatnonzero(sim.tg.alive)]
    assert any(n.startswith("U:wte.weight[") for n in names)
    assert not any("lm_head.weight" in n for n in names)
    # collective sync: the table is in one bucket once
    sim = Simulator(g, m)
    sim.run(Strategy.data_parallel(g, m))
    bucketed = [sim.tg.params[w].name for b in sim.tg.buckets for w in b]
    assert bucketed.count("wte.weight") == 1
    assert not any("lm_head" in n for n in bucketed)


def test_the_tied_table_is_updated_densely():
    """Embedding tables alone are updated sparsely (rows the batch used);
    tied to the output projection the gradient is dense, and so is the update."""
    from legionpy.nn.execution import sparse_params

    assert sparse_params(models.graph("gpt2", scale="small").graph) == set()
    assert sparse_params(models.graph("transformer", scale="small").graph) == {"embed.weight"}
