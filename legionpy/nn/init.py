"""Seeded parameter initialisation, identical under every strategy.

Each parameter's initial values are a pure function of ``(seed, parameter
name)`` and its init spec, generated on the WHOLE parameter on the host and
then written into its region: no tiling, device or rank can change them.

>>> from legionpy.ops import Parameter
>>> p = Parameter("fc.weight", (3, 2), {"kind": "glorot_uniform", "fan_in": 3, "fan_out": 2})
>>> bool((initial_value(p, 0) == initial_value(p, 0)).all())
True
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import ModelError
from ..ops import Parameter

__all__ = ["initial_value", "param_rng"]


def param_rng(seed: int, name: str) -> np.random.Generator:
    """A generator seeded by ``seed`` and a stable hash of ``name``."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng(np.random.SeedSequence([int(seed) & (2**63 - 1), h]))


def initial_value(p: Parameter, seed: int) -> np.ndarray:
    """The initial array of parameter ``p`` (float32, ``p.shape``)."""
    spec = p.init or {"kind": "zeros"}
    kind = spec.get("kind", "zeros")
    rng = param_rng(seed, p.name)
    if kind == "array":  # imported weights (legionpy.frontends)
        a = np.asarray(spec["value"])
        if a.shape != tuple(p.shape):
            raise ModelError(f"parameter {p.name!r}: imported array of shape {a.shape}, "
                             f"the parameter's is {p.shape}")
    elif kind == "zeros":
        a = np.zeros(p.shape)
    elif kind == "ones":
        a = np.ones(p.shape)
    elif kind == "constant":
        a = np.full(p.shape, float(spec["value"]))
    elif kind == "glorot_uniform":
        lim = np.sqrt(6.0 / (spec["fan_in"] + spec["fan_out"]))
        a = rng.uniform(-lim, lim, p.shape)
    elif kind == "uniform":
        a = rng.uniform(-spec["bound"], spec["bound"], p.shape)
    elif kind == "normal":
        a = rng.normal(0.0, spec.get("std", 1.0), p.shape)
    else:
        raise ModelError(f"parameter {p.name!r}: unknown initialiser {kind!r}; known: zeros, "
                         "ones, constant, glorot_uniform, uniform, normal, array")
    return a.astype(p.dtype)
