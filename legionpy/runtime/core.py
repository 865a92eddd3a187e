"""The Runtime: launch-time analysis and the process-wide singleton.

Every launch is analysed on the launching thread, in program order, before
anything runs, and only from what the program did (never from timing):

1. ids: every op (point task, copy, fill) takes the next integer id;
2. privileges: region arguments are matched to the task's privileges
   (launch.py), giving one RegionRequirement per privilege;
3. dependences: ``DependenceAnalyzer.analyze`` (legionpy.regions) gives
   the earlier ops each point must wait for (true, anti, output);
4. mapping: the mapper picks a device per point and a memory per
   requirement (runtime/mapping.py);
5. coherence: per (root, field) the FieldState (regions/coherence.py) yields the
   copies to issue (each an op on its (src, dst) link) and the prologue
   (fills to materialise, reductions to fold) the task runs first;
6. the op goes to the scheduler (scheduler.py), which runs it on its
   device's FIFO worker once its dependences finished.

Under MPI every rank performs exactly the same steps 1-5, so all ranks agree
on ids, devices and copies; a rank then executes only its devices' ops
(replication.py decides each rank's part; mpi.py is the MPI layer; devices
come from every rank, rank-major, see ``machine_devices``).

Tasks with no region arguments skip steps 2, 3 and 5 (the fast path). At a
fence every op has finished, so the dependence state restarts empty and
unreferenced reduction buffers are freed.

Debug output (stderr), ``LEGIONPY_DEBUG``: 1 per-fence summary (tasks,
copies, bytes, seconds), 2 every op with device, time and bytes, 3 also
every mapper decision.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import weakref
from typing import Any

import numpy as np

from ..affinity import fine_timers, one_core
from ..errors import LaunchError, MappingError, RegionError, TaskError
from ..regions import WD, DependenceAnalyzer, Partition, Region, RegionRequirement, Subregion
from ..regions.coherence import HOST, FieldState, FoldAction, Request
from .body import PointBody
from .devices import Device, limit_blas, machine_devices, queue_name
from .futures import Future, FutureMap
from .instances import Instances
from .launch import LaunchOptions, TaskFunction
from .mapping import DefaultMapper, Mapper, MapperTask
from .mpi import launched_under_mpi
from .replication import describe_args
from .scheduler import DONE, Op, Scheduler, SerialExecutor, ThreadExecutor
from .trace import Trace
from .tracing import Tracer

__all__ = ["Runtime"]

_REGION_TYPES = (Region, Subregion)
_TRACING = ("record", "replay")


class Runtime:
    """Devices, mapper, analysis state, scheduler and trace of one process.

    ``Runtime(cpus=None, executor=None, mapper=None, trace=None, debug=None)``:
    ``cpus`` (default LEGIONPY_CPUS or the core count), ``executor``
    "threads" | "serial" (default LEGIONPY_EXECUTOR or "threads"), ``trace``
    a path to write Chrome JSON at exit (default LEGIONPY_TRACE), ``debug``
    0-3 (default LEGIONPY_DEBUG)."""

    def __init__(self, cpus: int | None = None, executor: str | None = None,
                 mapper: Any = None, trace: str | None = None, debug: int | None = None) -> None:
        self.t0 = time.perf_counter()
        self.rank = 0
        self.repl: Any = None
        fine_timers()  # before this process starts its threads: they inherit it
        cl = None
        if launched_under_mpi():
            from .mpi import cluster

            cl = cluster()
            self.rank = cl.rank
            if cl.size > 1:
                executor = "threads"  # blocking transfers need their own link workers
        self.devices: list[Device] = machine_devices(cpus, cl)
        self.local = [d for d in self.devices if d.rank == self.rank]
        self.debug = int(debug if debug is not None else os.environ.get("LEGIONPY_DEBUG", 0) or 0)
        self.sched = Scheduler(on_done=self._on_done)
        kind = executor or os.environ.get("LEGIONPY_EXECUTOR", "threads")
        if kind == "serial":
            self.sched.executor = SerialExecutor(self.sched)
        elif kind == "threads":
            self.sched.executor = ThreadExecutor(self.sched)
            self.sched.one_core = one_core()  # its threads share it: yield it now and then
            limit_blas(1)
        else:
            raise ValueError(f"executor must be 'threads' or 'serial', got {kind!r}")
        self.executor = kind
        self.analyzer = DependenceAnalyzer()
        self.states: dict[tuple[int, str], FieldState] = {}
        self._tracked: set[int] = set()
        self._fields_cache: dict[tuple[int, int], tuple] = {}  # see _requirements
        self._reduced: set[tuple[int, str]] = set()  # (root uid, field) that got a reduction
        self.instances = Instances()
        if any(d.kind == "gpu" for d in self.local):
            from .gpu import ordinal

            self.instances.gpu_of = {d.id: ordinal(d) for d in self.local if d.kind == "gpu"}
            from .streams import Streams

            self.sched.use_streams(Streams(self).install())  # one stream per device and link
        self.trace = Trace(self.t0, self.rank)
        self.tracer = Tracer(self)
        self._host_waits: list | None = None  # ids a host op waited for (while recording)
        self._host_prologue: list = []
        if cl is not None and cl.size > 1:
            from .replication import Replicator

            self.repl = Replicator(self, cl)
            Op.show_rank = True
            atexit.register(self._exit_fence)
        #: Stand-in hook (tests of invariant 3, docs/taskgraph.md): when set,
        #: ``f(src, dst, nbytes) -> seconds | None`` and every copy sleeps that
        #: long in all (the data still moves; None: no stand-in; one process).
        self.copy_standin: Any = None
        #: stand-in runs (optimizer/mirror.py): {collective name: simulated s};
        #: a collective takes at least its simulated time
        self.collective_standin: dict[str, float] | None = None
        self._next_id = 0
        self._seq = 0
        self._launches = 0
        self._live: dict[int, Op] = {}
        self._failures: list[Op] = []
        self._stats = [0, 0, 0, time.perf_counter()]  # tasks, copies, bytes, since
        self.mapper: Any = None
        self.set_mapper(mapper if mapper is not None else DefaultMapper())
        self._trace_path = trace if trace is not None else os.environ.get("LEGIONPY_TRACE")
        if self._trace_path:
            self.trace.start()
            atexit.register(self._write_trace, at_exit=True)
        self.closed = False
        if self.repl is None:  # under MPI report_failure already ends the job
            ref = weakref.ref(self)
            atexit.register(lambda: (rt := ref()) is not None and rt._exit_check())

    # -- configuration --------------------------------------------------------------
    def set_mapper(self, mapper: Any) -> None:
        """Install ``mapper`` (a legionpy.mapper.Mapper); it sees ``self.devices``."""
        if not isinstance(mapper, Mapper):
            raise MappingError(f"set_mapper needs a legionpy.mapper.Mapper, got {mapper!r}")
        mapper.devices = list(self.devices)
        self.mapper = mapper
        self._default_map = type(mapper).map_task is Mapper.map_task
        if hasattr(self, "tracer"):
            self.tracer.invalidate()

    def invalidate_traces(self) -> None:
        """Forget every recorded trace: the mapper's decisions or a strategy
        changed, so the next use of each trace records it again."""
        self.tracer.invalidate()

    # -- tracing (tracing.py) -----------------------------------------------------------
    def begin_trace(self, name: str, strict: bool = False, order: Any = None,
                    keep_buffers: Any = ()) -> None:
        """Start trace ``name``: replay its recording when it applies, else record."""
        self.tracer.begin(name, strict=strict, order=order, keep_buffers=keep_buffers)

    def end_trace(self, name: str) -> None:
        """End trace ``name`` (recording kept; replay summarised)."""
        self.tracer.end(name)

    def _new_id(self) -> int:
        i = self._next_id
        self._next_id = i + 1
        return i

    # -- single launches ------------------------------------------------------------
    def launch(self, task: TaskFunction, args: tuple, kwargs: dict,
               options: LaunchOptions) -> Future:
        """Launch one task; see ``TaskFunction.__call__``."""
        if self.tracer.mode in _TRACING:
            return self.tracer.launch(task, None, args, kwargs, options)
        return self._launch(task, args, kwargs, options)

    def _untraced_launch(self, task: TaskFunction, colors: Any, args: tuple, kwargs: dict,
                         options: LaunchOptions) -> Any:
        if colors is None:
            return self._launch(task, args, kwargs, options)
        return self._index_launch(task, colors, args, kwargs, options)

    def _launch(self, task: TaskFunction, args: tuple, kwargs: dict,
                options: LaunchOptions) -> Future:
        op_id = self._next_id
        self._next_id = op_id + 1
        seq = self._seq
        self._seq = seq + 1
        rargs = None
        for i, a in enumerate(args):
            if isinstance(a, _REGION_TYPES):
                if rargs is None:
                    rargs = []
                rargs.append((i, a))
            elif isinstance(a, Partition):
                raise LaunchError(f"task {task.name!r} got the partition {a!r} as argument {i} "
                                  "of a single launch; pass P[color], or use index_launch")
        if rargs is not None:
            psets = task.privileges_for(len(rargs))
            rargs = [(i, a, ps) for (i, a), ps in zip(rargs, psets)]
        elif task.privileges:
            task.privileges_for(0)  # raises the mismatch
        if self.repl is not None:
            self.repl.note(f"{task.name}({describe_args(args)}) {task.privileges}")
        reqs = self._requirements(rargs) if rargs else []
        futs = None
        for k, a in (*enumerate(args), *kwargs.items()):
            if isinstance(a, Future):
                futs = (futs or []) + [k]
        return self._point(task, op_id, seq, args, kwargs, rargs, reqs, futs, options, None, None,
                           None, None)

    def _requirements(self, rargs: list) -> list[RegionRequirement]:
        """One RegionRequirement per privilege of each region argument; the
        resolved fields are cached per (field space, privilege)."""
        cache = self._fields_cache
        new = RegionRequirement.__new__
        reqs = []
        for _, region, pset in rargs:
            fs = region.fields
            for p in pset.privileges:
                hit = cache.get((id(fs), id(p)))
                if hit is None:
                    req = RegionRequirement(region, p)  # validates, raises the field errors
                    if len(cache) > 4096:
                        cache.clear()
                    cache[id(fs), id(p)] = (fs, p, req.fields)  # keeps fs, p alive: ids stay valid
                else:
                    req = new(RegionRequirement)
                    req.region = region
                    req.privilege = p
                    req.fields = hit[2]
                reqs.append(req)
        return reqs

    def _point(self, task: TaskFunction, op_id: int, seq: int, args: tuple, kwargs: dict,
               rargs: list | None, reqs: list, futs: list | None, options: LaunchOptions,
               point: tuple | None, index: int | None, domain: list | None,
               target: Device | None) -> Future:
        """One point: ``reqs`` its requirements (from ``rargs``), ``futs`` the
        positions / keywords of its Future arguments (None if none)."""
        if options.kind == "collective":
            from .collectives import launch_point

            return launch_point(self, task, op_id, args, kwargs, rargs, reqs, options)
        name = options.name or task.name
        mapper = self.mapper
        mt = None
        if self._default_map and target is not None:
            dev, mems = target, None  # the MapperTask would be seen by no mapper call
        else:
            mt = MapperTask(name, options.kind, options.tag, op_id, seq, reqs, point, index,
                            domain, self._locality if reqs else None)
            if target is None:
                target = mapper.select_task_options(mt).device
            mt.target = target
            if self._default_map and target is not None:
                dev, mems = target, None
            else:
                m = mapper.map_task(mt)
                dev, mems = m.device, m.memories
        devices = self.devices
        if dev is None or not (0 <= dev.id < len(devices)) or (
                devices[dev.id] is not dev and devices[dev.id] != dev):
            if mt is None:
                mt = MapperTask(name, options.kind, options.tag, op_id, seq, reqs, point, index,
                                domain)
            raise MappingError(f"mapper {type(mapper).__name__} mapped {mt!r} to {dev!r}, which "
                               f"is not one of the runtime's devices {self.devices}")
        if self.debug >= 3:
            _log(f"map {name} op {op_id}{'' if point is None else f' point {point}'} -> "
                 f"{dev}{'' if mems is None else f' memories {mems}'}")
        dep_ops: list[Op] = []
        live = self._live
        fut_pos = futs
        repl = self.repl
        if futs:
            for k in futs:
                fop = (args[k] if isinstance(k, int) else kwargs[k])._op
                dep_ops.append(fop)
                if repl is not None:
                    t = repl.future_arg(fop, dev)
                    if t is not None:
                        dep_ops.append(t)
        views = prologues = None
        dep_ids = {d.id for d in dep_ops} if dep_ops else ()
        if reqs:
            views, prologues, ids = self._analyze(op_id, reqs, rargs, dev, mems, dep_ops, task)
            dep_ids = ids.union(dep_ids)
        fn = task.fn
        body = PointBody(fn, name, point, args, kwargs, rargs, prologues, views, fut_pos,
                         self.instances)
        if dev.kind == "gpu":  # prologue, views and body on the task's GPU
            from .gpu import backend, ordinal

            body.device = (backend().Device, ordinal(dev))
        op = Op(op_id, options.kind, name, dev.id, body, point, index, options.tag)
        op.rank = dev.rank
        if dev.rank != self.rank:
            repl.ghost(op, dev.rank)
        elif repl is not None:
            repl.cl.keep(op)
        if reqs:
            live[op_id] = op
        if repl is not None:
            repl.launched = op_id + 1
        op.deps = tuple(sorted(dep_ids))
        self.sched.submit(op, dep_ops)
        self.sched.executor.drain()
        return Future(op, self.sched)

    def _analyze(self, op_id: int, reqs: list, rargs: list, dev: Device, mems: Any,
                 dep_ops: list, task: TaskFunction, spread: bool = False
                 ) -> tuple[list, list, set]:
        """Dependences + coherence of one point; appends the unfinished ones to
        ``dep_ops``; returns (views: ``(pos, region, fieldspecs)`` for
        body.build_view, prologues, all dependence ids). ``spread``: the
        requirements' memories are on several ranks (a collective, see
        collectives.py): this rank makes the instances of its own only."""
        deps = set(self.analyzer.analyze(op_id, reqs))
        if mems is not None:
            if len(mems) != len(reqs) or any(not -1 <= m < len(self.devices) for m in mems):
                raise MappingError(
                    f"map_task for {task.name!r} (op {op_id}) returned memories {mems}: need one "
                    f"memory id in -1..{len(self.devices) - 1} per requirement ({len(reqs)})")
        prologues: list = []
        views: list = []
        k = 0
        repl = self.repl
        mine = dev.rank == self.rank
        states = self.states
        inst = self.instances
        new_id = self._new_id
        tr = self.tracer if self.tracer.mode == "record" else None
        for pos, region, pset in rargs:
            fieldspecs = []
            rect = region.rect
            root = region.root
            uid = root.uid
            for req in reqs[k:k + len(pset.privileges)]:
                mem = dev.id if mems is None else mems[k]
                if repl is not None:
                    mem = repl.memory(mem, dev)
                    if spread:
                        mine = repl.owns(mem)
                priv = req.privilege
                mode, redop = priv.mode, priv.redop
                for f in req.fields:
                    key = (uid, f)
                    if tr is not None:
                        tr.touch(key, root)
                    st = states.get(key)
                    if st is None:
                        st = self._new_state(root, f)
                    buf = None
                    if mode == "reduce":
                        buf = (op_id, k, f)
                        self._reduced.add(key)
                    elif mine:
                        if not inst.covers(mem, root, f, rect):
                            self._quiesce()  # in-flight ops may hold views of the old array
                        inst.reserve(mem, root, f, rect)
                    if mode == "write_discard" and key in self._reduced:
                        self._discarded(st, rect)
                    plan, states[key] = st.access(
                        Request(rect, mode, mem, op_id, redop, buf), new_id)
                    if tr is not None and plan.buffer is not None:
                        tr.reduced_into(plan.buffer, root)
                    if plan.copies or plan.prologue:
                        self._plan_consumers(plan, states[key])
                    if mode == "reduce":  # mem's open buffer for (root, f), maybe older
                        buf = (plan.buffer, redop)
                        if mine and plan.prologue:  # folds of another op's reductions
                            for a in plan.prologue:
                                if not inst.covers(a.memory, root, f, a.rect):
                                    self._quiesce()
                                inst.reserve(a.memory, root, f, a.rect)
                    if plan.copies:
                        for c in plan.copies:
                            self._submit_copy(c, root, f)
                    if plan.deps:
                        deps |= plan.deps
                    if plan.prologue:
                        prologues.append((root, f, plan.prologue))
                    fieldspecs.append((f, mem, mode, buf))
                k += 1
            views.append((pos, region, fieldspecs))
        live = self._live
        for d in deps:
            o = live.get(d)
            if o is not None:
                dep_ops.append(o)
        return views, prologues, deps

    def _plan_consumers(self, plan: Any, st: FieldState) -> None:
        """Reduction buffer lifetimes (docs/memory.md): every copy or fold of
        ``plan`` that reads a buffer of this rank is one more consumer of it;
        a buffer the new state ``st`` no longer refers to is dead, and goes
        back to the pool as soon as its last consumer has run."""
        inst, repl = self.instances, self.repl
        read = []
        for c in plan.copies:
            if c.buffer is not None and (repl is None or repl.owns(c.src)):
                inst.will_consume(c.buffer)
                read.append(c.buffer)
        for a in plan.prologue:
            if type(a) is FoldAction and a.buffer is not None and (
                    repl is None or repl.owns(a.memory)):
                inst.will_consume(a.buffer)
                read.append(a.buffer)
        for b in dict.fromkeys(read):
            if not st.refers(b):
                inst.mark_dead(b)

    def _discarded(self, st: FieldState, rect: Any) -> None:
        """A write or fill of ``rect`` drops the pending reductions there
        unread: those buffers live until the next fence (their reducers may
        still be running when the other consumers finish)."""
        bufs = st.buffers_in(rect)
        if bufs:
            self.instances.abandon(bufs)

    def _new_state(self, root: Any, field: str) -> FieldState:
        """Fields start as a lazy fill of 0; a region's instances and state
        are dropped when the region is garbage collected."""
        if root.uid not in self._tracked:
            self._tracked.add(root.uid)
            weakref.finalize(root, self._forget, root.uid, list(root.fields))
        return FieldState.filled(root.rect, 0)

    def _forget(self, uid: int, fields: list) -> None:
        for f in fields:
            self.states.pop((uid, f), None)
        self.instances.drop_root(uid)
        self._tracked.discard(uid)

    def _submit_copy(self, c: Any, root: Any, field: str) -> None:
        if self.repl is not None:
            return self.repl.submit_copy(c, root, field)
        inst = self.instances
        standin = self.copy_standin

        def run(op: Op) -> None:
            if standin is not None:
                d = standin(c.src, c.dst, op.bytes)
                if d is not None:
                    t0 = time.perf_counter()
                    inst.run_copy(c, root, field)  # keeps staging/folds valid
                    time.sleep(max(0.0, d - (time.perf_counter() - t0)))
                    return
            inst.run_copy(c, root, field)

        op = Op(c.id, "copy", f"{root.name}.{field}", (c.src, c.dst), run)
        op.bytes = c.volume * root.fields[field].itemsize
        op.deps = c.deps
        live = self._live
        deps = [live[d] for d in c.deps if d in live]
        live[c.id] = op
        self.sched.submit(op, deps)

    def _locality(self, mt: Any) -> dict[int, int]:
        out: dict[int, int] = {}
        for req in mt.requirements:
            if not req.privilege.reads:
                continue
            for f in req.fields:
                st = self.states.get((req.root.uid, f))
                if st is not None:
                    for m, v in st.valid_memories(req.rect).items():
                        out[m] = out.get(m, 0) + v
        return out

    # -- index launches -------------------------------------------------------------
    def index_launch(self, task: TaskFunction, colors: Any, args: tuple, kwargs: dict,
                     options: LaunchOptions) -> FutureMap:
        if self.tracer.mode in _TRACING:
            return self.tracer.launch(task, colors, args, kwargs, options)
        return self._index_launch(task, colors, args, kwargs, options)

    def _index_launch(self, task: TaskFunction, colors: Any, args: tuple, kwargs: dict,
                      options: LaunchOptions) -> FutureMap:
        from .checks import check_index_interference

        domain = [c if isinstance(c, tuple) else (c,) if isinstance(c, int) else tuple(c)
                  for c in colors]
        if not domain:
            raise LaunchError(f"index launch of {task.name!r} over an empty domain")
        pids = options.points
        if pids is not None and len(pids) != len(domain):
            raise LaunchError(f"index launch of {task.name!r}: LaunchOptions.points has "
                              f"{len(pids)} entries for {len(domain)} colors")
        rpos = [i for i, a in enumerate(args) if isinstance(a, (Region, Subregion, Partition))]
        psets = task.privileges_for(len(rpos)) if (rpos or task.privileges) else []
        for i, a in enumerate(args):
            if isinstance(a, (Partition, FutureMap)):
                missing = [c for c in domain if c not in a]
                if missing:
                    raise LaunchError(f"index launch of {task.name!r}: argument {i} ({a!r}) has "
                                      f"no color {missing[0]} of the launch domain")
        check_index_interference(task.name, domain, args, rpos, psets)
        if self.repl is not None:
            self.repl.note(f"index {task.name}{domain[0]}..{domain[-1]}x{len(domain)}"
                           f"({describe_args(args)}) {task.privileges}")
        base = self._next_id
        self._next_id = base + len(domain)
        seq = self._seq
        self._seq = seq + 1
        self._launches += 1
        mt = MapperTask(options.name or task.name, options.kind, options.tag, base, seq, [],
                        None, None, domain, points=pids)
        slices = self.mapper.slice_task(mt, domain)
        if len(slices) != len(domain) or {p for p, _ in slices} != set(domain):
            raise MappingError(f"slice_task of {type(self.mapper).__name__} for {task.name!r} "
                               f"must return one (point, device) per color of {domain[:4]}...")
        where = dict(slices)
        # per-launch work, done once: projections, requirement templates, Future positions
        projected = [i for i, a in enumerate(args) if isinstance(a, (Partition, FutureMap))]
        proj = [(i, args[i], getattr(args[i], "_subregions", None)) for i in projected]
        tmpl = None  # [(pos, pset, [(privilege, fields)])]
        if rpos:
            probe = list(args)
            for i in projected:
                probe[i] = args[i][domain[0]]
            tmpl = []
            for i, ps in zip(rpos, psets):
                reqs0 = self._requirements([(i, probe[i], ps)])
                tmpl.append((i, ps, [(r.privilege, r.fields) for r in reqs0]))
        futs_pos = [i for i, a in enumerate(args) if isinstance(a, (Future, FutureMap))]
        futs_pos += [k for k, v in kwargs.items() if isinstance(v, Future)]
        futs_pos = futs_pos or None
        new_req = RegionRequirement.__new__
        point = self._point
        futs = []
        for k, color in enumerate(domain):
            a = args
            if proj:
                a = list(args)
                for i, arg, subs in proj:
                    sub = subs.get(color) if subs is not None else None
                    a[i] = sub if sub is not None else arg[color]
                a = tuple(a)
            rargs = None
            reqs = []
            if tmpl is not None:
                rargs = []
                for i, ps, privs in tmpl:
                    region = a[i]
                    rargs.append((i, region, ps))
                    for p, fields in privs:
                        req = new_req(RegionRequirement)
                        req.region = region
                        req.privilege = p
                        req.fields = fields
                        reqs.append(req)
            futs.append(point(task, base + k, seq, a, kwargs, rargs, reqs, futs_pos, options,
                              color, k if pids is None else pids[k], domain, where[color]))
        return FutureMap(domain, futs)

    # -- fills, reads, writes, fences -----------------------------------------------------
    def fill(self, region: Any, field: str, value: Any) -> None:
        """Lazily set ``field`` of ``region`` (Region or Subregion) to ``value``."""
        root = region.root
        root.fields.resolve((field,), where=region.name)
        value = np.asarray(value, dtype=root.fields[field])[()]
        if self.tracer.mode in _TRACING:
            return self.tracer.host_op("fill", region, field, value)
        return self._fill(region, field, value)

    def _untraced_host_op(self, kind: str, region: Any, field: str, value: Any) -> Any:
        if kind == "fill":
            return self._fill(region, field, value)
        if kind == "write":
            return self._write_region(region, field, value)
        return self._read_region(region, field)

    def _replay_host_op(self, kind: str, region: Any, field: str, value: Any, waits: list,
                        prologue: list) -> Any:
        """A recorded fill, write or read, replayed after the ops in ``waits``."""
        if kind == "fill":
            return None
        streams = self.sched.streams
        for o in waits:
            self.sched.wait(o)
            if o.state != DONE:
                raise o.error
            if streams is not None:
                streams.host_wait(o)
        root, rect = region.root, region.rect
        host = self.instances.instance(HOST, root, field)
        if kind == "write":
            host[rect.to_slices()] = self._checked_array(region, field, value)
            return None
        self.instances.run_prologue(prologue, root, field)
        return host[rect.to_slices()].copy()

    def _touch(self, region: Any, field: str) -> None:
        if self.tracer.mode == "record":
            self.tracer.touch((region.root.uid, field), region.root)

    def _fill(self, region: Any, field: str, value: Any) -> None:
        root = region.root
        self._touch(region, field)
        if self.repl is not None:
            self.repl.note(f"fill R{root.uid}{region.rect.lo}{region.rect.hi}.{field}={value}")
        op_id = self._new_id()
        deps = self.analyzer.analyze(op_id, [RegionRequirement(region, WD(field))])
        key = (root.uid, field)
        st = self.states.get(key) or self._new_state(root, field)
        if key in self._reduced:
            self._discarded(st, region.rect)
        self.states[key] = st.fill(region.rect, value)
        op = Op(op_id, "fill", f"fill {region.name}.{field}", None, None)
        op.deps = tuple(deps)
        self._live[op_id] = op
        self.sched.submit(op, [self._live[d] for d in deps if d in self._live])

    def write_region(self, region: Any, field: str, array: Any) -> None:
        """Replace ``field`` over ``region``'s rect with ``array`` (waits for users)."""
        region.root.fields.resolve((field,), where=region.name)
        arr = self._checked_array(region, field, array)
        if self.tracer.mode in _TRACING:
            return self.tracer.host_op("write", region, field, arr)
        return self._write_region(region, field, arr)

    @staticmethod
    def _checked_array(region: Any, field: str, array: Any) -> np.ndarray:
        arr = np.asarray(array)
        if arr.shape != region.rect.shape:
            raise RegionError(f"write of {region.name}.{field}: array shape {arr.shape} differs "
                              f"from the region's shape {region.rect.shape}")
        return arr

    def _write_region(self, region: Any, field: str, arr: np.ndarray) -> None:
        root, rect = region.root, region.rect
        self._touch(region, field)
        if self.repl is not None:
            self.repl.note(f"write R{root.uid}{rect.lo}{rect.hi}.{field} {arr.dtype}")
        op_id = self._new_id()
        deps = self.analyzer.analyze(op_id, [RegionRequirement(region, WD(field))])
        self._wait_ids(deps)
        self.instances.instance(HOST, root, field)[rect.to_slices()] = arr
        key = (root.uid, field)
        st = self.states.get(key) or self._new_state(root, field)
        if key in self._reduced:
            self._discarded(st, rect)
        _, self.states[key] = st.access(Request(rect, "write_discard", HOST, op_id), self._new_id)

    def read_region(self, region: Any, field: str) -> np.ndarray:
        """A numpy copy of ``field`` over ``region``'s rect (waits for writers)."""
        region.root.fields.resolve((field,), where=region.name)
        if self.tracer.mode in _TRACING:
            return self.tracer.host_op("read", region, field)
        return self._read_region(region, field)

    def _read_region(self, region: Any, field: str) -> np.ndarray:
        from ..regions import R

        root, rect = region.root, region.rect
        self._touch(region, field)
        if self.repl is not None:
            self.repl.note(f"read R{root.uid}{rect.lo}{rect.hi}.{field}")
        op_id = self._new_id()
        deps = set(self.analyzer.analyze(op_id, [RegionRequirement(region, R(field))]))
        key = (root.uid, field)
        st = self.states.get(key) or self._new_state(root, field)
        host = self.instances.instance(HOST, root, field)
        plan, self.states[key] = st.access(Request(rect, "read", HOST, op_id), self._new_id)
        self._plan_consumers(plan, self.states[key])
        for c in plan.copies:
            self._submit_copy(c, root, field)
        self._wait_ids(deps | plan.deps)
        self._host_prologue = plan.prologue
        self.instances.run_prologue(plan.prologue, root, field)
        return host[rect.to_slices()].copy()

    def worker_cpu(self) -> dict[int, float]:
        """Device id -> CPU seconds its worker thread has used so far, for this
        rank's devices that have run a task (the time it ran, not the time it
        waited for a core or the interpreter lock; a per-thread clock, read
        in about a microsecond). Empty with the serial executor."""
        return {k: v for k, v in self.sched.executor.cpu_seconds().items() if type(k) is int}

    def worker_span_cpu(self) -> dict[int, float]:
        """Device id -> CPU seconds its tasks' bodies have used while
        :meth:`count_span_cpu` is on, in whichever thread ran them (with
        worker threads: their CPU less their work between tasks, finishing
        one, releasing its successors, taking the next); empty while it is
        off."""
        spans = self.sched.span_cpu
        return {} if spans is None else {k: v for k, v in spans.items() if type(k) is int}

    @property
    def counting_span_cpu(self) -> bool:
        """Whether :meth:`count_span_cpu` is on."""
        return self.sched.span_cpu is not None

    def count_span_cpu(self, on: bool) -> None:
        """Add up each device's task bodies' CPU seconds (two thread-clock
        reads per task, about a microsecond) from now on, from zero
        (:meth:`worker_span_cpu`), or stop."""
        self.sched.count_span_cpu(on)

    def memory_stats(self, reset: bool = False) -> dict[int, dict[str, Any]]:
        """Bytes of instances, reduction and staging buffers per memory of
        this rank: ``{memory: {"bytes": in use now, "peak_bytes": most in use
        at once, "peak_by_kind": {"instances", "reduction", "staging": bytes}
        at that peak, "reserved_bytes": allocated now, the buffer pool
        included}}`` (memory -1: the host's whole-root replicas). ``reset``:
        peaks restart from now."""
        inst = self.instances
        out = {m: {"bytes": inst.nbytes.get(m, 0), "peak_bytes": inst.peak.get(m, 0),
                   "peak_by_kind": dict(inst.peak_kinds.get(m, {})),
                   "reserved_bytes": inst.reserved.get(m, 0)}
               for m in sorted(set(inst.nbytes) | set(inst.peak))}
        if reset:
            inst.reset_peak()
        return out

    def _quiesce(self) -> None:
        """Wait for every in-flight local op (before an instance is re-made);
        errors stay with the ops (fence reports them)."""
        for o in list(self._live.values()):
            if not o.remote and o.state < DONE:
                self.sched.wait(o)

    def _wait_ids(self, ids: Any) -> None:
        if self._host_waits is not None:
            self._host_waits.extend(ids)
        streams = self.sched.streams
        for d in sorted(ids):
            o = self._live.get(d)
            if o is not None:
                self.sched.wait(o)
                if o.state != DONE:
                    o.error.legionpy_reported = True
                    raise o.error
                if streams is not None:
                    streams.host_wait(o)
            elif streams is not None:
                streams.host_wait_id(d)

    def fence(self, timeout: float | None = None) -> None:
        """Wait for every launched op; raise the first failure (TaskError).
        Under MPI first compare the launches of every rank (RankMismatchError).
        Not inside a trace that records or replays (LaunchError)."""
        if self.tracer.mode in _TRACING:
            raise LaunchError(f"fence inside trace {self.tracer.name!r}: a traced block must "
                              "not fence; wait on a Future or fence after end_trace")
        if self.repl is not None:
            self.repl.check_launches()
        self.sched.wait(None, timeout)
        if self.sched.streams is not None:
            self.sched.streams.fence()  # the host waits for every stream
        if self.repl is not None:
            self.repl.reset()
            self.repl.cl.check()
        failures, self._failures = self._failures, []
        self._live.clear()
        self.analyzer = DependenceAnalyzer()
        # only states that ever took a reduction can refer to a reduction buffer
        live_bufs: set = set()
        for key in list(self._reduced):
            st = self.states.get(key)
            bufs = [r.buffer for p in st for r in p.reds] if st is not None else ()
            if bufs:
                live_bufs.update(bufs)
            else:
                self._reduced.discard(key)
        self.instances.keep_only(live_bufs)
        if self.debug >= 1:
            t, c, b, since = self._stats
            _log(f"fence: {t} tasks, {c} copies, {b} bytes moved, {time.perf_counter() - since:.6f}"
                 f" s, {len(failures)} failed")
            self._stats = [0, 0, 0, time.perf_counter()]
        if failures:
            roots = [o for o in failures if not isinstance(o.error.__cause__, type(o.error))]
            first = min(roots or failures, key=lambda o: o.id)
            raise first.error

    def _on_done(self, op: Op) -> None:
        if op.state == DONE:
            live = self._live
            if live.get(op.id) is op:  # a trace's end marker id is reused by every replay
                live.pop(op.id, None)  # not del: a failing job's shutdown may clear it meanwhile
        else:
            self._failures.append(op)
            if self.repl is not None and not isinstance(op.error.__cause__, TaskError):
                self.repl.cl.report_failure(str(op.error))
        if self.trace.enabled:
            self.trace.add(op)
        if self.debug:
            st = self._stats
            if op.kind == "copy":
                st[1] += 1
                st[2] += op.bytes
            elif op.kind != "fill":
                st[0] += 1
            if self.debug >= 2:
                _log(f"{op.kind} {op.name} op {op.id} on {queue_name(op.queue)}: "
                     f"{(op.end - op.start) * 1e6:.1f} us, {op.bytes} bytes"
                     f"{'' if op.state == DONE else ' FAILED'}")

    def _write_trace(self, at_exit: bool = False) -> None:
        """Write ``LEGIONPY_TRACE``; under MPI rank 0 writes one file with
        every rank's records (``pid`` = rank), gathered at shutdown."""
        if not self._trace_path:
            return
        if self.repl is None:
            if len(self.trace):
                self.trace.save(self._trace_path)
            return
        if at_exit and not self.closed:  # _exit_fence's shutdown writes it, after the fence
            return
        if getattr(self, "_trace_gathered", False):
            return
        self._trace_gathered = True
        # each rank's records count from its own start: the wall clock of that
        # start puts them on one timeline (ranks start ms apart)
        start = time.time() - (time.perf_counter() - self.t0)
        parts = self.repl.cl.coll.gather((self.trace.to_chrome()["traceEvents"], start), root=0)
        if self.rank == 0 and any(events for events, _ in parts):
            from .trace import write_merged

            write_merged(self._trace_path, [events for events, _ in parts],
                         starts=[t for _, t in parts])

    def _exit_check(self) -> None:
        """At interpreter exit: wait for the launched tasks; a failure that no
        ``get`` or fence raised ends the program with its message, status 1."""
        if self.closed:
            return
        try:
            self.sched.wait(None, 60)
        except Exception:  # noqa: BLE001 - the failures are below
            pass
        roots = [o for o in self._failures
                 if not isinstance(o.error.__cause__, type(o.error))] or self._failures
        unseen = [o for o in roots if not getattr(o.error, "legionpy_reported", False)]
        if unseen:
            for o in sorted(unseen, key=lambda o: o.id):
                print(f"legionpy: error: {o.error} (the task failed and nothing awaited it; "
                      "call .get() on its Future or lp.fence() to handle it)",
                      file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def _exit_fence(self) -> None:
        """At interpreter exit under MPI: finish in-flight transfers first."""
        if not self.closed and self.repl is not None and self.repl.cl.failure is None:
            try:
                self.shutdown()
            except Exception as exc:  # noqa: BLE001 - report, the job is ending
                _log(f"rank {self.rank} at exit: {exc}")

    def shutdown(self) -> None:
        """Fence (errors are dropped), write the trace, stop workers."""
        if self.closed:
            return
        self.closed = True
        try:
            self.fence(timeout=30)
        except Exception:  # noqa: BLE001 - already reported by fence/get
            pass
        self._write_trace()
        if self.instances.gpu_of:
            from .gpu import close_all

            close_all()  # CUDA IPC handles this process opened
        self.sched.executor.close()
        if self.sched.streams is not None:
            self.sched.streams.close()
        if self.repl is not None:
            for req in self.repl.persistent:
                req.Free()
            self.repl.persistent.clear()
        if self.executor == "threads":
            limit_blas(None)


def _log(msg: str) -> None:
    print(f"[legionpy] {msg}", file=sys.stderr, flush=True)
