"""Collectives under mpirun (issue 24): ``collectives.py ops|train|gather|die [after]``.

ops: all-reduce (ring, tree), reduce-scatter and all-gather over every
device through the MPI transport (one sub-communicator, non-blocking
collectives), checked against numpy on every rank. train: the tiny CNN's
parameters after three steps with ``sync="collective"`` equal
``sync="shards"`` (data, hybrid, random strategies). die: rank 1 exits
before a collective; rank 0 must end with an error naming the collective
and the rank, never hang."""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime"))

import legionpy as lp  # noqa: E402
import legionpy.runtime as lr  # noqa: E402
from legionpy.geometry import Rect  # noqa: E402
from legionpy.ops.kernels.common import like  # noqa: E402
from legionpy.regions import WD, Partition, R, Region  # noqa: E402
from legionpy.runtime.collectives import Collective  # noqa: E402
from legionpy.runtime.gpu import to_host  # noqa: E402

mode = sys.argv[1]
rank = MPI.COMM_WORLD.rank
L = int(os.environ.get("ROW", "13"))  # 14 on 2 GPUs: whole chunks, so NCCL runs them


def rows(n):
    reg = Region((n * L,), {"x": np.float32}, name="flat")
    return Partition.by_rects(reg, {(p,): Rect((p * L,), ((p + 1) * L,)) for p in range(n)})


def data(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(L).astype(np.float32) for _ in range(n)]


def put(values):
    def f(v):  # host values into the instance (a GPU array on GPU devices)
        v.x[...] = like(values[v.rect.lo[0] // L], v.x)
    return lr.TaskFunction(f, [WD("x")], name="put")


def get(v):
    return np.array(to_host(v.x))


GET = lr.TaskFunction(get, [R("x")], name="get")


def read(part, n):
    fm = lr.index_launch(GET, part.colors, part)
    return [np.asarray(fm[(p,)].get()) for p in range(n)]


t0 = time.time()
if mode == "ops":
    n = len(lr.get_runtime().devices)
    for alg in ("ring", "tree"):
        part = rows(n)
        vals = data(n, 1)
        lr.index_launch(put(vals), part.colors, part)
        Collective("all_reduce", range(n), [part[(p,)] for p in range(n)], "x", alg,
                   name=f"AR({alg})")()
        for got in read(part, n):
            np.testing.assert_allclose(got, sum(vals), rtol=1e-5, atol=1e-6)
    part = rows(n)
    vals = data(n, 2)
    lr.index_launch(put(vals), part.colors, part)
    parts = [part[(p,)] for p in range(n)]
    Collective("reduce_scatter", range(n), parts, "x", name="RS(t)")()
    c = -(-L // n)
    for p, got in enumerate(read(part, n)):
        lo, hi = p * c, min(L, (p + 1) * c)
        np.testing.assert_allclose(got[lo:hi], sum(vals)[lo:hi], rtol=1e-5, atol=1e-6)
    Collective("all_gather", range(n), parts, "x", name="AG(t)")()
    for got in read(part, n):
        np.testing.assert_allclose(got, sum(vals), rtol=1e-5, atol=1e-6)
    lr.fence()
    recs = [r for r in lr.get_runtime().trace.records() if r["kind"] == "collective"]
    print(f"OK collective ops rank {rank}", flush=True)
elif mode == "train":
    from test_nn_invariance import STRATS, X_IMG, Y, hybrid
    from tiny_models import cnn

    from legionpy.optimizer import Machine

    n = len(lr.get_runtime().devices)
    transports = set()
    for sname, s in (("data", "data"), ("hybrid", hybrid), ("random", STRATS["random"])):
        out = {}
        for sync in ("shards", "collective"):
            rt = lp.init()
            m = cnn()
            strat = s if isinstance(s, str) else s(m.graph, n)
            m.compile(optimizer=lp.nn.SGD(lr=0.1, momentum=0.9), strategy=strat,
                      machine=Machine.local(n), sync=sync)
            with rt.trace.tap() as t:
                m.fit(X_IMG, Y, epochs=1, verbose=0, shuffle=False)
            transports |= {r["transport"] for r in t.records() if r["kind"] == "collective"}
            out[sync] = m.parameters()
            lp.runtime.shutdown()
        for k in out["shards"]:
            np.testing.assert_allclose(out["collective"][k], out["shards"][k], rtol=1e-5,
                                       atol=1e-6, err_msg=f"{sname} {k}")
    print(f"TRANSPORTS rank {rank}: {sorted(x for x in transports if x)}", flush=True)
    print(f"OK collective training rank {rank}", flush=True)
elif mode == "gather":
    # a ghost still pending when its result arrives: point 0 (rank 0) writes
    # what a slow reader on rank 1 reads, so rank 1's ghost of it waits for
    # that reader, while rank 0 ran it and sends its result at once; on GPU
    # runtimes a ghost ends by running a stream marker (FutureMap.gather)
    n = len(lr.get_runtime().devices)
    part = rows(n)
    first = part[(0,)]

    def slow(v):
        if rank == 1:
            time.sleep(0.4)

    def mark(v):
        v.x[...] = 1
        return ("wrote", MPI.COMM_WORLD.rank)

    lr.index_launch(put(data(n, 0)), part.colors, part)
    lr.index_launch(lr.TaskFunction(slow, [R("x")], name="slow"), part.colors, first)
    fm = lr.index_launch(lr.TaskFunction(mark, [WD("x")], name="mark"), part.colors, part)
    got = fm.gather()
    assert got == [("wrote", p * MPI.COMM_WORLD.size // n) for p in range(n)], got
    print(f"OK gather rank {rank}", flush=True)
elif mode == "die":
    n = len(lr.get_runtime().devices)
    part = rows(n)
    lr.index_launch(put(data(n, 3)), part.colors, part)
    if len(sys.argv) > 2:  # the communicator exists: the rank dies between collectives
        Collective("all_reduce", range(n), [part[(p,)] for p in range(n)], "x",
                   name="AR(first)")()
    lr.fence()
    if rank == 1:
        os._exit(1)
    Collective("all_reduce", range(n), [part[(p,)] for p in range(n)], "x",
               name="AR(die)")()
    print(f"rank {rank} got", read(part, n)[0][:2], flush=True)
    lr.fence()
print(f"rank {rank} finished {mode} after {time.time() - t0:.1f} s", flush=True)
