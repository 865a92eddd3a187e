"""One training step of every committed export (tests/data, written by
tests/data/make_onnx.py) gives torch's gradients, without torch: each
``NAME.npz`` holds torch's float64 gradients of the MSE to a stored target
(train mode: batch norm on batch statistics, dropout off) and each
parameter's initial value. legionpy's gradient is recovered from one SGD
step as ``(before - after) / lr`` (``lr`` large, so the float32 difference
keeps its digits: the bench's method), each legionpy parameter matched to
the torch parameter with the same initial values (transposed for dense
weights, the leading rows of a position table the sequence uses, BERT's
token-type row 0 broadcast into a bias over the sequence; tied weights
summed over their uses), and compared within 1e-4 of each
parameter's largest gradient (floored at 1e-3 of the model's largest:
gradients that vanish in exact arithmetic are rounding noise)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import legionpy as lp
from legionpy.frontends import from_onnx
from legionpy.optimizer import Machine

pytest.importorskip("onnx")
DATA = os.path.join(os.path.dirname(__file__), "..", "data")
CASES = [("resnet", "dynamo"), ("resnet", "legacy"), ("mobilenet", "dynamo"),
         ("mobilenet", "legacy"), ("gpt2", "dynamo"), ("bert", "dynamo"), ("bert", "legacy"),
         ("vit", "dynamo"), ("vit", "legacy"), ("convnext", "dynamo"), ("convnext", "legacy")]
LR = 1e4


def reference(name):
    d = np.load(os.path.join(DATA, f"{name}.npz"))
    xs = [d["x"]] + ([d["mask"]] if "mask" in d else [])
    params = {k[6:]: d[k] for k in d.files if k.startswith("param.")}
    grads = {k[5:]: d[k] for k in d.files if k.startswith("grad.")}
    return xs, d["target"], params, grads


def lead(a: np.ndarray) -> np.ndarray:
    """``a`` without leading size-1 dims (a (1, 1, D) class token is (D,))."""
    while a.ndim > 1 and a.shape[0] == 1:
        a = a[0]
    return a


def match(value: np.ndarray, params: dict):
    """How legionpy's parameter ``value`` holds torch's: a list of (torch
    name, form), form ``"same"`` (maybe reshaped), ``"T"`` (transposed),
    ``("rows", n)`` (its first n rows), ``"row0"`` (its first row,
    broadcast over the sequence, alone or added to the positions: BERT's
    token type), or None."""
    v = lead(value)
    for tn, t in params.items():
        if lead(t).shape == v.shape and np.array_equal(lead(t), v):
            return [(tn, "same")]
    for tn, t in params.items():
        if t.ndim == 2 and t.T.shape == value.shape and np.array_equal(t.T, value):
            return [(tn, "T")]
    for tn, t in params.items():  # one row broadcast over the sequence (BERT's token type)
        if t.ndim == 2 and v.ndim == 2 and v.shape[1:] == t.shape[1:] and v.shape[0] > 1 and \
                np.array_equal(v, np.broadcast_to(t[0], v.shape)):
            return [(tn, "row0")]
    for tn, t in params.items():
        t = lead(t)
        if v.ndim == t.ndim and v.shape[1:] == t.shape[1:] and v.shape[0] < t.shape[0]:
            if np.array_equal(t[:v.shape[0]], v):
                return [(tn, ("rows", v.shape[0]))]
            for tn2, t2 in params.items():  # positions + token type row 0, folded
                if tn2 != tn and t2.ndim == 2 and t2.shape[1:] == v.shape[1:] and \
                        np.allclose(t[:v.shape[0]] + t2[0], v, rtol=0, atol=1e-7):
                    return [(tn, ("rows", v.shape[0])), (tn2, "row0")]
    return None


def step_gradients(name, how, xs, target, params):
    """torch name -> legionpy's gradient (summed over tied uses)."""
    m = from_onnx(os.path.join(DATA, f"{name}_{how}.onnx"), batch_size=len(xs[0]))
    m.compile(optimizer=lp.nn.SGD(lr=LR), loss="mse", machine=Machine.local(1))
    before = m.parameters()
    m.fit(xs if len(xs) > 1 else xs[0], target, epochs=1, verbose=0, shuffle=False)
    after = m.parameters()
    got, unmatched = {}, []
    for pn, v in before.items():
        forms = match(v, params)
        if forms is None:
            unmatched.append(pn)
            continue
        g = (v.astype(np.float64) - after[pn]) / LR
        for tn, form in forms:
            shape = params[tn].shape
            if form == "T":
                gt = g.T
            elif form == "row0":
                gt = np.zeros(shape)
                gt[0] = lead(g).sum(0)
            elif form != "same":
                gt = np.zeros(shape)
                gt[:form[1]] = lead(g)
            else:
                gt = g
            got[tn] = got.get(tn, 0) + gt.reshape(shape)
    return got, unmatched


@pytest.mark.parametrize("name,how", CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_one_step_gives_torchs_gradients(name, how, rt1):
    xs, target, params, grads = reference(name)
    got, unmatched = step_gradients(name, how, xs, target, params)
    assert not unmatched, f"legionpy parameters with no torch counterpart: {unmatched}"
    missing = set(params) - set(got)
    assert not missing, f"torch parameters legionpy does not train: {sorted(missing)}"
    floor = 1e-3 * max(float(np.abs(grads[tn]).max()) for tn in got)
    for tn, g in got.items():
        scale = max(float(np.abs(grads[tn]).max()), floor)
        err = float(np.abs(g - grads[tn]).max()) / scale
        assert err < 1e-4, f"{tn}: relative error {err:.2e}"
