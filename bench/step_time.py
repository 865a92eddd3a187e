"""One training step through the full runtime path vs PyTorch CPU.

Models: the AlexNet-like CNN of ``bench/kernels.py`` (3x64x64, batch 32:
five convs with relu, three 2x2 max pools, three dense layers; its CONVS and
DENSES tables are reused, not copied) and a 2-layer MLP (1024 -> 2048 relu ->
10, batch 32). Ours: ``lp.nn.Model`` compiled with the data strategy on ONE
device, one ``fit`` step (F, B and U tasks, lazy gradient fills, reduction
buffers) plus a fence. PyTorch: forward, cross-entropy, backward and an SGD
step with the same shapes. Both run with ``--threads`` BLAS/torch threads.

A third case is the LSTM of REFERENCE.md: 2 layers, hidden 256, 20 steps,
batch 32, input 256, a classifier on the last state. Ours: one ``lstm`` cell
op per step (40 cells sharing their layer's weights) through the same nn
path; PyTorch: ``nn.LSTM`` + linear + cross-entropy + SGD step.

Last the zoo at its small defaults (lenet, alexnet, rnntc, rnnlm), one
device, one thread: a step replayed from a trace (``fit`` traces every
step), the same step untraced (``LEGIONPY_TRACE_STEPS=0``), and legionpy's
own kernels: the summed run time of the step's task bodies (taken from the
runtime's trace of a replayed step), so the runtime's share is visible
without torch.

With ``--graphs`` (or ``--only-graphs``): the same zoo models on 2 EMULATED
GPUs (``LEGIONPY_GPU_BACKEND=emulated``: numpy underneath, serial executor),
replayed steps with CUDA graphs (runtime/graphs.py) vs without
(``LEGIONPY_CUDA_GRAPHS=0``), 8 steady-state steps of one ``fit``: host CPU
milliseconds per step (process time; the emulated kernels run on the host,
so this is host time, not a GPU figure), the scheduler ops the host ran per
step (task and copy bodies, graph launches) and the emulated kernels plus
graph launches it issued (what a CUDA graph saves on a GPU).

    python bench/step_time.py [--threads 1] [--repeat 5] [--skip-cnn] [--only-lstm] [--only-zoo]
                              [--graphs | --only-graphs]

Prints milliseconds per step and the ratios ours / torch and step / kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels as KB  # noqa: E402  (the CNN's shapes live there)

import legionpy as lp  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

MLP = (1024, 2048, 10)
LSTM = {"layers": 2, "hidden": 256, "steps": 20, "batch": 32}


def build_cnn(m):
    c0, h0, w0 = KB.CONVS[0][1]
    t = m.input((c0, h0, w0), name="image")
    for name, _, cout, k, p, pool in KB.CONVS:
        t = m.conv2d(t, cout, k, padding=p, activation="relu", name=name)
        if pool:
            t = m.pool2d(t, 2, name=f"pool_{name}")
    t = m.flat(t, name="flat")
    for name, _, units, act in KB.DENSES:
        t = m.dense(t, units, activation=act, name=name)
    return m.softmax(t, name="softmax")


def build_mlp(m):
    t = m.input((MLP[0],), name="x")
    t = m.dense(t, MLP[1], activation="relu", name="fc1")
    return m.softmax(m.dense(t, MLP[2], name="fc2"), name="softmax")


def build_lstm(m):
    h, steps = LSTM["hidden"], LSTM["steps"]
    x = m.input((steps, h), name="x")
    state, first = [None] * LSTM["layers"], [None] * LSTM["layers"]
    for t in range(steps):
        inp = x.select(1, t)
        for layer in range(LSTM["layers"]):
            s = m.lstm(inp, state[layer], h, share=first[layer], name=f"lstm{layer}.t{t}")
            first[layer] = first[layer] or s
            state[layer], inp = s, s.h
    return m.softmax(m.dense(inp, 10, name="fc"), name="softmax")


def theirs_lstm(x, y, repeat: int) -> float | None:
    if torch is None:
        return None
    h = LSTM["hidden"]
    rnn, fc = torch.nn.LSTM(h, h, LSTM["layers"], batch_first=True), torch.nn.Linear(h, 10)
    opt = torch.optim.SGD([*rnn.parameters(), *fc.parameters()], lr=0.01, momentum=0.9)
    xt, yt = torch.tensor(x), torch.tensor(y)
    best = float("inf")
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        out, _ = rnn(xt)
        loss = F.cross_entropy(fc(out[:, -1]), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def best_step(rt, m, x, y, repeat: int) -> tuple[float, float]:
    """(best ms of a ``fit`` step after the two that record the trace, the
    summed ms of that step's task bodies)."""
    best, kernels = float("inf"), 0.0
    for i in range(repeat + 2):
        rt.trace.start()
        t0 = time.perf_counter()
        m.fit(x, y, verbose=0, shuffle=False)
        lp.fence()
        dt = time.perf_counter() - t0
        recs = rt.trace.stop()
        if i >= 2 and dt < best:
            best = dt
            kernels = sum(r["end"] - r["start"] for r in recs
                          if r["kind"] in ("compute", "update"))
    return best * 1e3, kernels * 1e3


KERNELS: dict[str, float] = {}  # the last ``ours`` step's kernel ms, by build function


def ours(build, x, y, repeat: int, batch: int = KB.BATCH) -> float:
    """Best ms of a replayed ``fit`` step (two steps record the trace)."""
    rt = lp.init(cpus=1, executor="serial")
    try:
        m = lp.nn.Model(batch_size=batch)
        build(m)
        m.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9), strategy="data")
        best, KERNELS[build.__name__] = best_step(rt, m, x, y, repeat)
        return best
    finally:
        lp.runtime.shutdown()


ZOO = ("lenet", "alexnet", "rnntc", "rnnlm")


def zoo_step(name: str, repeat: int, traced: bool) -> tuple[float, float]:
    """(best ms per step, kernel ms of that step) of zoo model ``name``."""
    from legionpy import data as D
    from legionpy import models

    os.environ["LEGIONPY_TRACE_STEPS"] = "1" if traced else "0"
    rt = lp.init(cpus=1, executor="serial")
    try:
        m = models.build(name, scale="small", seed=0)
        xs, y = D.for_model(m, m.batch_size, seed=0)
        m.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9), strategy="data")
        return best_step(rt, m, xs, y, repeat)
    finally:
        lp.runtime.shutdown()
        os.environ.pop("LEGIONPY_TRACE_STEPS", None)


def zoo_table(repeat: int) -> None:
    print("zoo, small defaults, 1 device: replayed step vs untraced vs its kernels (ms)")
    print(f"  {'model':8s} {'replayed':>9s} {'untraced':>9s} {'kernels':>8s} "
          f"{'replayed/kernels':>17s} {'untraced/kernels':>17s} {'speedup':>8s}")
    for name in ZOO:
        t, k = zoo_step(name, repeat, True)
        u, _ = zoo_step(name, repeat, False)
        print(f"  {name:8s} {t:9.2f} {u:9.2f} {k:8.2f} {t / k:17.2f} {u / k:17.2f} "
              f"{u / t:7.2f}x")


def graphs_step(name: str, repeat: int, graphs: bool, steps: int = 8
                ) -> tuple[float, tuple[float, float], dict]:
    """(host CPU ms per step (process time: other jobs on the machine do not
    count), (scheduler ops the host ran per step, kernels plus graph
    launches it issued per step), graph counters) of zoo model ``name`` on 2
    emulated GPUs: the best of ``repeat`` runs of ``steps`` steady-state
    steps, taken inside one ``fit`` after its first 4 (two record the trace,
    one probes for host syncs, one captures)."""
    from legionpy import data as D
    from legionpy import models
    from legionpy.runtime import emugpu

    env = {"LEGIONPY_GPU_BACKEND": "emulated", "LEGIONPY_GPUS": "2",
           "LEGIONPY_CUDA_GRAPHS": "1" if graphs else "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    best, issued, stats = float("inf"), (0.0, 0.0), {}
    try:
        for _ in range(repeat):
            rt = lp.init(executor="serial")
            try:
                m = models.build(name, scale="small", seed=0)
                xs, y = D.for_model(m, m.batch_size * (steps + 6), seed=0)
                m.compile(optimizer=lp.nn.SGD(lr=0.01, momentum=0.9), strategy="data")
                marks: dict = {}

                def on_step(i: int, _: dict, rt: object = rt, marks: dict = marks) -> None:
                    if i == 4:  # step i's results are in (one step behind the launches)
                        emugpu.reset_stats()
                        rt.trace.start()
                        marks["t0"] = time.process_time()
                    elif i == 4 + steps:
                        marks["dt"] = (time.process_time() - marks["t0"]) / steps
                        marks["recs"] = rt.trace.stop()
                        st = emugpu.stats()  # a graph launch is one kernel on its stream
                        marks["kernels"] = (sum(st["stream_kernels"].values())
                                            + sum(st["legacy_kernels"].values()))
                m.fit(xs, y, verbose=0, shuffle=False, on_step=on_step)
                if marks["dt"] < best:
                    best = marks["dt"]
                    ops = sum(r["device"] is not None or r["link"] is not None
                              for r in marks["recs"])
                    issued = (ops / steps, marks["kernels"] / steps)
                    stats = dict(rt.tracer.graphs.stats)
            finally:
                lp.runtime.shutdown()
        return best * 1e3, issued, stats
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def graphs_table(repeat: int) -> None:
    print("zoo, small defaults, 2 EMULATED GPUs (numpy underneath, serial executor): a "
          "replayed step with CUDA graphs vs without; host CPU ms per step, ops issued per step")
    print(f"  {'model':8s} {'no graphs':>10s} {'graphs':>8s} {'speedup':>8s} "
          f"{'ops run':>13s} {'kernels+launches':>17s} {'ops/graph':>10s}")
    for name in ZOO:
        t0, (o0, k0), _ = graphs_step(name, repeat, False)
        t1, (o1, k1), st = graphs_step(name, repeat, True)
        print(f"  {name:8s} {t0:10.2f} {t1:8.2f} {t0 / t1:7.2f}x {o0:6.0f} ->{o1:4.0f} "
              f"{k0:8.0f} ->{k1:6.0f} {st['replaced'] / max(st['launched'], 1):10.1f}")


def theirs(build, x, y, repeat: int) -> float | None:
    if torch is None:
        return None
    m = lp.nn.Model(batch_size=KB.BATCH)
    build(m)
    params, xt, yt = {}, torch.tensor(x), torch.tensor(y)
    for n, p in m.graph.parameters().items():
        params[n] = torch.zeros(p.shape, requires_grad=True)
        torch.nn.init.normal_(params[n], std=0.01)
    opt = torch.optim.SGD(params.values(), lr=0.01, momentum=0.9)

    def step():
        v = {}
        for op in m.graph.ops:
            a = v[op.inputs[0].op.name] if op.inputs else xt
            w = {k: params[p.name] for k, p in op.params.items()}
            if op.kind == "conv2d":
                a = torch.relu(F.conv2d(a, w["weight"], w["bias"], padding=op.attrs["padding"]))
            elif op.kind == "pool2d":
                a = F.max_pool2d(a, 2)
            elif op.kind == "flat":
                a = a.flatten(1)
            elif op.kind == "dense":
                a = a @ w["weight"] + w["bias"]
                a = torch.relu(a) if op.attrs["activation"] == "relu" else a
            v[op.name] = a
        loss = F.cross_entropy(v[m.graph.ops[-2].name], yt)
        opt.zero_grad()
        loss.backward()
        opt.step()

    best = float("inf")
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-cnn", action="store_true")
    ap.add_argument("--only-lstm", action="store_true")
    ap.add_argument("--only-zoo", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="also the emulated-GPU graphs table")
    ap.add_argument("--only-graphs", action="store_true")
    args = ap.parse_args()
    if args.only_graphs:
        with threadpool_limits(args.threads):
            graphs_table(args.repeat)
        return
    if args.only_zoo:
        with threadpool_limits(args.threads):
            zoo_table(args.repeat)
        return
    if torch is not None:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, KB.BATCH)
    cases = [("mlp 1024-2048-10", build_mlp, (KB.BATCH, MLP[0]))]
    if not args.skip_cnn:
        cases.insert(0, ("alexnet-like 3x64x64", build_cnn, (KB.BATCH,) + KB.CONVS[0][1]))
    print(f"one training step, batch {KB.BATCH}, {args.threads} thread(s), best of "
          f"{args.repeat}")
    if args.only_lstm:
        cases = []
    with threadpool_limits(args.threads):
        xl = rng.standard_normal((LSTM["batch"], LSTM["steps"], LSTM["hidden"])).astype(
            np.float32)
        yl = rng.integers(0, 10, LSTM["batch"])
        KB.row("lstm 2x256, seq 20 (cells)", ours(build_lstm, xl, yl, args.repeat,
                                                   LSTM["batch"]),
               theirs_lstm(xl, yl, args.repeat))
        print(f"  (its kernels: {KERNELS['build_lstm']:.2f} ms of the step)")
        for name, build, shape in cases:
            x = rng.standard_normal(shape).astype(np.float32)
            a = ours(build, x, y, args.repeat)
            b = theirs(build, x, y, args.repeat)
            KB.row(name, a, b)
        zoo_table(args.repeat)
        if args.graphs:
            graphs_table(args.repeat)


if __name__ == "__main__":
    main()
