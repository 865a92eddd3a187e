"""Static vs adaptive placement with one artificially slowed device.

    python bench/adaptive.py [--devices 4] [--slow 4.0] [--steps 12]

An MLP (``--layers`` dense layers of ``--width`` units, batch ``--batch``)
trains data-parallel on ``--devices`` CPU devices; device ``devices - 1``
runs every tile ``--slow`` times slower (``legionpy.nn.execution.SLOW_DEVICES``,
the hook behind ``LEGIONPY_SLOW_DEVICES``). Three runs, each two epochs of
``--steps`` steps, the second epoch timed (after the adaptive mapper has
settled):

- ``unslowed``: the static data-parallel strategy, no slow device (the target);
- ``static``: the same strategy with the slow device;
- ``adaptive``: the same, with :class:`legionpy.mapper.AdaptiveMapper`
  moving tiles off the slow device between steps.

Prints samples/s of each, the fraction of the lost throughput the adaptive
mapper recovers ``(adaptive - static) / (unslowed - static)``, the moves and
whether the trained parameters equal the static run's. ``--json`` prints one
object instead.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import legionpy as lp
from legionpy.mapper import AdaptiveMapper
from legionpy.nn import execution


def build(batch: int, width: int, layers: int) -> lp.nn.Model:
    m = lp.nn.Model(batch_size=batch, seed=0)
    t = m.input((width,))
    for _ in range(layers):
        t = m.dense(t, width, activation="relu")
    m.softmax(m.dense(t, 8))
    return m


def run(args, slow: float, enabled: bool) -> dict:
    execution.SLOW_DEVICES.clear()
    if slow > 1:
        execution.SLOW_DEVICES[args.devices - 1] = slow
    lp.init(cpus=args.devices)
    mapper = AdaptiveMapper(high=args.high, low=args.low, patience=args.patience,
                            max_moves=args.max_moves, enabled=enabled)
    lp.runtime().set_mapper(mapper)
    m = build(args.batch, args.width, args.layers)
    m.compile(optimizer=lp.nn.SGD(lr=0.01), strategy="data")
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.standard_normal((n, args.width)).astype(np.float32)
    y = rng.integers(0, 8, n)
    hist = m.fit(x, y, epochs=2, verbose=0, shuffle=False)
    params = m.parameters()
    on_slow = sum(d == args.devices - 1 for c in m.strategy.values() for d in c.devices)
    lp.shutdown()
    execution.SLOW_DEVICES.clear()
    return {"samples_per_s": hist["samples_per_s"][-1], "moves": len(mapper.moves),
            "tiles_on_slow_device": on_slow, "params": params,
            "last_util": {str(d): round(u, 3) for d, u in mapper.history[-1]["util"].items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=min(4, os.cpu_count() or 2),
                   help="CPU devices (default: min(4, cores); more threads than cores blur "
                        "the slow-down)")
    p.add_argument("--slow", type=float, default=4.0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--high", type=float, default=0.7)
    p.add_argument("--low", type=float, default=0.5)
    p.add_argument("--patience", type=int, default=1)
    p.add_argument("--max-moves", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    base = run(args, 1.0, False)
    static = run(args, args.slow, False)
    adaptive = run(args, args.slow, True)
    same = all(np.allclose(static["params"][k], adaptive["params"][k], rtol=1e-5, atol=1e-6)
               for k in static["params"])
    lost = base["samples_per_s"] - static["samples_per_s"]
    rec = (adaptive["samples_per_s"] - static["samples_per_s"]) / lost if lost > 0 else 1.0
    out = {"devices": args.devices, "slow_factor": args.slow,
           "unslowed_samples_per_s": base["samples_per_s"],
           "static_samples_per_s": static["samples_per_s"],
           "adaptive_samples_per_s": adaptive["samples_per_s"],
           "recovered_fraction": rec, "moves": adaptive["moves"],
           "tiles_on_slow_device": {"static": static["tiles_on_slow_device"],
                                    "adaptive": adaptive["tiles_on_slow_device"]},
           "util_static": static["last_util"], "util_adaptive": adaptive["last_util"],
           "same_parameters": same}
    if args.json:
        print(json.dumps(out))
        return
    print(f"MLP {args.layers}x{args.width}, batch {args.batch}, {args.devices} CPU devices, "
          f"device {args.devices - 1} slowed {args.slow:g}x")
    print(f"  unslowed (data parallel)  {base['samples_per_s']:9.1f} samples/s")
    print(f"  static   (data parallel)  {static['samples_per_s']:9.1f} samples/s")
    print(f"  adaptive (AdaptiveMapper) {adaptive['samples_per_s']:9.1f} samples/s  "
          f"({adaptive['moves']} tile moves; tiles on the slow device "
          f"{static['tiles_on_slow_device']} -> {adaptive['tiles_on_slow_device']})")
    print(f"  recovered {rec * 100:.0f}% of the lost throughput "
          f"(adaptive/static {adaptive['samples_per_s'] / static['samples_per_s']:.2f}x); "
          f"parameters equal to the static run's: {same}")
    print(f"  last-step utilisation static {static['last_util']}  adaptive "
          f"{adaptive['last_util']}")


if __name__ == "__main__":
    main()
