"""Processor sharing of the interpreter lock and the cores (issue 26).

The local machine model's re-scheduler
(:func:`legionpy.optimizer.fidelity.simulate_with_runtime`) runs the
simulator's task graph on threads: one per device and per link (the
runtime's FIFO queue workers, runtime/scheduler.py) and one control thread
per process. Python threads of one process share its interpreter lock
(GIL), and every thread shares the machine's cores. A thread holding the
lock keeps it until it blocks or a numpy call gives it up for a large
loop, and a thread wanting it back waits for the holder (the convoy effect:
Beazley, "Understanding the Python GIL", PyCon 2010; CPython's
``ceval_gil.h``): in the traces, the tasks of small kernels of a process
run strictly one after another, while tasks whose numpy calls release the
lock interleave, each slowed by the hand-overs. One stretch of the lock
held before a task starts, the previous model, let a process's tasks
overlap more than they do: one-process steps came out 25-35% low.

This module schedules the graph as a fluid (processor-sharing) system, the
model of time-shared resources since Kleinrock (1967) and of CPU sharing in
cluster simulators (e.g. SimGrid's max-min fair sharing, Casanova et al.,
JPDC 2014):

* each running task (or control thread) ``j`` has ``work`` seconds to do at
  full speed, a fraction ``a_j`` of it Python (needs its process's lock),
  the rest free (numpy loops that release it), interleaved evenly;
* it progresses at rate ``x_j <= 1``, with ``sum_j a_j x_j <= 1`` per
  process. Who gets the lock: first come, first served (the default,
  ``fair=False``) -- the thread that has been busy longest takes what it
  needs and the others what it leaves, so tasks that hold the lock
  throughout (small kernels) run one at a time, as the traces show (a
  thread keeps the lock until it blocks: the convoy), while kernels that
  release it overlap; a thread keeps its seniority while it has work
  queued, the control thread is the most senior. While two or more threads
  of a process actually interleave, every hand-over costs: each runs at
  ``1 / (1 + switch * w)`` of its share (calibrated on synthetic models:
  ``RuntimeOverhead.gil_switch``; overlapping LSTM cells were measured at
  3-5x their time alone), ``w`` growing with how often the lock changes
  hands (:func:`handover_weight`); a kernel that releases the lock for
  nine-tenths of its time or more takes it twice per kernel and neither
  pays nor causes that cost (:data:`FREE_PYTHON`). ``fair=True``: max-min
  fair shares of a lock of capacity ``1 / (1 + switch)`` instead;
* two or more threads of a process whose kernels hand the lock over at
  every numpy call (a measured lock share over 1: ``contention``,
  :func:`legionpy.optimizer.lockshare.contention`) take turns call by
  call, and each hand-over costs: while two such want the lock, each gets
  its contention times less done for the lock it holds (two threads of
  LSTM cells of 16 x 64 took 1.4x as long as one after the other, each
  burning 1.8x the CPU per cell). Beside a thread that keeps the lock (the
  control thread) a kernel waits its turn at no cost;
* all threads of all processes share ``cores``: when the rates add up to
  more, each is scaled down alike (0: no core limit);
* a worker whose queue was empty takes ``wake`` seconds to start the task
  that arrives (no core, no lock meanwhile); so does a worker whose task
  waited for its process's lock, when the lock comes to it: both sleep on
  a condition variable (CPython's lock is one) and the OS must wake them
  (on the saved calibrations of 27 Nov this took the zoo's mean error from
  6.9, 8.5, 12.7, 7.4% to 6.6, 7.9, 13.1, 6.7%, rnntc's model-parallel row
  2-5 points closer each time);
* rates change only when a task starts or ends; between those events each
  thread's remaining work falls linearly.

Each device and link stays a FIFO resource (its ready tasks start in order
of readiness, ties by id: the simulator's rule), so the task graph and every
resource's order are the simulator's; only the durations stretch. With
every ``a_j = 0`` and no core limit it is the plain list schedule.

>>> # two tasks of 1 s, all Python, on two devices of ONE process: 2 s in all
>>> r = share_schedule(["cpu0", "cpu1"], [0, 0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0],
...                    [[], []], cores=2)
>>> [round(e, 6) for e in r["end"]]
[2.0, 2.0]
>>> r = share_schedule(["cpu0", "cpu1"], [0, 0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0],
...                    [[], []], cores=2, fair=False)
>>> [round(e, 6) for e in r["end"]]
[1.0, 2.0]
>>> # the same in two processes (a lock each): 1 s each
>>> r = share_schedule(["cpu0", "cpu1"], [0, 1], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0],
...                    [[], []], cores=2)
>>> [round(e, 6) for e in r["end"]]
[1.0, 1.0]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

__all__ = ["share_schedule", "share_rates", "handover_weight", "HANDOVER_GAIN",
           "FREE_PYTHON"]

_EPS = 1e-15
#: seconds of control work within which a task counts as issued (float error
#: in the control thread's progress must not leave an issue a step away)
_ISSUE_TOL = 1e-12


def share_rates(threads: Sequence[tuple], cores: float,
                switch: float = 0.0, fair: bool = True,
                core_groups: dict[int, tuple[int, float]] | None = None) -> list[float]:
    """Progress rates of running threads ``(process, python fraction[,
    cores used[, yields[, spans[, contention]]]])`` (module doc; ``yields``:
    the thread gives the lock up at once whenever another wants it -- a
    copy or collective waiting on its transfer -- so it neither pays nor
    causes hand-over costs; ``contention``: its kernel's hand-over cost
    beside another such, :func:`_contended`): max-min fair shares of each
    process's lock,
    capacity ``1 / (1 + switch)`` when two or more of its threads want it,
    then the cores (``cores`` <= 0: unlimited) shared alike, a thread using
    ``cores used`` (default 1) of them at full speed.

    >>> share_rates([(0, 1.0), (0, 1.0)], cores=0)
    [0.5, 0.5]
    >>> share_rates([(0, 1.0), (0, 0.25)], cores=0)    # the light one keeps full speed
    [0.75, 1.0]
    >>> share_rates([(0, 0.0), (1, 0.0), (1, 0.0)], cores=2)   # 3 free threads, 2 cores
    [0.6666666666666666, 0.6666666666666666, 0.6666666666666666]

    ``fair`` False: first come, first served -- ``threads`` in order of
    seniority, each takes what it needs of what the senior ones left:

    >>> share_rates([(0, 1.0), (0, 1.0)], cores=0, fair=False)
    [1.0, 0.0]
    >>> share_rates([(0, 0.25), (0, 1.0)], cores=0, fair=False)
    [1.0, 0.75]
    >>> [round(v, 6) for v in share_rates([(0, 0.25), (0, 1.0)], cores=0, switch=0.25,
    ...                                    fair=False)]
    [0.8, 0.6]

    ``core_groups``: processes bound to cores (legionpy/affinity.py),
    process -> (its group of cores, the group's cores); the threads of a
    group's processes share only its cores, and a thread that keeps ranks
    of several processes busy (a copy or collective between ranks, listed in
    its optional fifth element) uses one core of each of their groups.
    Three free threads: two of process 0 on its one core, one of process 1
    on its own:

    >>> share_rates([(0, 0.0), (0, 0.0), (1, 0.0)], cores=2,
    ...             core_groups={0: (0, 1.0), 1: (1, 1.0)})
    [0.5, 0.5, 1.0]
    """
    x = [1.0] * len(threads)
    by_proc: dict[int, list[int]] = {}
    for j, th in enumerate(threads):
        p, a = th[0], th[1]
        if a > 0:
            by_proc.setdefault(p, []).append(j)
    slow = [k for js in by_proc.values() for k in _contended(threads, js)]
    for js in by_proc.values():
        cap = 1.0 if len(js) < 2 else 1.0 / (1.0 + switch)
        need = [threads[j][1] for j in js]
        if sum(need) <= cap:
            continue
        if not fair:  # the senior threads keep the lock (the convoy)
            left = 1.0
            for j in js:
                x[j] = min(1.0, left / threads[j][1])
                left = max(0.0, left - threads[j][1] * x[j])
            shared = [j for j in js if x[j] > 0 and threads[j][1] > FREE_PYTHON
                      and not (len(threads[j]) > 3 and threads[j][3])]
            if len(shared) > 1:  # they interleave: every hand-over costs
                w = handover_weight([threads[j][1] * x[j] for j in shared])
                for j in shared:
                    x[j] /= 1.0 + switch * w
            continue
        # water-filling: the lock share lam with sum(min(a_j, lam)) == cap
        order = sorted(range(len(js)), key=lambda k: need[k])
        left, rest = cap, len(js)
        lam = 0.0
        for k in order:
            if need[k] * rest <= left:
                left -= need[k]
                rest -= 1
            else:
                lam = left / rest
                break
        for k, j in enumerate(js):
            if need[k] > lam:
                x[j] = lam / need[k]
    for j, k in slow:  # the lock's hand-overs inside the kernels: held as long, less done
        x[j] /= k
    if cores > 0 and core_groups:
        _share_groups(threads, x, core_groups)
    elif cores > 0:
        tot = sum(v * (th[2] if len(th) > 2 else 1.0) for v, th in zip(x, threads))
        if tot > cores:
            f = cores / tot
            # a thread using no core and no lock (waking up) keeps its pace
            x = [v * f if th[1] > 0 or len(th) < 3 or th[2] > 0 else v
                 for v, th in zip(x, threads)]
    return x


#: how fast the hand-over cost of a first-come lock grows with the share of
#: it the junior threads take (:func:`handover_weight`); fitted offline on
#: four one-process calibrations' rows and benches of 28-29 Nov (R37, R39,
#: R45, R47): with 10 the benches' mean errors were 5.6, 8.7, 8.3, 6.7%
#: against 6.2, 10.1, 8.9, 8.0% with the cost all or nothing, with 5 and
#: 20 worse on two of them
HANDOVER_GAIN = 10.0

#: a thread whose Python is at most this part of its work (a kernel that
#: releases the lock for 90% of its time or more: alexnet's and lenet's
#: im2col convolutions and wide GEMMs, their lock shares 0) takes the lock
#: about twice per kernel, at its dispatch and its return, not at every
#: numpy call: it neither pays nor causes the hand-over cost, like a thread
#: that yields (:func:`share_rates`). Charged the cost, a convolution
#: backward of 1.38 ms ran 3.3 ms in the model beside the other device's
#: Python (29 Nov), and alexnet's two-device rows in one process read +10%
#: on average over ten quiet benches. Refitted on five of those
#: calibrations with their own lock shares (R65-R74), the benches' mean
#: error went 7.4, 5.7, 8.5, 5.6, 7.2% -> 6.3, 4.9, 8.4, 5.1, 6.1% and
#: alexnet's data / owt rows +11 / +10, +13 / +8, +6 / +5, +11 / +9% ->
#: +2 / +2, +4 / -1, -2 / -2, +2 / +0% (in R70, whose calibration read
#: alexnet's first convolution lock-bound, +21 / +20% both ways); 0.2 did
#: no better. Under ``mpirun`` the fit takes no hand-over cost (one device
#: per process), so nothing moves there
FREE_PYTHON = 0.1


def handover_weight(use: Sequence[float]) -> float:
    """The part of the full hand-over cost ``switch`` that threads
    interleaving on a first-come lock pay (:func:`share_rates`), given the
    lock each uses, the senior first: the lock changes hands about as often
    as the juniors take it, and as often as the senior takes it back, so the
    cost grows with the smaller of the juniors' share ``u`` and the
    senior's, ``HANDOVER_GAIN * min(u, 1 - u)``, up to all of it. A junior
    that gets 1% of the lock (a kernel whose Python is 99% of it, beside
    another such) barely slows the senior; with the cost all or nothing it
    halved the senior's pace for as long as they ran together, and the
    prediction jumped when a measured share crossed 1 (rnntc owt, one
    process, 29 Nov: predicted 19.4 ms, measured 14.0).

    >>> round(handover_weight([0.99, 0.01]), 6), handover_weight([0.5, 0.5]), handover_weight([1.0])
    (0.1, 1.0, 0.0)
    """
    tot = sum(use)
    if len(use) < 2 or tot <= 0:
        return 0.0
    u = (tot - use[0]) / tot
    return min(1.0, HANDOVER_GAIN * min(u, 1.0 - u))


def _contended(threads: Sequence[tuple], js: list[int]) -> list[tuple[int, float]]:
    """``(thread, contention)`` of the threads ``js`` of one process (those
    wanting its lock) whose task's contention (``threads[j][5]``,
    :func:`legionpy.optimizer.lockshare.contention`) is over 1, when two or
    more such threads want it: their kernels hand the lock over at every
    numpy call, so they take turns call by call, and each hand-over costs
    besides the wait. Such a thread holds the lock as long as its share
    says and gets that much less done. Beside a thread that keeps the lock
    (the control thread's Python, a task's own Python) or gives it up (a
    copy's wait), a kernel just waits its turn: no cost.

    >>> _contended([(0, 1.0, 1.0, False, (), 1.5), (0, 1.0, 1.0, False, (), 1.2)], [0, 1])
    [(0, 1.5), (1, 1.2)]
    >>> _contended([(0, 1.0, 1.0, False, (), 1.5), (0, 1.0, 1.0, False, (), 1.0)], [0, 1])
    []
    """
    def k(j: int) -> float:
        yields = len(threads[j]) > 3 and threads[j][3]
        return 1.0 if yields or len(threads[j]) < 6 else threads[j][5]

    hand = [j for j in js if k(j) > 1.0]
    return [(j, k(j)) for j in hand] if len(hand) > 1 else []


def _share_groups(threads: Sequence[tuple], x: list[float],
                  core_groups: dict[int, tuple[int, float]]) -> None:
    """Scale ``x`` in place so no group of cores is asked for more than it
    has (:func:`share_rates`' ``core_groups``); a thread spanning groups
    takes the smallest of their factors."""
    def spans(th: tuple) -> tuple:
        procs = th[4] if len(th) > 4 and th[4] else (th[0],)
        # the thread's cores (default 1), shared alike by the processes it keeps busy
        each = (th[2] if len(th) > 2 else 1.0) / len(procs)
        return tuple((core_groups.get(p, (p, 1.0))[0], each) for p in procs)

    load: dict[int, float] = {}
    used = []
    for v, th in zip(x, threads):
        sp = spans(th)
        used.append(sp)
        for g, c in sp:
            load[g] = load.get(g, 0.0) + v * c
    cap = {g: c for g, c in core_groups.values()}
    factor = {g: min(1.0, cap.get(g, 1.0) / tot) if tot > 0 else 1.0
              for g, tot in load.items()}
    for j, (th, sp) in enumerate(zip(threads, used)):
        # a thread using no core and no lock (waking up) keeps its pace
        if th[1] > 0 or len(th) < 3 or th[2] > 0:
            x[j] *= min((factor[g] for g, _ in sp), default=1.0)


def _behind(threads: Sequence[tuple], x: list[float], back: list[int], cores: float,
            core_groups: dict[int, tuple[int, float]] | None) -> None:
    """Rates, in place, of the threads ``back`` (all-Python control threads
    behind every other thread of their process: ``share_schedule``'s
    ``issue``): what the others (their rates in ``x``) leave of their
    process's lock and of its cores, at most full speed.

    >>> x = [0.25, 0.0]   # a worker at a quarter speed in a numpy kernel, all Python
    >>> _behind([(0, 1.0), (0, 1.0)], x, [1], cores=0, core_groups=None); x
    [0.25, 0.75]
    >>> x = [1.0, 0.0]    # a worker releasing the lock, alone on its process's one core
    >>> _behind([(0, 0.1), (0, 1.0)], x, [1], cores=1, core_groups={0: (0, 1.0)}); x
    [1.0, 0.0]
    """
    ahead = [j for j in range(len(threads)) if j not in back]
    for j in back:
        p = threads[j][0]
        lock = 1.0 - sum(threads[k][1] * x[k] for k in ahead if threads[k][0] == p)
        core = float("inf")
        if cores > 0:
            if core_groups:
                g, cap = core_groups.get(p, (p, 1.0))
                used = 0.0
                for k in ahead:
                    procs = threads[k][4] if len(threads[k]) > 4 and threads[k][4] \
                        else (threads[k][0],)
                    each = (threads[k][2] if len(threads[k]) > 2 else 1.0) / len(procs)
                    used += x[k] * each * sum(1 for q in procs
                                              if core_groups.get(q, (q, 1.0))[0] == g)
                core = cap - used
            else:
                core = cores - sum(x[k] * (threads[k][2] if len(threads[k]) > 2 else 1.0)
                                   for k in ahead)
        x[j] = max(0.0, min(1.0, lock, core))


#: the least of a group's cores its other threads keep beside polling waits
_POLL_FLOOR = 0.05


def _polled(core_groups: dict[int, tuple[int, float]] | None, poll: Sequence[float],
            running: dict, procs_of: Callable[[int], tuple]
            ) -> dict[int, tuple[int, float]] | None:
    """``core_groups`` less the cores the running tasks' polls take
    (:func:`share_schedule`'s ``poll``): each polling task takes ``poll[i]``
    of a core from the group of every process it spans.

    >>> _polled({0: (0, 1.0), 1: (1, 1.0)}, [0.2], {"c": [1.0, 0, 0.0, 0]},
    ...         lambda i: (0, 1))
    {0: (0, 0.8), 1: (1, 0.8)}
    """
    if not core_groups:
        return core_groups
    taken: dict[int, float] = {}
    for entry in running.values():
        i = entry[3]
        if i >= 0 and poll[i] > 0:
            for p in procs_of(i):
                g = core_groups.get(p, (p, 1.0))[0]
                taken[g] = taken.get(g, 0.0) + poll[i]
    if not taken:
        return core_groups
    return {p: (g, max(_POLL_FLOOR * c, c - taken.get(g, 0.0)))
            for p, (g, c) in core_groups.items()}


def share_schedule(res: Sequence[str], proc: Sequence[int], work: Sequence[float],
                   python: Sequence[float], ready: Sequence[float],
                   succs: Sequence[Sequence[int]], cores: float = 0.0, switch: float = 0.0,
                   control: Sequence[float] = (), weight: Sequence[float] | None = None,
                   wake: float = 0.0, fair: bool = True,
                   spread: Sequence[tuple[int, ...]] | None = None,
                   core_groups: dict[int, tuple[int, float]] | None = None,
                   control_after: Sequence[int] = (),
                   delay: Sequence[float] | None = None,
                   contention: Sequence[float] | None = None,
                   issue: Sequence[float] | None = None,
                   poll: Sequence[float] | None = None) -> dict:
    """Schedule tasks on FIFO resources under processor sharing (module doc).

    ``res[i]``: task i's resource (a thread), ``proc[i]``: its process,
    ``work[i]``: seconds at full speed, ``python[i]``: the fraction of them
    that holds the lock, ``ready[i]``: the earliest start (its issue),
    ``succs[i]``: the tasks that wait for it. ``control[p]``: seconds of
    all-Python work of process p's control thread, running from time 0, or,
    given ``control_after`` (task ids), from when the last of those tasks
    ends (``fit`` launches the next step once this step's loss has arrived).
    ``weight[i]``: the cores task i keeps busy at full speed (default 1; a
    copy between two processes: its sender and its receiver, both waiting
    on the transfer, runtime/mpi.py ``Cluster.wait``). ``wake``: seconds a
    thread takes to wake up when a task arrives at its idle resource (the
    worker sleeps on its queue; then it must get its process's lock), no
    core or lock used meanwhile; a task queued while the resource is busy
    starts as the previous one ends. ``fair`` False: the lock goes first
    come, first served (:func:`share_rates`), a thread keeping its seniority
    while it has work queued. ``spread[i]``: the processes whose cores task
    i keeps busy (a copy or collective between ranks; default its own); such
    a task's thread waits on the transfer and gives the lock up whenever
    another wants it (``yields``, :func:`share_rates`). ``core_groups``: the
    processes' cores when each is bound to its own (:func:`share_rates`).
    ``delay[i]``: seconds task i waits once it has its resource (after any
    wake-up), using neither a core nor the lock (a copy between processes:
    the other side's thread seeing it). ``contention[i]``: task i's
    kernel's hand-over cost beside another such (:func:`share_rates`; 1:
    none). ``issue[i]``: the seconds of its process's control work done
    before task i is issued (its launch): the control threads then run from
    time 0 *behind* every other thread of their processes, on the lock and
    the cores they leave (a rank whose threads share one core: the control
    thread yields it, and a worker keeps it for its whole kernel), and a task
    joins its resource's queue once its inputs are ready and every process
    it spans has issued it (:func:`_behind`). ``poll[i]``: the share of a
    core task i's wait takes from each process it spans while it runs, on
    top of its ``weight`` (a collective's thread waking every 50 us to poll
    MPI, on a rank whose threads share one core: ``core_groups``); the
    other threads of those processes share what is left. Returns ``{"start", "end"}`` per
    task (``start``: when its work begins -- after any wake-up, and once it
    gets a share of its lock), ``"admit"`` (when it got its resource), and
    ``"control_start"`` and
    ``"control_end"`` per process.
    """
    n = len(res)
    preds = [0] * n
    for s in succs:
        for t in s:
            preds[t] += 1
    arrivals: list[tuple[float, int]] = [(ready[i], i) for i in range(n) if preds[i] == 0]
    heapq.heapify(arrivals)
    queues: dict[str, list[tuple[float, int]]] = {}
    busy: set[str] = set()
    start = [0.0] * n
    admit = [0.0] * n  # when the task got its resource (before any wake-up)
    end = [0.0] * n
    # running threads: key -> [remaining work, process, python fraction, task id or -1 - p,
    # cores used, yields, processes spanned]
    running: dict[object, list] = {}
    idle_since: dict[str, float] = {}  # when each resource's thread last ran out of work
    waking: set = set()  # resources whose thread is waking up for its next task
    blocked: set = set()  # threads waiting for their process's lock
    stash: dict = {}  # a thread's task while it wakes up for the lock handed to it
    senior: dict[object, int] = {}  # thread -> when (event count) it last became busy
    begun: set = set()  # tasks that have had a share of their lock
    events = 0
    trigger = set(control_after)
    control_start = [0.0] * len(control)

    def task_entry(i: int) -> list:
        span = spread[i] if spread is not None else ()
        return [work[i], proc[i], python[i], i, 1.0 if weight is None else weight[i],
                bool(span), span, 1.0 if contention is None else contention[i]]

    def wake_entry(i: int, seconds: float) -> list:  # waking up for task i: no core, no lock
        return [seconds, proc[i], 0.0, i, 0.0, True, (), 1.0]

    def start_control() -> None:
        for p, c in enumerate(control):
            control_start[p] = t
            if c > 0:
                running[("control", p)] = [c, p, 1.0, -1 - p, 1.0, False, (), 1.0]

    control_end = [0.0] * len(control)
    t = 0.0
    gated = issue is not None
    if gated:
        trigger = set()
    # tasks whose inputs are ready, not yet issued by every process they span:
    # per such tuple of processes, a heap of (issue, task)
    unissued: dict[tuple, list[tuple[float, int]]] = {}

    def procs_of(i: int) -> tuple:
        return tuple(spread[i]) if spread is not None and spread[i] else (proc[i],)

    def progress(p: int) -> float:  # the control work process p has done
        c = running.get(("control", p))
        return control[p] if c is None else control[p] - c[0]

    def issued(q: float, procs: tuple) -> bool:
        return all(progress(p) >= q - _ISSUE_TOL for p in procs)

    def arrive(i: int, at: float) -> None:
        if gated and not issued(issue[i], procs_of(i)):
            heapq.heappush(unissued.setdefault(procs_of(i), []), (issue[i], i))
        else:
            heapq.heappush(arrivals, (max(ready[i], at), i))

    if not trigger:
        start_control()
    if gated:
        first, arrivals = arrivals, []
        for r, i in first:
            arrive(i, r)
    done = 0
    rates: list[float] = []
    keys: list = []
    dirty = True
    while done < n or running:
        for procs, h in unissued.items():  # the control threads have issued them by now
            while h and issued(h[0][0], procs):
                i = heapq.heappop(h)[1]
                heapq.heappush(arrivals, (max(ready[i], t), i))
        # tasks whose inputs are ready by now join their resources' queues
        while arrivals and arrivals[0][0] <= t:
            r, i = heapq.heappop(arrivals)
            heapq.heappush(queues.setdefault(res[i], []), (r, i))
        for name, q in queues.items():
            if q and name not in busy:
                r, i = heapq.heappop(q)
                busy.add(name)
                start[i] = admit[i] = t
                idle = r > idle_since.get(name, float("-inf"))  # idle until now
                if idle:
                    events += 1
                    senior[name] = events
                # the thread slept on its empty queue: it wakes first; a
                # delayed task waits besides
                pause = (wake if idle else 0.0) + (delay[i] if delay is not None else 0.0)
                if pause > 0:
                    running[name] = wake_entry(i, pause)
                    waking.add(name)
                else:
                    running[name] = task_entry(i)
                dirty = True
        if dirty:
            keys = sorted(running, key=lambda k: senior.get(k, 0)) if not fair else list(running)
            threads = [(running[k][1], running[k][2], running[k][4], running[k][5],
                        running[k][6], running[k][7]) for k in keys]
            groups = _polled(core_groups, poll, running, procs_of) if poll else core_groups
            if gated:  # the control threads take what the others leave
                back = [j for j, k in enumerate(keys) if running[k][3] < 0]
                front = [j for j in range(len(keys)) if running[keys[j]][3] >= 0]
                got = share_rates([threads[j] for j in front], cores, switch, fair, groups)
                rates = [0.0] * len(keys)
                for j, v in zip(front, got):
                    rates[j] = v
                _behind(threads, rates, back, cores, groups)
            else:
                rates = share_rates(threads, cores, switch, fair, groups)
            dirty = False
            for k, x in zip(keys, rates):
                i = running[k][3]
                if k in waking:
                    continue
                if x <= 0 and running[k][2] > 0:
                    blocked.add(k)  # waits for its process's lock
                elif x > 0 and k in blocked:
                    blocked.discard(k)
                    if wake > 0 and i >= 0:
                        # the lock passes to a worker asleep on it: it wakes first
                        stash[k] = running[k]
                        running[k] = wake_entry(i, wake)
                        waking.add(k)
                        dirty = True
                        continue
                if x > 0 and i >= 0 and i not in begun:
                    begun.add(i)
                    start[i] = t
            if dirty:
                continue
        nxt = arrivals[0][0] if arrivals else float("inf")
        dt = nxt - t
        for k, x in zip(keys, rates):
            if x > 0:
                dt = min(dt, running[k][0] / x)
        if gated:  # the next issue of a waiting task
            pace = {-1 - running[k][3]: x for k, x in zip(keys, rates)
                    if x > 0 and running[k][3] < 0}
            for procs, h in unissued.items():
                for p in procs:
                    left = h[0][0] - progress(p) if h and p in pace else 0.0
                    if left > _ISSUE_TOL:
                        dt = min(dt, left / pace[p])
        if dt == float("inf"):
            raise ValueError(f"task graph has a cycle: {n - done} of {n} tasks never ran")
        t += dt
        finished = []
        for k, x in zip(keys, rates):
            rem = running[k][0] - x * dt
            running[k][0] = rem
            if rem <= _EPS * max(1.0, t):
                finished.append(k)
        for k in finished:
            dirty = True
            if k in waking:  # awake: the task's work begins (or goes on)
                waking.discard(k)
                i = running[k][3]
                if k in stash:
                    running[k] = stash.pop(k)
                    continue
                start[i] = t
                running[k] = task_entry(i)
                if work[i] > _EPS * max(1.0, t):
                    continue
                running.pop(k)
            else:
                i = running.pop(k)[3]
            if i < 0:
                control_end[-1 - i] = t
                continue
            end[i] = t
            idle_since[res[i]] = t
            done += 1
            if i in trigger:
                trigger.discard(i)
                if not trigger:
                    start_control()
            busy.discard(res[i])
            for s in succs[i]:
                preds[s] -= 1
                if preds[s] == 0:
                    arrive(s, t)
    return {"start": start, "end": end, "admit": admit, "control_end": control_end,
            "control_start": control_start}
