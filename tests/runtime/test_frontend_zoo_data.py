"""Models exported by PyTorch's two ONNX exporters (tests/data, written by
tests/data/make_onnx.py; no torch needed here): a tiny ResNet (adaptive
average pool), a MobileNet-V2/V3 mix (ReLU6, depthwise, Hardswish,
squeeze-and-excitation), a GPT-2 decoder (causal mask) and a BERT encoder
(padding mask input), a ViT (class token) and a ConvNeXt (layer scale,
dynamo's as_strided gather). Each imports, predicts as torch did (rtol
1e-4) and trains; bad files fail with one clear error naming the file."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import legionpy as lp
from legionpy.errors import ModelError
from legionpy.frontends import from_onnx
from legionpy.optimizer import Machine, Simulator, Strategy

pytest.importorskip("onnx")
DATA = os.path.join(os.path.dirname(__file__), "..", "data")
CASES = [("resnet", "dynamo"), ("resnet", "legacy"), ("mobilenet", "dynamo"),
         ("mobilenet", "legacy"), ("gpt2", "dynamo"), ("bert", "dynamo"), ("bert", "legacy"),
         ("vit", "dynamo"), ("vit", "legacy"), ("convnext", "dynamo"), ("convnext", "legacy")]


def load(name):
    d = np.load(os.path.join(DATA, f"{name}.npz"))
    xs = [d["x"]] + ([d["mask"]] if "mask" in d else [])
    return xs, d["y"]


@pytest.mark.parametrize("name,how", CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_exported_model_predicts_as_torch_and_trains_a_step(name, how, rt1):
    xs, y = load(name)
    m = from_onnx(os.path.join(DATA, f"{name}_{how}.onnx"), batch_size=len(xs[0]))
    m.compile(optimizer=lp.nn.SGD(lr=0.01), loss="mse", machine=Machine.local(1))
    got = m.predict(xs if len(xs) > 1 else xs[0])
    np.testing.assert_allclose(got, y, rtol=1e-4, atol=2e-5)
    target = np.random.default_rng(0).standard_normal(y.shape).astype(np.float32)
    h = m.fit(xs if len(xs) > 1 else xs[0], target, epochs=2, verbose=0, shuffle=False)
    if not any(o.kind == "batch_norm" for o in m.graph.ops):  # eval-mode forward: torch's
        assert h["loss"][0] == pytest.approx(float(((y - target) ** 2).mean()), rel=1e-4)
    assert h["loss"][1] < h["loss"][0]


def test_gpt2_trains_on_next_tokens_and_search_splits_heads_mlp_vocab(rt1, tmp_path):
    (ids,), _ = load("gpt2")
    path = os.path.join(DATA, "gpt2_dynamo.onnx")
    m = from_onnx(path, batch_size=2, add_softmax=True)
    m.compile(optimizer=lp.nn.Adam(lr=0.01), machine=Machine.local(1))
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 64, (8, ids.shape[1] + 1))
    h = m.fit(seq[:, :-1], seq[:, 1:], epochs=3, verbose=0, shuffle=False)
    assert h["loss"][-1] < h["loss"][0]
    ops = m.graph.ops
    scores = [o for o in ops if o.kind == "batch_matmul" and o.output_shape[-1] == 12]
    assert len(scores) == 2 and all(o.dims[1] == "attribute" for o in scores)  # heads
    masks = [o for o in ops if o.kind == "binary" and o.inputs[0].op in scores]
    assert len(masks) == 2 and not any(o.params for o in masks)  # fixed causal masks
    dense = {o.output_shape[-1]: o.dims[-1] for o in ops if o.kind == "dense"}
    assert dense[4 * 32] == "parameter" and dense[64] == "parameter"  # MLP, vocabulary
    machine = Machine.preset("p100", nodes=1)
    g = from_onnx(path, batch_size=8).graph  # another batch than the export's 2
    sim = Simulator(g, machine)
    best = lp.optimizer.search.mcmc(g, machine, iterations=8, seed=0)
    assert 0 < sim.simulate(best) <= sim.simulate(Strategy.data_parallel(g, machine))


def test_truncated_and_non_onnx_files_fail_clearly(tmp_path):
    src = os.path.join(DATA, "resnet_legacy.onnx")
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(open(src, "rb").read()[:3000])
    with pytest.raises(ModelError, match=r"cut\.onnx.*not an ONNX model.*export it again"):
        from_onnx(str(cut), batch_size=2)
    txt = tmp_path / "notes.onnx"
    txt.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelError, match=r"notes\.onnx.*not an ONNX model"):
        from_onnx(str(txt), batch_size=2)


def test_missing_external_data_names_both_files(tmp_path):
    shutil.copy(os.path.join(DATA, "gpt2_dynamo.onnx"), tmp_path / "g.onnx")
    with pytest.raises(ModelError, match=r"g\.onnx.*keeps its weights in 'gpt2_dynamo\.onnx\."
                                         r"data'.*missing.*copy it next to"):
        from_onnx(str(tmp_path / "g.onnx"), batch_size=2)


def test_cli_reports_bad_files_in_one_line_without_traceback(tmp_path, capsys, monkeypatch):
    from legionpy.cli import main

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    monkeypatch.delenv("LEGIONPY_DEBUG", raising=False)
    assert main(["train", str(bad), "--steps", "1"]) != 0
    err = capsys.readouterr().err
    assert "bad.onnx" in err and "Traceback" not in err
    monkeypatch.setenv("LEGIONPY_DEBUG", "1")
    assert main(["train", str(bad), "--steps", "1"]) != 0
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["vit", "convnext"])
def test_class_token_and_layer_scale_graphs_search_and_simulate(name):
    """The search places the new trained ops like any other (their dims
    split) and beats or equals data parallelism on an imported graph."""
    g = from_onnx(os.path.join(DATA, f"{name}_dynamo.onnx"), batch_size=8).graph
    kind = "concat_param" if name == "vit" else "layer_scale"
    ops = [o for o in g.ops if o.kind == kind]
    assert ops and all(len(o.parallel_dims) == len(o.output_shape) for o in ops)
    machine = Machine.preset("p100", nodes=1)
    sim = Simulator(g, machine)
    best = lp.optimizer.search.mcmc(g, machine, iterations=20, seed=0)
    assert 0 < sim.simulate(best) <= sim.simulate(Strategy.data_parallel(g, machine))
