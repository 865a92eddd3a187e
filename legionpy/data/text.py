"""A real text corpus that ships with Python: standard-library docstrings.

:func:`docstring_corpus` joins ``inspect.getdoc`` of a fixed list of stdlib
modules and their public members (deterministic: sorted names; the text
depends only on the Python version). Text is lower-cased and encoded over
:data:`CHARS` (id 0 = any other character), a 32-symbol vocabulary.

- :func:`char_lm`: next-character windows ``(inputs, targets)`` (RNNLM);
- :func:`module_classes`: which module a window comes from (RNNTC), the
  first ``num_classes`` modules of :data:`MODULES`.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import numpy as np

__all__ = ["CHARS", "MODULES", "docstring_corpus", "encode", "char_lm", "module_classes"]

#: id 0 is "other"; ids 1..31 these characters.
CHARS = " abcdefghijklmnopqrstuvwxyz.,()\n"[:31]
MODULES = ("json", "re", "collections", "functools", "itertools", "textwrap", "argparse",
           "string", "random", "os")
_INDEX = {c: i + 1 for i, c in enumerate(CHARS)}


@functools.cache
def docstring_corpus(module: str | None = None) -> str:
    """Docstrings of ``module`` (or of all :data:`MODULES`) and its public members."""
    parts = []
    for name in ([module] if module else MODULES):
        mod = importlib.import_module(name)
        parts.append(inspect.getdoc(mod) or "")
        for attr in sorted(a for a in dir(mod) if not a.startswith("_")):
            doc = inspect.getdoc(getattr(mod, attr, None))
            if doc and getattr(getattr(mod, attr), "__module__", name) in (name, None):
                parts.append(doc)
    return "\n".join(parts)


def encode(text: str) -> np.ndarray:
    """Characters -> int64 ids over :data:`CHARS` (0 = other)."""
    return np.array([_INDEX.get(c, 0) for c in text.lower()], np.int64)


def _windows(ids: np.ndarray, n: int, width: int, rng: np.random.Generator) -> np.ndarray:
    start = rng.integers(0, len(ids) - width, n)
    return ids[start[:, None] + np.arange(width)]


def char_lm(n: int, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs (n, steps), targets (n, steps))``: next-character prediction."""
    ids = encode(docstring_corpus())
    w = _windows(ids, n, steps + 1, np.random.default_rng([seed, 5]))
    return w[:, :-1].copy(), w[:, 1:].copy()


def module_classes(n: int, steps: int, num_classes: int = 2, seed: int = 0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(chars (n, steps), y (n,))``: which of the first ``num_classes``
    modules' docstrings a window of text was taken from."""
    rng = np.random.default_rng([seed, 6])
    y = rng.integers(0, num_classes, n)
    x = np.empty((n, steps), np.int64)
    for c in range(num_classes):
        ids = encode(docstring_corpus(MODULES[c % len(MODULES)]))
        sel = np.flatnonzero(y == c)
        x[sel] = _windows(ids, len(sel), steps, rng)
    return x, y.astype(np.int64)
