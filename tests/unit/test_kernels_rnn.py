"""LSTM cell (through time) and Luong attention: finite differences in float64
and torch autograd (nn.LSTM) where importable."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_refs import needs_torch, num_grad, torch

from legionpy.ops import kernels as K


def sig(z):
    return 1 / (1 + np.exp(-z))


def lstm_ref(xs, h, c, w, b):
    """Plain unrolled LSTM (gate order i, f, g, o)."""
    hid = h.shape[1]
    hs = []
    for x in xs:
        z = np.concatenate([x, h], 1) @ w + b
        i, f, g, o = (
            sig(z[:, :hid]),
            sig(z[:, hid : 2 * hid]),
            np.tanh(z[:, 2 * hid : 3 * hid]),
            sig(z[:, 3 * hid :]),
        )
        c = f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs), h, c


def test_lstm_through_time_finite_differences():
    rng = np.random.default_rng(0)
    t_, n, i_, h_ = 4, 2, 3, 2
    xs = rng.standard_normal((t_, n, i_))
    h0, c0 = rng.standard_normal((n, h_)), rng.standard_normal((n, h_))
    w, b = rng.standard_normal((i_ + h_, 4 * h_)) * 0.5, rng.standard_normal(4 * h_) * 0.5
    dhs, dht, dct = (rng.standard_normal(s) for s in ((t_, n, h_), (n, h_), (n, h_)))
    hs, ht, ct, caches = K.lstm_layer_forward(xs, h0, c0, w, b)
    hs_r, ht_r, ct_r = lstm_ref(xs, h0, c0, w, b)
    np.testing.assert_allclose(hs, hs_r, rtol=1e-12)
    np.testing.assert_allclose(ct, ct_r, rtol=1e-12)

    def loss():
        a, bb, cc = lstm_ref(xs, h0, c0, w, b)
        return float((a * dhs).sum() + (bb * dht).sum() + (cc * dct).sum())

    grads = K.lstm_layer_backward(dhs, dht, dct, caches, w)
    for arr, g in zip((xs, h0, c0, w, b), grads):
        np.testing.assert_allclose(g, num_grad(loss, arr), rtol=1e-5, atol=1e-7)


def test_lstm_cells_unrolled_equal_layer():
    """The per-step cell (one task per step) and the fused layer agree, forward
    and backward, with dW of the layer = sum over steps of the cells' dW."""
    rng = np.random.default_rng(5)
    t_, n, i_, h_ = 6, 3, 4, 5
    xs = rng.standard_normal((t_, n, i_)).astype(np.float32)
    h0, c0 = rng.standard_normal((2, n, h_)).astype(np.float32)
    w = (rng.standard_normal((i_ + h_, 4 * h_)) * 0.4).astype(np.float32)
    b = (rng.standard_normal(4 * h_) * 0.4).astype(np.float32)
    dhs = rng.standard_normal((t_, n, h_)).astype(np.float32)
    hs, ht, ct, cache = K.lstm_layer_forward(xs, h0, c0, w, b)
    h, c, caches = h0, c0, []
    for t in range(t_):
        h, c, cc = K.lstm_cell_forward(xs[t], h, c, w, b)
        np.testing.assert_allclose(h, hs[t], rtol=1e-5, atol=1e-6)
        caches.append(cc)
    dxs, dh0, dc0, dw, db = K.lstm_layer_backward(dhs, None, None, cache, w)
    dh, dc = None, None
    dw_sum, db_sum = np.zeros_like(w), np.zeros_like(b)
    for t in range(t_ - 1, -1, -1):
        dh = dhs[t] if dh is None else dh + dhs[t]
        dx, dh, dc, dwt, dbt = K.lstm_cell_backward(dh, dc, caches[t], w)
        np.testing.assert_allclose(dx, dxs[t], rtol=1e-4, atol=1e-5)
        dw_sum += dwt
        db_sum += dbt
    np.testing.assert_allclose(dh, dh0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dc, dc0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw_sum, dw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(db_sum, db, rtol=1e-4, atol=1e-5)
    # no incoming gradient at all: zeros, not garbage
    zero = K.lstm_layer_backward(None, None, None, cache, w)
    assert all(np.all(g == 0) for g in zero)
    assert K.lstm_layer_backward(dhs, None, None, cache, w, need_input_grad=False)[0] is None


def test_lstm_cell_rejects_bad_weight():
    with pytest.raises(ValueError, match="expected"):
        K.lstm_cell_forward(
            np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((6, 16)), np.zeros(16)
        )


@needs_torch
def test_lstm_two_layers_against_torch():
    torch.manual_seed(0)
    t_, n, i_, h_ = 5, 3, 7, 6
    net = torch.nn.LSTM(i_, h_, num_layers=2)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((t_, n, i_)).astype(np.float32)
    h0 = rng.standard_normal((2, n, h_)).astype(np.float32)
    c0 = rng.standard_normal((2, n, h_)).astype(np.float32)
    dout = rng.standard_normal((t_, n, h_)).astype(np.float32)
    dhn = rng.standard_normal((2, n, h_)).astype(np.float32)
    xt, h0t, c0t = (torch.tensor(a, requires_grad=True) for a in (xs, h0, c0))
    out, (hn, cn) = net(xt, (h0t, c0t))
    (out * torch.tensor(dout)).sum().add((hn * torch.tensor(dhn)).sum()).backward()

    params = []
    for layer in range(2):
        w, b = K.lstm_weights_from_torch(
            *(
                getattr(net, f"{k}_l{layer}").detach().numpy()
                for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            )
        )
        params.append((w, b))
    inp, caches, finals = xs, [], []
    for layer, (w, b) in enumerate(params):
        hs, ht, ct, cache = K.lstm_layer_forward(inp, h0[layer], c0[layer], w, b)
        caches.append(cache)
        finals.append((ht, ct))
        inp = hs
    np.testing.assert_allclose(inp, out.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(finals[1][1], cn[1].detach().numpy(), rtol=1e-5, atol=1e-5)
    d_above = dout
    for layer in (1, 0):
        w, _ = params[layer]
        dxs, dh0, dc0, dw, db = K.lstm_layer_backward(d_above, dhn[layer], None, caches[layer], w)
        gw, gb = K.lstm_weights_from_torch(
            *(
                getattr(net, f"{k}_l{layer}").grad.numpy()
                for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            )
        )
        np.testing.assert_allclose(dw, gw, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(
            db, getattr(net, f"bias_ih_l{layer}").grad.numpy(), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(dh0, h0t.grad[layer].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dc0, c0t.grad[layer].numpy(), rtol=1e-4, atol=1e-5)
        d_above = dxs
    np.testing.assert_allclose(d_above, xt.grad.numpy(), rtol=1e-4, atol=1e-5)


def attention_ref(q, k, v, wa):
    u = q if wa is None else q @ wa
    s = np.einsum("nth,nh->nt", k, u)
    e = np.exp(s - s.max(1, keepdims=True))
    a = e / e.sum(1, keepdims=True)
    return np.einsum("nt,nth->nh", a, v), a


@pytest.mark.parametrize("general", [True, False])
def test_attention_finite_differences(general):
    rng = np.random.default_rng(2)
    n, t_, h_ = 2, 5, 3
    q, k, v = (
        rng.standard_normal((n, h_)),
        rng.standard_normal((n, t_, h_)),
        rng.standard_normal((n, t_, h_)),
    )
    wa = rng.standard_normal((h_, h_)) if general else None
    dctx, dwts = rng.standard_normal((n, h_)), rng.standard_normal((n, t_))
    ctx, wts, cache = K.attention_forward(q, k, v, wa)
    ctx_r, wts_r = attention_ref(q, k, v, wa)
    np.testing.assert_allclose(ctx, ctx_r, rtol=1e-12)
    np.testing.assert_allclose(wts, wts_r, rtol=1e-12)

    def loss():
        c, a = attention_ref(q, k, v, wa)
        return float((c * dctx).sum() + (a * dwts).sum())

    dq, dk, dv, dwa = K.attention_backward(dctx, q, k, v, cache, wa, dweights=dwts)
    arrays = [(q, dq), (k, dk), (v, dv)] + ([(wa, dwa)] if general else [])
    for arr, g in arrays:
        np.testing.assert_allclose(g, num_grad(loss, arr), rtol=1e-6, atol=1e-8)
    assert dwa is None or dwa.shape == wa.shape


def test_attention_mask_excludes_steps():
    rng = np.random.default_rng(3)
    q, kv = rng.standard_normal((2, 3)), rng.standard_normal((2, 4, 3))
    mask = np.array([[True, True, False, False], [True, True, True, True]])
    ctx, wts, _ = K.attention_forward(q, kv, kv, mask=mask)
    assert np.all(wts[0, 2:] == 0)
    np.testing.assert_allclose(ctx[0], attention_ref(q[:1], kv[:1, :2], kv[:1, :2], None)[0][0])


@needs_torch
def test_attention_against_torch():
    rng = np.random.default_rng(4)
    n, t_, h_ = 3, 6, 5
    q = rng.standard_normal((n, h_)).astype(np.float32)
    kv = rng.standard_normal((n, t_, h_)).astype(np.float32)
    wa = rng.standard_normal((h_, h_)).astype(np.float32)
    qt, kvt, wat = (torch.tensor(a, requires_grad=True) for a in (q, kv, wa))
    score = torch.einsum("nth,nh->nt", kvt, qt @ wat)
    a = torch.softmax(score, dim=1)
    ctx_t = torch.einsum("nt,nth->nh", a, kvt)
    dctx = rng.standard_normal((n, h_)).astype(np.float32)
    ctx_t.backward(torch.tensor(dctx))
    ctx, _, cache = K.attention_forward(q, kv, kv, wa)
    np.testing.assert_allclose(ctx, ctx_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    dq, dk, dv, dwa = K.attention_backward(dctx, q, kv, kv, cache, wa)
    np.testing.assert_allclose(dq, qt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dk + dv, kvt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dwa, wat.grad.numpy(), rtol=1e-4, atol=1e-5)
