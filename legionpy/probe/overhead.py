"""The runtime measured on this machine: its own per-task overhead, the
kernels' slowdown when every device runs at once, and the cores other
programs keep busy (moved from ``optimizer/fidelity.py`` and
``optimizer/calibration.py``: the optimizer holds the models these figures
feed, :class:`~legionpy.optimizer.fidelity.RuntimeOverhead` and the
simulator, and never runs a task).

* :func:`measure_runtime_overhead`: :class:`RuntimeOverhead` with empty
  tasks (never with the models being compared), the method in
  :mod:`legionpy.optimizer.fidelity`'s module doc;
* :func:`measure_kernel_concurrency`: a GEMM and a memory-bound stream
  launched on ONE device, then on every device at once, through the runtime
  (so with its worker threads, BLAS limits and MPI ranks as in training);
  the ratios of the median kernel times are ``kernel_scale`` /
  ``kernel_scale_mem``;
* :func:`measure_lock_hold`: how long a numpy tile kernel holds the
  interpreter lock (``RuntimeOverhead.gil_kernel_s``, issue 26): small
  dense-layer kernels of growing size run on one thread, then on two at
  once; the seconds the second thread adds to each call are the part the
  lock serialises (all of a small kernel, none of a large one's loops);
  the largest such part is the cap;
* :func:`measure_mpi_collectives`: what the runtime's MPI transport takes
  for a reduce-scatter and an all-gather between ranks (nonblocking calls
  polled as ``Cluster.wait`` polls them) at three sizes, fitted as
  ``coll_s + coll_byte_s * bytes``;
* :func:`measure_poll_share`: a GEMM alone, then beside a thread waiting
  on a message as the runtime waits for a collective (``Cluster.wait``:
  spin, then a poll every 50 us); on a rank whose threads share one core
  the polls take part of the core from the kernel
  (``RuntimeOverhead.poll_share``);
* :func:`cpu_clock` / :func:`background_cores`: the machine's busy
  CPU-seconds from ``/proc/stat`` less this job's, over the wall time.

All are collective under MPI and return rank 0's figures on every rank.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Any

import numpy as np

from .. import runtime as lr
from ..affinity import cpu_clock, node_cores, unbound
from ..affinity import own_background as _background
from ..optimizer.fidelity import RuntimeOverhead
from ..regions import WD, Partition, R, Region
from ..runtime import LaunchOptions, TaskFunction
from ..runtime.mpi import allgather, bcast_root
from .machine import local_machine

__all__ = ["measure_runtime_overhead", "measure_kernel_concurrency", "least_slowdown",
           "measure_lock_hold",
           "measure_mpi_collectives", "measure_poll_share", "cpu_clock", "background_cores",
           "interpreter_speed"]


def measure_runtime_overhead(launches: int = 120, tile_rows: int = 16) -> RuntimeOverhead:
    """Measure :class:`RuntimeOverhead` on the current runtime with empty
    tasks (never with the models being compared): index launches of one
    point per device with 1 and with 6 region requirements (the per-task and
    per-requirement terms are the line through the two medians, for the
    control thread and for the workers), then pairs of launches where the
    second reads, with a one-tile shift, what the first wrote on another
    device (one copy per point: the extra control-thread time of the second
    launch, and the copy records' durations less the link model's latency
    and bytes). Under MPI it is collective and returns rank 0's figures on
    every rank. Takes ~0.3 s."""
    rt = lr.get_runtime()
    n = len(rt.devices)
    shape = (n * tile_rows, 16)
    regs = [Region(shape, {"x": np.float32}, name=f"_ovh_{i}") for i in range(6)]
    for r in regs:
        r.write("x", np.zeros(shape, np.float32))
    parts = [Partition.equal(r, (n, 1)) for r in regs]
    colors = parts[0].colors
    shifted = Partition.by_rects(regs[1], {c: parts[1][((c[0] + 1) % n, 0)].rect
                                           for c in colors})

    def empty(*_args: Any) -> None:
        return None

    tasks = {}
    for k in (1, 6):
        tasks[k] = (TaskFunction(empty, [WD("x")] + [R("x")] * (k - 1), name=f"_ovh_{k}",
                                 kind="compute"), LaunchOptions(f"_ovh_{k}", "compute", None))
    wr = (TaskFunction(empty, [WD("x")], name="_ovh_w", kind="compute"),
          LaunchOptions("_ovh_w", "compute", None))
    rd = (TaskFunction(empty, [WD("x"), R("x")], name="_ovh_r", kind="compute"),
          LaunchOptions("_ovh_r", "compute", None))

    def launch(t: tuple, args: list) -> float:
        t0 = time.perf_counter()
        lr.index_launch(t[0], colors, *args, launch_options=t[1])
        return (time.perf_counter() - t0) / n

    control: dict[int, list] = {1: [], 6: []}
    for k, t in tasks.items():
        for _ in range(10):  # warm up the launch path's caches
            launch(t, parts[:k])
        lr.fence()
    with rt.trace.tap() as tap:  # leaves the user's LEGIONPY_TRACE whole
        for i in range(launches):
            for k, t in tasks.items():
                control[k].append(launch(t, parts[:k]))
            if i % 10 == 9:
                lr.fence()  # keep the queues short: the workers never starve the control thread
        lr.fence()
        plain, copied = [], []
        if n > 1:
            for i in range(launches // 2):
                launch(wr, [parts[1]])
                plain.append(launch(rd, [parts[2], parts[1]]))
                launch(wr, [parts[1]])
                copied.append(launch(rd, [parts[2], shifted]))
                if i % 10 == 9:
                    lr.fence()
        lr.fence()
    recs = _ran_here(tap.records())
    med = statistics.median
    work = {k: [r["end"] - r["start"] for r in recs if r["kind"] == "compute"
                and r["name"].startswith(f"_ovh_{k}")] for k in (1, 6)}
    copies = [r["end"] - r["start"] for r in recs if r["kind"] == "copy"]
    c1, c6 = med(control[1]), med(control[6])
    w1, w6 = med(work[1]), med(work[6])
    mine = {"req_launch_s": max(0.0, (c6 - c1) / 5), "req_task_s": max(0.0, (w6 - w1) / 5)}
    mine["launch_s"] = max(0.0, c1 - mine["req_launch_s"])
    mine["task_s"] = max(0.0, w1 - mine["req_task_s"])
    mine["copy_launch_s"] = max(0.0, med(copied) - med(plain)) if copied else 0.0
    mine["copy_s"] = 0.0
    # Copies: subtract what the link model already charges (latency + bytes / bw).
    if copies and n > 1:
        ln = local_machine().links[0]
        nbytes = tile_rows * 16 * 4
        mine["copy_s"] = max(0.0, med(copies) - ln.latency - nbytes / ln.bandwidth)
    figures = bcast_root(mine)
    return RuntimeOverhead(machine="", **figures)


def measure_kernel_concurrency(n: int = 320, elems: int = 1_000_000,
                               reps: int = 10, tries: int = 3) -> dict[str, float]:
    """Kernel slowdown when every device runs at once (module doc), for a
    compute-bound kernel (four ``n`` x ``n`` float32 GEMMs) and a
    memory-bound one (four elementwise passes over ``elems`` floats): each
    launched ``reps`` times as a task on device 0 alone, then on every
    device at once; medians of the trace's task durations; of ``tries``
    such pairs, the one with the least slowdown. Returns
    ``kernel_scale`` / ``kernel_scale_mem`` (together / alone, at least 1)
    and the two kernels' arithmetic intensities (flop per byte), between
    which :meth:`RuntimeOverhead.scale_for` interpolates. Collective under
    MPI (rank 0's figures on every rank)."""
    rt = lr.get_runtime()
    ndev = len(rt.devices)
    reg = Region((ndev * 4, 4), {"x": np.float32}, name="_calib_conc")
    reg.write("x", np.zeros((ndev * 4, 4), np.float32))
    part = Partition.equal(reg, (ndev, 1))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    bm = rng.standard_normal((n, n)).astype(np.float32)
    local = threading.local()  # each worker streams over its own array

    def gemm(*_args: Any) -> None:
        for _ in range(4):
            a @ bm

    def stream(*_args: Any) -> None:
        x = getattr(local, "x", None)
        if x is None:
            x = local.x = np.ones(elems, np.float32)
        for _ in range(4):
            np.maximum(x, 0.0)

    kernels = []
    for label, fn in (("gemm", gemm), ("stream", stream)):
        name = f"_calib_{label}"
        kernels.append((label, name, TaskFunction(fn, [WD("x")], name=name, kind="compute"),
                        LaunchOptions(name, "compute", None)))
    measured = []
    for _ in range(tries):
        figures: dict[str, float] = {}
        for label, name, task, opts in kernels:
            m = _alone_and_together(task, opts, name, part, reps)
            figures[f"{label}_alone_s"], figures[f"{label}_together_s"] = m["alone"], m["together"]
        measured.append(figures)
    # the least slowdown of `tries`: the OS sometimes runs both device
    # threads on one core for a while (one calibration measured 1.95x for
    # the GEMM, where others measure 1.01-1.04), which no training step then
    # sees; contention can only add time
    best = least_slowdown(*measured)
    best.update(intensity_compute=2.0 * n ** 3 / (3 * n * n * 4),  # flop / byte
                intensity_mem=1.0 / 8,  # one op per float read and written
                stream_bytes=4 * 2 * 4 * elems)  # a stream call's bytes moved
    return bcast_root(best)


def _with_scales(figures: dict[str, float]) -> dict[str, float]:
    """``figures`` with ``kernel_scale`` / ``kernel_scale_mem``: each
    kernel's together / alone, at least 1."""
    g = figures["gemm_together_s"] / figures["gemm_alone_s"] if figures["gemm_alone_s"] else 1
    m = (figures["stream_together_s"] / figures["stream_alone_s"]
         if figures["stream_alone_s"] else 1)
    return dict(figures, kernel_scale=max(1.0, g), kernel_scale_mem=max(1.0, m))


def least_slowdown(*measured: dict[str, float]) -> dict[str, float]:
    """Of several :func:`measure_kernel_concurrency` figures taken apart in
    time, each kernel's pair with the least slowdown (contention can only add
    time): three tries back to back all read 1.9x for the GEMM in a fresh
    process that measured 1.01-1.04x otherwise, and the README's first
    command then printed 44% error, so the calibration measures before and
    after its rows, 30 s apart."""
    out = dict(measured[0])
    for label in ("gemm", "stream"):
        a, t = f"{label}_alone_s", f"{label}_together_s"
        best = min(measured, key=lambda f: f[t] / f[a] if f[a] else math.inf)
        out[a], out[t] = best[a], best[t]
    return _with_scales(out)


def _ran_here(recs: list[dict]) -> list[dict]:
    """The trace records of ops this rank ran: under ``mpirun`` every rank
    also records a *ghost* of each task and copy another rank runs (no
    device, no link, no time), and a median over both halves read half the
    kernel (runtime/replication.py). Measured 28 Nov under ``mpirun -n 2``:
    the GEMM's "together" median came out 1.28 ms against 2.6 alone, so
    ``kernel_scale`` was clamped to 1 whatever the contention.

    >>> _ran_here([{"device": 0, "link": None}, {"device": None, "link": None},
    ...            {"device": None, "link": (0, 1)}])
    [{'device': 0, 'link': None}, {'device': None, 'link': (0, 1)}]
    """
    return [r for r in recs if r["device"] is not None or r.get("link") is not None]


def _alone_and_together(task: Any, opts: Any, name: str, part: Any,
                        reps: int) -> dict[str, float]:
    """Median seconds of ``task`` (its trace records start with ``name``)
    launched ``reps`` times on the first point of ``part`` alone, then on
    every point at once: ``{"alone", "together"}``."""
    rt = lr.get_runtime()
    med = {}
    colors = part.colors
    for mode, cs in (("alone", colors[:1]), ("together", colors)):
        for _ in range(2):
            lr.index_launch(task, cs, part, launch_options=opts)
        lr.fence()
        with rt.trace.tap() as tap:  # leaves the user's LEGIONPY_TRACE whole
            for _ in range(reps):
                lr.index_launch(task, cs, part, launch_options=opts)
                lr.fence()  # one launch at a time: the devices overlap only within it
        recs = _ran_here(tap.records())
        ds = [r["end"] - r["start"] for r in recs
              if r["kind"] == "compute" and r["name"].startswith(name)]
        med[mode] = statistics.median(ds) if ds else 0.0
    return med


def _dense_tile(batch: int, width: int) -> Any:
    """A dense layer's forward and backward at (batch, width), numpy only."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    w = rng.standard_normal((width, width)).astype(np.float32)
    b = np.zeros(width, np.float32)
    dy = rng.standard_normal((batch, width)).astype(np.float32)

    def kernel() -> None:
        y = x @ w
        y += b
        np.maximum(y, 0, out=y)
        g = dy * (y > 0)
        g @ w.T, x.T @ g, g.sum(0)

    return kernel


def _per_call(threads: int, batch: int, width: int, seconds: float) -> float:
    """Mean seconds per kernel call with ``threads`` threads calling at once."""
    probe = _dense_tile(batch, width)
    t = time.perf_counter()
    probe()
    probe()
    n = max(5, int(seconds / max((time.perf_counter() - t) / 2, 1e-7)))
    out = [0.0] * threads
    gate = threading.Barrier(threads)

    def body(j: int) -> None:
        k = _dense_tile(batch, width)
        k()
        gate.wait()
        t0 = time.perf_counter()
        for _ in range(n):
            k()
        out[j] = (time.perf_counter() - t0) / n

    ts = [threading.Thread(target=body, args=(j,)) for j in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return sum(out) / threads


#: ``gil_kernel_s`` where :func:`measure_lock_hold` cannot see the lock
#: (under 1.5 free cores): 29 us, measured on the project's 2-core machine
#: with ~0.3 cores used by other programs (issue 26)
DEFAULT_GIL_KERNEL_S = 29e-6


def measure_lock_hold(sizes: tuple = ((16, 32), (16, 128), (32, 256), (64, 256)),
                      seconds: float = 0.08, reps: int = 2) -> dict[str, float]:
    """Seconds of a tile kernel the interpreter lock serialises (module doc):
    per size, what two threads add per call beyond what sharing the free
    cores explains (``one * max(1, 2 / (cores - background))``, the
    background measured meanwhile; at most one call's time; best of
    ``reps``); ``gil_kernel_s`` is the largest. With under 1.5 free cores the
    lock cannot be told from the load: ``gil_kernel_s`` is then
    :data:`DEFAULT_GIL_KERNEL_S` and ``lock_measured`` False. Plain threads, no
    runtime; collective under MPI (rank 0 measures)."""
    held = {}
    bg = None
    if lr.get_runtime().rank == 0:
        cores = node_cores()
        with unbound():  # two threads on the node's cores, not a bound rank's one
            for batch, width in sizes:
                c0 = cpu_clock()
                one = min(_per_call(1, batch, width, seconds) for _ in range(reps))
                two = min(_per_call(2, batch, width, seconds) for _ in range(reps))
                b = _background(c0, cpu_clock())
                bg = b if bg is None else max(bg, b or 0.0)
                # two threads with no lock take max(1, 2 / free cores) times one's time
                free = max(1.0, cores - (b or 0.0))
                fair = one * max(1.0, 2.0 / free)
                held[f"{batch}x{width}"] = (one, min(one, max(0.0, two - fair)))
    measured = max((h for _, h in held.values()), default=0.0)
    # under 1.5 free cores two threads cannot run at once whatever the lock
    # does: the probe cannot see it, so the figure measured on this 2-core
    # machine with its cores free stands in (and says so)
    blind = bool(held) and cores - (bg or 0.0) < 1.5
    figures = {"gil_kernel_s": DEFAULT_GIL_KERNEL_S if blind else measured,
               "lock_hold": {k: {"alone_s": a, "held_s": h} for k, (a, h) in held.items()},
               "lock_background_cores": bg, "lock_measured": not blind}
    return bcast_root(figures)


def measure_mpi_collectives(sizes: tuple = (16 << 10, 256 << 10, 1 << 20),
                            reps: int = 15) -> dict[str, float]:
    """Seconds the runtime's MPI transport takes for a collective between
    the job's ranks (module doc): a reduce-scatter and an all-gather of a
    float32 buffer of each of ``sizes`` bytes over every rank, as
    runtime/collectives.py ``MPITransport`` makes them (``Ireduce_scatter``,
    ``Iallgatherv`` in place) and waits for them (``Cluster.wait``: MPICH
    moves the data only while a rank polls), the ranks lined up by a
    barrier first; medians of ``reps``. A least-squares line through both
    kinds' medians gives ``coll_s`` (seconds per collective) and
    ``coll_byte_s`` (per byte of the buffer). The ping-pong behind the
    machine model's links (blocking sends, a few us) says a 256 KB
    reduce-scatter takes ~15 us; through the runtime it took 250-300 us on
    2 ranks of a 2-core machine (issue 26). Outside MPI, or with one rank:
    zeros. Collective under MPI (rank 0's figures on every rank)."""
    from ..runtime.mpi import cluster, launched_under_mpi

    if not launched_under_mpi() or cluster().size < 2:
        return {"coll_s": 0.0, "coll_byte_s": 0.0}
    cl = cluster()
    MPI = cl.MPI
    comm = cl.world.Dup()
    n = comm.Get_size()
    xs, ys = [], []
    try:
        for nbytes in sizes:
            c = max(1, nbytes // 4 // n)
            buf = np.ones(c * n, np.float32)
            counts, displs = [c] * n, [k * c for k in range(n)]
            for kind in ("reduce_scatter", "all_gather"):
                times = []
                for _ in range(reps):
                    comm.Barrier()
                    t0 = time.perf_counter()
                    if kind == "reduce_scatter":
                        recv = np.empty(c, np.float32)
                        req = comm.Ireduce_scatter(buf, recv, counts, op=MPI.SUM)
                    else:
                        req = comm.Iallgatherv(MPI.IN_PLACE, [buf, counts, displs, MPI.FLOAT])
                    cl.wait([req], lambda k=kind: f"the {k} calibration")
                    times.append(time.perf_counter() - t0)
                xs.append(float(buf.nbytes))
                ys.append(max(allgather(statistics.median(times))))
    finally:
        comm.Free()
    a = np.vstack([np.ones(len(xs)), xs]).T
    (c0, c1), *_ = np.linalg.lstsq(a, np.array(ys), rcond=None)
    if c1 < 0:  # no growth with size at these sizes: a constant
        c0, c1 = float(np.mean(ys)), 0.0
    return bcast_root({"coll_s": max(0.0, float(c0)), "coll_byte_s": float(c1),
                       "coll_points": [[x, y] for x, y in zip(xs, ys)]})


def measure_poll_share(reps: int = 7, calls: int = 30, n: int = 256) -> float:
    """The share of its core a rank loses while one of its threads waits on
    a collective (``RuntimeOverhead.poll_share``): each rank times ``calls``
    float32 GEMMs of ``n`` x ``n`` (as a device's worker runs a dense
    kernel: numpy lets the interpreter lock go) alone, then beside a thread
    in ``Cluster.wait`` on a message its neighbour sends only after its own
    GEMMs (so the wait spins, then polls every 50 us, as a collective's
    does); ``1 - alone / beside`` of the medians over ``reps`` rounds, the
    ranks' mean. On ranks bound a core each (legionpy/affinity.py) each
    poll's wake-up takes the core from the kernel: 0.32-0.34 under
    ``mpirun -n 2`` on this 2-core machine (a 330 us GEMM ran 1.47-1.51x as
    long); where the waiting thread has a core of its own, about 0.
    Outside MPI, or with one rank: 0. Collective under MPI (the same figure
    on every rank)."""
    from ..runtime.mpi import cluster, launched_under_mpi

    if not launched_under_mpi() or cluster().size < 2:
        return 0.0
    cl = cluster()
    comm = cl.world.Dup()
    size, rank = comm.Get_size(), comm.Get_rank()
    a = np.random.default_rng(rank).random((n, n), dtype=np.float32)

    def gemms() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            a @ a
        return (time.perf_counter() - t0) / calls

    alone, beside = [], []
    try:
        gemms()  # warm the caches and BLAS
        for _ in range(reps):
            comm.Barrier()
            alone.append(gemms())
            comm.Barrier()
            got = np.empty(1)
            req = comm.Irecv(got, source=(rank - 1) % size, tag=7)
            waiter = threading.Thread(target=cl.wait,
                                      args=([req], lambda: "the poll calibration's message"))
            waiter.start()
            beside.append(gemms())
            comm.Send(np.ones(1), dest=(rank + 1) % size, tag=7)
            waiter.join()
    finally:
        comm.Free()
    share = max(0.0, 1.0 - statistics.median(alone) / statistics.median(beside))
    return bcast_root(float(statistics.mean(allgather(share))))


def _interpreter_work() -> None:
    """A fixed piece of the interpreter's work: dict stores, attribute and
    list traffic, small allocations (what the control thread and a task's
    Python do)."""
    d: dict = {}
    out = []
    for i in range(2000):
        d[i & 255] = i
        out.append((i, d.get(i & 127)))
    out.clear()


def interpreter_speed(seconds: float = 0.3) -> float:
    """Median seconds of :func:`_interpreter_work` over ``seconds``: this
    interpreter's speed now, on this machine (lower is faster). On the
    project's 2-core virtual machine a loop of the kind (20,000 dict stores)
    slowed by 15% within 15 minutes with the machine otherwise idle (27 Nov:
    0.63 then 0.72-0.75 ms), while the machine's busy time showed nothing:
    the host's other tenants; this work read 117-133 us over a bench run.
    ``bench/fidelity.py`` records it beside each run and the calibration
    beside its rows, so a figure taken in a slower window than its
    calibration says so."""
    _interpreter_work()
    t0 = time.perf_counter()
    times = []
    while time.perf_counter() - t0 < seconds or len(times) < 5:
        t = time.perf_counter()
        _interpreter_work()
        times.append(time.perf_counter() - t)
    return float(statistics.median(times))


def background_cores(start: tuple | None, end: tuple | None) -> float | None:
    """Cores other programs kept busy between two :func:`cpu_clock` readings:
    the machine's busy CPU-seconds less this job's (every rank's, summed under
    MPI: collective, ranks assumed on one host, rank 0's figure returned on
    every rank), over the wall seconds. None when either reading is missing."""
    ok = start is not None and end is not None
    own = end[2] - start[2] if ok else 0.0
    parts = allgather((ok, own))
    ok, own = all(p[0] for p in parts), sum(p[1] for p in parts)
    out = None
    if ok and end[0] > start[0]:
        out = max(0.0, ((end[1] - start[1]) - own) / (end[0] - start[0]))
    # rank 0's figure on every rank: what depends on it (a prediction) is collective
    return bcast_root(out)
