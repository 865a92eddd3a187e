"""``from_torch(..., via="onnx")``: a module torch.fx cannot trace (Hugging
Face ``transformers`` models: data-dependent control flow in their mask and
cache code; transformers 5 no longer ships its own fx tracer,
``transformers.utils.fx``) is exported with ``torch.onnx.export(...,
dynamo=True)`` (torch.export captures the graph with the example's shapes)
into a temporary folder and imported with :func:`from_onnx`.

The module's first output is the model's output: a tensor, or the first
tensor of a tuple or of a ``ModelOutput`` (``logits``,
``last_hidden_state``); ``use_cache=False`` is passed where ``forward``
takes it (no key/value cache outputs). ``model.imported`` is empty on this
path (the weights still come from the module).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import tempfile
import warnings
from typing import Any

from ..errors import ModelError

__all__ = ["from_torch_onnx"]


def _first_tensor(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) \
        else []
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise ModelError(f"from_torch(via='onnx'): the module returned {type(out).__name__} "
                     "without a tensor")


def from_torch_onnx(module: Any, example_input: Any, batch_size: int | None, seed: int,
                    name: str | None) -> Any:
    import torch

    from .onnx_import import from_onnx

    try:
        takes_cache = "use_cache" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        takes_cache = False

    class First(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return _first_tensor(self.m(x, use_cache=False) if takes_cache else self.m(x))

    was = module.training
    module.eval()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                try:
                    torch.onnx.export(First(module), (example_input,), path, dynamo=True,
                                      external_data=True)
                except Exception as e:  # noqa: BLE001 - the exporter's own message
                    raise ModelError(f"from_torch(via='onnx'): torch.onnx.export cannot export "
                                     f"{type(module).__name__} ({type(e).__name__}: "
                                     f"{str(e).splitlines()[0][:300]})") from None
            m = from_onnx(path, batch_size=batch_size or int(example_input.shape[0]),
                          seed=seed, name=name or type(module).__name__)
    finally:
        module.train(was)
    m.imported = {}
    return m
