"""Train a small MLP with the layer API on several CPU devices.

    python examples/mlp.py [--devices 2] [--strategy data|model|owt|FILE]

Points inside or outside a ring, a 3-layer MLP, SGD with momentum; prints the held-out
accuracy and writes a checkpoint and the strategy next to this file.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import legionpy as lp


def rings(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points in the square, class 1 inside the ring 0.4 < |x| < 0.8."""
    x = np.random.default_rng(seed).uniform(-1, 1, (n, 2)).astype(np.float32)
    r = np.hypot(x[:, 0], x[:, 1])
    return x, ((r > 0.4) & (r < 0.8)).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--strategy", default="data")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    lp.init(cpus=args.devices)

    model = lp.nn.Model(batch_size=64, seed=0)
    t = model.input((2,), name="x")
    t = model.dense(t, 64, activation="tanh", name="fc1")
    t = model.dense(t, 64, activation="tanh", name="fc2")
    t = model.dense(t, 2, name="fc3")
    model.softmax(t, name="softmax")
    model.compile(optimizer=lp.nn.SGD(lr=0.1, momentum=0.9), metrics=["accuracy"],
                  loss="sparse_categorical_crossentropy", strategy=args.strategy)

    x, y = rings(4096)
    model.fit(x[:3584], y[:3584], epochs=args.epochs, verbose=1)
    print("held-out:", model.evaluate(x[3584:], y[3584:]))
    here = os.path.dirname(os.path.abspath(__file__))
    model.save(os.path.join(here, "mlp_ckpt.npz"))
    model.strategy.save(os.path.join(here, "mlp_strategy.json"))


if __name__ == "__main__":
    main()
