"""The optimizer on one flat chunk of a bucket (collective sync,
legionpy/nn/execution.py ``chunk_update``): dense runs updated in place as
views, embedding segments only where their gradient is nonzero -- the same
result as gathering every kept element of the chunk, which it replaces."""

from __future__ import annotations

import numpy as np
import pytest

from legionpy.nn import SGD, Adam
from legionpy.nn.execution import chunk_update


def gathered(opt, w, g, state, step, segs):
    """The former formulation: every dense element and every nonzero
    gradient of a segment, gathered, updated and scattered back."""
    keep = np.zeros(w.shape, bool)
    for lo, hi in segs:
        keep[lo:hi] = True
    idx = np.flatnonzero(~keep | (g != 0))
    ws, gs = w[idx], g[idx]
    st = {f: a[idx] for f, a in state.items()}
    opt.update(ws, gs, st, step)
    w[idx] = ws
    g[...] = 0
    for f, a in st.items():
        state[f][idx] = a


@pytest.mark.parametrize("segs", [[], [(0, 8)], [(10, 20)], [(30, 40), (5, 9)], [(0, 40)]])
@pytest.mark.parametrize("make", [lambda: Adam(lr=0.01), lambda: SGD(lr=0.1, momentum=0.9)])
def test_chunk_update_matches_gathering_the_kept_elements(segs, make):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(40).astype(np.float32)
    g0 = rng.standard_normal(40).astype(np.float32)
    for lo, hi in segs:  # an embedding's untouched rows: zero gradients
        g0[lo:hi][::2] = 0
    results = []
    for fn in (chunk_update, gathered):
        opt = make()
        w, g = w0.copy(), g0.copy()
        state = {f: np.full(40, 0.5, np.float32) for f in opt.fields}
        for step in (1, 2):
            gg = g0.copy() if step == 2 else g
            g[...] = gg
            fn(opt, w, g, state, step, segs)
            assert not g.any()  # every gradient consumed
        results.append((w, state))
    (wa, sa), (wb, sb) = results
    np.testing.assert_allclose(wa, wb, rtol=1e-6)
    for f in sa:
        np.testing.assert_allclose(sa[f], sb[f], rtol=1e-6)
    for lo, hi in segs:  # untouched embedding elements keep weight and state
        np.testing.assert_array_equal(wa[lo:hi][::2], w0[lo:hi][::2])
