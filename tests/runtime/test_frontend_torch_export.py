"""Models exported from PyTorch with torch.onnx.export load with
from_onnx, predict what PyTorch predicts (rtol 1e-4), train and search
(issue 14's done-criterion: a ResNet, a VGG/AlexNet, a Transformer encoder
and an LSTM classifier), also at a batch size other than the exported one
(shape constants computed for the export's batch are rescaled). Skipped where
torch is not installed."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import torch_models as TM  # noqa: E402

import legionpy as lp  # noqa: E402
from legionpy.frontends import from_onnx  # noqa: E402
from legionpy.optimizer import Machine, Strategy, search  # noqa: E402


def export(mod, x) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(mod, (x,), f, dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("cls", TM.FAMILIES, ids=lambda c: c.__name__)
def test_exported_model_predicts_trains_and_searches(cls):
    mod = TM.build(cls)
    x = TM.example(cls, 2 * TM.B)
    proto = export(mod, x[:TM.B])
    with torch.no_grad():
        want = mod(x).numpy()
    lp.init(cpus=2)
    try:
        m = from_onnx(proto, batch_size=2 * TM.B)  # another batch than the export's
        m.compile(loss="mse", strategy="data", machine=Machine.local(2))
        np.testing.assert_allclose(m.predict(x.numpy()), want, rtol=1e-4, atol=1e-5)
        t = from_onnx(proto, add_softmax=True)
        t.compile(optimizer=lp.nn.Adam(lr=0.01), machine=Machine.local(2))
        y = np.arange(len(x)) % want.shape[1]
        h = t.fit(x.numpy(), y, epochs=3, verbose=0, shuffle=False)
        assert h["loss"][-1] < h["loss"][0]
    finally:
        lp.runtime.shutdown()
    machine = Machine.preset("p100", nodes=1)
    best = search.mcmc(m.graph, machine, iterations=30, seed=0)
    sim = lp.optimizer.Simulator(m.graph, machine)
    assert sim.simulate(best) <= sim.simulate(Strategy.data_parallel(m.graph, machine))
