"""ONNX operators of issue 27 (reductions, Clip/ReLU6, hard activations,
depthwise/grouped convs, asymmetric pads, math, masks, Einsum, Cast): an
imported graph's predict equals onnxruntime's (rtol 1e-4), the new ops
land on legionpy ops with splittable dims, and the models train."""

from __future__ import annotations

import numpy as np
import onnx_graphs as G
import onnx_graphs_ops as GO
import pytest

import legionpy as lp
from legionpy.frontends import from_onnx
from legionpy.optimizer import Machine

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(5)


def ort_run(proto, xs):
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    return np.concatenate([s.run(None, {n: x[i:i + G.B] for n, x in zip(names, xs)})[0]
                           for i in range(0, len(xs[0]), G.B)])


def compare(proto, xs, rtol=1e-4):
    m = from_onnx(proto, batch_size=G.B)
    m.compile(optimizer=lp.nn.SGD(lr=0.01), loss="mse", machine=Machine.local(1))
    got, want = m.predict(xs if len(xs) > 1 else xs[0]), ort_run(proto, xs)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)
    return m


def kinds(m):
    return [o.kind for o in m.graph.ops]


def test_mobilenet_like_matches_onnxruntime(rt1):
    proto, shape = GO.mobilenet_like()
    m = compare(proto, [RNG.standard_normal((2 * G.B, *shape)).astype(np.float32)])
    k = kinds(m)
    fns = {o.attrs.get("fn") for o in m.graph.ops}
    assert {"clip", "hardswish", "hardsigmoid"} <= fns and k.count("pad") == 2
    assert "reduce" in k and "binary" in k  # ReduceMean, the SE block's broadcast Mul
    convs = [o for o in m.graph.ops if o.kind == "conv2d"]
    assert [c.attrs["groups"] for c in convs] == [1, 8, 1, 1, 2]
    se = next(o for o in m.graph.ops if o.kind == "binary")
    assert se.dims == ("sample", "attribute", "attribute", "attribute")
    red = next(o for o in m.graph.ops if o.kind == "reduce")
    assert red.attrs["axes"] == (2, 3) and red.dims == ("sample", "attribute")


def test_math_family_matches_onnxruntime(rt1):
    proto, shape = GO.math_family()
    m = compare(proto, [RNG.standard_normal((2 * G.B, *shape)).astype(np.float32)])
    fns = {o.attrs.get("fn") for o in m.graph.ops if o.kind == "unary"}
    assert {"sqrt", "reciprocal", "neg", "exp", "erf", "pow", "log", "abs", "mish",
            "softplus", "leaky_relu", "clip"} <= fns


def test_gpt_like_decoder_with_causal_mask_matches_onnxruntime(rt1):
    proto, shape, vocab = GO.gpt_like(layers=2)
    x = RNG.integers(0, vocab, (2 * G.B, *shape)).astype(np.int64)
    m = compare(proto, [x])
    mask = [o for o in m.graph.ops if o.kind == "binary" and o.attrs["fn"] == "where"]
    assert len(mask) == 2 and mask[0].attrs["cond"].shape == (1, 1, 6, 6)
    assert not mask[0].params  # a fixed mask, not a weight
    assert sum(o.kind == "batch_matmul" for o in m.graph.ops) == 4  # the Einsums
    lns = [o for o in m.graph.ops if o.kind == "layer_norm"]  # folded back, gamma/beta kept
    assert len(lns) == 4 and "reduce" not in kinds(m) and lns[0].dims[-1] is None
    assert lns[0].params["gamma"].init["kind"] == "array"


def test_bert_like_padding_mask_input_matches_onnxruntime(rt1):
    proto, shape, vocab = GO.bert_like()
    x = RNG.integers(0, vocab, (2 * G.B, *shape)).astype(np.int64)
    mask = (RNG.random((2 * G.B, *shape)) < 0.7).astype(np.int64)
    mask[:, 0] = 1
    m = compare(proto, [x, mask])
    assert "cast" in kinds(m)


def test_causal_mask_changes_the_output_as_in_onnxruntime(rt1):
    """The mask matters: the last position's change reaches no earlier one."""
    proto, shape, vocab = GO.gpt_like()
    m = from_onnx(proto, batch_size=G.B)
    m.compile(optimizer=lp.nn.SGD(lr=0.01), loss="mse", machine=Machine.local(1))
    x = RNG.integers(0, vocab, (G.B, *shape)).astype(np.int64)
    y = x.copy()
    y[:, -1] = (y[:, -1] + 1) % vocab
    a, b = m.predict(x), m.predict(y)
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-5, atol=1e-6)
    assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-3


def test_imported_decoder_trains_next_token(rt1):
    proto, shape, vocab = GO.gpt_like()
    m = from_onnx(proto, batch_size=G.B, add_softmax=True)
    m.compile(optimizer=lp.nn.Adam(lr=0.01), machine=Machine.local(1))
    x = RNG.integers(0, vocab, (4 * G.B, shape[0] + 1)).astype(np.int64)
    h = m.fit(x[:, :-1], x[:, 1:], epochs=5, verbose=0, shuffle=False)
    assert h["loss"][-1] < h["loss"][0]


def test_ceil_mode_max_pool_and_global_max_pool(rt1):
    g = G.G("ceil")
    t = g.node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    t = g.node("Add", [t, g.node("GlobalMaxPool", [t])])
    proto = g.model([("x", G.F, (2, 8, 8))], t, opset=17)
    m = compare(proto, [RNG.standard_normal((2 * G.B, 2, 8, 8)).astype(np.float32)])
    assert m.graph.ops[-1].output_shape == (G.B, 2, 4, 4)


def test_decomposed_layer_norm_without_scale_folds_to_ones(rt1):
    g = G.G("ln")
    mu = g.node("ReduceMean", ["x"], axes=[-1], keepdims=1)
    d = g.node("Sub", ["x", mu])
    v = g.node("ReduceMean", [g.node("Mul", [d, d])], axes=[-1], keepdims=1)
    y = g.node("Div", [d, g.node("Sqrt", [g.node("Add", [v, g.c(1e-6, np.float32)])])])
    proto = g.model([("x", G.F, (3, 8))], g.node("Relu", [y]), opset=17)
    m = compare(proto, [RNG.standard_normal((2 * G.B, 3, 8)).astype(np.float32)])
    ln = next(o for o in m.graph.ops if o.kind == "layer_norm")
    assert ln.attrs["eps"] == pytest.approx(1e-6) and len(m.graph.ops) == 3
    np.testing.assert_array_equal(ln.params["gamma"].init["value"], np.ones(8))


def test_channel_shuffle_then_split(rt1):
    """ShuffleNet: view (N, 2, C/2, H, W), transpose, view back, split channels."""
    g = G.G("shuffle")
    t = g.node("Reshape", ["x", g.c([G.B, 2, 4, 5, 5])])
    t = g.node("Transpose", [t], perm=[0, 2, 1, 3, 4])
    t = g.node("Reshape", [t, g.c([G.B, -1, 5, 5])])
    a, b = g.node("Split", [t, g.c([4, 4])], outs=2, axis=1)
    b = g.node("Conv", [b, g.w(4, 4, 1, 1)], kernel_shape=[1, 1])
    proto = g.model([("x", G.F, (8, 5, 5))], g.node("Concat", [a, b], axis=1), opset=17)
    compare(proto, [RNG.standard_normal((2 * G.B, 8, 5, 5)).astype(np.float32)])


def test_vit_convnext_forms_match_onnxruntime_and_train(rt1):
    """Dilated Conv, layer scale, class token and dynamo's as_strided gather:
    predict equals onnxruntime's at the export's batch and at twice it, the
    class token and the layer scale are trained parameters, the 2-D
    constant factor stays fixed."""
    proto, shape = GO.vit_convnext_like()
    x = RNG.standard_normal((2 * G.B, *shape)).astype(np.float32)
    m = compare(proto, [x])
    conv = next(o for o in m.graph.ops if o.kind == "conv2d")
    assert conv.attrs["dilation"] == (2, 2) and "pad" in kinds(m)  # asymmetric pads first
    cls = next(o for o in m.graph.ops if o.kind == "concat_param")
    assert cls.params["value"].shape == (1, 6) and cls.attrs["first"]
    assert cls.dims == ("sample", "attribute", "attribute")
    ls = next(o for o in m.graph.ops if o.kind == "layer_scale")
    assert ls.params["gamma"].shape == (6, 1, 1)
    fixed = [o for o in m.graph.ops if o.kind == "binary" and o.attrs["fn"] == "mul"]
    assert len(fixed) == 1 and not fixed[0].params
    assert "gather" in kinds(m)
    big = from_onnx(proto, batch_size=2 * G.B)  # positions built for B serve 2B samples
    big.compile(optimizer=lp.nn.SGD(lr=0.01), loss="mse", machine=Machine.local(1))
    np.testing.assert_allclose(big.predict(x), ort_run(proto, [x]), rtol=1e-4, atol=1e-5)
    before = big.parameters()
    big.fit(x, RNG.standard_normal((2 * G.B, 5)).astype(np.float32), epochs=1, verbose=0)
    after = big.parameters()
    for p in (cls.params["value"].name, ls.params["gamma"].name):
        assert np.abs(after[p] - before[p]).max() > 1e-6, p


def test_trained_factor_rule(rt1):
    """A Mul by a stored initializer (or a Reshape of one) that is a channel
    vector is a trained layer_scale; the same vector computed by constant
    folding (Sqrt of an initializer) or a scalar stays fixed."""
    g = G.G("factors")
    w = g.node("Reshape", [g.w(value=np.linspace(0.5, 1.5, 3).astype(np.float32)),
                           g.c([3, 1, 1])])
    t = g.node("Mul", ["x", w])
    t = g.node("Mul", [t, g.node("Sqrt", [g.w(value=np.full((3, 1, 1), 4.0, np.float32))])])
    t = g.node("Mul", [t, g.w(value=np.array(2.0, np.float32))])
    proto = g.model([("x", G.F, (3, 4, 4))], g.node("ReduceMean", [t, g.c([2, 3])], keepdims=0),
                    opset=18)
    m = compare(proto, [RNG.standard_normal((2 * G.B, 3, 4, 4)).astype(np.float32)])
    ls = [o for o in m.graph.ops if o.kind == "layer_scale"]
    assert len(ls) == 1 and ls[0].params["gamma"].shape == (3, 1, 1)
    assert [o.kind for o in m.graph.ops if o.kind in ("binary", "scale")] == ["binary", "scale"]


def test_castlike_of_a_constant_to_an_activation_folds(rt1):
    """Unoptimised dynamo exports cast literals to an activation's type
    (``CastLike(2, x)``): the constant is cast, the product is a scale."""
    g = G.G("castlike")
    two = g.node("CastLike", [g.c(2), "x"])
    out = g.node("Mul", ["x", two])
    m = compare(g.model([("x", G.F, (5,))], out, opset=18),
                [RNG.standard_normal((2 * G.B, 5)).astype(np.float32)])
    assert [o.kind for o in m.graph.ops] == ["input", "scale"]
