"""Export the small models the front-end tests import without torch (issue 27).

Each model is built from torchvision / transformers parts at a tiny size
(random weights: nothing is downloaded), exported with both ONNX exporters
where they differ (``dynamo``: ``torch.onnx.export(..., dynamo=True)``,
today's default, weights in an external ``.onnx.data`` file; ``legacy``:
``dynamo=False``, opset 17), and stored with a batch of inputs and torch's
eval-mode outputs in ``NAME.npz`` (``x`` and, for BERT, ``mask``; ``y``).
Models with batch norm are exported without the exporters' folding passes
(``optimize=False`` / ``do_constant_folding=False``), which would fold
batch norm into the convolutions: the imported model is then torch's to
train.

Each ``NAME.npz`` also holds the reference of one training step: ``target``
(an MSE target of ``y``'s shape), ``param.<torch name>`` (each trained
parameter's initial value, float32: how a test finds which imported
parameter is which, by value) and ``grad.<torch name>`` (torch's gradient
of ``mean((f(x) - target)^2)`` in float64, in train mode: batch norm on
batch statistics; dropout is off in every model here).
tests/runtime/test_frontend_zoo_data.py imports them, compares predict with
``y`` and trains a step; test_frontend_zoo_grads.py compares the gradients.
Run from the repository root with torch installed:

    python tests/data/make_onnx.py          # rewrites tests/data/*.onnx*, *.npz
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
B = 4


def tiny_resnet():
    import torch
    from torch import nn
    from torchvision.models.resnet import BasicBlock

    down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        BasicBlock(8, 8), BasicBlock(8, 16, stride=2, downsample=down),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)), torch.randn(B, 3, 16, 16)


def tiny_mobilenet():
    """MobileNet-V2 inverted residuals (ReLU6, depthwise) and a V3 block
    (Hardswish, squeeze-and-excitation with Hardsigmoid)."""
    import torch
    from torch import nn
    from torchvision.models.mobilenetv2 import InvertedResidual
    from torchvision.ops import SqueezeExcitation

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
        InvertedResidual(8, 8, 1, 2), InvertedResidual(8, 16, 2, 3),
        nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.Hardswish(),
        SqueezeExcitation(16, 8, scale_activation=nn.Hardsigmoid),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)), torch.randn(B, 3, 16, 16)


def tiny_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = GPT2LMHeadModel(GPT2Config(
                n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False))

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    return LM(), torch.randint(0, 64, (B, 12))


def tiny_bert():
    import torch
    from transformers import BertConfig, BertModel

    class Enc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel(BertConfig(
                num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                intermediate_size=64, vocab_size=64, max_position_embeddings=16,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                add_pooling_layer=False)

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(0, 64, (B, 12))
    mask = torch.ones(B, 12, dtype=torch.int64)
    mask[0, 8:] = 0  # padding in the first sample
    return Enc(), (ids, mask)


def tiny_vit():
    """torchvision's VisionTransformer: class token, learned positions."""
    import torch
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2,
                             hidden_dim=16, mlp_dim=32, num_classes=5), torch.randn(B, 3, 16, 16)


def tiny_convnext():
    """torchvision's ConvNeXt at two tiny stages: layer scale, LayerNorm2d,
    depthwise 7x7 convs, and (dynamo) the classifier's as_strided gather."""
    import torch
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=5,
                    layer_scale=0.5), torch.randn(B, 3, 16, 16)


#: name -> (builder, exporters, keep batch norm unfolded)
MODELS = {
    "resnet": (tiny_resnet, ("dynamo", "legacy"), True),
    "mobilenet": (tiny_mobilenet, ("dynamo", "legacy"), True),
    "gpt2": (tiny_gpt2, ("dynamo",), False),  # the legacy exporter has no aten::diff (masks)
    "bert": (tiny_bert, ("dynamo", "legacy"), False),
    "vit": (tiny_vit, ("dynamo", "legacy"), False),
    "convnext": (tiny_convnext, ("dynamo", "legacy"), False),
}


def export(module, args, path: str, how: str, keep_bn: bool = False) -> None:
    import torch

    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if how == "dynamo":
            torch.onnx.export(module, args, path, dynamo=True, external_data=True,
                              optimize=not keep_bn)
        else:
            torch.onnx.export(module, args, path, dynamo=False, opset_version=17,
                              do_constant_folding=not keep_bn)


def reference_step(module, args, target: np.ndarray) -> dict:
    """``param.NAME`` (float32 initial values) and ``grad.NAME`` (float64
    gradients of the MSE to ``target``, train mode) of every parameter."""
    import copy

    import torch

    arrays = {f"param.{n}": p.detach().numpy().copy() for n, p in module.named_parameters()}
    m64 = copy.deepcopy(module).double().train()
    a64 = [a.double() if a.is_floating_point() else a for a in args]
    loss = torch.nn.functional.mse_loss(m64(*a64), torch.tensor(target, dtype=torch.float64))
    loss.backward()
    for n, p in m64.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        arrays[f"grad.{n}"] = g.numpy().copy()
    return arrays


def main() -> None:
    import torch

    torch.manual_seed(0)
    for name, (build, hows, keep_bn) in MODELS.items():
        module, x = build()
        with torch.no_grad():  # distinct, non-trivial values (ViT's head and token start at 0)
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        module.eval()
        args = x if isinstance(x, tuple) else (x,)
        with torch.no_grad():
            y = module(*args).numpy()
        target = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
        arrays = {"x": args[0].numpy(), "y": y, "target": target}
        if len(args) > 1:
            arrays["mask"] = args[1].numpy()
        arrays.update(reference_step(module, args, target))
        module.eval()
        np.savez(os.path.join(HERE, f"{name}.npz"), **arrays)
        for how in hows:
            path = os.path.join(HERE, f"{name}_{how}.onnx")
            export(module, args, path, how, keep_bn)
            size = sum(os.path.getsize(f) for f in (path, path + ".data") if os.path.exists(f))
            print(f"{os.path.basename(path)}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
