"""The mirror (DESIGN.md invariant 3): the runtime's trace of one training
iteration and the optimizer's :class:`~legionpy.optimizer.taskgraph.TaskGraph`
in one comparable form, and their differences.

Both halves become a :class:`MirrorGraph`:

- compute tasks by name -- ``F:op[k]``, ``B:op[k]``, ``U:param[t]`` (``k``
  the point index of the launch, ``t`` the update shard) -- and device;
- copies by ``(task fed, source device, destination device, bytes)``, with
  an occurrence number when one task gets several equal copies (numbered in
  id order). In a trace the task a copy feeds is the lowest-id task that
  waits for it (the task whose analysis issued it); in a task graph it is
  named by the copy's key (a multi-hop route counts as one copy);
- collectives (docs/seam.md) as units: ``RS:b<bucket>.<group>`` /
  ``AG:b<bucket>.<group>`` with ``(kind, group, algorithm, bytes)``; their
  per-step link events are not compared one by one (the simulator has the
  collective as one node). A runtime trace records one as ``{"kind":
  "collective", "name": "RS(b0.0)", "collective", "group", "algorithm",
  "bytes", "deps", "steps": [...]}``;
- dependences as reachability between those nodes (the runtime records
  redundant, transitively implied edges; lazy fills are contracted);
- ``order``: the nodes in id order (trace) or key order (task graph): the
  stable ids of the two halves sort alike.

``compare(a, b)`` lists the differences as readable lines (empty: equal).
Used by tests/runtime/test_mirror.py and ``legionpy simulate --compare``::

    from legionpy.optimizer.mirror import traced_taskgraph, taskgraph_form, compare
    rt.trace.start(); ...one iteration...; lp.fence(); recs = rt.trace.stop()
    sim = Simulator(graph, Machine.local(n)); sim.run(strategy)
    assert compare(traced_taskgraph(recs), taskgraph_form(sim.tg)) == []
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MirrorGraph", "traced_taskgraph", "taskgraph_form", "compare", "install_standins",
           "device_orders", "trace_labels", "simulated_starts"]

_NAME = re.compile(r"^([FBU])\((.*)\)$")
_COLL = re.compile(r"^(RS|AG|AR)\((.*)\)$")
_BUCKET = re.compile(r"^b\d+\.\d+$")  # U(b<bucket>.<group>), nn/sync.py


@dataclass
class MirrorGraph:
    """``tasks``: {name: device}; ``copies``: {label: (fed, src, dst, bytes)};
    ``order``: node labels in stable-id order; ``reach``: {label: set of
    labels reachable from it}. A copy's label is ``X:fed@src->dst:bytes#n``."""

    tasks: dict[str, int] = field(default_factory=dict)
    copies: dict[str, tuple] = field(default_factory=dict)
    #: {label: (kind, group, algorithm, bytes)} of the collectives
    collectives: dict[str, tuple] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    reach: dict[str, set] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{len(self.tasks)} tasks, {len(self.copies)} copies"
                + (f", {len(self.collectives)} collectives" if self.collectives else ""))


def _copy_label(fed: str, src: int, dst: int, nbytes: int, seen: dict) -> str:
    base = f"X:{fed}@{src}->{dst}:{nbytes}"
    n = seen.get(base, 0)
    seen[base] = n + 1
    return f"{base}#{n}"


def _reach(nodes: list, preds: dict, keep: set) -> dict:
    """{node in keep: nodes in keep reachable from it} (preds: node -> preds)."""
    succ = defaultdict(list)
    indeg = {n: 0 for n in nodes}
    for n in nodes:
        for p in preds.get(n, ()):
            succ[p].append(n)
            indeg[n] += 1
    topo, stack = [], [n for n in nodes if indeg[n] == 0]
    while stack:
        n = stack.pop()
        topo.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                stack.append(s)
    if len(topo) != len(nodes):
        raise ValueError("the dependence graph has a cycle")
    bit = {n: 1 << i for i, n in enumerate(n for n in nodes if n in keep)}
    below: dict = {}
    for n in reversed(topo):
        m = 0
        for s in succ[n]:
            m |= below[s] | bit.get(s, 0)
        below[n] = m
    names = {b: n for n, b in bit.items()}
    out = {}
    for n in nodes:
        if n in keep:
            m, s = below[n], set()
            while m:
                low = m & -m
                s.add(names[low])
                m ^= low
            out[n] = s
    return out


def _merged(records: list[dict]) -> dict[int, dict]:
    """Records by id (the concatenated records of every MPI rank: the
    executing rank's copy wins)."""
    by_id: dict[int, dict] = {}
    for r in records:
        old = by_id.get(r["id"])
        if old is None or (old.get("device") is None and old.get("link") is None):
            by_id[r["id"]] = r
    return by_id


def trace_labels(records: list[dict]) -> dict[int, str]:
    """``{record id: mirror label}`` of the compute/update tasks and of the
    copies that feed one (the labels :class:`MirrorGraph` uses)."""
    return _labels(_merged(records))


def _labels(by_id: dict[int, dict]) -> dict[int, str]:
    ids = sorted(by_id)
    name_of: dict[int, str] = {}
    for i in ids:
        r = by_id[i]
        if r["kind"] in ("compute", "update"):
            m = _NAME.match(r["name"])
            k = r.get("launch")
            if m is None or k is None:
                continue  # a task outside the layer API
            if r.get("point") and _BUCKET.match(m.group(2)):
                k = r["point"][0]  # collective sync: U(b.g) launched point by point
            name_of[i] = f"{m.group(1)}:{m.group(2)}[{k}]"
        elif r["kind"] == "collective":
            m = _COLL.match(r["name"])
            if m is not None:
                name_of[i] = f"{m.group(1)}:{m.group(2)}"
    fed: dict[int, int] = {}
    for i in ids:
        if i in name_of:
            for d in by_id[i]["deps"]:
                if d in by_id and by_id[d]["kind"] == "copy" and (d not in fed or i < fed[d]):
                    fed[d] = i
    seen: dict = {}
    for i in ids:
        r = by_id[i]
        if r["kind"] == "copy" and i in fed and r.get("link") is not None:  # not a ghost
            src, dst = r["link"]
            name_of[i] = _copy_label(name_of[fed[i]], src, dst, int(r["bytes"]), seen)
    return name_of


def traced_taskgraph(records: list[dict]) -> MirrorGraph:
    """The MirrorGraph of a runtime trace (``Trace.records()`` of one
    iteration, from one process or the concatenated records of every MPI
    rank: records are merged by id, the executing rank's copy wins)."""
    by_id = _merged(records)
    ids = sorted(by_id)
    name_of = _labels(by_id)
    g = MirrorGraph()
    for i in ids:
        if i not in name_of:
            continue
        r = by_id[i]
        lab = name_of[i]
        if r["kind"] == "copy":
            fed = lab[2:lab.index("@")]
            g.copies[lab] = (fed, r["link"][0], r["link"][1], int(r["bytes"]))
        elif r["kind"] == "collective":
            g.collectives[lab] = (r["collective"], tuple(r["group"]), r["algorithm"],
                                  int(r["bytes"]))
        else:
            g.tasks[lab] = r["device"]
        g.order.append(lab)
    nodes = ids
    preds = {i: [d for d in by_id[i]["deps"] if d in by_id] for i in ids}
    keep = set(name_of)
    reach = _reach(nodes, preds, keep)
    g.reach = {name_of[n]: {name_of[x] for x in s} for n, s in reach.items()}
    return g


def simulated_starts(tg: Any) -> dict[str, float]:
    """``{mirror label: simulated start (s)}`` of a simulated task graph (a
    multi-hop copy: the start of its first hop)."""
    from .taskgraph import COPY, unpack_key

    out: dict[str, float] = {}
    seen: dict = {}
    first_hop: set = set()
    for s in tg.order().tolist():
        if tg.kind[s] != COPY:
            out[tg.task_name(s)] = float(tg.start[s])
            continue
        L, _, k, arg, c, hop = unpack_key(int(tg.key[s]))
        if (L, k, arg, c) in first_hop:
            continue
        first_hop.add((L, k, arg, c))
        e = int(tg.ends[s])
        lab = _copy_label(tg.task_name_of(L, k), e // 65536, e % 65536, int(tg.nbytes[s]), seen)
        out[lab] = float(tg.start[s])
    return out


def taskgraph_form(tg: Any) -> MirrorGraph:
    """The MirrorGraph of a built :class:`TaskGraph` (``Simulator.tg``)."""
    from .taskgraph import COPY, unpack_key

    order = tg.order()
    g = MirrorGraph()
    label: dict[int, str] = {}
    seen: dict = {}
    first_hop: dict = {}  # (L, k, arg, c) -> label
    for s in order.tolist():
        if tg.kind[s] != COPY:
            name = tg.task_name(s)
            label[s] = name
            info = tg.coll_info.get(int(tg.key[s]))
            if info is not None:
                g.collectives[name] = (info[0], tuple(info[1]), info[2], int(info[3]))
            else:
                g.tasks[name] = int(tg.res[s])
            g.order.append(name)
            continue
        L, _, k, arg, c, hop = unpack_key(int(tg.key[s]))
        ck = (L, k, arg, c)
        if ck in first_hop:
            label[s] = first_hop[ck]
            continue
        e = int(tg.ends[s])
        fed = tg.task_name_of(L, k)
        lab = _copy_label(fed, e // 65536, e % 65536, int(tg.nbytes[s]), seen)
        first_hop[ck] = label[s] = lab
        g.copies[lab] = (fed, e // 65536, e % 65536, int(tg.nbytes[s]))
        g.order.append(lab)
    e = tg.edges()
    preds: dict = defaultdict(list)
    for a, b in e.tolist():
        preds[b].append(a)
    nodes = order.tolist()
    reach = _reach(nodes, preds, set(nodes))
    out: dict = defaultdict(set)
    for n, r in reach.items():
        out[label[n]] |= {label[x] for x in r}
    for lab in out:
        out[lab].discard(lab)
    g.reach = dict(out)
    return g


def compare(a: MirrorGraph, b: MirrorGraph, names: tuple[str, str] = ("trace", "taskgraph"),
            order: bool = True, limit: int = 20) -> list[str]:
    """Differences between two MirrorGraphs as readable lines (``[]``: the
    same tasks on the same devices, the same copies, the same dependences
    and, with ``order``, the same stable-id order)."""
    na, nb = names
    out: list[str] = []
    for t in sorted(a.tasks.keys() - b.tasks.keys()):
        out.append(f"task {t} (device {a.tasks[t]}) is in the {na} only")
    for t in sorted(b.tasks.keys() - a.tasks.keys()):
        out.append(f"task {t} (device {b.tasks[t]}) is in the {nb} only")
    for t in sorted(a.tasks.keys() & b.tasks.keys()):
        if a.tasks[t] != b.tasks[t]:
            out.append(f"task {t} runs on device {a.tasks[t]} in the {na}, "
                       f"{b.tasks[t]} in the {nb}")
    for c in sorted(a.copies.keys() - b.copies.keys()):
        out.append(f"copy {c} (feeds {a.copies[c][0]}) is in the {na} only")
    for c in sorted(b.copies.keys() - a.copies.keys()):
        out.append(f"copy {c} (feeds {b.copies[c][0]}) is in the {nb} only")
    for c in sorted(a.collectives.keys() - b.collectives.keys()):
        out.append(f"collective {c} {a.collectives[c]} is in the {na} only")
    for c in sorted(b.collectives.keys() - a.collectives.keys()):
        out.append(f"collective {c} {b.collectives[c]} is in the {nb} only")
    for c in sorted(a.collectives.keys() & b.collectives.keys()):
        x, y = a.collectives[c], b.collectives[c]
        if x != y:
            what = ", ".join(f"{f} {u!r} in the {na}, {v!r} in the {nb}"
                             for f, u, v in zip(("kind", "group", "algorithm", "bytes"), x, y)
                             if u != v)
            out.append(f"collective {c}: {what}")
    if not out:
        for n in a.order:
            ra, rb = a.reach.get(n, set()), b.reach.get(n, set())
            for m in sorted(ra - rb):
                out.append(f"{m} depends on {n} in the {na} only")
            for m in sorted(rb - ra):
                out.append(f"{m} depends on {n} in the {nb} only")
            if len(out) > limit:
                break
    if not out and order and a.order != b.order:
        i = next(i for i, (x, y) in enumerate(zip(a.order, b.order)) if x != y)
        out.append(f"stable-id order differs at position {i}: {a.order[i]} in the {na}, "
                   f"{b.order[i]} in the {nb}")
    if len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more"]
    return out


def install_standins(executor: Any, sim: Any) -> None:
    """Stand-in run (invariant 3): every compute/update task of ``executor``
    (an nn Executor, ``model._ex``) sleeps its duration in ``sim``'s last
    simulated task graph instead of running its kernel, and every copy of
    the runtime sleeps the simulated link time (``sim.cost.copy_time`` on the
    machine's link). A collective (collective sync) lasts at least its
    simulated time (``runtime.collective_standin``). Undo with
    ``executor.standin = None; runtime.copy_standin = None;
    runtime.collective_standin = None``."""
    from .taskgraph import COLLECTIVE, COPY

    tg = sim.tg
    order = tg.order()
    executor.standin = {tg.task_name(s): float(tg.dur[s]) for s in order.tolist()
                        if tg.kind[s] != COPY}
    machine, cost = sim.machine, sim.cost

    def copy_time(src: int, dst: int, nbytes: int) -> float | None:
        if src < 0 or dst < 0:
            return None  # host memory: not part of the simulated iteration
        return float(sum(cost.copy_time(float(nbytes), machine.links[lid])
                         for lid in machine.route(src, dst)))

    executor.rt.copy_standin = copy_time
    executor.rt.collective_standin = {
        f"{m.group(1)}({m.group(2)})": float(tg.dur[s]) for s in order.tolist()
        if tg.kind[s] == COLLECTIVE and (m := re.match(r"^(\w+):(.*)$", tg.task_name(s)))}
    # replayed steps run in this simulation's order (nn/schedule.py)
    executor.machine, executor.cost_model = machine, cost
    executor.rt.invalidate_traces()


def device_orders(records: list[dict] | None = None, tg: Any = None) -> dict[Any, list[str]]:
    """``{device: compute/update task names in start order}`` of a trace
    (``records``) or of a simulated task graph (``tg``), and ``{"comm:0,1":
    collective names}`` per communicator (collective sync)."""
    out: dict[Any, list] = defaultdict(list)
    if records is not None:
        for r in sorted(records, key=lambda r: (r["start"], r["id"])):
            if r["kind"] == "collective":
                m = _COLL.match(r["name"])
                if m is not None and r["device"] is not None:
                    out[r["device"]].append(f"{m.group(1)}:{m.group(2)}")
                continue
            m = _NAME.match(r["name"]) if r["kind"] in ("compute", "update") else None
            if m is not None and r.get("launch") is not None and r["device"] is not None:
                # a bucket's update runs one launch per group position: its point names it
                k = r["point"][0] if _BUCKET.match(m.group(2)) and r.get("point") else r["launch"]
                out[r["device"]].append(f"{m.group(1)}:{m.group(2)}[{k}]")
        return dict(out)
    from .taskgraph import COPY

    comm = getattr(tg, "_comm_group", {})
    slots = [s for s in tg.order().tolist() if tg.kind[s] != COPY]
    for s in sorted(slots, key=lambda s: (tg.start[s], tg.key[s])):
        r = int(tg.res[s])
        key = "comm:" + ",".join(map(str, comm[r])) if r in comm else r
        out[key].append(tg.task_name(s))
    return dict(out)
