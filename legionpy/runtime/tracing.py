"""Dynamic tracing: analyse a repeated sequence of launches once, replay it.

After Lee, Slaughter, Bauer, Treichler, Warszawski, Garland and Aiken,
"Dynamic Tracing: Memoization of Task Graphs for Dynamic Task-Based
Runtimes" (SC'18): the dependence analysis, mapping and coherence of a
sequence of launches that repeats (a training step) is captured the first
time and replayed afterwards, so a replayed point task costs an Op and a
queue push instead of the whole analysis (core.py steps 1-5).

Use::

    for batch in batches:
        with lp.trace("step"):          # or lp.begin_trace("step") ... lp.end_trace("step")
            ...launches, fills, Region.write / Region.read...

Recording
---------
A trace is recorded while the runtime runs it normally: the scheduler's
``recorder`` hook sees every op submitted (point tasks, copies, fill
markers, MPI ghosts) with the ops it waits for, and each launch, fill, read
and write of the block becomes an :class:`Item` with a *signature* (task,
launch options, domain, region and partition arguments by identity,
positions of Futures; plain values are not part of it: they are passed
anew at each replay). A recording also keeps, per (root region, field) it
accessed, the coherence state before (its :meth:`FieldState.signature`,
free of op ids) and after (the state itself).

Replay
------
``begin_trace(name)`` replays when a recording exists, the mapper did not
change since (``Runtime.invalidate_traces``) and every field the recording
accessed is in the state it had when the recording began (same pieces,
valid memories, pending reductions and open buffers; op ids aside). That
*precondition* is what makes the recorded copies, prologues and mapper
decisions the right ones. The first run of a block therefore records; in
a training loop the second usually records again (the first moved the
weights from host memory to the devices) and every later one replays.

A replay makes no dependence analysis, no coherence query and no mapper
call. It creates the recorded ops with shifted ids, binds each point body
to the new plain arguments (region views are built once per recording),
and submits them with the recorded dependences. Two markers (queue None)
bracket it: *begin* waits for every op still in flight before the replay
(it is also where the reduction buffers the trace opened are reset to
their identity, so they are reused, not reallocated), and the recorded ops
that depended on anything before the trace wait for it; *end* waits for
every replayed op. After the replay each accessed field's state is the
recorded final state with every producer id replaced by *end*, and *end*
is registered with the dependence analyzer as a read-write user of every
accessed field, so later untraced operations wait for the replay exactly
as for a conservative summary of it.

Order
-----
Each device and link runs its replayed ops in one fixed order: the op
``k`` of a queue waits for the op ``k - 1`` of that queue (an extra
scheduling edge, not a dependence: it is not in ``Op.deps``). The order is
``"simulated"`` when a schedule was given (``order=`` of :func:`trace`, a
function of the recording's records, which the layer API uses to pass the
optimizer's simulated schedule), else ``"recorded"``: the start order the
recording's own run took. ``LEGIONPY_REPLAY_ORDER=ready`` turns the fixed
order off (each queue runs in order of readiness, as untraced launches do).

Limits
------
A block that leaves a reduction pending at its end, which its next run
folds, never meets its precondition (the buffer it opened is not the one
its recording started with), so it is recorded every time: correct, but
not faster. Training steps fold every gradient inside the step.

Mismatch
--------
A replay compares each launch with the recording. At the first launch that
differs, the replayed prefix is summarised as above (its end marker and the
states after the prefix), the differing launch and the rest of the block
run untraced, the recording is dropped and the next use of the name
records anew; ``LEGIONPY_DEBUG=1`` prints both launches. With
``strict=True`` the same repair is made and then a
:class:`~legionpy.errors.TraceMismatchError` naming both launches is raised.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from ..errors import LaunchError, TraceMismatchError
from ..regions import Partition, Region, Subregion
from .body import PointBody
from .futures import Future, FutureMap
from .graphs import Graphs
from .scheduler import DONE, Op

__all__ = ["Tracer", "Recording", "Item", "Template"]

_REGION_LIKE = (Region, Subregion, Partition)


def _arg_sig(a: Any) -> Any:
    if isinstance(a, _REGION_LIKE):
        return a  # by identity (regions and partitions do not define ==)
    if isinstance(a, Future):
        return Future
    if isinstance(a, FutureMap):
        return FutureMap
    return None


def launch_signature(task: Any, domain: tuple | None, args: tuple, kwargs: dict,
                     options: Any) -> tuple:
    """What must be equal for a launch to replay a recorded one."""
    return (task, options, domain, tuple(map(_arg_sig, args)),
            tuple((k, _arg_sig(v)) for k, v in kwargs.items()))


class Template:
    """One recorded op: how to make it again."""

    __slots__ = ("rid", "kind", "name", "queue", "fn", "deps", "logical", "ext", "bytes",
                 "point", "launch", "tag", "rank", "remote", "prev", "waits", "futs")

    def __init__(self, op: Op, rid: int, deps: tuple, logical: tuple, ext: bool) -> None:
        self.rid = rid  # op id - recording base
        self.kind, self.name, self.queue, self.fn = op.kind, op.name, op.queue, op.fn
        self.deps = deps  # offsets (submission order) of recorded ops it waits for
        self.logical = logical  # the dependences among them (``Op.deps``; not MPI link order)
        self.ext = ext  # waited for an op before the trace
        self.bytes, self.point, self.launch, self.tag = op.bytes, op.point, op.launch, op.tag
        self.rank, self.remote = op.rank, op.remote
        self.prev = -1  # offset of the op before it on its queue (fixed replay order)
        self.waits = deps  # what a replay waits for: deps, and prev in a fixed order
        self.futs = isinstance(op.fn, PointBody) and bool(op.fn.fut_pos)


class Item:
    """One launch, fill, read or write of a recording."""

    __slots__ = ("kind", "sig", "desc", "lo", "hi", "points", "colors", "domain", "deps",
                 "ext", "keys", "changes", "region", "field", "prologue", "note", "waits")

    def __init__(self, kind: str, sig: tuple, desc: str) -> None:
        self.kind, self.sig, self.desc = kind, sig, desc
        self.lo = self.hi = 0  # its ops: Recording.ops[lo:hi]
        self.points: list[int] = []  # offsets of the point ops, in domain order
        self.colors: Any = None  # the colors object of an index launch (identity fast path)
        self.domain: list | None = None
        self.deps: tuple = ()  # read / write: offsets of the ops it waited for
        self.waits: tuple = ()  # read / write: offsets it must wait for on replay
        self.ext = False
        self.keys: set = set()  # (root uid, field) accessed
        self.changes: list = []  # [(key, state after the item)]
        self.region = self.field = None
        self.prologue: list = []
        self.note: str | None = None  # MPI launch-hash text


class Recording:
    """A recorded trace: items, op templates, states before and after."""

    def __init__(self, name: str, base: int, mapper_epoch: int) -> None:
        self.name = name
        self.base = base
        self.count = 0  # op ids it consumed
        self.launches = 0  # launch sequence numbers it consumed
        self.mapper_epoch = mapper_epoch
        self.items: list[Item] = []
        self.ops: list[Template] = []
        self.off_of: dict[int, int] = {}  # recorded op id -> offset (recording only)
        self.recorded: list[Op] = []  # the recorded run's ops, until the order is fixed
        self.keys: dict[tuple, Any] = {}  # (uid, field) -> root
        self.pre: dict[tuple, tuple | None] = {}
        self.post: dict[tuple, Any] = {}
        self.end_id = -1  # the id of every replay's end marker (one per recording)
        self.summary: list = []  # [(uid, field, root rect)] for the analyzer
        self.final: dict[tuple, Any] = {}  # post states, producers -> end_id
        self.idempotent: set = set()  # keys whose final state meets the precondition
        self.reduced: set = set()
        self.buffers: list = []  # [(buffer key, redop)] the trace opens
        #: reduction buffer lifetimes: {buffer: copies and folds reading it},
        #: the buffers that die in the block (Instances.expect at each replay)
        self.consumers: dict = {}
        self.dying: set = set()
        self.replayable = True
        self.why_not = ""
        self.ordered: str | None = None  # None until the fixed order is set
        self.order_fn: Callable | None = None
        #: regions (root uids) whose reduction buffers the replays keep, and
        #: the buffer keys the recording reduced into there
        self.keep_roots: set = set()
        self.kept: set = set()
        self.replays = 0

    # -- the records form (for schedules and tests) -------------------------------------
    def records(self) -> list[dict]:
        """One dict per recorded op, as ``Trace.records`` has them, with
        ``id`` the op's offset in the recording and ``deps`` offsets."""
        out = []
        for off, t in enumerate(self.ops):
            dev, link = (t.queue, None) if not isinstance(t.queue, tuple) else (None, t.queue)
            out.append({"id": off, "name": t.name, "kind": t.kind, "device": dev, "link": link,
                        "bytes": t.bytes, "deps": list(t.logical), "point": t.point,
                        "launch": t.launch, "tag": t.tag, "rank": t.rank})
        return out

    def set_order(self, order: dict[Any, list[int]], how: str) -> bool:
        """Fix each queue's replay order: ``{queue: [offsets in order]}``;
        ops of a queue not listed keep their recorded relative order after
        the listed ones. Returns False (and leaves the order unset) when the
        order contradicts the dependences (it would deadlock)."""
        last: dict[Any, int] = {}
        for t in self.ops:
            t.prev = -1
        for q, offs in order.items():
            prev = -1
            for o in offs:
                self.ops[o].prev = prev
                prev = o
            last[q] = prev
        listed = {o for offs in order.values() for o in offs}
        for off, t in enumerate(self.ops):
            if t.queue is None or t.remote or off in listed:
                continue
            t.prev = last.get(t.queue, -1)
            last[t.queue] = off
        if not self._acyclic():
            for t in self.ops:
                t.prev = -1
            return False
        for t in self.ops:
            t.waits = t.deps if t.prev < 0 else (*t.deps, t.prev)
        self.ordered = how
        return True

    def _acyclic(self) -> bool:
        """Do the dependences plus the fixed-order edges admit a schedule?"""
        n = len(self.ops)
        indeg = [0] * n
        succ: list[list[int]] = [[] for _ in range(n)]
        for off, t in enumerate(self.ops):
            preds = t.deps if t.prev < 0 else (*t.deps, t.prev)
            indeg[off] = len(preds)
            for p in preds:
                succ[p].append(off)
        stack = [i for i in range(n) if indeg[i] == 0]
        seen = 0
        while stack:
            i = stack.pop()
            seen += 1
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    stack.append(j)
        return seen == n


class Tracer:
    """Per-Runtime tracing state (see the module docstring)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.recordings: dict[str, Recording] = {}
        self.mode: str | None = None  # None | "record" | "replay"
        self.name: str | None = None
        self.rec: Recording | None = None
        self.item: Item | None = None
        self.strict = False
        self.mapper_epoch = 0
        self.order_policy = os.environ.get("LEGIONPY_REPLAY_ORDER", "fixed")
        if self.order_policy not in ("fixed", "ready"):
            raise ValueError("LEGIONPY_REPLAY_ORDER must be 'fixed' (the simulated or recorded "
                             f"order) or 'ready', got {self.order_policy!r}")
        # replay state
        self.pos = 0
        self.cur: list[Op] = []
        self.begin_op: Op | None = None
        self.delta = 0
        self.last_end: Op | None = None
        self.stats = {"recorded": 0, "replayed": 0, "mismatched": 0}
        self.graphs = Graphs(rt)  # CUDA graphs of replays on GPUs (runtime/graphs.py)
        self.gr: Any = None  # this replay's graph state

    # -- public entry points -----------------------------------------------------------
    def invalidate(self) -> None:
        """Forget every recording (the mapper or a strategy changed)."""
        self.mapper_epoch += 1
        self.graphs.dropped(self.recordings.values())
        self.recordings.clear()

    def begin(self, name: str, strict: bool = False, order: Callable | None = None,
              keep_buffers: Any = ()) -> None:
        if self.mode is not None:
            raise LaunchError(f"begin_trace({name!r}) inside trace {self.name!r}: traces do "
                              f"not nest; end_trace({self.name!r}) first")
        rt = self.rt
        self.name, self.strict = name, strict
        rec = self.recordings.get(name)
        if rec is not None and self._can_replay(rec):
            self._start_replay(rec)
            return
        rec = Recording(name, rt._next_id, self.mapper_epoch)
        rec.order_fn = order
        rec.keep_roots = {r.root.uid for r in keep_buffers}
        rec.pre = dict(rt.states)  # persistent states: a snapshot costs the dict
        rt.instances.log = (rec.consumers, rec.dying)
        self.rec = rec
        self.mode = "record"
        rt.sched.recorder = self._on_submit

    def end(self, name: str) -> None:
        if self.mode is None or name != self.name:
            raise LaunchError(f"end_trace({name!r}) without begin_trace({name!r})"
                              + (f" (trace {self.name!r} is open)" if self.mode else ""))
        if self.mode == "untraced":  # a replay that diverged
            self._reset()
        elif self.mode == "record":
            self._finish_recording()
        elif self.pos != len(self.rec.items):
            rec = self.rec
            self._diverge(f"the block ended after {self.pos} of its {len(rec.items)} "
                          f"recorded operations (next: {rec.items[self.pos].desc})")
        else:
            self._finish_replay()

    def abort(self) -> None:
        """The block raised: close the trace without keeping a recording."""
        if self.rt.sched.recorder is not None:
            self.rt.sched.recorder = None
            self.recordings.pop(self.name, None)
        elif self.mode == "replay":
            self._summarise(self.pos)
            self.recordings.pop(self.name, None)
        self._reset()

    # -- operations inside a trace (called by the Runtime) ------------------------------------
    def launch(self, task: Any, colors: Any, args: tuple, kwargs: dict,
               options: Any) -> Any:
        """A single (``colors`` None) or index launch inside the trace."""
        rt = self.rt
        if self.mode == "replay":
            item = self.rec.items[self.pos]
            if item.kind == "launch":
                domain = item.domain
                if colors is not None and colors is not item.colors:
                    domain = _domain(colors)
                sig = launch_signature(task, None if colors is None else tuple(domain), args,
                                       kwargs, options)
                if sig == item.sig:
                    return self._replay_launch(item, domain, args, kwargs)
            self._diverge(f"{_launch_desc(task, colors, args)} where the recording has "
                          f"{item.desc}")
            return rt._untraced_launch(task, colors, args, kwargs, options)
        domain = None if colors is None else _domain(colors)
        item = Item("launch", launch_signature(task, None if domain is None else tuple(domain),
                                               args, kwargs, options),
                    _launch_desc(task, colors, args))
        item.colors, item.domain = colors, domain
        self._open_item(item)
        out = rt._untraced_launch(task, colors, args, kwargs, options)
        futs = [out] if isinstance(out, Future) else [out[c] for c in domain]
        off_of = self.rec.off_of
        item.points = [off_of[f._op.id] for f in futs]
        self._close_item(item)
        self.rec.launches += 1
        return out

    def host_op(self, kind: str, region: Any, field: str, value: Any = None) -> Any:
        """``fill``, ``write`` or ``read`` inside the trace."""
        rt = self.rt
        sig = (kind, region, field, value if kind == "fill" else None,
               getattr(value, "shape", None) if kind == "write" else None)
        desc = f"{kind} of {region.name}.{field}"
        if self.mode == "replay":
            item = self.rec.items[self.pos]
            if item.kind == kind and item.sig == sig:
                return self._replay_host(item, value)
            self._diverge(f"{desc} where the recording has {item.desc}")
            return rt._untraced_host_op(kind, region, field, value)
        item = Item(kind, sig if kind != "fill" else sig, desc)
        item.region, item.field = region, field
        self._open_item(item)
        rt._host_waits = []
        out = rt._untraced_host_op(kind, region, field, value)
        waited, rt._host_waits = rt._host_waits, None
        if kind == "read":
            item.prologue = rt._host_prologue
        rec = self.rec
        item.deps = tuple(sorted({rec.off_of[i] for i in waited if i in rec.off_of}))
        item.ext = any(i < rec.base for i in waited)
        self._close_item(item)
        return out

    def reduced_into(self, buffer: Any, root: Any) -> None:
        """The recording reduces into ``buffer`` of ``root``: kept by the
        replays when the trace keeps that region's buffers."""
        if root.uid in self.rec.keep_roots:
            self.rec.kept.add(buffer)

    def touch(self, key: tuple, root: Any) -> None:
        """The recording accessed (root uid, field) ``key``."""
        self.rec.keys[key] = root
        self.item.keys.add(key)

    # -- recording -------------------------------------------------------------------
    def _open_item(self, item: Item) -> None:
        rec = self.rec
        item.lo = len(rec.ops)
        self.item = item
        rt = self.rt
        if rt.repl is not None:
            item.note = f"trace {self.name} #{len(rec.items)}"

    def _close_item(self, item: Item) -> None:
        rec = self.rec
        item.hi = len(rec.ops)
        states = self.rt.states
        item.changes = [(k, states.get(k)) for k in item.keys]
        rec.items.append(item)
        self.item = None

    def _on_submit(self, op: Op, deps: list) -> None:
        rec = self.rec
        if self.item is None:
            return  # an op made outside an item (cannot happen from the launching thread)
        off_of = rec.off_of
        ids = set(op.deps)
        logical = tuple(sorted(off_of[i] for i in ids if i in off_of))
        ids.update(d.id for d in deps)
        internal = tuple(sorted(off_of[i] for i in ids if i in off_of))
        # an op that waits for nothing inside the trace waits for the begin
        # marker: else a replay's root op (a cross-rank copy whose source
        # was written before any fence the trace saw) starts while the
        # previous replay still runs, and the two ranks' link workers can
        # take their transfers in different orders and wait for each other
        ext = not internal or any(i < rec.base for i in ids)
        if op.kind == "copy" and op.name.startswith("future "):
            rec.replayable = False
            rec.why_not = "a Future crosses MPI ranks inside it"
        off_of[op.id] = len(rec.ops)
        rec.ops.append(Template(op, op.id - rec.base, internal, logical, ext))
        rec.recorded.append(op)

    def _finish_recording(self) -> None:
        rt, rec = self.rt, self.rec
        rt.sched.recorder = None
        rec.count = rt._next_id - rec.base
        snapshot, rec.pre = rec.pre, {}
        rec.end_id = rt._new_id()
        for key, root in rec.keys.items():
            before = snapshot.get(key)
            rec.pre[key] = None if before is None else before.signature()
            rec.post[key] = rt.states[key]
            rec.final[key] = rt.states[key].relabel(rec.end_id)
            if rec.pre[key] is not None and rec.final[key].signature() == rec.pre[key]:
                rec.idempotent.add(key)
            rec.summary.append((key[0], key[1], root.rect))
        rec.reduced = {k for k in rec.keys if k in rt._reduced}
        lo, hi = rec.base, rec.base + rec.count
        seen = set()
        for t in rec.ops:
            if isinstance(t.fn, PointBody) and t.fn.views:
                for _, _, specs in t.fn.views:
                    for _, _, _, buf in specs:
                        if buf is not None and buf[0] not in seen and isinstance(buf[0], tuple) \
                                and lo <= buf[0][0] < hi:
                            seen.add(buf[0])
                            rec.buffers.append(buf)
        rec.off_of = {}
        if rec.replayable:
            self.recordings[self.name] = rec
        else:
            self.recordings.pop(self.name, None)
            _debug(rt, 1, f"trace {self.name!r} is not replayable: {rec.why_not}")
        self.stats["recorded"] += 1
        _debug(rt, 1, f"trace {self.name!r} recorded: {len(rec.items)} operations, "
                      f"{len(rec.ops)} ops, {len(rec.keys)} fields")
        self._reset()

    # -- replay -------------------------------------------------------------------------
    def _can_replay(self, rec: Recording) -> bool:
        if rec.mapper_epoch != self.mapper_epoch:
            return False
        states = self.rt.states
        final, same = rec.final, rec.idempotent
        for key, sig in rec.pre.items():
            st = states.get(key)
            if st is final.get(key) and key in same:
                continue  # as the last replay left it, and that state is its precondition
            if sig is None:
                if st is not None:
                    return False
            elif st is None or st.signature() != sig:
                return False
        return True

    def _fix_order(self, rec: Recording) -> None:
        if self.order_policy == "ready":
            rec.ordered = "ready"
            return
        if rec.order_fn is not None:
            order = rec.order_fn(rec.records())
            if order and rec.set_order(order, "simulated"):
                rec.recorded = []
                return
            _debug(self.rt, 1, f"trace {rec.name!r}: no usable simulated order (it contradicts "
                               "the recorded dependences); replaying in the recorded order")
        sched = self.rt.sched
        for op in rec.recorded:  # the recording's own run: wait once for its start order
            if op.state < DONE and op.queue is not None:
                sched.wait(op)
        by_queue: dict[Any, list] = {}
        for off, op in enumerate(rec.recorded):
            if op.queue is not None and not op.remote:
                by_queue.setdefault(op.queue, []).append((op.start, op.id, off))
        rec.set_order({q: [o for _, _, o in sorted(v)] for q, v in by_queue.items()},
                      "recorded")
        rec.recorded = []

    def _start_replay(self, rec: Recording) -> None:
        rt = self.rt
        if rec.ordered is None:
            self._fix_order(rec)
            for t in rec.ops:  # cross-rank copies: persistent MPI requests, for the replays
                make = getattr(t.fn, "persistent", None)
                if make is not None:
                    t.fn = make()
        begin_id = rt._new_id()
        base = rt._next_id
        rt._next_id = base + rec.count
        self.delta = base - rec.base
        begin = Op(begin_id, "marker", f"begin trace {rec.name}", None, None)
        self.begin_op = begin
        waits = list(rt._live.values())
        if self.last_end is not None:
            waits.append(self.last_end)
        streams = rt.sched.streams
        if streams is not None and streams.done:
            # the kernels of finished ops may still be in flight (the buffers it
            # resets may be read by a staged copy of the recording's run, the
            # trace's first ops read what they wrote): its frontier includes them
            begin.deps = tuple(streams.done)
        self.cur = [Op(base + t.rid, t.kind, t.name, t.queue, t.fn, t.point, t.launch, t.tag)
                    for t in rec.ops]
        self.rec, self.mode, self.pos = rec, "replay", 0
        self.gr = self.graphs.start(rec, self.cur, begin, rec.ordered)
        if rec.buffers or rec.consumers:  # a graph captures its buffers: they stay
            begin.fn = _reset_buffers(rt.instances, rec, release=self.gr is None)
        rt.sched.submit(begin, waits)
        if rt.repl is not None:
            rt.repl.note(f"replay {rec.name}")

    def _submit(self, item: Item) -> None:
        """Submit the ops made by ``item``, in one scheduler call."""
        rec, cur, rt = self.rec, self.cur, self.rt
        begin = self.begin_op
        repl = rt.repl
        ops = rec.ops
        ids = rt.trace.enabled  # Op.deps only feed the trace records
        gr = self.gr
        batch = []
        for off in range(item.lo, item.hi):
            t = ops[off]
            op = cur[off]
            op.bytes, op.rank, op.remote = t.bytes, t.rank, t.remote
            deps = [cur[d] for d in t.waits]
            if t.ext:
                deps.append(begin)
            if ids:
                op.deps = ((begin.id,) if t.ext else ()) + tuple([cur[d].id for d in t.logical])
            if t.futs:
                fn = op.fn
                for p in fn.fut_pos:
                    deps.append((fn.args[p] if isinstance(p, int) else fn.kwargs[p])._op)
            if repl is not None and not t.remote and t.kind != "copy" and t.queue is not None:
                repl.cl.keep(op)
            if gr is not None and off in gr.plan.seg_of:  # a CUDA graph member
                batch.extend(gr.member(off, op, deps))
                continue
            batch.append((op, deps))
        rt.sched.submit_many(batch)
        if repl is not None and item.hi > item.lo:
            # ops up to this item's are registered (kept for other ranks'
            # Future requests); the trace's later ops are not yet: a request
            # for one waits (it was answered "no task op" when this said the
            # whole trace, and the loss Future of a rank that ran ahead failed)
            repl.launched = max(repl.launched, max(op.id for op in cur[item.lo:item.hi]) + 1)
        rt.sched.executor.drain()

    def _replay_launch(self, item: Item, domain: list | None, args: tuple,
                       kwargs: dict) -> Any:
        rec, cur, rt = self.rec, self.cur, self.rt
        for off in item.points:
            fn = rec.ops[off].fn
            if isinstance(fn, PointBody):  # else a ghost (another rank runs the point)
                cur[off].fn = fn.rebind(args, kwargs)
        if item.note is not None:
            rt.repl.note(item.note)
        self._submit(item)
        self.pos += 1
        rt._seq += 1
        gr = self.gr
        futs = [Future(cur[o], gr.sched if gr is not None and o in gr.plan.seg_of else rt.sched)
                for o in item.points]
        return futs[0] if domain is None else FutureMap(domain, futs)

    def _replay_host(self, item: Item, value: Any) -> Any:
        rt, cur = self.rt, self.cur
        if item.note is not None:
            rt.repl.note(item.note)
        if self.gr is not None:
            self.gr.flush(item.deps)
        self._submit(item)
        self.pos += 1
        waits = [cur[d] for d in item.deps] + ([self.begin_op] if item.ext else [])
        waits += cur[item.lo:item.hi]
        return rt._replay_host_op(item.kind, item.region, item.field, value, waits,
                                  item.prologue)

    def _finish_replay(self) -> None:
        rec = self.rec
        self._summarise(len(rec.items))
        rec.replays += 1
        self.stats["replayed"] += 1
        self._reset()

    def _summarise(self, n: int) -> None:
        """After replaying the first ``n`` items: the end marker, the states,
        the analyzer. Ops of later items are released as no-ops (they may be
        the fixed-order predecessors of submitted ones)."""
        rt, rec, cur = self.rt, self.rec, self.cur
        if self.gr is not None:  # segments cut short by a divergence run live
            self.gr.flush()
        submit = rt.sched.submit
        done_upto = rec.items[n - 1].hi if n else 0
        for off in range(done_upto, len(cur)):
            op = cur[off]
            op.kind, op.queue, op.fn = "marker", None, None
            submit(op, [])
        whole = n == len(rec.items)
        end = Op(rec.end_id if whole else rt._new_id(), "marker", f"end trace {rec.name}",
                 None, None)
        end.deps = (self.begin_op.id,)
        rt._live[end.id] = end
        self.last_end = end
        rt.sched.submit(end, [self.begin_op] + cur[:done_upto])
        live_states = rt.states
        if whole:  # the final states were relabelled once, at the recording's end
            live_states.update(rec.final)
            rt.analyzer.summarize(end.id, rec.summary)
            rt._reduced.update(rec.reduced)
            return
        states: dict = {}
        for item in rec.items[:n]:
            states.update(item.changes)
        keys = {k for item in rec.items[:n] for k in item.keys}
        for k in keys:
            st = states.get(k, live_states.get(k))
            if st is not None:
                live_states[k] = st.relabel(end.id)
        rt.analyzer.summarize(end.id, [(k[0], k[1], rec.keys[k].rect) for k in keys])
        rt._reduced.update(k for k in rec.reduced if k in keys)

    def _diverge(self, what: str) -> None:
        rec = self.rec
        n = self.pos
        self._summarise(n)
        self.recordings.pop(rec.name, None)
        self.stats["mismatched"] += 1
        msg = (f"trace {rec.name!r}: operation #{n} is {what}; replayed the {n} before it, the "
               "rest of the block runs untraced and the next use records the trace again")
        strict = self.strict
        self._reset()
        self.mode = "untraced"  # until end_trace: the rest of the block runs normally
        self.name = rec.name
        if strict:
            raise TraceMismatchError(msg)
        _debug(self.rt, 1, msg)

    def _reset(self) -> None:
        self.rt.instances.log = None
        self.mode = self.name = self.rec = self.item = None
        self.cur = []
        self.begin_op = None
        self.gr = None
        self.pos = 0


def _reset_buffers(inst: Any, rec: Recording, release: bool) -> Callable[[Op], None]:
    """The begin marker's body: the reduction buffers a trace opens that are
    still there start at their identity again, and the replay's copies and
    folds are expected as the buffers' consumers, so each buffer that dies in
    the block goes back to the pool after its last one (the next replay's
    reducers take it from there): the recording's lifetimes, replayed. Not
    with ``release`` False (a replay as CUDA graphs, which captured the
    buffers' addresses): its buffers then live to the next fence. Nor for
    the buffers the trace keeps (``rec.kept``: its ``keep_buffers``
    regions'): they stay, so the views cut from them stay valid."""
    buffers, kept = rec.buffers, rec.kept
    dying = {k for k in rec.dying if k not in kept}
    consumers = {k: n for k, n in rec.consumers.items() if k not in kept} if release else None

    def reset(op: Op) -> None:
        for key, redop in buffers:
            inst.reset_buffer(key, redop)  # under the buffer's GPU when it has one
        if consumers:
            inst.expect(consumers, dying)
    return reset


def _domain(colors: Any) -> list:
    return [c if isinstance(c, tuple) else (c,) if isinstance(c, int) else tuple(c)
            for c in colors]


def _launch_desc(task: Any, colors: Any, args: tuple) -> str:
    from .replication import describe_args

    if colors is None:
        return f"launch of {task.name!r}({describe_args(args)})"
    n = len(colors) if hasattr(colors, "__len__") else "?"
    return f"index launch of {task.name!r} over {n} points ({describe_args(args)})"


def _debug(rt: Any, level: int, msg: str) -> None:
    if rt.debug >= level:
        print(f"[legionpy] {msg}", file=sys.stderr, flush=True)


@contextmanager
def traced(rt: Any, name: str, strict: bool = False, order: Callable | None = None,
           keep_buffers: Any = ()):
    rt.begin_trace(name, strict=strict, order=order, keep_buffers=keep_buffers)
    try:
        yield
    except BaseException:
        rt.tracer.abort()
        raise
    rt.end_trace(name)
