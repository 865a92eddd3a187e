"""Shared by the kernel tests (tests/unit/test_kernels_*.py): torch when
importable, the ``needs_torch`` skip mark and plain numpy references."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - CI without torch
    torch = F = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not importable")


def num_grad(f, x, eps=1e-6):
    """Central finite differences of the scalar ``f()`` w.r.t. ``x`` (changed in place)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f()
        x[idx] = old - eps
        down = f()
        x[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g
