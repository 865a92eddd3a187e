"""Bytes per device: instances sized to the tiles vs the simulator's
``peak_memory`` and vs whole-root instances (what every device held before).

A full-size zoo model trains two steps on 4 CPU devices with stand-in tasks
(kernels skipped: instances, reduction buffers and copies are the real ones;
numpy's calloc commits no pages, so this runs in seconds on a laptop). For
each device it prints the runtime's peak bytes in use
(``legionpy.runtime.memory_stats``), the simulator's ``peak_memory`` of the
same strategy (same optimizer slots) and their ratio, and the baseline: the
bytes the same instances held when each covered its whole root region.

    python bench/memory.py [MODEL ...]     # default: alexnet resnet101
"""

from __future__ import annotations

import sys

import numpy as np

import legionpy as lp
import legionpy.runtime as lr
from legionpy.optimizer import Machine, Simulator

DEVICES = 4


def run(name: str, strategy: str) -> None:
    rt = lr.init(cpus=DEVICES)
    try:
        model = getattr(lp.models, name)()
        g = model.graph
        model.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9),
                      loss="sparse_categorical_crossentropy", strategy=strategy)
        model._ex.standin = {}  # every task: no kernel, no sleep
        ins = g.ops[0]
        dtype = np.int64 if "int" in str(getattr(ins, "dtype", "")) else np.float32
        x = np.zeros((2 * g.batch_size, *ins.output_shape[1:]), dtype)
        y = np.zeros((2 * g.batch_size, *g.ops[-1].output_shape[1:-1]), np.int64)
        model.fit(x, y, epochs=1, verbose=0, shuffle=False)
        got = rt.memory_stats()
        inst = rt.instances
        whole = {d: 0 for d in range(DEVICES)}
        roots = {r.uid: r for r in _roots(model)}
        for (mem, uid, f), _ in inst.arrays.items():
            if mem >= 0 and uid in roots:
                r = roots[uid]
                whole[mem] += int(np.prod(r.shape)) * np.dtype(r.fields[f]).itemsize
        sim = Simulator(g, Machine.parse(f"p100:1x{DEVICES}"), optimizer_slots=1)
        want = list(sim.run(model.strategy).peak_memory.values())
        for d in range(DEVICES):
            p = got.get(d, {}).get("peak_bytes", 0)
            print(f"{name:10s} {strategy:6s} device {d}: runtime peak {p / 1e6:9.1f} MB  "
                  f"simulator {want[d] / 1e6:9.1f} MB  ratio {p / want[d]:5.2f}  "
                  f"whole-root instances {whole[d] / 1e6:9.1f} MB "
                  f"({whole[d] / max(p, 1):4.1f}x)")
    finally:
        lr.shutdown()


def _roots(model) -> list:
    ex = model._ex
    out = list(ex.regions.values())
    for part, *_ in ex.updates:
        out.append(part.parent.root if hasattr(part, "parent") else part.region.root)
    return out


if __name__ == "__main__":
    for name in sys.argv[1:] or ["alexnet", "resnet101"]:
        for strategy in ("data", "model"):
            run(name, strategy)
