"""Front ends: models users already have, as uncompiled :class:`legionpy.nn.Model`.

- :func:`from_onnx` (``onnx`` package): an ONNX file or ``ModelProto``;
- :func:`from_torch` (``torch``, the ``[torch]`` extra): a ``torch.nn.Module``
  traced with torch.fx (or, ``via="onnx"``, exported with torch.onnx).

Both give layers named after the source graph's nodes and parameters taken
from its weights; compile, fit, predict, search and simulate them like any
model. ``SUPPORTED_ONNX`` lists the ONNX operators the importer handles.
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_onnx", "from_torch", "SUPPORTED_ONNX", "UnsupportedOperatorError"]


def from_onnx(model: Any, batch_size: int | None = None, seed: int = 0,
              add_softmax: bool = False, name: str | None = None) -> Any:
    """See :func:`legionpy.frontends.onnx_import.from_onnx`."""
    from ..errors import ModelError

    try:
        import onnx  # noqa: F401
    except ImportError:
        raise ModelError("from_onnx needs the onnx package: pip install onnx") from None
    from .onnx_import import from_onnx as _from_onnx

    return _from_onnx(model, batch_size, seed, add_softmax, name)


def from_torch(module: Any, example_input: Any, batch_size: int | None = None,
               seed: int = 0, name: str | None = None, via: str = "fx") -> Any:
    """See :func:`legionpy.frontends.torch_fx.from_torch`."""
    from .torch_fx import from_torch as _from_torch

    return _from_torch(module, example_input, batch_size, seed, name, via)


def __getattr__(name: str) -> Any:
    if name == "SUPPORTED_ONNX":
        from .onnx_ops import HANDLERS

        return tuple(sorted(HANDLERS))
    if name == "UnsupportedOperatorError":
        from .onnx_import import UnsupportedOperatorError

        return UnsupportedOperatorError
    raise AttributeError(f"module 'legionpy.frontends' has no attribute {name!r}")
