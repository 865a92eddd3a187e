"""The interpreter lock's share of each tile kernel (issue 26).

The local machine model (:mod:`.fidelity`, :mod:`.sharing`) lets a task's
kernel hold its process's interpreter lock for its first
``RuntimeOverhead.gil_kernel_s`` (10-150 us, fitted on synthetic dense
models): numpy's dispatch and small loops hold it, larger loops release
it. Small convolutions do not fit that cap: alexnet's (3x3 and 7x7 images,
batch 16) are numpy calls on small arrays whose im2col copies and index
loops hold the lock for most of their 100-800 us, so two devices of one
process running them overlap far less than the cap says, and alexnet's
model-parallel step in one process was predicted 25-34% low.

This module measures the share per tile kernel, the way
:func:`legionpy.probe.overhead.measure_lock_hold` measures the cap on a
dense tile: the kernel's wall time per call alone (``one``), and while a
second thread runs the same kernel on its own arrays (``two``). Two
threads that never need the lock take ``one`` each on two free cores; two
that hold it throughout take ``2 * one``. In the sharing model's fluid
terms (each thread needs the lock for a fraction ``a`` of its progress,
the lock serves 1), two such threads run at ``min(1, 1 / (2a))``, so
``a = two / (2 * one)`` where ``two / one`` exceeds :data:`MIN_RATIO` (below
it the lock is not the bottleneck and the fluid model cannot tell ``a``:
the cap stands). The model then lets a task's kernel hold the lock for
``max(min(kernel, gil_kernel_s), share * kernel)``: the cap stays the floor
the calibration fitted, the share raises it where a kernel is measured to
hold the lock longer.

Two threads share more than the lock: the cores, the caches, the memory
system. So ``one`` is the larger of the kernel's time alone and its time
beside the twin running in *another process*
(:class:`~legionpy.optimizer.twinproc.TwinProcess`), which shares all of
that but the lock: the ratio is the lock's part alone. Without that
control alexnet's first convolution (an im2col copy and a GEMM of 1-4 ms,
the lock released throughout) read slowed 1.0-1.4x beside its twin, a
share of 0 or 0.55-0.8 from one process to the next, and the one-process
model-parallel prediction 20.3 or 25.2 ms for a step measured at 20.2.
With it the same tile read 0 in every process (28 Nov).

The lock is handed over every 0.1 ms while a share is measured (the
interpreter's switch interval, 5 ms by default): two threads that hold it
throughout then alternate many times within a batch, and the ratio is
their demand for it, the sharing model's fluid terms. At 5 ms a batch of
a few ms fell anywhere in one thread's turn, and repeats of the same 25-50
us kernels read shares of 0 or 1; at 0.1 ms repeats agree within
0.02-0.07. Measured on the project's 2-core machine (27 Nov, quiet):
alexnet's convolutions 0.7-1.0, its pools 1.0, the LSTM cells 0.6-0.95.

A share over 1 (two threads take longer than one after the other, up to
:data:`MAX_SHARE`) is kept too: such a kernel hands the lock over at every
numpy call, and while another such kernel of its process wants the lock
each hand-over costs (:func:`contention`; the sharing model slows both,
:mod:`.sharing`). Two workers of one process running rnnlm's LSTM cells
used 19.3 ms of CPU a step, for about 6 ms on one device; the model ran
them one after the other at no extra cost and put the step 23% low.

Two threads short of cores look like two threads short of the lock, so
shares measured while other programs kept more than :data:`BUSY_CORES`
busy are not kept, nor measured again in the process. Under ``mpirun`` the
other ranks would be such programs: rank 0 measures alone while they
sleep (:func:`legionpy.measure.fidelity.prime_alone`).
Shares are cached per tile key beside the step cost model's table
(``$LEGIONPY_CACHE/locks-step-cpu-v2-v5.json``), measured for the tiles a
strategy runs when the step cost model is primed
(:class:`~legionpy.optimizer.calibration.StepCostModel`). Tasks carry them
into the re-scheduler as ``lock_share``
(:func:`legionpy.optimizer.fidelity.annotate_lock_shares`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from ..affinity import cpu_clock, own_background, unbound
from .costmodel import TABLES
from .twinproc import TwinError

__all__ = ["MIN_RATIO", "MAX_SHARE", "lock_share", "looping", "contention", "measure_shares",
           "op_shares", "cache_file", "TRIES"]

#: two threads' time per call over one's below which the lock is not the
#: bottleneck (the memory system and the cores add 0-6% on the 2-core machine)
MIN_RATIO = 1.1
#: a kernel phase shorter than this is taken to hold the lock throughout
#: (it is under every cap the calibration tries, so its share cannot matter)
TINY_S = 1e-5
#: the largest share kept: ``two / one`` over 2 (a share over 1) means two
#: threads running the kernel take longer than one after the other: numpy
#: hands the lock over at every call on arrays of more than a few hundred
#: elements, and each hand-over costs (an LSTM cell of batch 16 and 64
#: units: 41 us alone, 113 us for two cells on two threads, 1.4x one after
#: the other; 8 and 4 units, the calibration's cells: 1.25x).
#: :func:`contention` is the excess. Shares over 1 are noisier than those
#: under it (the same tile read 0.65 and 2.6 in two caches, 28 Nov): kept
#: up to 1.5, they brought the two-device rows closer to their one-device
#: rows in all four calibrations tried (the mean error down in three),
#: where 3.0 put one row 52% high (docs/decisions.md)
MAX_SHARE = 1.5
#: cores other programs may keep busy while shares are measured: above it
#: two threads lack cores whatever the lock does, and nothing is kept
BUSY_CORES = 0.3
#: measurements of each share, the median kept: one ratio alone spiked
#: (a dense tile of 218 us read a median ratio of 1.006 over 20 repeats in
#: one quiet process, but 1.31 once, a share of 0.65 where the others read
#: 0), and 43 of 372 key-phases read 0 in some calibrations and 0.55-1.5 in
#: others (29 Nov); a tile that reads under :data:`MIN_RATIO` in the
#: majority stops there (a lock-free tile costs two measurements, not three)
TRIES = 3


#: tiles whose shares this process measured on a loaded machine (not kept,
#: not measured again here)
_LOADED: set[str] = set()


def _wall_per_call(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _beside(fn: Callable[[], Any], n: int, reps: int, run: Callable[[], Any]) -> float:
    """Best of ``reps`` batches of ``fn``'s wall time per call while
    ``run()``'s context (a twin running elsewhere) lasts."""
    with run():
        time.sleep(0.001)
        return min(_wall_per_call(fn, n) for _ in range(reps))


@contextmanager
def looping(fn: Callable[[], Any], threads: int = 1) -> Iterator[None]:
    """``threads`` helper threads calling ``fn`` in a loop for the ``with``
    block's duration (a kernel's twin; the step cost model's contended
    timings run theirs too)."""
    stop = threading.Event()

    def helper() -> None:
        while not stop.is_set():
            fn()

    helpers = [threading.Thread(target=helper, daemon=True) for _ in range(threads)]
    for h in helpers:
        h.start()
    try:
        yield
    finally:
        stop.set()
        for h in helpers:
            h.join()


def lock_share(fn: Callable[[], Any], twin: Callable[[], Any], seconds: float = 0.008,
               reps: int = 2, apart: Callable[[], Any] | None = None,
               tries: int = TRIES) -> float:
    """The share of ``fn``'s time it holds the interpreter lock (module
    doc): ``two / (2 * base)`` of its wall time per call while ``twin``
    (the same kernel on its own arrays) runs in a loop on a second thread
    (``two``), over its time alone or, with ``apart``, beside the twin
    running in another process (``base``: the larger of the two); each the
    best of ``reps`` batches of ``seconds``; the median ratio of ``tries``
    such measurements (:data:`TRIES`); 0 where it is under
    :data:`MIN_RATIO`. ``apart()``: a context manager during which the twin
    runs in another process (:class:`~legionpy.optimizer.twinproc.TwinProcess`):
    what the caches, the memory system and the cores cost the kernel, the
    lock aside. One BLAS thread; on the node's cores (an MPI rank bound to
    one core would time the helper's turns on it)."""
    from threadpoolctl import threadpool_limits

    switch = sys.getswitchinterval()
    ratios: list[float] = []
    with unbound(), threadpool_limits(1):
        # the lock handed over every 0.1 ms rather than 5: two threads that
        # hold it throughout alternate many times in a batch, so the ratio is
        # their demand for it (the sharing model's fluid terms), not where in
        # a 5 ms turn a short batch happened to fall (shares of such 25-50 us
        # kernels read 0 or 1 from one batch to the next)
        sys.setswitchinterval(1e-4)
        try:
            fn()
            twin()
            n = max(3, int(seconds / max(_wall_per_call(fn, 2), 1e-7)))
            while len(ratios) < tries:
                ratios.append(_ratio(fn, twin, n, reps, apart))
                if sum(r < MIN_RATIO for r in ratios) > tries // 2:
                    break  # the median is under MIN_RATIO whatever the rest read
        finally:
            sys.setswitchinterval(switch)
    if len(ratios) < tries:  # settled under MIN_RATIO before the last try
        return 0.0
    ratio = sorted(ratios)[tries // 2]
    return min(MAX_SHARE, ratio / 2.0) if ratio >= MIN_RATIO else 0.0


def _ratio(fn: Callable[[], Any], twin: Callable[[], Any], n: int, reps: int,
           apart: Callable[[], Any] | None) -> float:
    """One measurement of :func:`lock_share`'s ``two / base``."""
    base = min(_wall_per_call(fn, n) for _ in range(reps))
    two = _beside(fn, n, reps, partial(looping, twin))
    if apart is not None and two >= MIN_RATIO * base:  # else under MIN_RATIO whatever it says
        base = max(base, _beside(fn, n, reps, apart))
    return two / base if base > 0 else 1.0


def measure_shares(table: dict[str, list[float]], runner: Callable, tiles: list,
                   device: Any, times: dict[str, list[float]] | None = None,
                   apart: Callable[[], Any] | None = None) -> bool:
    """Measure the (forward, backward) shares of ``tiles`` (``(op, rect)``)
    that ``table`` lacks, on ``device``; True when any was added. Kept only
    when other programs (an ``mpirun`` job's other ranks included) kept at
    most :data:`BUSY_CORES` busy meanwhile (:func:`legionpy.affinity.cpu_clock`).
    ``times``: the tiles' kernel seconds (``{key: [forward, backward]}``); a
    phase under :data:`TINY_S` is all dispatch and holds the lock throughout
    (share 1, not measured: ~2x measured for every such kernel of the zoo).
    ``apart``: called once there is a share to measure, a
    :class:`~legionpy.optimizer.twinproc.TwinProcess` running ``runner``'s
    kernels, the control of each share (:func:`lock_share`); its CPU
    seconds are not counted as another program's."""
    from .costmodel import cost_key

    todo = [(op, rect, cost_key(op, rect, device.kind)) for op, rect in tiles]
    todo = [t for t in todo if t[2] not in table and t[2] not in _LOADED]
    if not todo:
        return False
    got = {}
    twin_proc = helper = _started(apart)  # helper: its CPU is ours even if it dies
    c0 = cpu_clock()
    helper_s = helper.cpu_s if helper is not None else 0.0
    for op, rect, key in todo:
        took = (times or {}).get(key, (1.0, 1.0))
        if max(took) < TINY_S:
            got[key] = [1.0, 1.0]
            continue
        f, b = runner(op, rect, device)
        f2, b2 = runner(op, rect, device)  # the second thread's own arrays
        shares = []
        for ph, (fn, twin, t) in enumerate(((f, f2, took[0]), (b, b2, took[1]))):
            if t < TINY_S:
                shares.append(1.0)
                continue
            try:
                shares.append(lock_share(fn, twin, apart=None if twin_proc is None else
                                         partial(twin_proc.running, op, rect, device, ph)))
            except _HELPER_ERRORS as e:  # the helper died: the thread twin alone from here
                _no_control(e)
                twin_proc = None
                shares.append(lock_share(fn, twin))
        got[key] = shares
    c1 = cpu_clock()
    bg = own_background(c0, c1)
    if bg is not None and helper is not None:
        bg = max(0.0, bg - (helper.cpu_s - helper_s) / max(c1[0] - c0[0], 1e-9))
    if bg is not None and bg > BUSY_CORES:
        # other programs (or the job's other ranks) took a core: two threads
        # were short of cores whatever the lock did; the cap stands, in this
        # process (a later process measures again)
        _LOADED.update(key for _, _, key in todo)
        return False
    table.update(got)
    return True


#: what a failed or dead helper process raises (optimizer/twinproc.py)
_HELPER_ERRORS = (OSError, EOFError, TimeoutError, TwinError)


def _no_control(e: BaseException) -> None:
    print(f"legionpy: the lock shares are measured without their control (a kernel's twin "
          f"in another process could not run: {e}); a share may read a slowdown the memory "
          "system causes as the lock's", file=sys.stderr, flush=True)


def _started(apart: Callable[[], Any] | None) -> Any:
    """``apart()``, the helper process, or None (said on stderr) where it
    cannot start."""
    if apart is None:
        return None
    try:
        return apart()
    except _HELPER_ERRORS as e:
        _no_control(e)
        return None


def op_shares(table: dict[str, list[float]], graph: Any, strategy: Any,
              device_kind: str) -> dict[tuple[str, str], float]:
    """``{(op name, "F" | "B"): share}`` of ``strategy``'s tiles in
    ``table`` (the largest of an op's tiles, which an equal split makes
    alike); ops with none measured are left out."""
    from .costmodel import cost_key

    out: dict[tuple[str, str], float] = {}
    for op in graph.ops:
        if op.kind == "input":
            continue
        for rect in op.output_rect.split(strategy[op.name].degrees):
            hit = table.get(cost_key(op, rect, device_kind))
            if hit is None:
                continue
            for phase, share in zip("FB", hit):
                k = (op.name, phase)
                out[k] = max(out.get(k, 0.0), float(share))
    return out


def contention(share: float) -> float:
    """How much slower a kernel of measured ``share`` (:func:`lock_share`,
    up to :data:`MAX_SHARE`) runs while another thread of its process wants
    the lock, beyond waiting for it: the share's excess over 1 (the lock
    held throughout), at least 1 and at most :data:`MAX_SHARE`.

    >>> contention(0.4), contention(1.0), contention(1.5), contention(2.6)
    (1.0, 1.0, 1.5, 1.5)
    """
    return min(MAX_SHARE, max(1.0, float(share)))


def cache_file(cost_cache_path: str) -> str:
    """The shares' cache beside a step cost model's table (v3: shares over 1
    kept, :data:`MAX_SHARE`; v4: over the twin in another process's time,
    :mod:`.twinproc`; v5: the median of :data:`TRIES` measurements)."""
    return os.path.join(os.path.dirname(os.path.abspath(cost_cache_path)),
                        f"locks-step-cpu-{TABLES}-v5.json")
