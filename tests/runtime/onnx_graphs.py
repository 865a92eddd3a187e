"""Small ONNX graphs built with onnx.helper in the shapes PyTorch exports,
one per operator family and whole models, shared by the front-end tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(7)
B = 4


class G:
    """A graph under construction: ``g.node(op, ins, **attrs) -> output name``."""

    def __init__(self, name: str) -> None:
        self.name, self.nodes, self.inits, self.k = name, [], [], 0

    def w(self, *shape, scale=0.3, value=None) -> str:
        self.k += 1
        a = value if value is not None else RNG.standard_normal(shape) * scale
        n = f"w{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(a, dtype=a.dtype if
                                                             value is not None else np.float32),
                                                  n))
        return n

    def c(self, value, dtype=np.int64) -> str:
        return self.w(value=np.asarray(value, dtype))

    def node(self, op, ins, outs=1, name=None, **attrs):
        self.k += 1
        o = [f"t{self.k}_{i}" for i in range(outs)]
        self.nodes.append(helper.make_node(op, ins, o, name=name or f"/{op}_{self.k}",
                                           **attrs))
        return o[0] if outs == 1 else o

    def model(self, inputs, out, opset=17):
        ins = [helper.make_tensor_value_info(n, t, ["N", *s]) for n, t, s in inputs]
        outs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
        g = helper.make_graph(self.nodes, self.name, ins, outs, self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


F = TensorProto.FLOAT
I64 = TensorProto.INT64


def conv_bn(g, x, cin, cout, k=3, stride=1, pad=1, relu=True):
    t = g.node("Conv", [x, g.w(cout, cin, k, k)], kernel_shape=[k, k], strides=[stride] * 2,
               pads=[pad] * 4)
    t = g.node("BatchNormalization", [t, g.w(value=1 + 0.2 * RNG.random(cout).astype(
        np.float32)), g.w(cout), g.w(cout), g.w(value=0.5 + RNG.random(cout).astype(
            np.float32))], epsilon=1e-5, momentum=0.9)
    return g.node("Relu", [t]) if relu else t


def resnet_like():
    """Conv-BN-ReLU stem, max pool, two residual blocks (one strided with a
    1x1 projection), global average pool, flatten, Gemm."""
    g = G("resnet_like")
    t = conv_bn(g, "x", 3, 8, 3, 1, 1)
    t = g.node("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
    u = conv_bn(g, conv_bn(g, t, 8, 8), 8, 8, relu=False)
    t = g.node("Relu", [g.node("Add", [u, t])])
    u = conv_bn(g, conv_bn(g, t, 8, 16, stride=2), 16, 16, relu=False)
    p = conv_bn(g, t, 8, 16, k=1, stride=2, pad=0, relu=False)
    t = g.node("Relu", [g.node("Add", [u, p])])
    t = g.node("Flatten", [g.node("GlobalAveragePool", [t])], axis=1)
    out = g.node("Gemm", [t, g.w(10, 16), g.w(10)], transB=1)
    return g.model([("x", F, (3, 12, 12))], out), (3, 12, 12)


def vgg_like():
    """AlexNet/VGG-like: convs, pools, an inception-style Concat, Reshape,
    Gemm+Relu, Dropout, Gemm, Softmax."""
    g = G("vgg_like")
    t = g.node("Relu", [g.node("Conv", ["x", g.w(6, 3, 5, 5), g.w(6)], kernel_shape=[5, 5],
                                 strides=[2, 2], pads=[2, 2, 2, 2])])
    t = g.node("MaxPool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    a = g.node("Relu", [g.node("Conv", [t, g.w(4, 6, 1, 1), g.w(4)], kernel_shape=[1, 1])])
    b = g.node("Relu", [g.node("Conv", [t, g.w(4, 6, 3, 3), g.w(4)], kernel_shape=[3, 3],
                                 pads=[1, 1, 1, 1])])
    t = g.node("Concat", [a, b], axis=1)
    t = g.node("AveragePool", [t], kernel_shape=[2, 2], strides=[2, 2])
    t = g.node("Reshape", [t, g.c([-1, 8 * 2 * 2])])
    t = g.node("Relu", [g.node("Gemm", [t, g.w(16, 32), g.w(16)], transB=1)])
    t = g.node("Dropout", [t, g.c(0.5, np.float32)])
    t = g.node("Gemm", [t, g.w(16, 5), g.w(5)])
    out = g.node("Softmax", [t], axis=-1)
    return g.model([("x", F, (3, 16, 16))], out), (3, 16, 16)


def _erf_gelu(g, x):
    d = g.node("Div", [x, g.c(2 ** 0.5, np.float32)])
    e = g.node("Erf", [d])
    a = g.node("Add", [e, g.c(1.0, np.float32)])
    return g.node("Mul", [g.node("Mul", [x, a]), g.c(0.5, np.float32)])


def transformer_encoder(seq=6, d=16, heads=4, ff=32, vocab=13, layers=2, causal=False):
    """Token embedding (Gather) + a learned positional table (Add), then
    post-norm encoder layers as PyTorch exports them: a fused qkv MatMul
    split three ways, Reshape/Transpose to heads, scaled scores,
    Softmax, context back, out projection, residual + LayerNormalization,
    MatMul -> erf GELU -> MatMul MLP; classify from position 0 (Gather)."""
    g = G("transformer_encoder")
    hd = d // heads
    t = g.node("Gather", [g.w(vocab, d), "tokens"], axis=0)
    t = g.node("Add", [t, g.w(1, seq, d)])
    for _ in range(layers):
        qkv = g.node("Add", [g.node("MatMul", [t, g.w(d, 3 * d)]), g.w(3 * d)])
        q, k, v = g.node("Split", [qkv, g.c([d, d, d])], outs=3, axis=-1)
        q, k, v = (g.node("Transpose", [g.node("Reshape", [z, g.c([0, seq, heads, hd])])],
                          perm=[0, 2, 1, 3]) for z in (q, k, v))
        s = g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])])
        s = g.node("Div", [s, g.c(hd ** 0.5, np.float32)])
        p = g.node("Softmax", [s], axis=-1)
        c = g.node("Transpose", [g.node("MatMul", [p, v])], perm=[0, 2, 1, 3])
        c = g.node("Reshape", [c, g.c([B, seq, d])])
        o = g.node("Add", [g.node("MatMul", [c, g.w(d, d)]), g.w(d)])
        t = g.node("LayerNormalization", [g.node("Add", [t, o]), g.w(value=(1 + 0.1 * RNG.
                   standard_normal(d)).astype(np.float32)), g.w(d)], axis=-1, epsilon=1e-5)
        f = _erf_gelu(g, g.node("Add", [g.node("MatMul", [t, g.w(d, ff)]), g.w(ff)]))
        f = g.node("Add", [g.node("MatMul", [f, g.w(ff, d)]), g.w(d)])
        t = g.node("LayerNormalization", [g.node("Add", [t, f]), g.w(value=np.ones(
            d, np.float32)), g.w(d)], axis=-1, epsilon=1e-5)
    t = g.node("Gather", [t, g.c(0)], axis=1)
    out = g.node("Gemm", [t, g.w(3, d), g.w(3)], transB=1)
    return g.model([("tokens", I64, (seq,))], out), (seq,), vocab


def lstm_classifier(seq=5, emb=6, hidden=8, vocab=11, classes=3):
    """Embedding, batch-first -> time-major Transpose, two ONNX LSTM layers
    (as PyTorch exports a 2-layer nn.LSTM), h_n[-1] (Concat + Gather), Gemm."""
    g = G("lstm_classifier")
    t = g.node("Gather", [g.w(vocab, emb), "tokens"], axis=0)
    t = g.node("Transpose", [t], perm=[1, 0, 2])
    hs, inp = [], emb
    for _ in range(2):
        y, yh, _yc = g.node("LSTM", [t, g.w(1, 4 * hidden, inp), g.w(1, 4 * hidden, hidden),
                                     g.w(1, 8 * hidden)], outs=3, hidden_size=hidden)
        t = g.node("Squeeze", [y, g.c([1])])
        hs.append(yh)
        inp = hidden
    hn = g.node("Concat", hs, axis=0)
    last = g.node("Gather", [hn, g.c(-1)], axis=0)
    out = g.node("Gemm", [last, g.w(classes, hidden), g.w(classes)], transB=1)
    return g.model([("tokens", I64, (seq,))], out), (seq,), vocab


def elementwise():
    """Tanh, Sigmoid, Mul, Sub, Slice, Unsqueeze/Squeeze and opset-20 Gelu."""
    g = G("elementwise")
    a = g.node("Tanh", [g.node("MatMul", ["x", g.w(6, 8)])])
    b = g.node("Sigmoid", [g.node("Sub", ["x", g.w(6)])])
    b = g.node("MatMul", [b, g.w(6, 8)])
    t = g.node("Mul", [a, b])
    t = g.node("Slice", [t, g.c([2]), g.c([7]), g.c([1])])
    t = g.node("Squeeze", [g.node("Unsqueeze", [t, g.c([1])]), g.c([1])])
    t = g.node("Gelu", [g.node("Mul", [t, g.c(3.0, np.float32)])])
    return g.model([("x", F, (6,))], t, opset=20), (6,)
