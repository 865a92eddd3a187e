"""CUDA graphs for replayed traces: capture each device's fixed order once,
launch it as graphs afterwards.

A replayed trace (runtime/tracing.py) submits the same ops in the same
per-queue order every step, each op a Python body that issues a handful of
kernels. When every op of the trace is on this process's GPUs (or links
between them) the replay is cut, per device, into *segments*, each captured
once into a CUDA graph (``cupy.cuda.Stream.begin_capture`` /
``end_capture``) and, on later replays, launched with one
``cupy.cuda.Graph.launch`` per segment instead of running its ops' bodies.
With ``LEGIONPY_GPU_BACKEND=emulated`` the capture is runtime/emugraph.py's.
docs/gpu.md ("CUDA graphs") says why it has this shape; the summary:

Segments
--------
A segment is a run of one GPU's fixed replay order (``Template.prev``
chains) of *capturable* ops, cut so that only its first op waits for
anything outside it (other than ops its first op already waits for,
transitively) and only its last op has successors on another queue or is
waited for by a host read or write of the block. Offsets (submission order)
increase along a segment. Contracting such runs keeps the replay's
dependence graph acyclic and every cross-queue dependence a segment
boundary, so the graphs overlap with copies exactly as the live ops did.

On replay each member op is submitted as a marker (no queue, no body) that
waits for the segment's *runner*, one op on the device's queue submitted
with the segment's last member; the runner waits for every outside
dependence of the members and then

- ``launch``: launches the segment's graph (the steady state);
- ``probe`` (a segment's first run): runs the bodies live; ops that return
  a value and, on the emulated backend, ops that synchronise with the host
  become live;
- ``capture``: captures the members' bodies on the device's compute stream,
  ends the capture and launches the graph once (the next replay, or after an
  invalidation);
- ``live``: runs the members' bodies in order (an op turned out not to be
  capturable, or the graph is stale).

Capturable: a point task (PointBody) on a GPU of this process, without
Future arguments, whose prologue folds no staged copy (a staging array
comes from a pool at each copy), and not found live. An op is found *live*
when

- capturing it raised GraphCaptureError (a host transfer or
  synchronisation: ``.item()``, ``float()``, ``cupy.asarray`` of host data,
  ``synchronize``, boolean masks; the members after it are then captured one
  by one, and discarded, to find every such op in one replay);
- its body returned a value (a host value, or a device array the graph would
  overwrite at the next launch while a Future still holds it);
- its plain arguments differ from those of the replay it was captured in
  (a graph replays the kernel parameters it captured: a step counter, a
  learning rate, an input batch passed by value).

Python state: a graph launch runs no Python, so a body's Python-side state
(the layer API's F and B of a tile share the tile's cache through their
object) keeps the arrays of the body's last Python run, which the graph
rewrites in place. Bodies that are methods of the same object at the same
point form a *group*: an op found live makes its whole group live for good
(every runner checks this when it runs, so a later member of the group in
the same replay already runs live), and whenever members of a group run
Python (captured, or live with a segment that had to run live), the graphs
of the group's other segments captured in an earlier replay are dropped and
captured again when they next run, so graph arrays and Python state agree.
The segments are rebuilt at the next replay.
Copies run live (emulated copies stage through the host; a capturable peer
copy on link streams is future work).

Memory: a graph writes the addresses it captured. Instances are fixed
across replays; the temporaries a capture allocates are kept for the
graph's life (emulated: the graph holds its arrays; CuPy: a capture-time
allocator, ``cupy.cuda.using_allocator``, whose allocations the segment
keeps). Reduction buffers come from a pool at every step and go back after
their last consumer (docs/memory.md): a launch first takes the buffers its
graph made back out of the pool (all or none), checks that the buffers made
before it are the captured arrays, and reports the folds it ran as
consumed; a buffer made and consumed inside one graph is the graph's own.
A grown instance (``Instances.generation``), a buffer that is not the
captured array, or a group's Python running elsewhere makes a graph stale:
it is captured again, and past ``STALE_LIMIT`` times in a row (no launch
between) its segment runs live for good. A re-recorded trace
(``set_strategy``, a new mapper) drops its graphs with it.

``LEGIONPY_CUDA_GRAPHS=0`` turns graphs off. A trace with an op on a CPU
device or another rank, or replayed in readiness order
(``LEGIONPY_REPLAY_ORDER=ready``: no fixed order), is replayed without
graphs; ``LEGIONPY_DEBUG=1`` says why.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..errors import GraphCaptureError, TaskError
from . import gpu
from .body import PointBody
from .graphcap import CupyCapture, EmuCapture, buffer_keys, reclaim, take_out
from .scheduler import Op

__all__ = ["Graphs", "Plan", "Segment", "enabled"]


#: a segment whose graph went stale more often than this in a row, without a
#: launch between, runs live from then on (it would be captured at every
#: step; a fence, which drops the buffers, costs one capture and counts once)
STALE_LIMIT = 2


def enabled() -> bool:
    """``LEGIONPY_CUDA_GRAPHS``: unset (the default) or 1; 0 turns graphs off."""
    return os.environ.get("LEGIONPY_CUDA_GRAPHS", "1").strip() != "0"


def forced() -> bool:
    """``LEGIONPY_CUDA_GRAPHS=1``: graphs even where the backend cannot
    capture every kernel (the ops it refuses run live)."""
    return os.environ.get("LEGIONPY_CUDA_GRAPHS", "").strip() == "1"


class Segment:
    """A run of one GPU's fixed order captured as one graph."""

    __slots__ = ("queue", "k", "members", "graph", "gen", "args", "keep", "captures",
                 "launches", "when", "bufs", "probed", "consumes", "stale")

    def __init__(self, queue: int, k: int, members: tuple[int, ...]) -> None:
        self.queue, self.k, self.members = queue, k, members
        self.graph: Any = None
        self.gen = -1  # Instances.generation when captured
        self.args: dict[int, Any] = {}  # offset -> plain arguments captured
        self.keep: list = []  # CuPy: the capture's allocations
        self.captures = self.launches = 0
        self.when = -1  # the replay (Graphs.replays) that captured it
        #: [(key, array, rect, memory, made by the capture?)]: the reduction
        #: buffers its graph uses (see Replay._buffers)
        self.bufs: list[tuple] = []
        self.probed = False  # its members ran once under a probe for host syncs
        self.stale = 0  # stale in a row, no launch between (past STALE_LIMIT: live)
        #: reduction buffers its members' prologues fold (their graph reads
        #: them): a launch reports each consumed, as the folds' Python would
        self.consumes: list = []

    def __repr__(self) -> str:
        return f"<Segment GPU {self.queue}: ops {list(self.members)}>"


class Plan:
    """The segments of one recording, and what was found live."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.live: set[int] = set()
        self.segs: list[Segment] = []
        self.seg_of: dict[int, Segment] = {}
        self.group_of: dict[int, Any] = {}  # offset -> its group (see _group)
        self.dirty = True
        self.why_not: str | None = None


class Graphs:
    """Per-Runtime CUDA graph state (see the module docstring)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.on = enabled() and any(d.kind == "gpu" for d in rt.local)
        self.cap: Any = None  # the capture backend, made on first use
        #: why graphs are off although asked for (the backend cannot capture)
        self.why_off: str | None = None
        if self.on and not forced():
            self.why_off = self.backend().unsupported()
            if self.why_off is not None:
                self.on = False
                _debug(rt, f"CUDA graphs are off: {self.why_off}; LEGIONPY_CUDA_GRAPHS=1 "
                           "uses them anyway (the ops it refuses run live)")
        self.replays = 0  # replays started (a capture remembers which)
        #: ``captured``: segments captured; ``launched``: graph launches;
        #: ``replaced``: op bodies a launch replaced; ``live_runs``: segments
        #: run live; ``stale``: graphs dropped (grown instance, replaced
        #: reduction buffer, a group's Python ran elsewhere);
        #: ``invalidated``: graphs dropped with their recording
        self.stats = {"captured": 0, "launched": 0, "replaced": 0, "live_runs": 0,
                      "stale": 0, "invalidated": 0, "capture_failed": 0, "returned": 0}

    # -- plans ------------------------------------------------------------------------
    def start(self, rec: Any, cur: list[Op], begin: Op, ordered: str | None) -> Replay | None:
        """A replay of ``rec`` begins: its graph state, or None (no graphs)."""
        if not self.on:
            return None
        plan = getattr(rec, "gplan", None)
        if plan is None:
            plan = rec.gplan = Plan(rec)
            plan.why_not = self._why_not(rec, ordered)
            if plan.why_not is not None:
                _debug(self.rt, f"trace {rec.name!r} replays without CUDA graphs: {plan.why_not}")
        if plan.why_not is not None:
            return None
        if plan.dirty:
            self._segment(plan)
        self.replays += 1
        return Replay(self, plan, cur, self.replays) if plan.segs else None

    def _why_not(self, rec: Any, ordered: str | None) -> str | None:
        rt = self.rt
        if rt.repl is not None:
            return "it runs under MPI (graphs cover the GPUs of one process)"
        if ordered == "ready":
            return "LEGIONPY_REPLAY_ORDER=ready leaves no fixed per-queue order to capture"
        devs = rt.devices
        for t in rec.ops:
            q = t.queue
            if t.remote:
                return f"{t.kind} {t.name!r} runs on another rank"
            if isinstance(q, int) and devs[q].kind != "gpu":
                return f"{t.kind} {t.name!r} runs on {devs[q]}, not a GPU"
            if isinstance(q, tuple) and any(m >= 0 and devs[m].kind != "gpu" for m in q):
                return f"copy {t.name!r} runs on link {q}, not between GPUs"
        return None

    def close_group(self, plan: Plan, offs: set[int]) -> None:
        """Mark ``offs`` live, with every op sharing Python state with one."""
        ops = plan.rec.ops
        keys = {_group(ops[o].fn) for o in offs} - {None}
        plan.live.update(offs)
        if keys:
            plan.live.update(o for o, t in enumerate(ops) if _group(t.fn) in keys)
        plan.dirty = True

    @staticmethod
    def _capturable(t: Any) -> bool:
        return (isinstance(t.queue, int) and isinstance(t.fn, PointBody) and not t.futs
                and t.kind != "copy")

    def _segment(self, plan: Plan) -> None:
        """(Re)cut the recording's per-GPU fixed orders into segments; a
        segment whose members did not change keeps its graph."""
        rec = plan.rec
        ops = rec.ops
        n = len(ops)
        rid = {t.rid: off for off, t in enumerate(ops)}
        plan.group_of = {off: g for off, t in enumerate(ops) if (g := _group(t.fn)) is not None}
        staged: set[int] = set()  # readers of staged folds and the copies feeding them
        for off, t in enumerate(ops):
            if isinstance(t.fn, PointBody) and t.fn.prologues:
                for _, _, acts in t.fn.prologues:
                    for a in acts:
                        if getattr(a, "staged", None) is not None:
                            staged.add(off)
                            c = rid.get(a.staged - rec.base)
                            if c is not None:
                                staged.add(c)
        never = staged | {off for off, t in enumerate(ops) if not self._capturable(t)}
        if not never <= plan.live:
            self.close_group(plan, never)  # and the ops sharing Python state with them
        succ: list[list[int]] = [[] for _ in range(n)]
        nxt: dict[int, int] = {}
        for off, t in enumerate(ops):
            for d in t.waits:
                succ[d].append(off)
            if t.prev >= 0:
                nxt[t.prev] = off
        host = {d for item in rec.items if item.kind in ("read", "write") for d in item.deps}
        old = {(s.queue, s.members): s for s in plan.segs}
        plan.segs, plan.seg_of = [], {}
        anc_cache: dict[int, set[int]] = {}

        def ancestors(h: int) -> set[int]:
            got = anc_cache.get(h)
            if got is None:
                got, stack = set(), [h]
                while stack:
                    for d in ops[stack.pop()].waits:
                        if d not in got:
                            got.add(d)
                            stack.append(d)
                anc_cache[h] = got
            return got

        def close(run: list[int]) -> None:
            if run:
                q = ops[run[0]].queue
                key = (q, tuple(run))
                seg = old.get(key) or Segment(q, self._ordinal(q), key[1])
                plan.segs.append(seg)
                for o in run:
                    plan.seg_of[o] = seg

        heads = [off for off, t in enumerate(ops) if t.prev < 0 and isinstance(t.queue, int)]
        for h in heads:
            run: list[int] = []
            off: int | None = h
            while off is not None:
                t = ops[off]
                if off in plan.live:
                    close(run)
                    run = []
                else:
                    if run:
                        inside = set(run)
                        outside = [d for d in t.waits if d not in inside]
                        if off < run[-1] or not set(outside) <= ancestors(run[0]):
                            close(run)
                            run = []
                    run.append(off)
                    q = t.queue
                    if off in host or any(ops[s].queue != q and ops[s].queue is not None
                                          for s in succ[off]):
                        close(run)
                        run = []
                off = nxt.get(off)
            close(run)
        dropped = [s for s in old.values() if s.graph is not None and s not in plan.segs]
        self.stats["invalidated"] += len(dropped)
        plan.dirty = False

    def ran_python(self, plan: Plan, seg: Segment, offs: list[int], now: int) -> None:
        """The bodies ``offs`` of ``seg`` ran Python (live or captured) in
        replay ``now``: the graphs of other segments holding ops of their
        groups, captured in an earlier replay, hold arrays that Python state
        no longer refers to; they are captured again when they next run."""
        keys = {plan.group_of.get(o) for o in offs} - {None}
        if not keys:
            return
        for other in plan.segs:
            if other is not seg and other.graph is not None and other.when != now and any(
                    plan.group_of.get(o) in keys for o in other.members):
                other.graph, other.keep = None, []
                other.stale += 1
                self.stats["stale"] += 1

    def dropped(self, recordings: Any) -> None:
        """Recordings are forgotten (a new strategy or mapper): their graphs go."""
        for rec in recordings:
            plan = getattr(rec, "gplan", None)
            if plan is not None:
                self.stats["invalidated"] += sum(s.graph is not None for s in plan.segs)

    # -- backend ----------------------------------------------------------------------
    def _ordinal(self, q: int) -> int:
        return self.rt.instances.gpu_of[q]

    def backend(self) -> Any:
        if self.cap is None:
            self.cap = EmuCapture() if gpu.backend().name == "emulated" else CupyCapture()
        return self.cap

    def stream(self, seg: Segment) -> Any:
        """Where a segment is captured and launched: its GPU's compute stream
        (runtime/streams.py), the stream its runner runs on."""
        return self.rt.sched.streams.compute_stream(seg.queue)


class Replay:
    """One replay's graph state: which segments were submitted how far."""

    def __init__(self, gr: Graphs, plan: Plan, cur: list[Op], number: int) -> None:
        self.gr, self.plan, self.cur, self.number = gr, plan, cur, number
        self.runner: dict[int, Op] = {}  # id(segment) -> its runner op this replay
        self.inside: dict[int, set] = {}  # id(segment) -> its member ops this replay
        self.bodies: dict[int, Any] = {}  # offset -> the member's body (markers have none)
        self.deps: dict[int, list] = {}  # id(segment) -> outside deps so far
        self.done: dict[int, list[int]] = {}  # id(segment) -> members submitted so far
        self.volatile: set[int] = set()
        self.sched = _Flushing(self, gr.rt.sched)

    def member(self, off: int, op: Op, deps: list) -> list[tuple[Op, list]]:
        """Submit entries for member ``off``: a marker after the runner, plus
        the runner when ``off`` is the segment's last member."""
        seg = self.plan.seg_of[off]
        sid = id(seg)
        runner = self.runner.get(sid)
        if runner is None:
            rt = self.gr.rt
            runner = self.runner[sid] = Op(rt._new_id(), "graph",
                                           f"graph GPU {seg.queue} ({len(seg.members)} ops)",
                                           seg.queue, None)
            self.deps[sid], self.done[sid] = [], []
            self.inside[sid] = {self.cur[m] for m in seg.members}
        inside = self.inside[sid]
        self.deps[sid].extend(d for d in deps if d not in inside)
        self.done[sid].append(off)
        if not self._same_args(seg, off, op):
            self.volatile.add(off)
        self.bodies[off] = op.fn
        op.queue, op.fn = None, _result  # a marker: done when the runner is
        out = [(op, [runner])]
        if off == seg.members[-1]:
            out.insert(0, self._runner(seg))
        return out

    def _same_args(self, seg: Segment, off: int, op: Op) -> bool:
        fn = op.fn
        if not isinstance(fn, PointBody):
            return True
        now = _plain(fn)
        was = seg.args.get(off)
        if was is None:  # not captured yet: compare with the recording's arguments
            was = _plain(self.plan.rec.ops[off].fn)
        return _same(now, was)

    def _runner(self, seg: Segment) -> tuple[Op, list]:
        sid = id(seg)
        runner = self.runner[sid]
        offs = self.done[sid]
        ops = [(self.cur[o], self.bodies.pop(o)) for o in offs]
        gr, plan = self.gr, self.plan
        full = len(offs) == len(seg.members)
        vol = [o for o in offs if o in self.volatile]
        if vol:
            gr.close_group(plan, set(vol))
            _debug(gr.rt, f"trace {plan.rec.name!r}: {self.cur[vol[0]].describe()} runs live "
                          "from now on (new plain arguments at each replay, or a wait on it "
                          "inside the block)")
        inst = gr.rt.instances

        def run(_: Op) -> None:
            live = [o for o in offs if o in plan.live]
            if not full or vol or live:
                gr.close_group(plan, set(live) | set(vol) | (set() if full else set(offs)))
                return self._live(seg, offs, ops)
            if seg.graph is not None and (seg.gen != inst.generation
                                          or not self._buffers(seg)):
                seg.graph, seg.keep = None, []
                seg.stale += 1
                gr.stats["stale"] += 1
            if seg.graph is None and seg.stale > STALE_LIMIT:  # it would capture every step
                gr.close_group(plan, set(offs))
                return self._live(seg, offs, ops)
            if seg.graph is not None:
                return self._launch(seg, ops)
            if not seg.probed:
                return self._probe(seg, offs, ops)
            return self._capture(seg, offs, ops)
        runner.fn = run
        return runner, self.deps.pop(sid)

    # -- what a runner does (on the GPU's worker) -------------------------------------------
    def _live(self, seg: Segment, offs: list[int], ops: list) -> None:
        self.gr.stats["live_runs"] += 1
        seg.graph, seg.keep = None, []
        self.gr.ran_python(self.plan, seg, offs, self.number)
        for op, body in ops:
            _run(op, body)

    def _launch(self, seg: Segment, ops: list, replay: bool = True,
                waits: list = ()) -> None:
        """Launch the segment's graph; ``waits``: the events its capture
        waited on (deferred, gpu.deferring_waits), waited on first."""
        gr = self.gr
        t0 = time.perf_counter()
        be = gr.backend()
        stream = gr.stream(seg)
        if waits:
            with gpu.backend().Device(seg.k):
                for ev in waits:
                    stream.wait_event(ev)
        be.launch(seg.graph, stream, seg.k)
        t1 = time.perf_counter()
        for op, _ in ops:
            op.start, op.end = t0, t1
        if replay:  # not the launch that completes a capture
            consumed = gr.rt.instances.consumed
            for key in seg.consumes:
                consumed(key)
            seg.launches += 1
            seg.stale = 0
            gr.stats["launched"] += 1
            gr.stats["replaced"] += len(ops)

    def _probe(self, seg: Segment, offs: list[int], ops: list) -> None:
        """First run of a segment: its bodies run live; an op that returns a
        value, or (where the backend can tell: the emulated one) makes a host
        synchronisation a capture would refuse, is live from now on with its
        group; the rest is captured at the next replay. (A capture that fails
        must run its bodies again, Python side effects included; the probe
        runs each body once. With CuPy a host synchronisation is found only
        when a capture meets it, one op per replay; a value returned, as a
        batch norm's statistics are, is found here.)"""
        gr, plan = self.gr, self.plan
        be = gr.backend()
        bad = {}
        for o, (op, body) in zip(offs, ops):
            def run(op: Op = op, body: Any = body) -> None:
                _run(op, body)
            why = be.probe(seg.k, run) if be.can_probe else run()
            if why:
                bad[o] = why
                gr.stats["capture_failed"] += 1
            elif op.result is not None:
                bad[o] = "it returns a value"
                gr.stats["returned"] += 1
        seg.probed = True
        gr.ran_python(plan, seg, offs, self.number)
        if bad:
            gr.close_group(plan, set(bad))
            for o, why in bad.items():
                _debug(gr.rt, f"trace {plan.rec.name!r}: {self.cur[o].describe()} cannot be "
                              f"captured ({why}); it runs live from "
                              "now on")

    def _capture(self, seg: Segment, offs: list[int], ops: list) -> None:
        gr, plan = self.gr, self.plan
        at = [0]
        inst = gr.rt.instances
        red = inst.redbufs
        keys = {k: red.get(k) for _, body in ops for k in buffer_keys(body)}
        seen: dict = {}  # key -> {id(array): (array, memory)} used during the capture

        be = gr.backend()

        def bodies() -> None:
            for i, (op, body) in enumerate(ops):
                at[0] = i
                _run(op, body, be.refusal)
                for k in keys:
                    e = red.get(k)
                    if e is not None:
                        seen.setdefault(k, {})[id(e[0])] = (e[0], inst.redmem.get(k, -1))
        try:
            with gpu.deferring_waits() as waits:
                graph, keep = be.capture(seg.k, gr.stream(seg), bodies)
        except GraphCaptureError as exc:
            gr.stats["capture_failed"] += 1
            gr.close_group(plan, {offs[at[0]]})
            _debug(gr.rt, f"trace {plan.rec.name!r}: {ops[at[0]][0].describe()} cannot be "
                          f"captured ({exc}); it runs live from now on")
            for op, _ in ops:
                op.result = None
            return self._live(seg, offs, ops)
        returned = {o for o, (op, _) in zip(offs, ops) if op.result is not None}
        if returned:
            gr.close_group(plan, returned)  # results: live from the next replay on
        seg.graph, seg.keep, seg.gen = graph, keep, inst.generation
        seg.args = {o: _plain(body) for o, (_, body) in zip(offs, ops)}
        seg.consumes = [a.buffer for _, body in ops for _, _, acts in body.prologues or ()
                        for a in acts if getattr(a, "buffer", None) is not None
                        and getattr(a, "staged", None) is None]
        seg.bufs = []
        for k, pre in keys.items():
            arrays = dict(seen.get(k, {}))
            if pre is not None:
                arrays.setdefault(id(pre[0]), (pre[0], inst.redmem.get(k, -1)))
            post = red.get(k)
            if len(arrays) > 1:  # grown during the capture: Python state moved on
                gr.close_group(plan, set(offs))  # launched this once, live afterwards
            elif pre is not None:
                seg.bufs.append((k, pre[0], pre[1], inst.redmem.get(k, -1), False))
            elif post is not None:
                seg.bufs.append((k, post[0], post[1], inst.redmem.get(k, -1), True))
            elif arrays:  # made and consumed inside the graph: its own, out of the pool
                buf, memory = next(iter(arrays.values()))
                if take_out(inst, buf, memory) is not None:
                    seg.keep.append(buf)
        seg.captures += 1
        seg.when = self.number
        gr.ran_python(plan, seg, offs, self.number)
        gr.stats["captured"] += 1
        self._launch(seg, ops, replay=False, waits=waits)

    def _buffers(self, seg: Segment) -> bool:
        """Before a launch: are the reduction buffers the graph writes this
        step's? A buffer made by the capture comes from the pool at every
        step (docs/memory.md): it is taken back from the pool now, before its
        reducer would take one, so the graph's array is this step's buffer; a
        buffer that existed before the capture must still be the same array.
        False: the graph is stale (captured again)."""
        inst = self.gr.rt.instances
        red = inst.redbufs
        todo = []
        for key, buf, rect, memory, made in seg.bufs:
            got = red.get(key)
            if got is not None:
                if got[0] is not buf or got[1] != rect:
                    return False
            elif not made:
                return False
            else:
                todo.append((key, buf, rect, memory))
        done = []
        for key, buf, rect, memory in todo:
            if not reclaim(inst, key, buf, rect, memory):
                for key, buf, memory in done:  # undo: the bodies will run (captured again)
                    inst.redbufs.pop(key, None)
                    inst.redmem.pop(key, None)
                    inst._account(memory, -buf.nbytes, "reduction")
                    inst.pool.give(memory, buf)
                return False
            done.append((key, buf, memory))
        return True

    # -- early completion ---------------------------------------------------------------------
    def flush(self, offs: Any = None) -> None:
        """Submit now, live, the runners of segments whose members so far
        include one of ``offs`` (None: every partly submitted segment): a
        wait on a member before the segment's last member was launched."""
        pending = [sid for sid in list(self.deps) if offs is None
                   or any(o in self.done[sid] for o in offs)]
        if not pending:
            return
        batch = []
        for sid in pending:
            seg = self.plan.seg_of[self.done[sid][0]]
            self.volatile.update(self.done[sid])  # runs live; next replay re-cuts
            batch.append(self._runner(seg))
            for m in seg.members:  # later members are submitted as plain ops
                if m not in self.done[sid]:
                    self.plan.seg_of.pop(m, None)
        self.gr.rt.sched.submit_many(batch)
        self.gr.rt.sched.executor.drain()


class _Flushing:
    """The scheduler, as Futures of graph members see it: a wait first
    flushes the member's segment (so a wait inside the block cannot hang)."""

    def __init__(self, rep: Replay, sched: Any) -> None:
        self.rep, self.sched = rep, sched

    def wait(self, op: Op, timeout: float | None = None) -> None:
        if op.state < 2:
            off = self.rep.cur.index(op) if op in self.rep.cur else None
            if off is not None:
                self.rep.flush([off])
        self.sched.wait(op, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sched, name)


def _result(op: Op) -> Any:
    """A member marker's body: the result its runner gave it."""
    return op.result


def _run(op: Op, body: Any, refusal: Any = None) -> None:
    """A member's body, as the scheduler would run it (times, result, errors).
    While capturing, ``refusal(exc)`` (the backend's) tells the backend
    refusing the capture (raised as GraphCaptureError: the op runs live)
    from an error of the task (raised as TaskError)."""
    op.start = time.perf_counter()
    try:
        op.result = body(op)
    except GraphCaptureError:
        raise
    except BaseException as exc:  # noqa: BLE001 - re-raised naming the member
        why = refusal(exc) if refusal is not None else None
        if why is not None:
            raise GraphCaptureError(f"{op.describe()}: {why}") from exc
        raise TaskError(f"{op.describe()} raised {type(exc).__name__}: {exc}") from exc
    finally:
        op.end = time.perf_counter()


def _group(fn: Any) -> Any:
    """Bodies sharing Python state: methods of one object, at one point."""
    if not isinstance(fn, PointBody):
        return None
    owner = getattr(fn.fn, "__self__", None)
    return None if owner is None else (id(owner), fn.point)


def _plain(fn: PointBody) -> tuple:
    """The plain (non-region) arguments of a body."""
    rpos = {p for p, _, _ in fn.rargs or ()}
    return (tuple(a for i, a in enumerate(fn.args) if i not in rpos),
            tuple(sorted(fn.kwargs.items())))


_SCALARS = (int, float, bool, str, bytes, type(None), np.generic, np.dtype)


def _same(a: Any, b: Any) -> bool:
    """Equal plain arguments: the same object, or equal scalars, or
    containers of those (arrays only by identity: their contents may change)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, _SCALARS):
        return bool(a == b)
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return False


def _debug(rt: Any, msg: str) -> None:
    if rt.debug >= 1:
        import sys
        print(f"[legionpy] {msg}", file=sys.stderr, flush=True)
