"""Several cross-rank behaviours in one mpirun (start-up costs ~1 s each):
reductions from every rank, Region.read on every rank, futures across
ranks (get on every rank, get on one rank only, a future as the argument of
a task on another rank, FutureMap.get and .gather), on_rank0_alone,
share_among_ranks, devices numbered rank-major, the kernel-concurrency probe's
medians (this rank's tasks, not the ghosts of the others'), and
describe_job(). Prints
"OK features rank R" on success."""

import os

import numpy as np
from mpi4py import MPI

import legionpy as lp
from legionpy import models
from legionpy.affinity import one_core
from legionpy.measure.fidelity import predict
from legionpy.optimizer import Machine, Strategy, lockshare
from legionpy.probe.job import describe_job
from legionpy.probe.overhead import measure_kernel_concurrency, measure_poll_share
from legionpy.runtime.mpi import on_rank0_alone, share_among_ranks

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rt = lp.runtime()
devs = rt.devices
assert [d.id for d in devs] == list(range(len(devs)))
assert [d.rank for d in devs] == sorted(d.rank for d in devs) and devs[-1].rank == size - 1
assert all(d.local_index == [e for e in devs if e.rank == d.rank].index(d) for d in devs)
n = len(devs)


@lp.task(privileges=[lp.Reduce("+", "s")])
def add_one(r):
    r.s[...] += 1


@lp.task(privileges=[lp.Reduce("max", "m")])
def put_max(k, r):
    r.m[...] = np.maximum(r.m, k)


@lp.task(privileges=[lp.WD("x")])
def stamp(r):
    r.x[...] = np.arange(r.rect.lo[0], r.rect.hi[0])[:, None] * 10 + r.rect.lo[1]


@lp.task
def whoami(k):
    return (k, MPI.COMM_WORLD.rank)


@lp.task
def plus(a, b):
    return a + b


@lp.task(privileges=[lp.R("x")])
def total(r):
    return float(r.x.sum())


# cross-rank reductions: overlapping halo tiles on every device reduce into one region
R = lp.Region((8 * n, 4), {"s": np.int64, "m": np.float64, "x": np.float64}, name="R")
H = lp.Partition.restriction(R, (8, 4), halo=(1, 0))
P = lp.Partition.equal(R, (n, 1))
for _ in range(3):
    lp.index_launch(add_one, H.colors, H)
fm = lp.index_launch(put_max, H.colors, 1.0, H)
lp.index_launch(put_max, P.colors, 2.0, P)
want = np.full((8 * n, 4), 3)
for k in range(1, n):
    want[8 * k - 1:8 * k + 1] = 6
np.testing.assert_array_equal(R.read("s"), want)  # every rank gathers every piece
np.testing.assert_array_equal(R.read("m"), np.full((8 * n, 4), 2.0))
lp.index_launch(add_one, P.colors, P)
np.testing.assert_array_equal(P[n - 1, 0].read("s"), want[8 * (n - 1):] + 1)

# Region.read on every rank of data written by tasks on every rank
lp.index_launch(stamp, P.colors, P)
x = R.read("x")
np.testing.assert_array_equal(x, np.arange(8 * n)[:, None] * 10 + np.zeros((1, 4)))
# write on every rank (replicated host), then tasks elsewhere read it
R.write("x", np.ones((8 * n, 4)))
assert lp.index_launch(total, P.colors, P).get() == [32.0] * n
assert total(R).get() == 32.0 * n

# futures across ranks
owners = lp.index_launch(whoami, range(n), 7).get()
assert owners == [(7, d.rank) for d in devs], owners
f = whoami(1)                                  # single launches go round robin,
g = plus(f, (9,))                              # so g runs on the next device (another rank)
assert g.get() == (1, f.get()[1], 9), g.get()
chain = plus((), (0,))
for i in range(1, 2 * n):
    chain = plus(chain, (i,))                  # each step on the next device
assert chain.get() == tuple(range(2 * n)), chain.get()
fm2 = lp.index_launch(whoami, range(n), 3)
fm3 = lp.index_launch(plus, range(n), fm2, (1,))  # FutureMap projected by color
assert fm3.get() == [(3, d.rank, 1) for d in devs]
# FutureMap.gather: a collective, every rank sends the results it ran (fit's loss)
fm4 = lp.index_launch(whoami, range(n), 4)
assert fm4.gather() == [(4, d.rank) for d in devs]
assert fm4.get() == fm4.gather()  # kept: a later get or gather asks nobody
fm5 = lp.index_launch(whoami, [(0,)], 6)  # one point: the other ranks only receive
assert fm5.gather() == [(6, 0)]
# a measurement on rank 0 alone, the others asleep; its result on every rank
ran = []
assert on_rank0_alone(lambda: ran.append(rank) or ("measured by", rank)) == ("measured by", 0)
assert ran == ([0] if rank == 0 else [])
# work split among the ranks: each runs its part, every rank gets every part
assert share_among_ranks(lambda r, n: (r, n, rank)) == [(r, size, r) for r in range(size)]
# the worker cost model's kernels and lock shares are measured on rank 0 alone
lockshare.BUSY_CORES = 2.0  # this checks who measures, not the machine's load
timed = []
real_share = lockshare.lock_share
lockshare.lock_share = lambda *a, **k: timed.append(1) or real_share(*a, **k)
g = models.graph("lenet", scale="small").graph
machine = Machine.local()
pred = predict(g, Strategy.data_parallel(g, machine), machine, overhead=False)
assert (len(timed) > 0) == (rank == 0), (rank, len(timed))
assert comm.allgather(pred["iteration_time_s"]) == [pred["iteration_time_s"]] * size
lockshare.lock_share = real_share
# the probe's "together" median is of the tasks this rank ran: with the other
# ranks' ghosts (no time) in it, it read half the kernel (28 Nov)
# (a core each: ranks sharing cores poll on the ones the probe times)
conc = measure_kernel_concurrency(n=128, elems=200_000, reps=8, tries=1)
if size <= (os.cpu_count() or 1):
    assert conc["gemm_together_s"] > 0.7 * conc["gemm_alone_s"], conc
    assert conc["stream_together_s"] > 0.7 * conc["stream_alone_s"], conc
# a thread waiting on a message as a collective's does polls every 50 us: on
# a rank whose threads share one core that takes part of it from a kernel
# (0.3 of it on a 2-core machine, 28 Nov); one figure on every rank
poll = measure_poll_share(reps=3, calls=15)
assert 0.0 <= poll < 0.9 and comm.allgather(poll) == [poll] * size, poll
if size > 1 and one_core():
    assert poll > 0.05, poll
late = whoami(5)
if rank == 0:  # only one rank asks: the owner answers from its service thread
    assert late.get()[0] == 5 and 0 <= late.get()[1] < size
lp.fence()

job = describe_job()
assert job["ranks"] == size and len(job["hosts"]) == size
assert sum(r["count"] for r in job["devices_per_rank"]) == n
assert job["links"]["memcpy"]["bandwidth"] > 0
if size > 1:
    assert job["links"]["intra_node"]["latency"] > 0 and len(job["pairs"]) == size - 1
assert describe_job() is job
assert comm.allgather(job["key"]) == [job["key"]] * size
print(f"OK features rank {rank}", flush=True)
