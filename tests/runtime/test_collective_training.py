"""Training with collective gradient sync (``sync="collective"``, nn/sync.py,
docs/seam.md section 2): per bucket and replica group, reduce-scatter of
gradients -> update of each position's chunk -> all-gather of weights. The
strategy invariance of DESIGN.md invariant 2 across sync modes: the same
parameters as ``sync="shards"`` (fp32, rtol 1e-5) for data, model, hybrid
and random strategies on 1, 2 and 4 CPU devices and on emulated GPUs, with
the steps traced and replayed."""

from __future__ import annotations

import numpy as np
import pytest
from test_nn_invariance import STRATS, X_IMG, X_VEC, Y, hybrid
from tiny_models import cnn, mlp

import legionpy as lp
from legionpy.optimizer import Machine


def train(build, x, n, strategy, sync, opt=None, start=None):
    rt = start() if start else lp.init(cpus=n)
    try:
        m = build()
        if not isinstance(strategy, str):
            strategy = strategy(m.graph, n)
        m.compile(optimizer=opt or lp.nn.SGD(lr=0.1, momentum=0.9), strategy=strategy,
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  machine=Machine.local(n), sync=sync)
        with rt.trace.tap() as t:
            hist = m.fit(x, Y, epochs=1, verbose=0, shuffle=False)
        out = m.parameters()
        return out, hist, dict(rt.tracer.stats), [
            r for r in t.records() if r["kind"] == "collective"]
    finally:
        lp.runtime.shutdown()


def same(a, b, what):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=f"{what}: {k}")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cnn_strategies_same_parameters_as_shards(n):
    for sname, s in STRATS.items():
        a = train(cnn, X_IMG, n, s, "shards")[0]
        b, _, stats, _ = train(cnn, X_IMG, n, s, "collective")
        same(a, b, f"cnn {sname} on {n} devices")
        assert stats.get("replayed", 0) >= 1, stats  # the steps were traced and replayed


def test_mlp_random_and_adam_batchnorm_dropout():
    n = 4
    same(train(mlp, X_VEC, n, STRATS["random"], "shards")[0],
         train(mlp, X_VEC, n, STRATS["random"], "collective")[0], "mlp random")

    def build():
        return cnn(extra=True)
    opt = lp.nn.Adam(lr=0.01)
    same(train(build, X_IMG, n, hybrid, "shards", opt)[0],
         train(build, X_IMG, n, hybrid, "collective", opt)[0], "cnn+bn+dropout Adam hybrid")


@pytest.mark.parametrize("n", [2, 4])
def test_emulated_gpus_nccl_and_peer_copies(emu, monkeypatch, n):
    """GPU groups run NCCL (runtime/nccl.py; its emulation in CI,
    runtime/emunccl.py), or peer copies along the rule's steps with
    LEGIONPY_NCCL=0: the same parameters as shards either way."""
    a = train(cnn, X_IMG, n, "data", "shards", start=lambda: emu(n))[0]
    b, _, _, colls = train(cnn, X_IMG, n, "data", "collective", start=lambda: emu(n))
    same(a, b, f"cnn data on {n} emulated GPUs, NCCL")
    assert colls and {r["transport"] for r in colls} == {"nccl"}
    monkeypatch.setenv("LEGIONPY_NCCL", "0")
    c, _, _, colls = train(cnn, X_IMG, n, "data", "collective", start=lambda: emu(n))
    same(a, c, f"cnn data on {n} emulated GPUs, peer copies")
    assert {r["transport"] for r in colls} == {"in-process"}


def test_devices_sharing_a_gpu_do_not_use_nccl(emu, monkeypatch):
    """Two devices on one GPU (how tests run on a one-GPU machine): NCCL
    refuses a communicator with a GPU twice, so the group takes peer copies."""
    monkeypatch.setenv("LEGIONPY_EMU_VISIBLE", "1")
    a = train(cnn, X_IMG, 2, "data", "shards", start=lambda: emu(2))[0]
    b, _, _, colls = train(cnn, X_IMG, 2, "data", "collective", start=lambda: emu(2))
    same(a, b, "cnn data on 2 devices of one emulated GPU")
    assert colls and {r["transport"] for r in colls} == {"in-process"}


def test_checkpoint_round_trip_and_parameters_between_steps(tmp_path):
    """Parameters and optimizer state live in the flat replicas between
    steps: ``parameters()`` and ``save`` read them back, ``load`` writes
    them into every replica; resuming equals training straight through."""
    def run(split):
        lp.init(cpus=2)
        try:
            m = cnn()
            m.compile(optimizer=lp.nn.SGD(lr=0.1, momentum=0.9), strategy="data",
                      loss="sparse_categorical_crossentropy", sync="collective")
            b = m.batch_size
            if not split:
                m.fit(X_IMG[:3 * b], Y[:3 * b], epochs=1, verbose=0, shuffle=False)
                return m.parameters()
            m.fit(X_IMG[:b], Y[:b], epochs=1, verbose=0, shuffle=False)
            m.parameters()  # a read between steps changes nothing
            m.save(str(tmp_path / "ck.npz"))
        finally:
            lp.runtime.shutdown()
        lp.init(cpus=2)
        try:
            m = cnn()
            m.compile(optimizer=lp.nn.SGD(lr=0.1, momentum=0.9), strategy="data",
                      loss="sparse_categorical_crossentropy", sync="collective")
            m.load(str(tmp_path / "ck.npz"))
            m.fit(X_IMG[b:3 * b], Y[b:3 * b], epochs=1, verbose=0, shuffle=False)
            return m.parameters()
        finally:
            lp.runtime.shutdown()
    same(run(False), run(True), "resumed from a checkpoint")


def test_unknown_sync_mode_is_an_error():
    lp.init(cpus=1)
    try:
        m = mlp()
        with pytest.raises(lp.errors.ModelError, match="sync mode 'allreduce'"):
            m.compile(strategy="data", sync="allreduce")
    finally:
        lp.runtime.shutdown()


def test_embeddings_sparse_update_adam():
    """Embedding tables update only the elements of touched rows (the
    SparseAdam semantics of the shards mode) inside a flat chunk."""
    from test_mirror import data_for, rnn

    lp.init(cpus=1)
    xs, y = data_for(rnn())  # the same batch for both runs
    lp.runtime.shutdown()

    def run(sync):
        lp.init(cpus=2)
        try:
            m = rnn()
            m.compile(optimizer=lp.nn.Adam(lr=0.01), strategy="data", sync=sync,
                      loss="sparse_categorical_crossentropy")
            for _ in range(3):
                m.fit(xs[0] if len(xs) == 1 else xs, y, epochs=1, verbose=0, shuffle=False)
            return m.parameters()
        finally:
            lp.runtime.shutdown()
    same(run("shards"), run("collective"), "rnn (embedding) Adam")


def test_small_buckets_follow_the_cap(monkeypatch):
    """LEGIONPY_BUCKET_MB splits the parameters into more buckets in the
    runtime too (one reduce-scatter each); the parameters stay the same."""
    monkeypatch.setenv("LEGIONPY_BUCKET_MB", "0.002")
    a = train(cnn, X_IMG, 2, "data", "shards")[0]
    b, _, _, colls = train(cnn, X_IMG, 2, "data", "collective")
    same(a, b, "cnn data, 2 KiB buckets")
    buckets = {r["name"].split(".")[0] for r in colls if r["collective"] == "reduce_scatter"}
    assert len(buckets) > 1, buckets


@pytest.mark.parametrize("first,then", [("shards", "collective"), ("collective", "shards")])
def test_a_checkpoint_resumes_under_the_other_sync_mode(tmp_path, first, then):
    """A checkpoint saved under one sync mode (shards was the default
    before) resumes under the other: parameters and Adam's state carry
    over, equal to training straight through."""
    def compiled(sync):
        lp.init(cpus=2)
        m = cnn()
        m.compile(optimizer=lp.nn.Adam(lr=0.01), strategy="data",
                  loss="sparse_categorical_crossentropy", sync=sync)
        return m

    try:
        m = compiled(first)
        b = m.batch_size
        m.fit(X_IMG[:3 * b], Y[:3 * b], epochs=1, verbose=0, shuffle=False)
        straight = m.parameters()
    finally:
        lp.runtime.shutdown()
    try:
        m = compiled(first)
        m.fit(X_IMG[:b], Y[:b], epochs=1, verbose=0, shuffle=False)
        m.save(str(tmp_path / "ck.npz"))
    finally:
        lp.runtime.shutdown()
    try:
        m = compiled(then)
        m.load(str(tmp_path / "ck.npz"))
        m.fit(X_IMG[b:3 * b], Y[b:3 * b], epochs=1, verbose=0, shuffle=False)
        same(straight, m.parameters(), f"saved under {first}, resumed under {then}")
    finally:
        lp.runtime.shutdown()
