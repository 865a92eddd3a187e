"""Collectives: the one rule both halves share for gradient synchronisation
(docs/seam.md). A leaf module (it imports only :mod:`legionpy.errors`), so
the simulator (``optimizer/taskgraph.py``), the mapper and the runtime
transports (in-process, mpi4py, NCCL) all call it.

What it decides, as pure functions of its inputs:

- **Buckets** (:func:`buckets`): parameters, in reverse first-use order
  (the order backward produces their gradients), packed into buckets of at
  most :data:`BUCKET_BYTES` (PyTorch DDP's ``bucket_cap_mb=25``, Li et al.,
  "PyTorch Distributed", VLDB 2020); a parameter larger than the cap is a
  bucket of its own.
- **Groups** (:func:`bucket_groups`): inside a bucket, the weight tiles are
  grouped by their users (the replica group, sorted device ids); each group
  with more than one device gets ONE reduce-scatter of the gradients and
  ONE all-gather of the weights over the concatenation of its tiles. Group
  position ``p`` owns chunk ``p`` of ``n`` (:func:`chunk_bounds`): it applies
  the optimizer to that chunk. So every device of the group is a shard
  home: every node plays the same role. A group of one device needs no
  collective (a no-op, not an error).
- **Algorithms** (:func:`steps`, :func:`phases`): ``ring`` (Patarasuk and
  Yuan 2009: ``n - 1`` rounds, position ``i`` sends to ``i + 1``);
  ``hierarchical`` (Horovod / NCCL's 2D: a ring inside each node, then ``g``
  rings across nodes, one per local rank; for all-reduce: reduce-scatter
  inside, reduce-scatter + all-gather across, all-gather inside); ``tree``
  (all-reduce only: a binary tree, reduce to the root then broadcast, as
  NCCL's tree for small messages; Thakur, Rabenseifner and Gropp 2005).
- **Cost and choice** (:func:`collective_time`, :func:`choose_algorithm`):
  the alpha-beta model on the machine's links (each message costs, on
  every link of its route, ``latency + bytes / bandwidth``); a round's
  messages run at once and a link carrying ``k`` of them serves them FIFO
  (``k`` times as long); a phase of identical rounds costs rounds x its
  round time. The choice is the cheapest algorithm (ties: ring,
  hierarchical, tree).

Example::

    from legionpy import collectives as C
    group = (0, 1, 2, 3)
    C.steps("reduce_scatter", group, 4096, "ring")[0]
    # Step(round=0, src=0, dst=1, chunks=range(3, 4), nbytes=1024.0, op='reduce', after=())
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from .errors import StrategyError

__all__ = ["SYNC_MODES", "DEFAULT_SYNC", "resolve_sync", "BUCKET_BYTES", "KINDS", "ALGORITHMS",
           "Step", "Phase", "Collective", "parameter_buckets",
           "buckets", "bucket_groups", "chunk_bounds", "padded", "hierarchical_shape", "steps",
           "phases", "collective_time", "choose_algorithm", "algorithms_for", "apply_steps",
           "round_time", "round_classes", "cost_plan", "plan_time", "plan_bytes"]

SYNC_MODES = ("collective", "shards")
"""Gradient synchronisation modes (docs/seam.md): ``collective`` (per bucket
and replica group, one reduce-scatter of the gradients, the update of each
member's chunk, one all-gather of the weights) or ``shards`` (each
parameter tile's update shard: point-to-point copies of the weights to its
users and of their gradients back, folds; docs/taskgraph.md)."""

DEFAULT_SYNC = "collective"
"""The gradient synchronisation both halves use when nothing names one:
collectives scale (one per bucket and group instead of a copy per shard and
user) and are what NCCL, MPI and DDP run."""


def resolve_sync(sync: str | None = None) -> str:
    """The gradient synchronisation of a run: ``sync`` when given, else the
    ``LEGIONPY_SYNC`` environment variable, else :data:`DEFAULT_SYNC`. The
    simulator, the search and the runtime all resolve it here, so one
    setting reaches both halves."""
    mode = sync or os.environ.get("LEGIONPY_SYNC") or DEFAULT_SYNC
    if mode not in SYNC_MODES:
        where = "sync=" if sync else "LEGIONPY_SYNC="
        raise StrategyError(f"sync mode {mode!r} ({where}{mode}) is not one of "
                            f"{', '.join(SYNC_MODES)}")
    return mode


BUCKET_BYTES = 25 * 2**20
"""Gradient bucket cap in bytes: PyTorch DDP's default ``bucket_cap_mb=25``.
Larger buckets mean fewer collectives (less latency, less overlap with the
backward pass); a parameter larger than the cap is a bucket of its own."""

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
ALGORITHMS = ("ring", "hierarchical", "tree")


class Step(NamedTuple):
    """One message of a collective: ``src`` sends the chunks ``chunks`` (a
    ``range`` of chunk indices, see :func:`chunk_bounds`; ``nbytes`` in all)
    to ``dst``, which adds them into its buffer (``op == "reduce"``) or
    stores them (``"copy"``). ``after``: indices of the steps (in the list
    :func:`steps` returns) whose data this one forwards; ``round``: the
    round it belongs to (steps of one round run at once)."""

    round: int
    src: int
    dst: int
    chunks: range
    nbytes: float
    op: str
    after: tuple[int, ...]


class Phase(NamedTuple):
    """``rounds`` identical rounds; ``edges``: ``(src, dst, nbytes)`` of the
    messages of one round (every round of a phase uses the same links with
    the same bytes, so its cost is ``rounds`` x one round's)."""

    rounds: int
    edges: tuple[tuple[int, int, float], ...]


class Collective(NamedTuple):
    """A collective as both halves name it: ``kind`` (:data:`KINDS`) over
    ``group`` (device ids, position ``p`` owns chunk ``p``) on ``nbytes``
    (the whole buffer) with ``algorithm`` (:data:`ALGORITHMS`)."""

    kind: str
    group: tuple[int, ...]
    nbytes: float
    algorithm: str


def _check(kind: str, group: Sequence[int], algorithm: str | None = None) -> None:
    if kind not in KINDS:
        raise StrategyError(f"collective kind {kind!r} is not one of {', '.join(KINDS)}")
    if len(set(group)) != len(group):
        raise StrategyError(f"collective group {tuple(group)} names a device twice")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise StrategyError(f"collective algorithm {algorithm!r} is not one of "
                         f"{', '.join(ALGORITHMS)}")
    if algorithm == "tree" and kind != "all_reduce":
        raise StrategyError(f"algorithm 'tree' runs all_reduce only, not {kind!r}; "
                         f"use 'ring' or 'hierarchical'")


# -- buckets and groups ------------------------------------------------------------
def bucket_bytes() -> float:
    """The bucket cap both halves use: ``LEGIONPY_BUCKET_MB`` (MiB) when set,
    else :data:`BUCKET_BYTES`."""
    mb = os.environ.get("LEGIONPY_BUCKET_MB")
    if not mb:
        return float(BUCKET_BYTES)
    try:
        value = float(mb)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise StrategyError(f"LEGIONPY_BUCKET_MB={mb!r}: give the gradient bucket cap in MiB, "
                            "a number above 0 (default 25, as PyTorch DDP's bucket_cap_mb)")
    return value * 2**20


def buckets(sizes: Sequence[float], cap: float | None = None,
            kinds: Sequence[object] | None = None) -> list[list[int]]:
    """Indices of ``sizes`` (bytes, in the order gradients become ready:
    reverse first-use order) packed greedily into buckets of at most
    ``cap`` bytes, order kept; an item larger than ``cap`` is alone.
    ``kinds`` (one per item, e.g. the parameters' dtypes): a bucket holds
    one kind only, as a flat buffer has one element type (a change of kind
    starts a new bucket). ``cap``: default :func:`bucket_bytes`."""
    cap = bucket_bytes() if cap is None else cap
    out: list[list[int]] = []
    fill = 0.0
    for i, s in enumerate(sizes):
        same = kinds is None or not out or kinds[out[-1][-1]] == kinds[i]
        if out and same and fill + s <= cap:
            out[-1].append(i)
            fill += s
        else:
            out.append([i])
            fill = s
    return out


def parameter_buckets(params: Sequence[object]) -> list[list[int]]:
    """The buckets of a graph's parameters (``params`` in first-use order,
    each with ``shape`` and ``dtype``) as lists of their indices: packed by
    :func:`buckets` in reverse first-use order (the order backward produces
    their gradients), one dtype per bucket. The simulator's task graph and
    the runtime's collective sync (nn/sync.py) both take theirs from here."""
    import numpy as np

    rev = list(reversed(params))
    sizes = [float(np.prod(p.shape) * np.dtype(p.dtype).itemsize) for p in rev]
    kinds = [np.dtype(p.dtype).str for p in rev]
    last = len(params) - 1
    return [[last - i for i in bk] for bk in buckets(sizes, kinds=kinds)]


def bucket_groups(tiles: Sequence[tuple[object, Sequence[int], float]]
                  ) -> list[tuple[tuple[int, ...], list[int], float]]:
    """``(group, tile indices, bytes)`` of a bucket's tiles grouped by their
    users: ``tiles`` is ``(tile, users, bytes)`` in bucket order; the group
    is the sorted users, groups in order of their first tile."""
    out: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}
    for i, (_, users, nb) in enumerate(tiles):
        g = tuple(sorted(int(u) for u in users))
        ent = out.setdefault(g, ([], [0.0]))
        ent[0].append(i)
        ent[1][0] += nb
    return [(g, idx, nb[0]) for g, (idx, nb) in out.items()]


def padded(n_elems: int, n: int) -> int:
    """Elements of the flat buffer of ``n_elems`` elements split over ``n``
    devices: padded with zeros to a multiple of ``n`` (as ZeRO and FSDP pad
    their flat parameters), so every chunk, every message and every
    device's update has the same size -- which keeps every node in the
    same role (optimizer/symmetry.py)."""
    return -(-int(n_elems) // int(n)) * int(n)


def chunk_bounds(n_elems: int, n: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` element bounds of the ``n`` equal chunks of the flat
    buffer of ``n_elems`` elements padded to :func:`padded` ``(n_elems,
    n)``: chunk ``p`` is ``[p c, (p + 1) c)`` with ``c = padded / n``."""
    c = padded(n_elems, n) // int(n)
    return [(p * c, (p + 1) * c) for p in range(int(n))]


def hierarchical_shape(group: Sequence[int], node_of: Callable[[int], int]
                       ) -> tuple[int, int] | None:
    """``(nodes, per node)`` when ``group`` is node-major (the devices of a
    node contiguous) with the same count ``>= 2`` on each of ``>= 2``
    nodes, else None (hierarchical does not apply)."""
    nodes: list[int] = []
    counts: list[int] = []
    for d in group:
        m = node_of(d)
        if nodes and nodes[-1] == m:
            counts[-1] += 1
        elif m in nodes:
            return None
        else:
            nodes.append(m)
            counts.append(1)
    if len(nodes) < 2 or counts[0] < 2 or any(c != counts[0] for c in counts):
        return None
    return len(nodes), counts[0]


def algorithms_for(kind: str, group: Sequence[int],
                   node_of: Callable[[int], int] | None = None) -> list[str]:
    """The algorithms that apply to ``kind`` over ``group``, in tie order."""
    out = ["ring"]
    if node_of is not None and hierarchical_shape(group, node_of):
        out.append("hierarchical")
    if kind == "all_reduce" and len(group) > 2:
        out.append("tree")
    return out


# -- steps ---------------------------------------------------------------------------
def _ring_rs(ring, chunk_of, nbytes_of, rnd0, out, prev):
    """Ring reduce-scatter over ``ring`` (positions ``i``; ``chunk_of(i)``:
    the chunk set position ``i`` owns at the end); appends to ``out``.
    ``prev[i]``: index of the last step that delivered into position ``i``."""
    n = len(ring)
    for r in range(n - 1):
        cur = list(prev)
        for i in range(n):
            j = (i + 1) % n
            c = chunk_of((i - r - 1) % n)  # position j ends owning chunk j
            after = () if prev[i] is None else (prev[i],)
            out.append(Step(rnd0 + r, ring[i], ring[j], c, nbytes_of(c), "reduce", after))
            cur[j] = len(out) - 1
        prev[:] = cur
    return rnd0 + n - 1


def _ring_ag(ring, chunk_of, nbytes_of, rnd0, out, prev):
    """Ring all-gather: position ``i`` starts owning ``chunk_of(i)``."""
    n = len(ring)
    for r in range(n - 1):
        cur = list(prev)
        for i in range(n):
            j = (i + 1) % n
            c = chunk_of((i - r) % n)
            after = () if prev[i] is None else (prev[i],)
            out.append(Step(rnd0 + r, ring[i], ring[j], c, nbytes_of(c), "copy", after))
            cur[j] = len(out) - 1
        prev[:] = cur
    return rnd0 + n - 1


def _on_rings(ring_op, rings, chunks, group, nb, rnd, out, prev) -> int:
    """``ring_op`` (:func:`_ring_rs` / :func:`_ring_ag`) on every ring of
    group positions in ``rings`` at once (the same rounds from ``rnd``;
    ``chunks(k)``: ring ``k``'s chunk_of); ``prev`` updated; the end round."""
    end = rnd
    for k, ps in enumerate(rings):
        sub = [prev[p] for p in ps]
        end = ring_op([group[p] for p in ps], chunks(k), nb, rnd, out, sub)
        for i, p in enumerate(ps):
            prev[p] = sub[i]
    return end


def steps(kind: str, group: Sequence[int], nbytes: float, algorithm: str = "ring",
          node_of: Callable[[int], int] | None = None) -> list[Step]:
    """Every message of ``kind`` over ``group`` with ``algorithm``, in round
    order. The buffer of ``nbytes`` is cut into chunks: ``n = len(group)``
    for ring and hierarchical (position ``p`` owns chunk ``p`` after a
    reduce-scatter and before an all-gather), one for tree. Hierarchical
    needs ``node_of`` and a node-major group (:func:`hierarchical_shape`).
    A group of one device has no steps."""
    _check(kind, group, algorithm)
    group = tuple(int(d) for d in group)
    n = len(group)
    out: list[Step] = []
    if n < 2:
        return out
    if algorithm == "tree":
        return _tree(group, float(nbytes))
    per = float(nbytes) / n

    def nb(c: range) -> float:
        return per * len(c)

    prev: list = [None] * n
    if algorithm == "ring":
        def own(i):
            return range(i, i + 1)
        rnd = 0
        if kind in ("reduce_scatter", "all_reduce"):
            rnd = _ring_rs(group, own, nb, rnd, out, prev)
        if kind in ("all_gather", "all_reduce"):
            _ring_ag(group, own, nb, rnd, out, prev)
        return out
    shape = hierarchical_shape(group, node_of) if node_of is not None else None
    if shape is None:
        raise StrategyError(f"hierarchical needs a node-major group with the same number (>= 2) "
                         f"of devices on each of >= 2 nodes; got {group}")
    N, g = shape
    # position p = m * g + l owns chunk p; inside node m, local l gathers the
    # strided piece {m' * g + l}; across nodes, the ring of local rank l
    # splits that piece by node.
    nodes = [list(range(m * g, (m + 1) * g)) for m in range(N)]
    lanes = [list(range(l, n, g)) for l in range(g)]

    def in_node(m):  # inside a node, local i gathers the strided piece {m' g + i}
        return lambda i: range(i, n, g)

    def in_lane(l):  # across nodes, the lane of local rank l splits it by node
        return lambda i: range(i * g + l, i * g + l + 1)

    rnd = 0
    if kind in ("reduce_scatter", "all_reduce"):
        rnd = _on_rings(_ring_rs, nodes, in_node, group, nb, rnd, out, prev)
        rnd = _on_rings(_ring_rs, lanes, in_lane, group, nb, rnd, out, prev)
    if kind in ("all_gather", "all_reduce"):
        rnd = _on_rings(_ring_ag, lanes, in_lane, group, nb, rnd, out, prev)
        _on_rings(_ring_ag, nodes, in_node, group, nb, rnd, out, prev)
    return out


def _tree(group: tuple[int, ...], nbytes: float) -> list[Step]:
    """Binary-tree all-reduce (heap numbering: the parent of position ``p``
    is ``(p - 1) // 2``): reduce to position 0 deepest level first, then
    broadcast back down; one chunk (``range(0, 1)``), whole buffer each."""
    n = len(group)
    depth = [0] * n
    for p in range(1, n):
        depth[p] = depth[(p - 1) // 2] + 1
    D = max(depth)
    out: list[Step] = []
    into: dict[int, list[int]] = {}  # position -> steps that reduced into it
    one = range(0, 1)
    for r, lev in enumerate(range(D, 0, -1)):
        for p in range(n):
            if depth[p] == lev:
                q = (p - 1) // 2
                out.append(Step(r, group[p], group[q], one, nbytes, "reduce",
                                tuple(into.get(p, ()))))
                into.setdefault(q, []).append(len(out) - 1)
    got = {0: tuple(into.get(0, ()))}
    for r, lev in enumerate(range(1, D + 1), start=D):
        for p in range(n):
            if depth[p] == lev:
                q = (p - 1) // 2
                out.append(Step(r, group[q], group[p], one, nbytes, "copy", got[q]))
                got[p] = (len(out) - 1,)
    return out


# -- cost ------------------------------------------------------------------------------
def phases(kind: str, group: Sequence[int], nbytes: float, algorithm: str = "ring",
           node_of: Callable[[int], int] | None = None) -> list[Phase]:
    """The rounds of :func:`steps` compressed into phases of identical rounds
    (same messages, bytes and links): O(n) per phase instead of O(n^2)
    steps, so a collective over 8,192 devices is costed in milliseconds."""
    _check(kind, group, algorithm)
    group = tuple(int(d) for d in group)
    n = len(group)
    if n < 2:
        return []
    nbytes = float(nbytes)
    if algorithm == "tree":
        out, rounds = [], {}
        for s in _tree(group, nbytes):
            rounds.setdefault(s.round, []).append((s.src, s.dst, s.nbytes))
        return [Phase(1, tuple(e)) for _, e in sorted(rounds.items())]
    ring = tuple((group[i], group[(i + 1) % n], nbytes / n) for i in range(n))
    if algorithm == "ring":
        k = (2 if kind == "all_reduce" else 1) * (n - 1)
        return [Phase(k, ring)]
    shape = hierarchical_shape(group, node_of) if node_of is not None else None
    if shape is None:
        raise StrategyError(f"hierarchical needs a node-major group with the same number (>= 2) "
                         f"of devices on each of >= 2 nodes; got {group}")
    N, g = shape
    intra = tuple((group[m * g + i], group[m * g + (i + 1) % g], nbytes / g)
                  for m in range(N) for i in range(g))
    inter = tuple((group[m * g + l], group[((m + 1) % N) * g + l], nbytes / n)
                  for l in range(g) for m in range(N))
    out = []
    if kind in ("reduce_scatter", "all_reduce"):
        out += [Phase(g - 1, intra), Phase(N - 1, inter)]
    if kind in ("all_gather", "all_reduce"):
        out += [Phase(N - 1, inter), Phase(g - 1, intra)]
    return out


def round_classes(edges: Sequence[tuple[int, int, float]],
                  route: Callable[[int, int], Sequence],
                  link_key: Callable[[object], object] | None = None) -> list[tuple]:
    """The messages of one round grouped by what they cost: ``[(nbytes,
    ((link, load), ...)), ...]``, one entry per distinct (bytes, hops) where
    a hop is its link's class (``link_key(link)``, default the link itself;
    ``link`` is the first link of that class seen) and ``load`` the number
    of the round's messages crossing that link (FIFO: ``load`` times as
    long). A ring over 8,192 devices has a handful of classes."""
    load: dict = {}
    routes = []
    for s, d, nb in edges:
        r = tuple(route(s, d))
        routes.append((r, nb))
        for lk in r:
            load[lk] = load.get(lk, 0) + 1
    key = link_key or (lambda lk: lk)
    rep: dict = {}
    out: dict = {}
    for r, nb in routes:
        hops = []
        for lk in r:
            k = key(lk)
            hops.append((rep.setdefault(k, lk), load[lk], k))
        sig = (nb, tuple((k, ld) for _, ld, k in hops))
        if sig not in out:
            out[sig] = (nb, tuple((lk, ld) for lk, ld, _ in hops))
    return list(out.values())


def cost_plan(kind: str, group: Sequence[int], algorithm: str,
              route: Callable[[int, int], Sequence], node_of: Callable[[int], int] | None = None,
              link_key: Callable[[object], object] | None = None) -> list[tuple]:
    """The bytes-independent part of :func:`collective_time`: per phase
    ``(rounds, classes, hop_bytes)`` with :func:`round_classes` of a 1-byte
    buffer (message bytes are fractions of the buffer) and ``hop_bytes`` the
    bytes one round moves over links per byte of buffer."""
    out = []
    for ph in phases(kind, group, 1.0, algorithm, node_of):
        cls = round_classes(ph.edges, route, link_key)
        hop = sum(nb * len(tuple(route(s, d))) for s, d, nb in ph.edges)
        out.append((ph.rounds, cls, hop))
    return out


def plan_time(plan: Sequence[tuple], nbytes: float,
              link_time: Callable[[object, float], float]) -> float:
    """Seconds of a :func:`cost_plan` for a buffer of ``nbytes``: per phase,
    rounds x the slowest message class (sum over its hops of load x
    ``link_time(link, bytes)``)."""
    total = 0.0
    for rounds, classes, _ in plan:
        best = 0.0
        for frac, hops in classes:
            nb = frac * nbytes
            t = 0.0
            for lk, ld in hops:
                t += ld * link_time(lk, nb)
            best = max(best, t)
        total += rounds * best
    return total


def plan_bytes(plan: Sequence[tuple], nbytes: float) -> float:
    """Bytes the collective moves over links (every hop of every message)."""
    return sum(rounds * hop for rounds, _, hop in plan) * nbytes


def round_time(edges: Sequence[tuple[int, int, float]], route: Callable[[int, int], Sequence],
               link_time: Callable[[object, float], float]) -> float:
    """Seconds of one round: every message crosses every link of its route
    (``route(src, dst)``: link ids); a link carrying ``k`` of the round's
    messages serves them FIFO, so a message's time is the sum over its hops
    of ``k_link * link_time(link, bytes)``; the round ends with its slowest
    message."""
    return plan_time([(1, round_classes(edges, route), 0.0)], 1.0, link_time)


def collective_time(kind: str, group: Sequence[int], nbytes: float, algorithm: str,
                    route: Callable[[int, int], Sequence],
                    link_time: Callable[[object, float], float],
                    node_of: Callable[[int], int] | None = None,
                    link_key: Callable[[object], object] | None = None) -> float:
    """Seconds of the collective on idle links (alpha-beta, see the module
    docstring): the sum over its phases of rounds x round time. Zero for a
    group of one device. ``link_key``: links with equal keys cost the same
    (``link_time`` depends on the key only), which lets rounds of thousands
    of messages collapse into a few classes."""
    return plan_time(cost_plan(kind, group, algorithm, route, node_of, link_key), nbytes,
                     link_time)


def choose_algorithm(kind: str, group: Sequence[int], nbytes: float,
                     route: Callable[[int, int], Sequence],
                     link_time: Callable[[object, float], float],
                     node_of: Callable[[int], int] | None = None,
                     link_key: Callable[[object], object] | None = None,
                     plans: dict | None = None) -> tuple[str, float]:
    """``(algorithm, seconds)``: the cheapest of :func:`algorithms_for` by
    :func:`collective_time` (ties: ring, hierarchical, tree). A group of one
    device: ``("ring", 0.0)`` (a no-op). ``plans``: a cache of
    :func:`cost_plan` by algorithm for this (kind, group), filled here."""
    _check(kind, group)
    if len(group) < 2:
        return "ring", 0.0
    best = None
    for a in algorithms_for(kind, group, node_of):
        plan = None if plans is None else plans.get(a)
        if plan is None:
            plan = cost_plan(kind, group, a, route, node_of, link_key)
            if plans is not None:
                plans[a] = plan
        t = plan_time(plan, nbytes, link_time)
        if best is None or t < best[1]:
            best = (a, t)
    return best


def rounds(step_list: Sequence[Step]) -> Iterator[Sequence[Step]]:
    """The steps of each round in turn (a round's messages run at once: every
    transport reads all of a round's sources before applying any of them)."""
    i = 0
    while i < len(step_list):
        j = i
        while j < len(step_list) and step_list[j].round == step_list[i].round:
            j += 1
        yield step_list[i:j]
        i = j


def apply_steps(bufs: dict, step_list: Sequence[Step], bounds: Sequence[tuple[int, int]]
                ) -> None:
    """Run ``step_list`` on flat buffers ``bufs`` ({device: 1-D array}, numpy
    or cupy), in place: the in-process transport's data movement and the
    reference the others are tested against. A round's messages are read
    before any of them is applied (they run at once); ``bounds``: the
    chunks' ``[lo, hi)`` element bounds (:func:`chunk_bounds`)."""
    for rnd in rounds(step_list):
        msgs = []
        for s in rnd:
            parts = [(bounds[c], bufs[s.src][bounds[c][0]:bounds[c][1]].copy())
                     for c in s.chunks]
            msgs.append((s, parts))
        for s, parts in msgs:
            dst = bufs[s.dst]
            for (lo, hi), data in parts:
                if s.op == "reduce":
                    dst[lo:hi] += data
                else:
                    dst[lo:hi] = data
