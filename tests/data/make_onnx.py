"""Export the small models the front-end tests import without torch (issue 27).

Each model is built from torchvision / transformers parts at a tiny size
(random weights: nothing is downloaded), exported with both ONNX exporters
where they differ (``dynamo``: ``torch.onnx.export(..., dynamo=True)``,
today's default, weights in an external ``.onnx.data`` file; ``legacy``:
``dynamo=False``, opset 17), and stored with a batch of inputs and torch's
eval-mode outputs in ``NAME.npz`` (``x`` and, for BERT, ``mask``; ``y``).
tests/runtime/test_frontend_zoo_data.py imports them, compares predict with
``y`` and trains a step. Run from the repository root with torch installed:

    python tests/data/make_onnx.py          # rewrites tests/data/*.onnx*, *.npz
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
B = 2


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


#: name -> (builder, exporters)
MODELS = {
    "resnet": (tiny_resnet, ("dynamo", "legacy")),
    "mobilenet": (tiny_mobilenet, ("dynamo", "legacy")),
    "gpt2": (tiny_gpt2, ("dynamo",)),  # the legacy exporter has no aten::diff (its masks)
    "bert": (tiny_bert, ("dynamo", "legacy")),
}


def export(module, args, path: str, how: str) -> None:
    import torch

    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if how == "dynamo":
            torch.onnx.export(module, args, path, dynamo=True, external_data=True)
        else:
            torch.onnx.export(module, args, path, dynamo=False, opset_version=17)


def main() -> None:
    import torch

    torch.manual_seed(0)
    for name, (build, hows) in MODELS.items():
        module, x = build()
        module.eval()
        args = x if isinstance(x, tuple) else (x,)
        with torch.no_grad():
            y = module(*args).numpy()
        arrays = {"x": args[0].numpy(), "y": y}
        if len(args) > 1:
            arrays["mask"] = args[1].numpy()
        np.savez(os.path.join(HERE, f"{name}.npz"), **arrays)
        for how in hows:
            path = os.path.join(HERE, f"{name}_{how}.onnx")
            export(module, args, path, how)
            size = sum(os.path.getsize(f) for f in (path, path + ".data") if os.path.exists(f))
            print(f"{os.path.basename(path)}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
