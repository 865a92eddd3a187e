"""The model zoo (legionpy.models) and its data (legionpy.data): full-size
graphs build fast with the expected sizes; small presets and size overrides;
generators are deterministic and shaped for their model. Published CNN
counts are in tests/unit/test_graph.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

import legionpy as lp
from legionpy import data, models
from legionpy.errors import GraphError, ModelError
from legionpy.models.training import parse_sizes


def test_every_model_is_an_uncompiled_nn_model_built_fast_at_full_size():
    t0 = time.perf_counter()
    for name, make in models.MODELS.items():
        m = make()
        assert isinstance(m, lp.nn.Model) and m._ex is None and m.zoo_name == name
        assert m.graph.name == name and m.outputs is not None
        assert m.graph.batch_size == models.BUILDERS[name][1]
    assert time.perf_counter() - t0 < 20  # a generous bound: graphs only, no arrays


def test_rnn_parameter_counts_at_the_papers_shapes():
    h = 1024
    lstm = 4 * h * (h + h + 1)  # one layer with input h: w_ih, w_hh, bias
    # RNNTC: embedding 32k x 1024, 4 layers, classifier to 2 classes
    assert models.rnntc().num_parameters() == 32000 * h + 4 * lstm + h * 2 + 2
    # NMT: two embeddings, 2 + 2 layers, attention (w_a, w_c), projection to 32k
    assert models.nmt().num_parameters() == (2 * 32000 * h + 4 * lstm + h * h + 2 * h * h
                                             + h * 32000 + 32000)
    assert len([o for o in models.rnntc().graph.ops if o.kind == "lstm"]) == 4 * 40
    nmt = models.nmt().graph
    assert len([o for o in nmt.ops if o.kind == "attention"]) == 40
    assert nmt.ops[-1].output_shape == (64, 40, 32000)
    assert models.rnnlm().graph.ops[-1].output_shape == (64, 40, 10000)


def test_lstm_cells_of_a_layer_share_parameters():
    g = models.rnnlm(scale="small").graph
    cells = [o for o in g.ops if o.kind == "lstm" and o.name.startswith("lstm0.")]
    assert len(cells) == models.SMALL["rnnlm"]["steps"]
    assert all(c.params["w_hh"] is cells[0].params["w_hh"] for c in cells)


def test_small_scale_and_size_overrides():
    m = models.alexnet(scale="small")
    assert m.batch_size == models.SMALL["alexnet"]["batch_size"]
    assert m.graph.ops[-1].output_shape[-1] == models.SMALL["alexnet"]["num_classes"]
    m = models.rnnlm(batch_size=4, scale="small", hidden=16, steps=3)
    assert m.graph.ops[-1].output_shape == (4, 3, models.SMALL["rnnlm"]["vocab"])
    with pytest.raises(GraphError, match="unknown size"):
        models.lenet(hidden=3)
    with pytest.raises(GraphError, match="scale"):
        models.lenet(scale="tiny")
    z = models.graph("lenet", batch_size=4)
    assert isinstance(z, models.ZooModel) and z.num_parameters() == 61706


def test_parse_sizes():
    assert parse_sizes(["hidden=8", "width=0.5", "blocks=1,1,2,1"]) == {
        "hidden": 8, "width": 0.5, "blocks": (1, 1, 2, 1)}
    with pytest.raises(ModelError, match="KEY=VALUE"):
        parse_sizes(["hidden"])


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_data_fits_every_model(name):
    m = models.build(name, scale="small")
    xs, y = data.for_model(m, 6, seed=1)
    ins = [o for o in m.graph.ops if o.kind == "input"]
    assert [x.shape[1:] for x in xs] == [o.output_shape[1:] for o in ins]
    out = m.graph.ops[-1].output_shape
    assert y.shape == (6,) + out[1:-1] and y.dtype == np.int64
    assert 0 <= y.min() and y.max() < out[-1]
    xs2, y2 = data.for_model(m, 6, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(xs, xs2)) and np.array_equal(y, y2)


def test_synthetic_tasks_have_structure():
    x, y = data.images(200, (3, 8, 8), 4, noise=0.0)
    assert all(np.allclose(x[y == c], x[y == c][0]) for c in range(4))  # class = pattern
    (src, dec), tgt = data.reverse_pairs(5, 6, 16)
    assert np.array_equal(tgt, src[:, ::-1]) and (dec[:, 0] == 1).all()
    assert np.array_equal(dec[:, 1:], tgt[:, :-1])
    inp, nxt = data.markov_lm(4, 10, 20)
    assert np.array_equal(inp[:, 1:], nxt[:, :-1])
    tok, lab = data.token_classes(400, 20, 32, 2)
    assert ((tok < 16).mean(axis=1)[lab == 0] > 0.5).mean() > 0.9


def test_text_corpus_ships_with_python():
    text = data.docstring_corpus()
    assert len(text) > 10_000 and "json" in text.lower()
    ids = data.encode(text)
    assert ids.min() >= 0 and ids.max() < 32 and (ids > 0).mean() > 0.9
    x, y = data.char_lm(3, 12)
    assert np.array_equal(x[:, 1:], y[:, :-1])
    x, y = data.module_classes(10, 12, 2)
    assert x.shape == (10, 12) and set(y) <= {0, 1}


def test_transformer_matches_torch_encoder_parameter_count():
    """Encoder stack = torch.nn.TransformerEncoder's parameters; the model adds
    the embedding and the head (README states both figures)."""
    from legionpy.models.transformer import encoder_parameters

    m = models.transformer()
    enc = encoder_parameters(512, 2048, 6)
    assert enc == 18_914_304
    assert m.num_parameters() == enc + 32000 * 512 + 512 * 32000 + 32000 == 51_714_304
    kinds = {o.kind for o in m.graph.ops}
    assert {"layer_norm", "positional_encoding", "transpose", "scale"} <= kinds
    probs = m.graph.op("enc0.attn.probs")
    assert probs.output_shape == (64, 8, 64, 64) and probs.attrs["causal"]
    assert probs.dims[1] == "attribute"  # the head dim: the search may split it
    torch = pytest.importorskip("torch")
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, activation="gelu", batch_first=True)
    tenc = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
    assert sum(p.numel() for p in tenc.parameters()) == enc
