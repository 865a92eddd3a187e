"""Operator registry: shape rules, SOAP dims, input/weight tiles from an
output tile, FLOP and byte counts (paper section 4, Table 1).

One registry (``REGISTRY``: kind -> class) serves the task-graph builder, the
search and the runtime. Kernels live in :mod:`legionpy.ops.kernels`.
"""

from __future__ import annotations

from .base import REGISTRY, Operator, Parameter, TensorRef, op_class, register
from .elementwise import Binary, Cast, Gather, Pad, Reduce, Unary
from .layers import (
    Add,
    BatchMatmul,
    BatchNorm,
    Concat,
    Conv2D,
    Dense,
    Dropout,
    Flat,
    Gelu,
    Input,
    Multiply,
    Pool2D,
    Relu,
    Reshape,
    Sigmoid,
    Softmax,
    Tanh,
)
from .recurrent import Attention, Embedding, LSTMCell, TiedDense
from .sequence import (
    AddBias,
    ConcatParam,
    LayerNorm,
    LayerScale,
    PositionalEncoding,
    Scale,
    Slice,
    Transpose,
)

__all__ = [
    "REGISTRY", "Operator", "Parameter", "TensorRef", "op_class", "register",
    "Add", "BatchMatmul", "BatchNorm", "Concat", "Conv2D", "Dense", "Dropout", "Flat",
    "Gelu", "Input", "Multiply", "Pool2D", "Relu", "Reshape", "Sigmoid", "Softmax",
    "Tanh", "Attention", "Embedding", "LSTMCell", "TiedDense", "AddBias", "LayerScale",
    "ConcatParam", "LayerNorm", "PositionalEncoding", "Scale", "Slice", "Transpose", "Unary",
    "Binary", "Reduce", "Pad", "Cast", "Gather",
]
