"""Bytes per device: the runtime's measured peak vs the simulator's
``peak_memory``, and vs whole-root instances (what every device held before
instances were sized to the tiles).

A full-size zoo model trains three steps (recorded, then replayed traces) on
4 CPU devices with stand-in tasks (kernels skipped: instances, reduction and
staging buffers and copies are the real ones; numpy's calloc commits no
pages, so this fits in a laptop's memory) under data, model and OWT (data
parallel convolutions, model parallel dense layers: a hybrid) strategies.
For each device it prints the runtime's peak bytes in use
(``legionpy.runtime.memory_stats``: instances, reduction buffers, staging
buffers at that peak), the simulator's ``peak_memory`` of the same strategy
(same optimizer slots) and their ratio, the bytes allocated at the end (the
buffer pools included), and the baseline: the bytes the same instances held
when each covered its whole root region.

    python bench/memory.py [MODEL ...] [--strategy data|model|owt ...]
                                           # default: alexnet vgg16, all three

Model-parallel VGG-16 at batch 64 does not fit a 24 GB machine: every
device's input-gradient buffers cover whole activations (up to 822 MB each)
and, unlike instances, buffers are written (identity) so their pages are
committed.
"""

from __future__ import annotations

import sys

import numpy as np

import legionpy as lp
import legionpy.runtime as lr
from legionpy.optimizer import Machine, Simulator

DEVICES = 4


def run(name: str, strategy: str) -> list[float]:
    rt = lr.init(cpus=DEVICES)
    try:
        model = getattr(lp.models, name)()
        g = model.graph
        model.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9),
                      loss="sparse_categorical_crossentropy", strategy=strategy)
        model._ex.standin = {}  # every task: no kernel, no sleep
        ins = g.ops[0]
        dtype = np.int64 if "int" in str(getattr(ins, "dtype", "")) else np.float32
        x = np.zeros((3 * g.batch_size, *ins.output_shape[1:]), dtype)
        y = np.zeros((3 * g.batch_size, *g.ops[-1].output_shape[1:-1]), np.int64)
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
        ratios = []
        for d in range(DEVICES):
            s = got.get(d, {})
            p = s.get("peak_bytes", 0)
            k = s.get("peak_by_kind", {})
            ratios.append(p / want[d])
            print(f"{name:9s} {strategy:5s} dev {d}: runtime peak {p / 1e6:7.1f} MB "
                  f"(instances {k.get('instances', 0) / 1e6:6.1f}, reduction "
                  f"{k.get('reduction', 0) / 1e6:5.1f}, staging {k.get('staging', 0) / 1e6:5.1f})"
                  f"  simulator {want[d] / 1e6:7.1f} MB  ratio {p / want[d]:4.2f}  "
                  f"allocated {s.get('reserved_bytes', 0) / 1e6:7.1f} MB  whole-root "
                  f"instances {whole[d] / 1e6:7.1f} MB ({whole[d] / max(p, 1):3.1f}x)",
                  flush=True)
        return ratios
    finally:
        lr.shutdown()


def _roots(model) -> list:
    ex = model._ex
    out = list(ex.regions.values())
    for part, *_ in ex.updates:
        out.append(part.parent.root if hasattr(part, "parent") else part.region.root)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    strategies = [args[i + 1] for i, a in enumerate(args) if a == "--strategy"]
    names = [a for i, a in enumerate(args)
             if a != "--strategy" and (i == 0 or args[i - 1] != "--strategy")]
    for name in names or ["alexnet", "vgg16"]:
        for strategy in strategies or ["data", "model", "owt"]:
            r = run(name, strategy)
            print(f"{name} {strategy}: runtime / simulator {min(r):.2f}-{max(r):.2f}", flush=True)
