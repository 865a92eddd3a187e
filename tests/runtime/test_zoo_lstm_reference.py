"""The unrolled LSTM (one ``lstm`` cell op per time step, weights shared by
the steps of a layer) through the whole nn path equals ``torch.nn.LSTM``:
forward outputs, and after one SGD step the parameters, so the gradients
through time (summed over steps by the weight-gradient reductions) agree.
Op-level cell checks are in tests/unit/test_ops_exec_layers.py."""

from __future__ import annotations

import numpy as np
import pytest

import legionpy as lp
import legionpy.runtime as lr

torch = pytest.importorskip("torch")

N, T, I, H, LAYERS, LR = 4, 5, 3, 6, 2, 0.5


def unrolled(m: lp.nn.Model):
    x = m.input((T, I), name="x")
    state, first, hs = [None] * LAYERS, [None] * LAYERS, []
    for t in range(T):
        inp = x.select(1, t)
        for layer in range(LAYERS):
            s = m.lstm(inp, state[layer], H, share=first[layer], name=f"l{layer}.t{t}")
            first[layer] = first[layer] or s
            state[layer] = s
            inp = s.h
        hs.append(state[-1].h)
    return m.reshape(m.concat(hs, axis=1, name="steps"), (T, H), name="seq")


@pytest.mark.parametrize("strategy", ["data", "model"])
def test_unrolled_lstm_matches_torch(strategy):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, T, I)).astype(np.float32)
    target = rng.standard_normal((N, T, H)).astype(np.float32)
    lr.init(cpus=2)
    try:
        m = lp.nn.Model(batch_size=N, seed=4)
        unrolled(m)
        m.compile(optimizer=lp.nn.SGD(lr=LR), loss="mse", strategy=strategy)
        p0 = m.parameters()
        y = m.predict(x)
        m.fit(x, target, verbose=0)
        p1 = m.parameters()
    finally:
        lr.shutdown()

    ref = torch.nn.LSTM(I, H, LAYERS, batch_first=True)
    with torch.no_grad():
        for layer in range(LAYERS):
            name = f"l{layer}.t0"
            getattr(ref, f"weight_ih_l{layer}").copy_(torch.tensor(
                p0[f"{name}.w_ih"].reshape(4 * H, -1)))
            getattr(ref, f"weight_hh_l{layer}").copy_(torch.tensor(
                p0[f"{name}.w_hh"].reshape(4 * H, H)))
            getattr(ref, f"bias_ih_l{layer}").copy_(torch.tensor(p0[f"{name}.bias"].reshape(-1)))
            getattr(ref, f"bias_hh_l{layer}").zero_()
    out, _ = ref(torch.tensor(x))
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=1e-4, atol=1e-5)
    loss = torch.nn.functional.mse_loss(out, torch.tensor(target))
    loss.backward()
    for layer in range(LAYERS):
        name = f"l{layer}.t0"
        for ours, theirs, shape in (("w_ih", "weight_ih", (4 * H, -1)),
                                    ("w_hh", "weight_hh", (4 * H, H)), ("bias", "bias_ih", -1)):
            grad = getattr(ref, f"{theirs}_l{layer}").grad.numpy()  # = bias_hh's grad
            want = p0[f"{name}.{ours}"].reshape(shape) - LR * grad
            np.testing.assert_allclose(p1[f"{name}.{ours}"].reshape(shape), want, rtol=1e-4,
                                       atol=1e-6, err_msg=f"{name}.{ours}")
