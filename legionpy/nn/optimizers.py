"""Optimizers: SGD (momentum, Nesterov, weight decay) and Adam.

An optimizer is a small frozen description plus an in-place update of one
weight tile. Its state lives in extra fields of the parameter's region
(``Optimizer.fields``: ``"m"`` for momentum, ``"m"`` and ``"v"`` for Adam),
so the update task ``U(param, tile)`` holds ``RW`` on ``w``, ``g`` and the
state over its tile on the tile's home device, and nothing else: state
never moves (DESIGN.md section 2). ``update`` also zeroes ``g`` for the
next step's ``Reduce("+")``.

Semantics follow PyTorch (``torch.optim.SGD`` / ``Adam``; weight decay is
L2 added to the gradient), so a reference training loop in PyTorch gives
the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError

__all__ = ["Optimizer", "SGD", "Adam"]


class Optimizer:
    """Base class: ``fields`` (state fields per parameter) and ``update``."""

    fields: tuple[str, ...] = ()
    #: does ``update`` depend on ``step``? (False: the runtime passes 1 every
    #: step, so a CUDA graph that captured the update stays valid)
    uses_step = True

    def update(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
               step: int) -> None:
        """Update the tile ``w`` in place from its gradient ``g`` (summed over the
        batch shares); ``step`` counts from 1. Zeroes ``g``."""
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(Optimizer):
    """``SGD(lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0)``."""

    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    uses_step = False

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.momentum < 0 or self.weight_decay < 0:
            raise ModelError(f"SGD needs lr > 0, momentum >= 0 and weight_decay >= 0, got "
                             f"lr={self.lr}, momentum={self.momentum}, "
                             f"weight_decay={self.weight_decay}")
        if self.nesterov and self.momentum == 0:
            raise ModelError("SGD(nesterov=True) needs momentum > 0")

    @property
    def fields(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("m",) if self.momentum else ()

    def update(self, w, g, state, step):
        if self.weight_decay:
            g += self.weight_decay * w
        if self.momentum:
            m = state["m"]
            m *= self.momentum
            m += g
            if self.nesterov:
                g += self.momentum * m
            else:
                g[...] = m
        w -= np.float32(self.lr) * g
        g[...] = 0


@dataclass(frozen=True)
class Adam(Optimizer):
    """``Adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)``."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ModelError(f"Adam needs lr > 0 and betas in [0, 1), got lr={self.lr}, "
                             f"betas=({self.beta1}, {self.beta2})")

    fields = ("m", "v")

    def update(self, w, g, state, step):
        if self.weight_decay:
            g += self.weight_decay * w
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        c1 = 1 - self.beta1 ** step
        c2 = 1 - self.beta2 ** step
        denom = np.sqrt(v / c2) + self.eps
        w -= (self.lr / c1) * m / denom
        g[...] = 0


def as_optimizer(opt: Any) -> Optimizer:
    if isinstance(opt, Optimizer):
        return opt
    if isinstance(opt, str):
        named = {"sgd": SGD, "adam": Adam}
        if opt.lower() in named:
            return named[opt.lower()]()
    raise ModelError(f"optimizer must be lp.nn.SGD(...), lp.nn.Adam(...), 'sgd' or 'adam', "
                     f"got {opt!r}")
