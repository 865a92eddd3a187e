"""Losses and metrics of the layer API.

Losses (``compile(loss=...)``): ``"sparse_categorical_crossentropy"`` (int
labels (N,); (N, T) for a sequence output (N, T, K), averaged per
position), ``"categorical_crossentropy"`` (one-hot or probabilities
(N, K)), both needing a model ending in ``softmax``, and ``"mse"`` (targets
shaped like the output). The loss gradient is computed inside the backward
task of the last operator's tiles (:func:`legionpy.ops.execute.loss_gradient`).

Metrics (``compile(metrics=[...])``): ``"accuracy"``, ``"crossentropy"``
(mean categorical cross-entropy of the output probabilities), ``"mse"``,
``"mae"``. Each is a sum over samples that tiles compute on their own rows
(:func:`metric_sums`); the model divides the sum over tiles by the number of
samples. So metrics, like the loss, come back as task results, never by
reading the output region.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelError
from ..ops.execute import LOSSES

__all__ = ["LOSSES", "METRICS", "check_loss", "check_metrics", "metric_sums"]

METRICS = ("accuracy", "crossentropy", "mse", "mae")
_ALIASES = {"acc": "accuracy", "mean_squared_error": "mse", "mean_absolute_error": "mae",
            "categorical_crossentropy": "crossentropy", "cross_entropy": "crossentropy",
            "sparse_categorical_crossentropy": "crossentropy"}


def check_loss(loss: Any, last_op: Any) -> str:
    if loss not in LOSSES:
        raise ModelError(f"unknown loss {loss!r}; choose one of {list(LOSSES)}")
    if loss != "mse" and not (last_op.kind == "softmax" and last_op.attrs.get("loss", True)):
        raise ModelError(f"loss {loss!r} needs the model to end with model.softmax(...); it "
                         f"ends with {last_op.kind} {last_op.name!r}; add a softmax or use "
                         "loss='mse'")
    return loss


def check_metrics(metrics: Any, loss: str, last_op: Any) -> tuple[str, ...]:
    out = []
    for m in metrics or ():
        name = _ALIASES.get(m, m) if isinstance(m, str) else m
        if name not in METRICS:
            raise ModelError(f"unknown metric {m!r}; choose from {list(METRICS)}")
        if name in ("accuracy", "crossentropy") and len(last_op.output_shape) < 2:
            raise ModelError(f"metric {m!r} needs an output with a class dim, got "
                             f"{last_op.output_shape}")
        out.append(name)
    return tuple(out)


def metric_sums(metrics: tuple[str, ...], y: np.ndarray, target: np.ndarray,
                sparse: bool, features: int) -> dict[str, float]:
    """Per-metric sums over the samples of an output tile ``y``: accuracy and
    cross-entropy need whole rows; mse/mae add the tile's share of each
    sample's mean over its ``features`` (all of the output's, not the tile's)."""
    out: dict[str, float] = {}
    pos = int(np.prod(y.shape[1:-1], dtype=np.int64))  # positions per sample (sequences)
    for m in metrics:
        if m == "accuracy":
            lab = target.reshape(-1) if sparse else target.argmax(axis=-1).reshape(-1)
            out[m] = float((y.argmax(axis=-1).reshape(-1) == lab).sum()) / pos
        elif m == "crossentropy":
            tiny = np.finfo(y.dtype).tiny
            if sparse:
                y2 = y.reshape(-1, y.shape[-1])
                p = y2[np.arange(y2.shape[0]), target.reshape(-1).astype(np.int64)]
                out[m] = float(-np.log(np.maximum(p, tiny)).sum()) / pos
            else:
                out[m] = float(-(target * np.log(np.maximum(y, tiny))).sum()) / pos
        else:
            d = y - _dense(target, y, sparse)
            per = (d * d) if m == "mse" else np.abs(d)
            out[m] = float(per.sum()) / features
    return out


def _dense(target: np.ndarray, y: np.ndarray, sparse: bool) -> np.ndarray:
    if not sparse:
        return target.reshape(y.shape)
    oh = np.zeros(y.shape, y.dtype)
    oh[np.arange(y.shape[0]), target.reshape(-1).astype(np.int64)] = 1
    return oh
