"""Small ONNX graphs of issue 27's operators, in the forms torchvision's
MobileNets/EfficientNets and GPT-2/BERT exports use them (built with
onnx.helper; no torch)."""

from __future__ import annotations

import numpy as np
from onnx_graphs import I64, RNG, B, F, G, conv_bn


def mobilenet_like():
    """Depthwise and grouped convs, Clip as ReLU6 (min/max inputs),
    HardSwish, a squeeze-and-excitation block (GlobalAveragePool -> 1x1
    convs -> HardSigmoid -> broadcast Mul), asymmetric Conv pads, Pad,
    SiLU as Sigmoid * x, ReduceMean with opset-18 axes input, Gemm."""
    g = G("mobilenet_like")
    t = conv_bn(g, "x", 3, 8, 3, 1, 1, relu=False)
    t = g.node("Clip", [t, g.c(0.0, np.float32), g.c(6.0, np.float32)])
    t = g.node("Conv", [t, g.w(8, 1, 3, 3)], kernel_shape=[3, 3], group=8, pads=[1, 1, 1, 1])
    t = g.node("HardSwish", [t])
    s = g.node("GlobalAveragePool", [t])
    s = g.node("Relu", [g.node("Conv", [s, g.w(4, 8, 1, 1), g.w(4)], kernel_shape=[1, 1])])
    s = g.node("Conv", [s, g.w(8, 4, 1, 1), g.w(8)], kernel_shape=[1, 1])
    s = g.node("HardSigmoid", [s], alpha=1 / 6, beta=0.5)
    t = g.node("Mul", [t, s])
    t = g.node("Conv", [t, g.w(8, 4, 3, 3)], kernel_shape=[3, 3], group=2, strides=[2, 2],
               pads=[0, 0, 1, 1])  # TF-style "same": pad after only
    t = g.node("Pad", [t, g.c([0, 0, 1, 0, 0, 0, 0, 2])])
    t = g.node("Mul", [t, g.node("Sigmoid", [t])])
    t = g.node("ReduceMean", [t, g.c([2, 3])], keepdims=0)
    out = g.node("Gemm", [t, g.w(5, 8), g.w(5)], transB=1)
    return g.model([("x", F, (3, 10, 10))], out, opset=18), (3, 10, 10)


def math_family():
    """Sqrt, Reciprocal, Neg, Exp, Erf, Pow, Log, Abs, Mish, Softplus,
    LeakyRelu, Div by an activation, ReduceSum (axes input) / ReduceMax
    (keepdims 0), Clip without a max, Cast, Sub from a constant."""
    g = G("math_family")
    x = g.node("Cast", ["x"], to=1)
    a = g.node("Sqrt", [g.node("Add", [g.node("Mul", [x, x]), g.c(1.0, np.float32)])])
    a = g.node("Neg", [g.node("Reciprocal", [a])])
    a = g.node("Add", [g.node("Exp", [a]), g.node("Erf", [x])])
    a = g.node("Pow", [a, g.c(2.0, np.float32)])
    a = g.node("Log", [g.node("Add", [g.node("Abs", [a]), g.c(0.5, np.float32)])])
    b = g.node("Mish", [x])
    b = g.node("Sub", [g.c(1.0, np.float32), g.node("Softplus", [b])])
    b = g.node("LeakyRelu", [b], alpha=0.1)
    c = g.node("Div", [a, g.node("Add", [g.node("Exp", [b]), g.c(1.0, np.float32)])])
    s = g.node("ReduceSum", [c, g.c([-1])], keepdims=1)
    c = g.node("Div", [c, g.node("Add", [g.node("Abs", [s]), g.c(1.0, np.float32)])])
    m = g.node("ReduceMax", [c, g.c([1])], keepdims=0)
    m = g.node("Clip", [m, g.c(-0.5, np.float32)])
    out = g.node("MatMul", [m, g.w(5, 3)])
    return g.model([("x", F, (4, 5))], out, opset=18), (4, 5)


def _decomposed_ln(g, x, d):
    """LayerNorm as older exports and hand-written modules spell it."""
    mu = g.node("ReduceMean", [x, g.c([-1])], keepdims=1)
    dx = g.node("Sub", [x, mu])
    var = g.node("ReduceMean", [g.node("Pow", [dx, g.c(2.0, np.float32)]), g.c([-1])],
                 keepdims=1)
    den = g.node("Sqrt", [g.node("Add", [var, g.c(1e-5, np.float32)])])
    y = g.node("Div", [dx, den])
    y = g.node("Mul", [y, g.w(value=(1 + 0.1 * RNG.standard_normal(d)).astype(np.float32))])
    return g.node("Add", [y, g.w(d)])


def _tanh_gelu(g, x):
    """GPT-2's ``gelu_new``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    c = g.node("Mul", [g.node("Pow", [x, g.c(3.0, np.float32)]), g.c(0.044715, np.float32)])
    t = g.node("Tanh", [g.node("Mul", [g.node("Add", [x, c]),
                                        g.c((2 / np.pi) ** 0.5, np.float32)])])
    return g.node("Mul", [g.node("Mul", [x, g.c(0.5, np.float32)]),
                          g.node("Add", [t, g.c(1.0, np.float32)])])


def gpt_like(seq=6, d=16, heads=4, vocab=11, layers=1):
    """A GPT-2-style decoder: token Gather + positions from Range (Gather of
    a learned table), pre-norm blocks with a decomposed LayerNorm, Einsum
    scores, a causal mask from ConstantOfShape -> Trilu -> Equal -> Where
    (-inf), Softmax, Einsum context, tanh-GELU MLP via Pow, tied LM head."""
    g = G("gpt_like")
    hd = d // heads
    wte = g.w(vocab, d)
    t = g.node("Gather", [wte, "tokens"], axis=0)
    pos = g.node("Range", [g.c(0), g.c(seq), g.c(1)])
    t = g.node("Add", [t, g.node("Gather", [g.w(seq + 2, d), pos], axis=0)])
    ones = g.node("ConstantOfShape", [g.c([seq, seq])],
                  value=__import__("onnx").helper.make_tensor("v", F, [1], [1.0]))
    keep = g.node("Trilu", [ones], upper=0)
    masked = g.node("Equal", [keep, g.c(0.0, np.float32)])
    for _ in range(layers):
        h = _decomposed_ln(g, t, d)
        q, k, v = (g.node("Transpose", [g.node("Reshape", [
            g.node("Add", [g.node("MatMul", [h, g.w(d, d)]), g.w(d)]),
            g.c([0, seq, heads, hd])])], perm=[0, 2, 1, 3]) for _ in range(3))
        s = g.node("Einsum", [q, k], equation="bhid,bhjd->bhij")
        s = g.node("Mul", [s, g.c(hd ** -0.5, np.float32)])
        s = g.node("Where", [masked, g.c(-np.inf, np.float32), s])
        p = g.node("Softmax", [s], axis=-1)
        c = g.node("Einsum", [p, v], equation="bhij,bhjd->bhid")
        c = g.node("Reshape", [g.node("Transpose", [c], perm=[0, 2, 1, 3]), g.c([0, seq, d])])
        t = g.node("Add", [t, g.node("MatMul", [c, g.w(d, d)])])
        f = _tanh_gelu(g, g.node("MatMul", [_decomposed_ln(g, t, d), g.w(d, 2 * d)]))
        t = g.node("Add", [t, g.node("MatMul", [f, g.w(2 * d, d)])])
    head = g.node("Transpose", [wte], perm=[1, 0])
    out = g.node("MatMul", [t, head])
    return g.model([("tokens", I64, (seq,))], out, opset=18), (seq,), vocab


def bert_like(seq=6, d=16, heads=4, vocab=11):
    """A BERT-style encoder layer with a padding mask input: Cast(mask) ->
    (1 - m) * -1e4 -> Unsqueeze (N, 1, 1, S) -> added to the scores (N, h,
    S, S) by broadcasting; Expand of an activation; LayerNormalization."""
    g = G("bert_like")
    hd = d // heads
    t = g.node("Gather", [g.w(vocab, d), "tokens"], axis=0)
    m = g.node("Cast", ["mask"], to=1)
    m = g.node("Mul", [g.node("Sub", [g.c(1.0, np.float32), m]), g.c(-1e4, np.float32)])
    m = g.node("Unsqueeze", [m, g.c([1, 2])])
    m = g.node("Expand", [m, g.c([1, heads, seq, seq])])
    q, k, v = (g.node("Transpose", [g.node("Reshape", [g.node("MatMul", [t, g.w(d, d)]),
                                                      g.c([0, seq, heads, hd])])],
                      perm=[0, 2, 1, 3]) for _ in range(3))
    s = g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])])
    s = g.node("Add", [g.node("Div", [s, g.c(hd ** 0.5, np.float32)]), m])
    c = g.node("MatMul", [g.node("Softmax", [s], axis=-1), v])
    c = g.node("Reshape", [g.node("Transpose", [c], perm=[0, 2, 1, 3]), g.c([0, seq, d])])
    t = g.node("LayerNormalization", [g.node("Add", [t, c]), g.w(value=np.ones(d, np.float32)),
                                      g.w(d)], axis=-1, epsilon=1e-12)
    return g.model([("tokens", I64, (seq,)), ("mask", I64, (seq,))], t, opset=17), \
        (seq,), vocab


def vit_convnext_like():
    """What ViT-B/16 and ConvNeXt exports add (issue 27): a dilated Conv, a
    layer scale (Mul by a (C, 1, 1) initializer: trained), a Mul by a 2-D
    initializer (no channel vector: a fixed constant), patches to tokens
    (Reshape, Transpose), a class token (a (1, 1, C) initializer Expand-ed
    to the export's batch, Concat before the tokens), learned positions
    (Add), dynamo's ``as_strided`` (Reshape to [-1], then a Gather of
    positions computed for the export's batch of ``B``), Gemm."""
    state = RNG.bit_generator.state  # the other graphs' weights do not depend on this one
    g = G("vit_convnext_like")
    c, hw = 6, 16
    t = g.node("Conv", ["x", g.w(c, 3, 3, 3), g.w(c)], kernel_shape=[3, 3], dilations=[2, 2],
               pads=[2, 1, 2, 3])
    t = g.node("Mul", [g.w(c, 1, 1, scale=1.0), t])                   # layer scale
    t = g.node("Mul", [t, g.w(value=(RNG.random((8, 8)) > 0.3).astype(np.float32))])
    t = g.node("Conv", [t, g.w(c, c, 2, 2)], kernel_shape=[2, 2], strides=[2, 2])  # (c, 4, 4)
    t = g.node("Transpose", [g.node("Reshape", [t, g.c([0, c, hw])])], perm=[0, 2, 1])
    cls = g.node("Expand", [g.w(1, 1, c), g.c([B, 1, c])])
    t = g.node("Concat", [cls, t], axis=1)                              # (hw + 1, c)
    t = g.node("Add", [t, g.w(1, hw + 1, c)])
    t = g.node("Add", [g.node("Gather", [t, g.c(0)], axis=1),          # the class token
                       g.node("ReduceMean", [t, g.c([1])], keepdims=0)])  # and the tokens
    flat = g.node("Reshape", [t, g.c([-1])])
    pos = (np.arange(B)[:, None] * c + np.arange(c)[None]).astype(np.int64)
    t = g.node("Gather", [flat, g.c(pos)], axis=0)                      # as_strided
    out = g.node("Gemm", [t, g.w(5, c), g.w(5)], transB=1)
    RNG.bit_generator.state = state
    return g.model([("x", F, (3, 8, 8))], out, opset=18), (3, 8, 8)
