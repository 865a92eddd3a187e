"""lp.frontends.from_torch (torch.fx): the four model families predict what
PyTorch predicts, and one training step gives the parameters PyTorch's step
gives (issue 14 items 2 and 5). Skipped where torch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_models as TM  # noqa: E402

import legionpy as lp  # noqa: E402
from legionpy.frontends import UnsupportedOperatorError, from_torch  # noqa: E402
from legionpy.optimizer import Machine  # noqa: E402


@pytest.fixture
def rt2():
    rt = lp.init(cpus=2)
    yield rt
    lp.runtime.shutdown()


@pytest.mark.parametrize("cls", TM.FAMILIES, ids=lambda c: c.__name__)
def test_predict_equals_pytorch(cls, rt2):
    mod = TM.build(cls)
    x = TM.example(cls, 2 * TM.B)
    with torch.no_grad():
        want = mod(x).numpy()
    m = from_torch(mod, x[:TM.B], batch_size=2 * TM.B)
    m.compile(loss="mse", strategy="model", machine=Machine.local(2))
    np.testing.assert_allclose(m.predict(x.numpy()), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", TM.FAMILIES, ids=lambda c: c.__name__)
def test_one_training_step_equals_pytorch(cls):
    """SGD on the mean squared error, batch statistics in batch norm (of the
    whole batch: one sample tile), dropout off: every parameter after one
    step equals PyTorch's (rtol 1e-4)."""
    mod = TM.build(cls)
    for sub in mod.modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p = 0.0
        if isinstance(sub, torch.nn.MultiheadAttention):
            sub.dropout = 0.0
    x = TM.example(cls, TM.B)
    m = from_torch(mod, x)
    before = {n: conv(mod.state_dict()) for n, conv in m.imported.items()}
    lp.init(cpus=1)
    try:
        m.compile(optimizer=lp.nn.SGD(lr=0.1), loss="mse", machine=Machine.local(1))
        got = _step(m, mod, x)
    finally:
        lp.runtime.shutdown()
    sd = mod.state_dict()
    assert set(got) == set(m.imported)
    for name, conv in m.imported.items():
        want = conv(sd)
        if name.endswith(".t0.bias"):  # an LSTM layer's b_ih + b_hh
            # PyTorch steps both biases by lr * grad: the sum moves twice as far
            want = before[name] + (want - before[name]) / 2
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-6, err_msg=name)


def _step(m, mod, x):
    """One SGD step in legionpy and in PyTorch; legionpy's parameters."""
    with torch.no_grad():
        target = torch.randn(mod(x).shape, generator=torch.Generator().manual_seed(1))
    m.fit(x.numpy(), target.numpy(), verbose=0, shuffle=False)
    mod.train()
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(mod(x), target).backward()
    opt.step()
    return m.parameters()


def test_unsupported_calls_are_listed_together():
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, dilation=2)
            self.up = torch.nn.Upsample(scale_factor=2)

        def forward(self, x):
            return torch.erf(self.up(x)) + torch.cumsum(x, 1).sum()

    with pytest.raises(UnsupportedOperatorError) as e:
        from_torch(Bad(), torch.randn(2, 3, 8, 8))
    msg = str(e.value)
    assert "Upsample: 1 node(s): up" in msg and "cumsum: 1 node(s)" in msg


def test_mobile_blocks_predict_and_train_as_pytorch():
    """ReLU6, depthwise conv, Hardswish, torchvision's squeeze-and-excitation
    (broadcast multiply), SiLU, ceil-mode max pool, torch.mean over H, W."""
    tv = pytest.importorskip("torchvision")
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU6(),
                                   nn.Conv2d(8, 8, 3, 1, 1, groups=8), nn.Hardswish(),
                                   tv.ops.SqueezeExcitation(8, 4, scale_activation=nn.Hardsigmoid),
                                   nn.SiLU(), nn.MaxPool2d(3, 2, ceil_mode=True))
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            return self.fc(self.a(x).mean([2, 3]))

    torch.manual_seed(0)
    mod = Net()
    x = torch.randn(4, 3, 11, 11)
    m = from_torch(mod, x)
    kinds = [o.kind for o in m.graph.ops]
    assert {"unary", "binary", "reduce", "pad"} <= set(kinds)
    m.compile(optimizer=lp.nn.SGD(lr=0.1), loss="mse", machine=Machine.local(1))
    mod.eval()
    with torch.no_grad():
        want = mod(x).numpy()
    np.testing.assert_allclose(m.predict(x.numpy()), want, rtol=1e-4, atol=1e-5)
    mod.train()
    target = torch.randn(4, 5)
    before = {n: conv(mod.state_dict()) for n, conv in m.imported.items()}
    torch.nn.functional.mse_loss(mod(x), target).backward()
    torch.optim.SGD(mod.parameters(), lr=0.1).step()
    m.fit(x.numpy(), target.numpy(), epochs=1, verbose=0, shuffle=False)
    got = m.parameters()
    for n, conv in m.imported.items():
        np.testing.assert_allclose(got[n] - before[n], conv(mod.state_dict()) - before[n],
                                   rtol=1e-3, atol=1e-6, err_msg=n)
