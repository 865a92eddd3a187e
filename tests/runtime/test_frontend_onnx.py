"""ONNX front end (issue 14 items 1 and 5): an imported model's predict
equals onnxruntime's output (rtol 1e-4) per operator family and for whole
small models; unsupported graphs fail with one error listing every
unsupported operator type and its nodes; imported models train and search."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphs as G
import pytest

import legionpy as lp
from legionpy.frontends import UnsupportedOperatorError, from_onnx
from legionpy.optimizer import Machine, Simulator, Strategy

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(3)


def data(shape, vocab=None, n=2 * G.B):
    if vocab:
        return RNG.integers(0, vocab, (n, *shape)).astype(np.int64)
    return RNG.standard_normal((n, *shape)).astype(np.float32)


def ort_run(proto, x):
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: x[i:i + G.B]})[0]
                           for i in range(0, len(x), G.B)])


def compare(proto, x, **kw):
    m = from_onnx(proto, batch_size=G.B, **kw)
    loss = "sparse_categorical_crossentropy" if m.graph.ops[-1].kind == "softmax" else "mse"
    m.compile(optimizer=lp.nn.SGD(lr=0.01), loss=loss, machine=Machine.local(1))
    got, want = m.predict(x), ort_run(proto, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return m


def test_resnet_like_cnn_matches_onnxruntime(rt1):
    proto, shape = G.resnet_like()
    m = compare(proto, data(shape))
    kinds = [o.kind for o in m.graph.ops]
    assert kinds.count("batch_norm") == 6 and "add" in kinds and "pool2d" in kinds
    assert m.graph.ops[1].name.startswith("/Conv_")  # names from the graph's nodes


def test_vgg_like_cnn_matches_onnxruntime(rt1):
    proto, shape = G.vgg_like()
    m = compare(proto, data(shape))
    assert m.graph.ops[-1].kind == "softmax" and m.graph.ops[-1].is_loss


def test_transformer_encoder_matches_onnxruntime(rt1):
    proto, shape, vocab = G.transformer_encoder()
    m = compare(proto, data(shape, vocab))
    kinds = {o.kind for o in m.graph.ops}
    assert {"layer_norm", "gelu", "transpose", "batch_matmul", "slice", "embedding",
            "add_bias"} <= kinds
    assert "Erf" not in str([o.name for o in m.graph.ops if o.kind != "gelu"])


def test_lstm_classifier_matches_onnxruntime(rt1):
    proto, shape, vocab = G.lstm_classifier()
    m = compare(proto, data(shape, vocab))
    cells = [o for o in m.graph.ops if o.kind == "lstm"]
    assert len(cells) == 10 and len(m.graph.parameters()) == 1 + 6 + 2  # table, per layer, fc


def test_elementwise_family_matches_onnxruntime(rt1):
    proto, shape = G.elementwise()
    compare(proto, data(shape))


def test_unsupported_ops_fail_with_one_error_listing_all():
    g = G.G("bad")
    t = g.node("Round", ["x"], name="round_a")
    t = g.node("Round", [t], name="round_b")
    t = g.node("Conv", [t, g.w(2, 3, 3, 3)], name="dilated", kernel_shape=[3, 3],
               dilations=[2, 2])
    t = g.node("Sign", [t], name="sg")
    proto = g.model([("x", G.F, (3, 9, 9))], t)
    with pytest.raises(UnsupportedOperatorError) as e:
        from_onnx(proto, batch_size=2)
    msg = str(e.value)
    assert "Round: 2 node(s): round_a, round_b" in msg
    assert "Sign: 1 node(s): sg" in msg and "nothing was built" in msg
    assert "Conv" not in msg.split("supported:")[0]  # its form is not checked after a Round


def test_unsupported_forms_are_reported_with_their_reason():
    g = G.G("bad_forms")
    a = g.node("Conv", ["x", g.w(2, 3, 3, 3)], name="samepad", kernel_shape=[3, 3],
               auto_pad="SAME_UPPER")
    b = g.node("Sign", ["x"], name="hs")
    c = g.node("Reshape", ["x", g.c([3, -1])], name="batchmove")
    proto = g.model([("x", G.F, (3, 9, 9))], g.node("Concat", [a, b, c], axis=1))
    with pytest.raises(UnsupportedOperatorError) as e:
        from_onnx(proto, batch_size=2)
    msg = str(e.value)
    for s in ("Conv: 1 node(s): samepad (auto_pad)", "Sign: 1 node(s): hs",
              "Reshape: 1 node(s): batchmove (Reshape to [3, 162] of (2, 3, 9, 9) (it splits "
              "the batch dim"):
        assert s in msg


def test_file_path_symbolic_batch_and_training(tmp_path, rt1):
    proto, shape = G.resnet_like()
    path = tmp_path / "r.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(lp.errors.ModelError, match=r"r\.onnx.*symbolic batch dim.*batch_size="):
        from_onnx(str(path))
    m = from_onnx(str(path), batch_size=G.B, add_softmax=True)
    assert m.graph.ops[-1].kind == "softmax"
    m.compile(optimizer=lp.nn.SGD(lr=0.05), machine=Machine.local(1))
    x, y = data(shape, n=4 * G.B), RNG.integers(0, 10, 4 * G.B)
    h = m.fit(x, y, epochs=4, verbose=0, shuffle=False)
    assert h["loss"][-1] < h["loss"][0]


def test_imported_graph_searches_and_simulates():
    proto, shape, _ = G.transformer_encoder()
    m = from_onnx(proto, batch_size=16)
    machine = Machine.preset("p100", nodes=1)
    sim = Simulator(m.graph, machine)
    t_data = sim.simulate(Strategy.data_parallel(m.graph, machine))
    best = lp.optimizer.search.mcmc(m.graph, machine, iterations=50, seed=0)
    assert 0 < sim.simulate(best) <= t_data


def test_every_model_command_takes_an_onnx_file(tmp_path, capsys):
    """search, simulate, profile and train accept a .onnx path as MODEL;
    train generates data of the input's shape and labels over the classes."""
    import json

    from legionpy.cli import main

    proto, _ = G.vgg_like()
    path = str(tmp_path / "vgg.onnx")
    onnx.save(proto, path)
    out = tmp_path / "s.json"
    runs = {
        "search": ["search", path, "--machine", "p100:1x2", "--iterations", "20",
                   "--batch-size", "8", "--methods", "data,mcmc", "--no-progress",
                   "--out", str(out)],
        "simulate": ["simulate", path, "--machine", "p100:1x2", "--batch-size", "8"],
        "profile": ["profile", path, "--batch-size", "8"],
        "train": ["train", path, "--steps", "3", "--batch-size", "8", "--devices", "2"],
    }
    res = {}
    for name, argv in runs.items():
        capsys.readouterr()
        assert main([*argv, "--json"]) == 0, name
        res[name] = json.loads(capsys.readouterr().out)
    assert "mcmc" in res["search"]["strategies"] and out.exists()
    assert res["simulate"]["iteration_time_s"] > 0
    assert res["train"]["steps"] == 3 and np.isfinite(res["train"]["final_loss"])
    assert main(["search", str(tmp_path / "missing.onnx"), "--json"]) != 0
