"""Issue 27 through PyTorch: a small torchvision ViT (class token), a
ConvNeXt block (layer scale) and a dilated convolution import through
torch.fx and both ONNX exporters, predict as torch does, and one SGD step
gives torch's parameters: the class token and the layer scale are trained
parameters. Skipped where torch (or torchvision) is not installed."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
onnx = pytest.importorskip("onnx")

import legionpy as lp  # noqa: E402
from legionpy.frontends import from_onnx, from_torch  # noqa: E402
from legionpy.optimizer import Machine  # noqa: E402

B = 4


def tiny_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2,
                             hidden_dim=16, mlp_dim=32, num_classes=5), (3, 16, 16)


def convnext_block():
    from torch import nn
    from torchvision.models.convnext import CNBlock

    return nn.Sequential(nn.Conv2d(3, 8, 2, 2), CNBlock(8, 1e-6, 0.0), CNBlock(8, 0.5, 0.0),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)), (3, 8, 8)


def dilated():
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=2, dilation=2), nn.ReLU(),
                         nn.Conv2d(6, 4, (3, 2), stride=(2, 1), padding=(3, 1),
                                   dilation=(3, 2)),
                         nn.Flatten(), nn.LazyLinear(5)), (3, 9, 10)


class Scaled(torch.nn.Module):
    """A trained scalar and a buffer multiplied in: the first trains, the
    second stays fixed."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)
        self.alpha = torch.nn.Parameter(torch.tensor(0.7))
        self.register_buffer("mask", torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]))

    def forward(self, x):
        return self.fc(x * self.alpha) * self.mask


def scaled():
    return Scaled(), (6,)


BUILD = {"vit": tiny_vit, "convnext": convnext_block, "dilated": dilated, "scaled": scaled}


def build(name):
    torch.manual_seed(0)
    mod, shape = BUILD[name]()
    x = torch.randn(B, *shape)
    mod(x)  # materialise lazy layers
    with torch.no_grad():  # non-trivial values (ViT's head and class token start at 0)
        for p in mod.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return mod.eval(), x


def export(mod, x, how):
    f = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if how == "dynamo":
            return torch.onnx.export(mod, (x,), dynamo=True).model_proto
        torch.onnx.export(mod, (x,), f, dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("name", list(BUILD))
@pytest.mark.parametrize("how", ["fx", "dynamo", "legacy"])
def test_predicts_as_torch(name, how, rt1):
    mod, x = build(name)
    m = from_torch(mod, x) if how == "fx" else from_onnx(export(mod, x, how), batch_size=B)
    kinds = {o.kind for o in m.graph.ops}
    want_kind = {"vit": "concat_param", "convnext": "layer_scale", "dilated": "conv2d",
                 "scaled": "dense"}[name]
    assert want_kind in kinds
    if name == "scaled":  # fx: the parameter trains; ONNX: a scalar; the 0/1 buffer: fixed
        assert sum(o.kind == "layer_scale" for o in m.graph.ops) == (how == "fx")
        assert any(o.kind == "binary" and not o.params for o in m.graph.ops)
    if name == "dilated":
        assert [o.attrs.get("dilation") for o in m.graph.ops if o.kind == "conv2d"] == [
            (2, 2), (3, 2)]
    m.compile(loss="mse", machine=Machine.local(1))
    with torch.no_grad():
        want = mod(x).numpy()
    np.testing.assert_allclose(m.predict(x.numpy()), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(BUILD))
def test_one_sgd_step_equals_torch(name):
    """Through fx: every imported parameter (the class token and both layer
    scales included) after one SGD step on the MSE equals torch's."""
    mod, x = build(name)
    m = from_torch(mod, x)
    target = torch.randn(mod(x).shape, generator=torch.Generator().manual_seed(1))
    before = {n: conv(mod.state_dict()) for n, conv in m.imported.items()}
    lp.init(cpus=1)
    try:
        m.compile(optimizer=lp.nn.SGD(lr=0.1), loss="mse", machine=Machine.local(1))
        m.fit(x.numpy(), target.numpy(), verbose=0, shuffle=False)
        got = m.parameters()
    finally:
        lp.runtime.shutdown()
    torch.nn.functional.mse_loss(mod(x), target).backward()
    torch.optim.SGD(mod.parameters(), lr=0.1).step()
    sd = mod.state_dict()
    assert set(m.imported) <= set(got)
    trained = [o for o in m.graph.ops if o.kind in ("concat_param", "layer_scale")]
    assert len(trained) == {"vit": 1, "convnext": 2, "dilated": 0, "scaled": 1}[name]
    for name_, conv in m.imported.items():
        np.testing.assert_allclose(got[name_] - before[name_], conv(sd) - before[name_],
                                   rtol=1e-3, atol=1e-7, err_msg=name_)
    for o in trained:  # a gradient reached them
        p = next(iter(o.params.values())).name
        assert np.abs(got[p] - before[p]).max() > 0, p
