"""Pipelined training (docs/pipeline.md) in one process: micro-batches as
tiles, gradients accumulated over them, one update per step. Losses and
weights equal the unpipelined run (same seed, same global batch) under
both schedules, with recomputation, on CPU devices and emulated GPUs, and
each device runs its micro-batches in the schedule's order."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import BATCH, cnn, mlp

import legionpy as lp
import legionpy.runtime as lr
from legionpy import models
from legionpy import pipeline as P
from legionpy.optimizer import Machine, Strategy

STEPS = 3


def transformer():
    return models.transformer(batch_size=BATCH, scale="small", seed=2)


def gpt2():
    return models.gpt2(batch_size=BATCH, scale="small", seed=3)


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "gpt2": gpt2}


def batches(m, steps: int):
    rng = np.random.default_rng(11)
    x = []
    for op in (o for o in m.graph.ops if o.kind == "input"):
        shape = (steps * BATCH, *op.output_shape[1:])
        if np.dtype(op.dtype).kind == "i":
            x.append(rng.integers(0, 16, shape).astype(op.dtype))
        else:
            x.append(rng.standard_normal(shape).astype(np.float32))
    last = m.graph.ops[-1].output_shape
    y = rng.integers(0, last[-1], (steps * BATCH, *last[1:-1]))
    return (x[0] if len(x) == 1 else x), y


def train(build, n: int, strategy, gpus: bool = False, monkeypatch=None) -> tuple:
    """(step losses, parameters) after STEPS steps of ``strategy`` (a name or
    ``f(graph, machine)``) on ``n`` CPU devices or emulated GPUs."""
    if gpus:
        monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
        monkeypatch.setenv("LEGIONPY_GPUS", str(n))
        lr.init()
    else:
        lr.init(cpus=n)
    try:
        m = build()
        mach = Machine.local(n)
        s = strategy(m.graph, mach) if callable(strategy) else strategy
        m.compile(optimizer=lp.nn.SGD(lr=0.05, momentum=0.9), strategy=s,
                  loss="sparse_categorical_crossentropy", machine=mach)
        x, y = batches(m, STEPS)
        h = m.fit(x, y, epochs=1, verbose=0, shuffle=False)
        return list(h["step_loss"]), m.parameters()
    finally:
        lr.shutdown()


def same(a: tuple, b: tuple, tol: float = 1e-6) -> None:
    np.testing.assert_allclose(a[0], b[0], rtol=tol, atol=tol)
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        np.testing.assert_allclose(a[1][k], b[1][k], rtol=tol, atol=tol, err_msg=k)


def pipe(**kw):
    return lambda g, mach: Strategy.pipeline(g, mach, **kw)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_pipelined_training_equals_unpipelined(model):
    ref = train(MODELS[model], 2, "data")
    for kw in (dict(schedule="gpipe"), dict(schedule="1f1b"),
               dict(schedule="1f1b", microbatches=2, recompute=[0, 1])):
        got = train(MODELS[model], 2, pipe(**kw))
        same(got, ref)


@pytest.mark.parametrize("strategy", ["model", "owt", "megatron"])
def test_gpt2_with_its_tied_table_trains_the_same_under_any_strategy(strategy):
    """The tied table's two uses (embedding rows, output projection) reduce
    into one gradient however either is split."""
    same(train(gpt2, 2, strategy), train(gpt2, 2, "data"), 1e-5)


def test_four_stages_with_data_parallel_inside():
    """2 stages x 2 devices (data parallel inside each), 4 micro-batches."""
    ref = train(transformer, 4, "data")
    got = train(transformer, 4, pipe(stages=2, microbatches=4))
    same(got, ref)


@pytest.mark.parametrize("schedule", P.SCHEDULES)
def test_pipelines_on_emulated_gpus_equal_cpu(monkeypatch, schedule):
    on_cpu = train(transformer, 2, pipe(schedule=schedule))
    on_gpu = train(transformer, 2, pipe(schedule=schedule), gpus=True,
                   monkeypatch=monkeypatch)
    same(on_gpu, on_cpu, 1e-5)


def test_each_device_runs_the_schedule_in_a_replayed_step():
    """The trace of a replayed step: on each device the first layer of its
    stage runs its forwards and backwards in the schedule's order."""
    rt = lr.init(cpus=2)
    try:
        m = transformer()
        mach = Machine.local(2)
        s = Strategy.pipeline(m.graph, mach, microbatches=4, schedule="1f1b")
        m.compile(optimizer=lp.nn.SGD(lr=0.05), strategy=s,
                  loss="sparse_categorical_crossentropy", machine=mach)
        x, y = batches(m, 1)
        ex = m._ex
        for step in range(3):
            if step == 2:
                rt.trace.start()
            ex.train_step(m._shards([x]), y, step)
            lp.fence()
        recs = rt.trace.stop()
    finally:
        lr.shutdown()
    stage = s.pipeline.stage_of(m.graph)
    for st in range(2):
        first = next(op for op in m.graph.ops if stage[op.index] == st and op.has_backward)
        got = []
        for r in sorted(recs, key=lambda r: r["start"]):
            for w in "FB":
                if r["name"] == f"{w}({first.name})":
                    got.append((w, r["point"][0] if r.get("point") else None))
        units = [w for w, _ in got]
        assert units == [w for w, _ in P.stage_order(st, 2, 4, "1f1b")], got
