"""Per-kernel CPU times of legionpy's kernels vs PyTorch (same thread count).

Shapes: an AlexNet-like CNN on 3x64x64 images, batch 32 (five 5x5/3x3 convs
with stride 1, three 2x2 max pools, three dense layers; about 62 GFLOP
forward), and a 2-layer LSTM (hidden 256, input 256, 20 steps, batch 32).
Also compares numpy's strided im2col copy with a numba one.

    python bench/kernels.py [--threads 1] [--repeat 3] [--skip-numba]

Prints milliseconds per call and the ratio ours / torch (< 1: we are faster).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from legionpy.ops import kernels as K

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is optional
    torch = None

BATCH = 32
# name, (C_in, H, W), C_out, kernel, padding, pool-after
CONVS = [
    ("conv1", (3, 64, 64), 64, 5, 2, True),
    ("conv2", (64, 32, 32), 192, 5, 2, True),
    ("conv3", (192, 16, 16), 384, 3, 1, False),
    ("conv4", (384, 16, 16), 256, 3, 1, False),
    ("conv5", (256, 16, 16), 256, 3, 1, True),
]
DENSES = [("fc6", 256 * 8 * 8, 4096, "relu"), ("fc7", 4096, 4096, "relu"), ("fc8", 4096, 10, None)]


def timeit(fn: Callable[[], Any], repeat: int) -> float:
    """Best of ``repeat`` runs after one warm-up, in milliseconds."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def row(name: str, ours: float, ref: float | None) -> None:
    if ref is None:
        print(f"{name:<22}{ours:10.2f} ms")
    else:
        print(f"{name:<22}{ours:10.2f} ms   torch {ref:10.2f} ms   ratio {ours / ref:5.2f}")


def conv_layer(rng, c, h, w, o, k, p, first, repeat):
    """(ours fwd, ours bwd, torch fwd, torch bwd, output) of conv + relu."""
    x = rng.standard_normal((BATCH, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((o, c, k, k), dtype=np.float32) * np.float32(0.05)
    b = np.zeros(o, np.float32)
    y = K.conv2d_forward(x, wt, b, 1, p, activation="relu")
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    f = timeit(lambda: K.conv2d_forward(x, wt, b, 1, p, activation="relu"), repeat)
    bw = timeit(
        lambda: K.conv2d_backward(
            dy, x, wt, 1, p, need_input_grad=not first, activation="relu", y=y
        ),
        repeat,
    )
    if torch is None:
        return f, bw, None, None, y
    xt = torch.tensor(x, requires_grad=not first)
    wtt, bt = torch.tensor(wt, requires_grad=True), torch.tensor(b, requires_grad=True)
    yt = torch.relu(F.conv2d(xt, wtt, bt, padding=p))
    dyt = torch.tensor(dy)
    tf = timeit(lambda: torch.relu(F.conv2d(xt, wtt, bt, padding=p)), repeat)
    tb = timeit(lambda: yt.backward(dyt, retain_graph=True), repeat)
    return f, bw, tf, tb, y


def pool_layer(y, repeat):
    """(ours, torch | None) of a 2x2 max pool forward + backward."""
    py = K.pool2d_forward(y, 2, 2, 0, "max")
    pdy = np.ones_like(py)
    ours = timeit(lambda: K.pool2d_forward(y, 2, 2, 0, "max"), repeat) + timeit(
        lambda: K.pool2d_backward(pdy, y, py, 2, 2, 0, "max"), repeat
    )
    if torch is None:
        return ours, None
    yt = torch.tensor(y, requires_grad=True)
    pyt = F.max_pool2d(yt, 2)
    pdyt = torch.tensor(pdy)
    ref = timeit(lambda: F.max_pool2d(yt, 2), repeat) + timeit(
        lambda: pyt.backward(pdyt, retain_graph=True), repeat
    )
    return ours, ref


def dense_layer(rng, n_in, n_out, act, repeat):
    """(ours, torch | None) of a dense layer forward + backward."""
    x = rng.standard_normal((BATCH, n_in), dtype=np.float32)
    wt = rng.standard_normal((n_in, n_out), dtype=np.float32) * np.float32(0.01)
    b = np.zeros(n_out, np.float32)
    y = K.dense_forward(x, wt, b, act)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    ours = timeit(lambda: K.dense_forward(x, wt, b, act), repeat) + timeit(
        lambda: K.dense_backward(dy, x, wt, activation=act, y=y), repeat
    )
    if torch is None:
        return ours, None
    xt = torch.tensor(x, requires_grad=True)
    wtt = torch.tensor(wt.T.copy(), requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)

    def fwd():
        z = F.linear(xt, wtt, bt)
        return torch.relu(z) if act else z

    yt, dyt = fwd(), torch.tensor(dy)
    return ours, timeit(fwd, repeat) + timeit(lambda: yt.backward(dyt, retain_graph=True), repeat)


def bench_cnn(repeat: int) -> tuple[float, float | None]:
    rng = np.random.default_rng(0)
    total, total_t = 0.0, 0.0
    print(f"-- AlexNet-like CNN, batch {BATCH}, 3x64x64 (forward + backward per layer)")
    for name, (c, h, w), o, k, p, pool in CONVS:
        f, bw, tf, tb, y = conv_layer(rng, c, h, w, o, k, p, name == "conv1", repeat)
        row(f"{name} fwd", f, tf)
        row(f"{name} bwd", bw, tb)
        total += f + bw
        total_t += (tf or 0.0) + (tb or 0.0)
        if pool:
            ours, ref = pool_layer(y, repeat)
            row(f"pool after {name}", ours, ref)
            total += ours
            total_t += ref or 0.0
    for name, n_in, n_out, act in DENSES:
        ours, ref = dense_layer(rng, n_in, n_out, act, repeat)
        row(f"{name} fwd+bwd", ours, ref)
        total += ours
        total_t += ref or 0.0
    logits = rng.standard_normal((BATCH, 10), dtype=np.float32)
    labels = rng.integers(0, 10, BATCH)
    total += timeit(lambda: K.sparse_cross_entropy(logits, labels), repeat)
    ref_total = total_t if torch is not None else None
    row("CNN step (sum)", total, ref_total)
    return total, ref_total


def bench_lstm(repeat: int, hidden: int = 256, steps: int = 20, layers: int = 2) -> None:
    rng = np.random.default_rng(1)
    print(f"-- LSTM {layers} layers, hidden {hidden}, {steps} steps, batch {BATCH}")
    xs = rng.standard_normal((steps, BATCH, hidden), dtype=np.float32)
    params = [
        (
            (rng.standard_normal((2 * hidden, 4 * hidden), dtype=np.float32) * 0.05),
            np.zeros(4 * hidden, np.float32),
        )
        for _ in range(layers)
    ]
    zeros = np.zeros((BATCH, hidden), np.float32)
    dout = rng.standard_normal((steps, BATCH, hidden), dtype=np.float32)

    def step() -> None:
        inp, caches = xs, []
        for w, b in params:
            inp, _, _, cache = K.lstm_layer_forward(inp, zeros, zeros, w, b)
            caches.append(cache)
        d = dout
        for layer in range(layers - 1, -1, -1):
            w, cache = params[layer][0], caches[layer]
            # like torch here: no gradient for the input sequence itself
            d = K.lstm_layer_backward(d, None, None, cache, w, need_input_grad=layer > 0)[0]

    ours = timeit(step, repeat)
    ref = None
    if torch is not None:
        net = torch.nn.LSTM(hidden, hidden, num_layers=layers)
        xt, dt = torch.tensor(xs), torch.tensor(dout)

        def tstep() -> None:
            out, _ = net(xt)
            out.backward(dt)

        ref = timeit(tstep, repeat)
    row("LSTM step fwd+bwd", ours, ref)


def im2col_case(im2col_numba, shape, k, repeat):
    x = np.random.default_rng(2).standard_normal(shape, dtype=np.float32)
    p = k // 2
    xpad = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    n, c, h, w = shape
    out = np.empty((n, c, k, k, h, w), np.float32)
    im2col_numba(xpad, k, k, h, w, out)
    t_np = timeit(lambda: K.im2col(x, k, 1, p), repeat)
    t_nb = timeit(lambda: im2col_numba(xpad, k, k, h, w, out), repeat)
    np.testing.assert_array_equal(out.reshape(n, 1, -1, h * w), K.im2col(x, k, 1, p)[0])
    print(f"{str(shape) + f' k{k}':<28} numpy {t_np:8.2f} ms   numba {t_nb:8.2f} ms")


def bench_im2col(repeat: int) -> None:
    """numpy strided copy vs a numba loop for the im2col of conv2 (and 32x64x56x56)."""
    try:
        import numba
    except ImportError:
        print("numba not importable: skipped")
        return

    @numba.njit(parallel=True, cache=False)
    def im2col_numba(xpad, kh, kw, ho, wo, out):  # out (N, C, kh, kw, ho, wo)
        n, c = xpad.shape[0], xpad.shape[1]
        for b in numba.prange(n * c):
            i, j = b // c, b % c
            for p in range(kh):
                for q in range(kw):
                    out[i, j, p, q] = xpad[i, j, p : p + ho, q : q + wo]
        return out

    print("-- im2col copy (stride 1): numpy strided view vs numba")
    for shape, k in (((BATCH, 64, 32, 32), 5), ((32, 64, 56, 56), 3)):
        im2col_case(im2col_numba, shape, k, repeat)
    # the REFERENCE figure: 32x64x56x56, 64 3x3 filters, numpy im2col conv 229 ms
    x = np.random.default_rng(3).standard_normal((32, 64, 56, 56), dtype=np.float32)
    w = np.random.default_rng(4).standard_normal((64, 64, 3, 3), dtype=np.float32)
    t = timeit(lambda: K.conv2d_forward(x, w, None, 1, 1), repeat)
    ref = None
    if torch is not None:
        xt, wt = torch.tensor(x), torch.tensor(w)
        ref = timeit(lambda: F.conv2d(xt, wt, padding=1), repeat)
    row("conv 32x64x56x56 3x3", t, ref)
    print("   (REFERENCE.md: numpy im2col conv 229 ms on the reference machine)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-numba", action="store_true")
    args = ap.parse_args()
    if torch is not None:
        torch.set_num_threads(args.threads)
    print(f"threads={args.threads} torch={'yes' if torch is not None else 'no'}")
    with threadpool_limits(args.threads):
        bench_cnn(args.repeat)
        bench_lstm(args.repeat)
        if not args.skip_numba:
            bench_im2col(args.repeat)


if __name__ == "__main__":
    main()
