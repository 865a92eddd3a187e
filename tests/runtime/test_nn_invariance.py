"""DESIGN.md invariant 2 in one process: k training steps from one seed give
the same parameters under data, model, hybrid and random strategies, on 1, 2
and 4 runtime devices, and equal a plain PyTorch training loop."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from tiny_models import BATCH, cnn, mlp, random_degrees

import legionpy as lp
from legionpy.nn.init import initial_value
from legionpy.optimizer import Machine, ParallelConfig, Strategy

STEPS = 3
RNG = np.random.default_rng(1)
X_IMG = RNG.standard_normal((STEPS * BATCH, 2, 12, 12)).astype(np.float32)
X_VEC = RNG.standard_normal((STEPS * BATCH, 7)).astype(np.float32)
Y = RNG.integers(0, 3, STEPS * BATCH)


def hybrid(graph, n: int) -> Strategy:
    """Attribute + parameter splits: convs, pools and relus split H 2 ways and
    conv channels n/2 ways; dense layers split samples 2 ways and output
    features n/2 ways; everything else its sample (or channel) dim."""
    def div(size: int, k: int) -> int:
        return max(d for d in range(1, k + 1) if size % d == 0)

    out = {}
    for op in graph.ops:
        shape, deg = op.output_shape, [1] * len(op.output_shape)
        if n > 1:
            if op.kind in ("conv2d", "pool2d", "relu") and len(shape) == 4:
                deg[2] = div(shape[2], 2)
                if op.kind == "conv2d":
                    deg[1] = div(shape[1], n // 2)
            elif op.kind == "dense":
                deg[0], deg[-1] = div(shape[0], 2), div(shape[-1], n // 2)
            elif op.kind == "batch_norm":
                deg[1] = div(shape[1], n)
            else:
                d = op.dims.index("sample") if "sample" in op.dims else op.parallel_dims[0]
                deg[d] = div(shape[d], n)
        k = math.prod(deg)
        out[op.name] = ParallelConfig(tuple(deg), tuple((i + op.index) % n for i in range(k)))
    return Strategy(out)


def random_strategy(graph, n: int, seed: int) -> Strategy:
    rng = random.Random(seed)
    out = {}
    for op in graph.ops:
        deg = random_degrees(op, n, rng)
        if op.kind == "batch_norm":
            deg[0] = 1  # sample tiles normalise with their own statistics
        k = math.prod(deg)
        out[op.name] = ParallelConfig(tuple(deg), tuple(rng.randrange(n) for _ in range(k)))
    return Strategy(out)


def train(build, x, n: int, strategy, opt=None) -> dict:
    lp.init(cpus=n)
    try:
        m = build()
        if not isinstance(strategy, (str, Strategy)):
            strategy = strategy(m.graph, n)
        m.compile(optimizer=opt or lp.nn.SGD(lr=0.1, momentum=0.9), strategy=strategy,
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  machine=Machine.local(n))
        m.fit(x, Y, epochs=1, verbose=0, shuffle=False)
        return m.parameters()
    finally:
        lp.runtime.shutdown()


def torch_reference(build, x, lr=0.1, momentum=0.9) -> dict:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = build().graph
    params = {n: torch.tensor(initial_value(p, build().seed), requires_grad=True)
              for n, p in g.parameters().items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr, momentum=momentum)
    for s in range(STEPS):
        vals = {}
        for op in g.ops:
            ins = [vals[r.op.name] for r in op.inputs]
            w = {k: params[p.name] for k, p in op.params.items()}
            a = op.attrs
            if op.kind == "input":
                v = torch.tensor(x[s * BATCH:(s + 1) * BATCH])
            elif op.kind == "conv2d":
                v = F.conv2d(ins[0], w["weight"], w["bias"], a["stride"], a["padding"])
            elif op.kind == "pool2d":
                v = F.max_pool2d(ins[0], a["kernel"], a["stride"], a["padding"])
            elif op.kind == "dense":
                v = ins[0] @ w["weight"] + w["bias"]
            elif op.kind == "flat":
                v = ins[0].reshape(BATCH, -1)
            elif op.kind in ("relu", "softmax"):
                v = ins[0] if op.kind == "softmax" else torch.relu(ins[0])
            act = a.get("activation")
            vals[op.name] = {None: v, "relu": torch.relu(v), "tanh": torch.tanh(v)}[act] \
                if op.kind in ("conv2d", "dense") else v
        loss = F.cross_entropy(vals[g.ops[-1].name], torch.tensor(Y[s * BATCH:(s + 1) * BATCH]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {n: p.detach().numpy() for n, p in params.items()}


def assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=f"{what}: {k}")


STRATS = {"data": "data", "model": "model", "hybrid": hybrid,
          "random": lambda g, n: random_strategy(g, n, seed=11 + n)}


@pytest.mark.parametrize("name,build,x", [("mlp", mlp, X_VEC), ("cnn", cnn, X_IMG)])
def test_strategies_and_device_counts_agree_with_torch(name, build, x):
    ref = torch_reference(build, x)
    for n in (1, 2, 4):
        for sname, s in STRATS.items():
            assert_same(train(build, x, n, s), ref, f"{name} {sname} on {n} devices")


def test_batchnorm_dropout_adam_invariant():
    """Batch norm normalises a sample tile with its own statistics (ops/layers.py),
    so strategies are compared at batch-norm sample degree 1."""
    def build():
        return cnn(extra=True)
    base = train(build, X_IMG, 1, "data", lp.nn.Adam(lr=0.01))
    for n, s in ((2, "model"), (4, "model"), (4, hybrid), (3, STRATS["random"])):
        assert_same(train(build, X_IMG, n, s, lp.nn.Adam(lr=0.01)), base, f"{s} on {n}")
