"""Data for the model zoo, generated or read locally (nothing is downloaded).

- :mod:`legionpy.data.synthetic`: seeded generators with learnable structure
  (so a training loss must fall): images whose class is a colour pattern,
  token sequences whose class shows in their token mix, Markov-chain text for
  next-token prediction, and a reverse-the-sequence translation task.
- :mod:`legionpy.data.text`: a real text corpus, the docstrings of standard
  library modules (``inspect.getdoc``), as characters over a 32-symbol vocab,
  for language modelling and which-module-is-this classification.
- :func:`for_model`: ``(inputs, targets)`` arrays that fit a zoo model.

>>> from legionpy import data, models
>>> m = models.rnnlm(batch_size=4, scale="small")
>>> xs, y = data.for_model(m, 8)
>>> xs[0].shape, y.shape
((8, 8), (8, 8))
"""

from __future__ import annotations

from .synthetic import for_model, images, markov_lm, reverse_pairs, token_classes
from .text import CHARS, char_lm, docstring_corpus, encode, module_classes

__all__ = ["for_model", "images", "markov_lm", "reverse_pairs", "token_classes", "CHARS",
           "char_lm", "docstring_corpus", "encode", "module_classes"]
