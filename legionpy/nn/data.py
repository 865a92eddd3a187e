"""Data loading: fixed-size batches, sharded along the sample dimension.

:class:`DataLoader` yields ``(xs, y)`` batches of exactly the model's batch
size (shuffled per epoch from ``(seed, epoch)``; the last partial batch is
dropped in training, padded in evaluation). :func:`shard` cuts a host batch
into the sample ranges of an input operator's tiles, ``{sample offset:
array}``; the forward task ``F(input, k)`` on ``config.devices[k]`` receives
the shards by value and copies in exactly its own, so each device loads only
its part of the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..geometry import Rect

__all__ = ["DataLoader", "shard"]


def shard(batch: np.ndarray, tiles: Sequence[Rect]) -> dict[int, np.ndarray]:
    """``{lo: batch[lo:hi]}`` for the sample range of every tile (deduplicated)."""
    return {t.lo[0]: batch[t.lo[0]:t.hi[0]] for t in tiles}


class DataLoader:
    """Batches of ``batch_size`` samples of ``xs`` (a list of arrays, one per
    model input) and ``y`` (or None)."""

    def __init__(self, xs: list[np.ndarray], y: np.ndarray | None, batch_size: int,
                 shuffle: bool = False, seed: int = 0, pad: bool = False) -> None:
        self.xs, self.y = xs, y
        self.n = len(xs[0])
        self.batch_size, self.shuffle, self.seed, self.pad = batch_size, shuffle, seed, pad
        self.epoch = 0
        self.skip = 0  # batches of the next epoch to skip (resuming mid-epoch)

    def __len__(self) -> int:
        b = self.batch_size
        return -(-self.n // b) if self.pad else self.n // b

    def __iter__(self) -> Iterator[tuple[list[np.ndarray], Any, int]]:
        """Yields ``(xs batch, y batch or None, number of real samples)``."""
        order = np.arange(self.n)
        if self.shuffle:
            np.random.default_rng([self.seed, self.epoch]).shuffle(order)
        self.epoch += 1
        b = self.batch_size
        first, self.skip = self.skip, 0
        for s in range(first, len(self)):
            idx = order[s * b:(s + 1) * b]
            real = len(idx)
            if real < b:
                idx = np.concatenate([idx, np.repeat(idx[-1:], b - real)])
            yield ([x[idx] for x in self.xs], None if self.y is None else self.y[idx], real)
