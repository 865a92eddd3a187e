"""Seeded synthetic tasks with learnable structure.

Every generator is a pure function of its arguments and ``seed`` (numpy's
``default_rng``), so every MPI rank builds the same arrays. Shapes exclude
nothing: ``n`` samples along axis 0, float32 images, int64 tokens.

- :func:`images`: class ``c`` is a coarse per-class colour pattern (a 4x4
  grid of +-1 per channel, upsampled) plus Gaussian noise; chance accuracy
  is ``1 / num_classes``, a small CNN separates them within tens of steps.
- :func:`token_classes`: class ``c`` draws 60 % of its tokens from its own
  slice of the vocabulary, the rest uniformly (RNNTC).
- :func:`markov_lm`: sequences from a sparse random Markov chain (each token
  has two likely successors); inputs ``seq[:-1]``, targets ``seq[1:]``, so
  the per-token loss falls from ``log(vocab)`` towards ``log(2)`` (RNNLM,
  Transformer).
- :func:`reverse_pairs`: translate = reverse a random sequence over tokens
  ``2..vocab-1``; decoder inputs are the targets shifted right after BOS = 1
  (teacher forcing, NMT).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["images", "token_classes", "markov_lm", "reverse_pairs", "for_model"]

BOS = 1


def images(n: int, shape: tuple[int, int, int], num_classes: int = 10, seed: int = 0,
           noise: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, C, H, W) float32, y (n,) int64)``: class patterns plus noise."""
    c, h, w = shape
    rng = np.random.default_rng([seed, 1])
    coarse = rng.choice([-1.0, 1.0], size=(num_classes, c, 4, 4))
    reps = (-(-h // 4), -(-w // 4))
    templates = np.kron(coarse, np.ones(reps))[:, :, :h, :w]
    y = rng.integers(0, num_classes, n)
    x = templates[y] + noise * rng.standard_normal((n, c, h, w))
    return x.astype(np.float32), y.astype(np.int64)


def token_classes(n: int, steps: int, vocab: int, num_classes: int = 2, seed: int = 0,
                  signal: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens (n, steps) int64, y (n,) int64)``: class ``c`` favours its
    own ``vocab // num_classes`` token ids."""
    rng = np.random.default_rng([seed, 2])
    y = rng.integers(0, num_classes, n)
    span = max(1, vocab // num_classes)
    own = y[:, None] * span + rng.integers(0, span, (n, steps))
    uniform = rng.integers(0, vocab, (n, steps))
    tok = np.where(rng.random((n, steps)) < signal, np.minimum(own, vocab - 1), uniform)
    return tok.astype(np.int64), y.astype(np.int64)


def markov_lm(n: int, steps: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs (n, steps), targets (n, steps))`` int64 from a sparse Markov chain."""
    rng = np.random.default_rng([seed, 3])
    succ = rng.integers(0, vocab, (vocab, 2))
    seq = np.empty((n, steps + 1), np.int64)
    seq[:, 0] = rng.integers(0, vocab, n)
    for t in range(steps):
        pick = rng.integers(0, 2, n)
        jump = rng.random(n) < 0.1
        nxt = succ[seq[:, t], pick]
        seq[:, t + 1] = np.where(jump, rng.integers(0, vocab, n), nxt)
    return seq[:, :-1].copy(), seq[:, 1:].copy()


def reverse_pairs(n: int, steps: int, vocab: int, seed: int = 0
                  ) -> tuple[list[np.ndarray], np.ndarray]:
    """``([src (n, steps), decoder input (n, steps)], target (n, steps))``."""
    rng = np.random.default_rng([seed, 4])
    src = rng.integers(2, vocab, (n, steps))
    tgt = src[:, ::-1].copy()
    dec = np.concatenate([np.full((n, 1), BOS), tgt[:, :-1]], axis=1)
    return [src.astype(np.int64), dec.astype(np.int64)], tgt.astype(np.int64)


def for_model(model: Any, n: int, seed: int = 0, text: bool = False
              ) -> tuple[list[np.ndarray], np.ndarray]:
    """``(inputs, targets)`` with ``n`` samples that fit zoo model ``model``
    (an ``nn.Model`` or graph from :mod:`legionpy.models`), chosen by the
    shapes of its input and output ops. ``text=True`` uses the docstring
    corpus (:mod:`legionpy.data.text`) for the recurrent models instead."""
    from . import text as T

    g = getattr(model, "graph", model)
    ins = [op for op in g.ops if op.kind == "input"]
    out = g.ops[-1].output_shape
    shape = ins[0].output_shape[1:]
    if ins[0].dtype == "float32":
        x, y = images(n, shape, out[-1], seed)
        return [x], y
    steps, vocab = shape[0], _vocab(g)
    if len(ins) == 2:
        return reverse_pairs(n, steps, vocab, seed)
    if len(out) == 2:
        if text:
            x, y = T.module_classes(n, steps, out[-1], seed)
            return [np.minimum(x, vocab - 1)], y
        x, y = token_classes(n, steps, vocab, out[-1], seed)
        return [x], y
    if text:
        x, y = T.char_lm(n, steps, seed)
        return [np.minimum(x, vocab - 1)], np.minimum(y, vocab - 1)
    x, y = markov_lm(n, steps, vocab, seed)
    return [x], y


def _vocab(g: Any) -> int:
    return min(op.attrs["vocab"] for op in g.ops if op.kind == "embedding")
