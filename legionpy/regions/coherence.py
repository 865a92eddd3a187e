"""Coherence: which physical instances hold valid data, and which copies a
region access needs. A pure state machine (no threads, no arrays).

Policy
------
The runtime keeps, per (root region, field), one :class:`FieldState`: a list
of disjoint :class:`Piece` s that tile the root rect. Each piece says where
the current contents of its rect live:

- ``valid``: ``{memory: producer_id}``, every memory whose instance holds the
  current data, with the id of the operation that put it there (the writer
  itself, a copy, or the task whose prologue materialised a fill or folded
  reductions). Readers on that memory wait for that id.
- ``fill``: a fill value not materialised anywhere else (``lp.fill`` is lazy:
  any memory can produce the data locally, so fills never need a copy).
  Regions start as a fill of 0.
- ``redop`` / ``reds``: pending reduction contributions, in program order,
  each a :class:`Red` (reduction buffer in some memory, identity-initialised,
  and the ids of the tasks that accumulated into it). The piece's current
  value is ``base (valid/fill) redop red1 redop red2 ...``.

Reduction buffers are per (memory, root, field) and *epoch*: the state keeps
the open buffer of each memory (``open_buffers``); a reducer with the same
op on that memory accumulates into it (its Red gains a producer), else opens
its own (``Request.buffer``; ``Plan.buffer`` says which one the task uses).
Any access that folds or drops part of a buffer (read, write, fill, reduce
with another op) closes it, so reducers after a reader in program order
start a new buffer. Same-op reducers of one memory need no ordering between
them (they commute; a device runs its tasks one at a time).

An access (:class:`Request`: rect, mode, memory, op id) turns into a
:class:`Plan`: copies to run first (on the (src, dst) link, each waiting for
the producer of its source), prologue actions that the task's device runs
before the body (materialise a fill, fold a reduction buffer, in program
order), and the ids the task must wait for. Rules per overlapped piece:

- ``read``: data valid at the memory -> wait for its producer; else a fill
  -> materialise locally; else copy from one valid memory (the last
  writer's memory, ``Piece.owner``, if still valid; else the lowest device
  id, host last). Pending reductions: remote buffers are copied to the reader's
  memory and every buffer is folded there (one copy per (buffer, reader)
  whatever the number of pieces, after every contributor); the reader's memory becomes the
  only valid one (``valid = {memory: op}``). Other valid copies stay valid.
- ``read_write``: as read, then ``valid = {memory: op}`` (others are stale).
- ``write_discard``: no copy-in; ``valid = {memory: op}``; fill and pending
  reductions are dropped.
- ``reduce(op)``: no copy-in; pending reductions with another op are folded
  at the memory first; then ``Red(memory, buffer, op)`` is appended. Valid
  base copies stay valid (they are the base the reductions fold onto).

Physical write-after-read hazards on a shared instance are covered by the
logical dependences: a writer always waits (logically) for earlier readers,
and every copy waits for the producer of its source, which is ordered after
the readers of the stale data it overwrites.

Worked example (one field, memories 0 and 1)::

    fill 0                -> [Piece([0,8), fill=0)]
    task 5 RW [0,8) on 0  -> prologue Fill(0); valid {0: 5}
    task 6 R  [4,8) on 1  -> Copy(7: 0->1, [4,8), after 5); task waits for 7
                             pieces [0,4) {0:5}, [4,8) {0:5, 1:7}
    task 8 Reduce(+) [0,8) on 1 -> red appended to both pieces
    read [0,8) on host(-1)-> copies 0->-1 [0,4), 1->-1 [4,8) (or from 0),
                             buffer copies 1->-1 for both pieces, folds at -1

Pieces overlapped by one access are handled in rect order (``lo``, then
``hi``), so copy ids and prologues are deterministic. The pieces of one
access that come from the same source memory (or the same reduction
buffer) are merged into ONE copy (``Copy.more``; bytes = the sum), whose
id is taken when its first piece is met: one copy per (task, field,
source), as the optimizer's task graph counts them (docs/taskgraph.md).

Cost. The pieces live in a :class:`~legionpy.regions.dependence.RectIndex`
(a grid over their rects), so an access finds the pieces it overlaps without
scanning the others, and the transition changes only those pieces: its cost
does not grow with the number of pieces (the tiles of a partition). States
stay persistent (``access`` leaves the old state intact) without copying:
versions share one mutable store, held by the newest one used, and every
other version keeps the undo diff to it (Baker's "rerooting" of persistent
arrays); reading an older version moves the store back to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..geometry import Rect
from .dependence import RectIndex

__all__ = [
    "HOST", "Piece", "Red", "Request", "Copy", "FillAction", "FoldAction", "Plan",
    "FieldState", "choose_source",
]

HOST = -1
"""Memory id of the host (system) memory of this process: where
``Region.write`` puts data and ``Region.read`` gathers it."""


@dataclass(frozen=True, slots=True)
class Red:
    """Pending reduction contributions: ``buffer`` (opaque key of the reduction
    instance of ``memory`` for this (root, field)), accumulated by the tasks
    ``producers`` (program order). One buffer per memory and epoch: every
    same-op reducer on that memory adds into it until a reader, a writer or
    a fill consumes part of it (see :class:`FieldState`)."""

    memory: int
    buffer: Any
    producers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Piece:
    rect: Rect
    valid: dict[int, int] = field(default_factory=dict)  # never mutated in place
    fill: Any = None
    redop: str | None = None
    reds: tuple[Red, ...] = ()
    owner: int | None = field(default=None, compare=False)  # last writer: preferred source


@dataclass(frozen=True, slots=True)
class Request:
    """One access: ``mode`` in read | read_write | write_discard | reduce."""

    rect: Rect
    mode: str
    memory: int
    op: int
    redop: str | None = None
    buffer: Any = None  # reduction instance key (reduce only)


@dataclass(frozen=True, slots=True)
class Copy:
    """Move ``rect`` (and the ``more`` rects) from ``src`` to ``dst`` after
    ``deps``. ``buffer`` is None for instance-to-instance copies, else the
    source reduction buffer (the runtime keeps its rect); such a copy lands in
    staging buffers at ``dst``, one per rect (``Instances.staging[(id,
    rect)]``). One access makes at most one copy per source memory (instance
    copies) and one per reduction buffer: the pieces of the request that come
    from the same place are merged into one copy op (bytes = their sum)."""

    id: int
    rect: Rect
    src: int
    dst: int
    deps: tuple[int, ...]
    buffer: Any = None
    more: tuple[Rect, ...] = ()  # further rects merged into this copy (same src, request)

    @property
    def rects(self) -> tuple[Rect, ...]:
        """Every rect this copy moves (``rect`` first), disjoint."""
        return (self.rect,) + self.more

    @property
    def volume(self) -> int:
        return self.rect.volume + sum(r.volume for r in self.more)


@dataclass(frozen=True, slots=True)
class FillAction:
    memory: int
    rect: Rect
    value: Any


@dataclass(frozen=True, slots=True)
class FoldAction:
    """Fold ``rect`` of a reduction buffer into ``memory``'s instance with
    ``redop``. The source is ``buffer`` (local) or, when ``staged`` is a copy
    id, the staging buffer that copy filled."""

    memory: int
    rect: Rect
    redop: str
    buffer: Any = None
    staged: int | None = None


@dataclass(slots=True)
class Plan:
    copies: list[Copy] = field(default_factory=list)
    prologue: list[FillAction | FoldAction] = field(default_factory=list)
    deps: set[int] = field(default_factory=set)
    groups: dict = field(default_factory=dict)  # ("i", src) | ("r", buffer) -> copy index
    buffer: Any = None  # reduce: the buffer key the task accumulates into

    def add_copy(self, key: Any, rect: Rect, src: int, dst: int, deps: tuple[int, ...],
                 new_id: Callable[[], int], buffer: Any = None) -> int:
        """Copy ``rect`` from ``src`` (or ``buffer``) to ``dst`` after ``deps``:
        merged into this plan's copy with the same ``key`` if there is one.
        Returns its id."""
        i = self.groups.get(key)
        if i is None:
            cid = new_id()
            self.groups[key] = len(self.copies)
            self.copies.append(Copy(cid, rect, src, dst, deps, buffer))
            self.deps.add(cid)
            return cid
        c = self.copies[i]
        more = tuple(d for d in deps if d not in c.deps)
        self.copies[i] = replace(c, deps=c.deps + more if more else c.deps,
                                 more=c.more + (rect,))
        return c.id


def choose_source(valid: dict[int, int], owner: int | None = None) -> int:
    """Deterministic source among valid memories: the last writer's memory
    (``owner``) when it is valid, else the lowest device id, host last. So
    replicas are fed from the producer / shard home, spreading the traffic
    over the owners' links (a ring-like all-gather), not from the first
    replica."""
    if owner is not None and owner in valid:
        return owner
    return min(valid, key=lambda m: (m == HOST, m))


class _Store:
    """The mutable pieces of the version that currently owns them."""

    __slots__ = ("index", "next_key", "refs")

    def __init__(self) -> None:
        self.index = RectIndex()
        self.next_key = 0
        self.refs: dict[Any, int] = {}  # reduction buffer key -> pieces referring to it

    def apply(self, removed: list[tuple[int, Piece]], added: list[tuple[int, Piece]]) -> None:
        ix = self.index
        refs = self.refs
        for k, p in removed:
            ix.remove(k)
            for r in p.reds:
                n = refs[r.buffer] - 1
                if n:
                    refs[r.buffer] = n
                else:
                    del refs[r.buffer]
        for k, p in added:
            ix.add(p.rect, k, p)
            for r in p.reds:
                refs[r.buffer] = refs.get(r.buffer, 0) + 1


class FieldState:
    """Coherence state of one (root, field): disjoint pieces tiling the root.

    ``access`` is a pure transition: it returns the plan and a new state and
    leaves ``self`` unchanged (pieces are immutable), so tests can compare
    whole states before and after, as Dask's scheduler tests do. (Internally
    the versions share one store, see the module docstring; using an older
    version is correct, only the most recent one is cheap. Versions of one
    state must not be used from several threads at once.)
    """

    __slots__ = ("_store", "_base", "_removed", "_added", "_open")

    def __init__(self, pieces: list[Piece]) -> None:
        store = _Store()
        store.apply([], list(enumerate(pieces)))
        store.next_key = len(pieces)
        self._store: _Store | None = store
        # when not the owner: my pieces = _base's pieces - _removed + _added
        self._base: FieldState | None = None
        self._removed: list[tuple[int, Piece]] = []
        self._added: list[tuple[int, Piece]] = []
        # open reduction buffers: {memory: (buffer key, redop)}, never mutated in place
        self._open: dict[int, tuple[Any, str]] = {}

    @classmethod
    def filled(cls, rect: Rect, value: Any = 0) -> FieldState:
        return cls([Piece(rect, {}, value)])

    def _own(self) -> _Store:
        """Make this version the owner of the shared store (reroot) and return it."""
        store = self._store
        if store is not None:
            return store
        path = []
        s = self
        while s._store is None:
            path.append(s)
            s = s._base  # type: ignore[assignment]
        owner = s
        store = owner._store
        for node in reversed(path):  # node._base is owner
            store.apply(node._removed, node._added)  # type: ignore[union-attr]
            owner._store, owner._base = None, node
            owner._removed, owner._added = node._added, node._removed
            node._store, node._base, node._removed, node._added = store, None, [], []
            owner = node
        return store  # type: ignore[return-value]

    def _commit(self, store: _Store, removed: list[tuple[int, Piece]],
                new: list[Piece], opened: dict | None = None) -> FieldState:
        """The successor version: this one's pieces minus ``removed`` plus
        ``new``, with the open buffers ``opened`` (default: unchanged)."""
        k = store.next_key
        added = [(k + i, p) for i, p in enumerate(new)]
        store.next_key = k + len(new)
        store.apply(removed, added)
        succ = FieldState.__new__(FieldState)
        succ._store, succ._base, succ._removed, succ._added = store, None, [], []
        succ._open = self._open if opened is None else opened
        self._store, self._base, self._removed, self._added = None, succ, added, removed
        return succ

    @property
    def pieces(self) -> list[Piece]:
        """The pieces, in rect order (a new list)."""
        return sorted((p for _, p in self._own().index.items()), key=_key)

    def open_buffers(self) -> dict[int, tuple[Any, str]]:
        """``{memory: (buffer key, redop)}``: the reduction buffer a further
        reducer with that op on that memory accumulates into."""
        return dict(self._open)

    def refers(self, buffer: Any) -> bool:
        """Some piece still has pending contributions in reduction buffer
        ``buffer`` (when none does, no later access can read it: the buffer
        is dead once the copies and folds already planned from it have run)."""
        return buffer in self._own().refs

    def buffers_in(self, rect: Rect) -> set:
        """Reduction buffers with pending contributions inside ``rect``."""
        return {r.buffer for _, p in self._own().index.query(rect) for r in p.reds}

    def __eq__(self, other: object) -> bool:
        """Same pieces (the open-buffer table is not compared)."""
        if not isinstance(other, FieldState):
            return NotImplemented
        return self.pieces == other.pieces

    def __repr__(self) -> str:
        return f"FieldState({self.pieces!r})"

    def signature(self) -> tuple:
        """The state without producer ids: per piece (rect, valid memories,
        fill, redop, pending buffers, owner), and the open buffers. Two
        states with the same signature need the same copies, prologues and
        buffers for any access; a trace replays only where it holds
        (runtime/tracing.py)."""
        return (tuple((p.rect, tuple(sorted(p.valid)), p.fill, p.redop,
                       tuple((r.memory, r.buffer) for r in p.reds), p.owner)
                      for p in self.pieces),
                tuple(sorted(self._open.items())))

    def relabel(self, producer: int) -> FieldState:
        """This state with every producer id (valid data, pending reductions)
        replaced by ``producer``: what a trace replay installs, naming its
        end marker, which finishes after every op the replay ran."""
        pieces = []
        for p in self.pieces:
            valid = dict.fromkeys(p.valid, producer)
            reds = tuple(Red(r.memory, r.buffer, (producer,)) for r in p.reds)
            pieces.append(Piece(p.rect, valid, p.fill, p.redop, reds, p.owner))
        out = FieldState(pieces)
        out._open = dict(self._open)
        return out

    def __iter__(self) -> Iterator[Piece]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return self._own().index.size

    @staticmethod
    def _overlapping(store: _Store, rect: Rect) -> list[tuple[int, Piece]]:
        """``(key, piece)`` of the pieces overlapping ``rect``, in rect order."""
        hits = store.index.query(rect)
        if len(hits) > 1:
            hits.sort(key=lambda kp: _key(kp[1]))
        return hits

    def valid_memories(self, rect: Rect) -> dict[int, int]:
        """``{memory: covered volume}`` of current data inside ``rect``."""
        out: dict[int, int] = {}
        for _, p in self._own().index.query(rect):
            if p.reds:
                continue
            v = (p.rect & rect).volume
            for m in p.valid:
                out[m] = out.get(m, 0) + v
        return out

    # -- transitions ----------------------------------------------------------
    def fill(self, rect: Rect, value: Any) -> FieldState:
        """Lazy fill of ``rect``: no data moves; every memory can materialise it."""
        store = self._own()
        removed = self._overlapping(store, rect)
        new: list[Piece] = []
        for _, p in removed:
            if not rect.contains(p.rect):
                new.extend(replace(p, rect=r) for r in p.rect.subtract(rect))
        new.append(Piece(rect, {}, value))
        return self._commit(store, removed, new,
                            self._closing(r.buffer for _, p in removed for r in p.reds))

    def _closing(self, consumed: Any) -> dict | None:
        """The open-buffer table without the buffers in ``consumed`` (None:
        unchanged). A buffer that a transition folds or drops, even in part,
        is closed: later reducers on its memory start a new one."""
        gone = set(consumed)
        if not gone or not self._open:
            return None
        opened = {m: b for m, b in self._open.items() if b[0] not in gone}
        return opened if len(opened) != len(self._open) else None

    def access(self, req: Request, new_id: Callable[[], int]) -> tuple[Plan, FieldState]:
        """Plan ``req`` and return ``(plan, new_state)``. ``new_id`` hands out
        ids for the copies (the runtime's op counter, so ids stay unique and
        deterministic). When the access changes no piece (a read of data
        already valid in its memory) the new state is ``self``."""
        plan = Plan()
        store = self._own()
        rect = req.rect
        rlo, rhi = rect.lo, rect.hi
        removed: list[tuple[int, Piece]] = []
        new: list[Piece] = []
        touched: list[tuple[int | None, Piece, Piece]] = []  # (key if whole, piece, part in rect)
        for k, p in self._overlapping(store, rect):
            q = p.rect
            for ql, qh, rl, rh in zip(q.lo, q.hi, rlo, rhi):
                if ql < rl or qh > rh:
                    break
            else:  # p lies inside rect
                touched.append((k, p, p))
                continue
            removed.append((k, p))
            new.extend(replace(p, rect=r) for r in q.subtract(rect))
            touched.append((None, p, replace(p, rect=q & rect)))
        mode, mem, op = req.mode, req.memory, req.op
        redop = req.redop
        opened = self._closing(r.buffer for _, _, part in touched
                               if mode != "reduce" or part.redop != redop for r in part.reds)
        if mode == "write_discard" or mode == "read_write":
            for k, p, part in touched:
                if mode == "read_write":
                    _materialise(part, mem, op, plan, new_id)
                if k is not None:
                    removed.append((k, p))
            new.append(Piece(rect, {mem: op}, owner=mem))
            return plan, self._commit(store, removed, new, opened)
        buf = None
        if mode == "reduce":  # accumulate into mem's open buffer, or open one
            table = self._open if opened is None else opened
            ob = table.get(mem)
            if ob is not None and ob[1] == redop:
                buf = ob[0]
            else:
                buf = req.buffer
                opened = {**table, mem: (buf, redop)}
            plan.buffer = buf
        for k, p, part in touched:
            if mode == "reduce":
                if part.reds and part.redop != redop:
                    part = _materialise(part, mem, op, plan, new_id)
                reds = part.reds
                for i, red in enumerate(reds):
                    if red.buffer == buf and red.memory == mem:
                        reds = reds[:i] + (Red(mem, buf, red.producers + (op,)),) + reds[i + 1:]
                        break
                else:
                    reds = reds + (Red(mem, buf, (op,)),)
                out = replace(part, redop=redop, reds=reds)
            else:
                out = _materialise(part, mem, op, plan, new_id)
                if out is p:  # whole and unchanged
                    continue
            if k is not None:
                removed.append((k, p))
            new.append(out)
        if not removed and not new and opened is None:
            return plan, self
        return plan, self._commit(store, removed, new, opened)


def _materialise(p: Piece, mem: int, op: int, plan: Plan, new_id: Callable[[], int]) -> Piece:
    """Make the current value of ``p`` present at ``mem`` (copies, fill, folds)."""
    valid = p.valid
    fill = p.fill
    if mem in valid:
        plan.deps.add(valid[mem])
    elif fill is not None:
        plan.prologue.append(FillAction(mem, p.rect, fill))
        valid = {**valid, mem: op}
    elif valid:
        src = choose_source(valid, p.owner)
        cid = plan.add_copy(("i", src), p.rect, src, mem, (valid[src],), new_id)
        valid = {**valid, mem: cid}
    if not p.reds:
        if valid is p.valid and p.redop is None:
            return p  # nothing to do: the same piece
        return Piece(p.rect, valid, fill, owner=p.owner)
    for red in p.reds:
        if red.memory == mem:
            plan.deps.update(red.producers)
            plan.prologue.append(FoldAction(mem, p.rect, p.redop, red.buffer))
        else:
            cid = plan.add_copy(("r", red.buffer), p.rect, red.memory, mem, red.producers,
                                new_id, red.buffer)
            plan.prologue.append(FoldAction(mem, p.rect, p.redop, staged=cid))
    return Piece(p.rect, {mem: op}, owner=mem)


def _key(p: Piece) -> tuple:
    return (p.rect.lo, p.rect.hi)
