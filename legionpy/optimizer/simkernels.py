"""Numba kernels of the simulator: adjacency lists, Algorithm 1 (full) and
Algorithm 2 (delta) of the paper, section 5.

State (all flat arrays indexed by task slot; see :mod:`.taskgraph`):
``alive``, ``dur`` (s), ``res`` (resource: compute device or D + link),
``key`` (stable id, int64), ``ready``/``start``/``end`` (s), and per resource a
doubly linked list ``dprev``/``dnext``/``dhead``/``dtail`` holding its tasks in
FIFO order. Edges live in a pool (``esrc``, ``edst``) threaded on per-task
doubly linked in/out lists, so one operator's tasks can be replaced in place.

The schedule both algorithms compute is the unique solution of

    ready(t) = max(end(p) for p in preds(t)), 0 without preds
    the tasks of a resource run in increasing (ready, key) order (FIFO by
      readiness, ties by stable id)
    start(t) = max(ready(t), end(previous task on t's resource))
    end(t)   = start(t) + dur(t)

unique because every duration is > 0: a task's ready time and its
predecessor on the resource are then fixed by tasks strictly earlier in
(ready, key) order. Write K(t) = (ready(t), key(t)) for a task's key.

Full simulation (Algorithm 1) pops a global heap in K order.

Delta simulation (Algorithm 2, exact and incremental). After one op's
tasks are replaced, only tasks whose schedule may change are visited, in
one sweep of increasing key X over a heap (like Algorithm 1). Each task is
CLEAN (untouched: old values), CHECKED (to be re-examined at its old key),
PENDING/BLOCKED (its key will change: detached from its resource list,
queued at a lower bound ``lb`` of its new ready time, or waiting for
``nwait`` unfinished predecessors) or DONE (final). Popping task t at X:

- its ready time R is computed from predecessors that are final at X (DONE,
  or CLEAN with old key < X); any other predecessor is unfinished, and then
  t is BLOCKED until the last of them is DONE;
- if R > X's ready time, t's key grows: it is re-queued at R;
- otherwise t is final at X: a PENDING t is inserted into its resource's
  list right after the last task with key < X (found by walking from a
  former neighbour and from the last task placed on that resource, from
  both sides at once); start = max(R, end of its list predecessor). Its
  next task in the list is CHECKED if that predecessor changed, its
  successors are made PENDING (queued at its end) if its end changed, and
  BLOCKED successors are counted down.

A task found to change (its predecessor's end changed, or it was CHECKED and
a predecessor is unfinished) is detached; its old next task and all its
successors are CHECKED at their old keys. Seeds: the new tasks and the
surviving tasks whose predecessor set changed are PENDING from the start
(lb 0); the surviving tasks whose list predecessor was removed are CHECKED.

Why it is exact. Invariant, at sweep key X: every task whose new schedule
differs from its old one and with min(old key, new key) < X is PENDING,
BLOCKED or DONE, and DONE tasks hold their final values. Hence the resource
lists hold only DONE tasks and CLEAN tasks, sorted by their stored keys,
and every listed task with stored key < X is final: the place found for a
task final at X and its list predecessor are exactly those of the full
simulation. The invariant holds by induction over X, by cases on why a
task t changes: (1) its ready time fell: the predecessor whose end fell is
DONE earlier (its new key is below t's new key) and makes t PENDING; (2)
its ready time rose: the predecessor whose end rose has an old key below
t's, so it was detached before X reached t's old key and CHECKED t there;
at that check it is still unfinished (t is made PENDING: an unfinished
task at X ends after X, so t's ready time does rise) or already DONE with
a changed end (it made t PENDING); (3) its ready time is the same but its
start changed: the task before it in the list changed, which happens only
by a detach, an insertion or a changed end of that task, each of which
CHECKs the next task at X below t's key. A PENDING task is popped at its
new key at the latest (its lb is a lower bound, and the last unfinished
predecessor to finish wakes it with lb >= that predecessor's end, which is
above the sweep key), and every push is at a key above the current one, so
the sweep is monotone. The kernel checks monotonicity, lb <= ready and that
nothing is left pending; on a failure it returns a negative code and the
simulator reschedules with Algorithm 1 (never seen in tests).

Work: each task is CHECKED, detached, and finalized at most once, and
scans its edges a bounded number of times, so the cost is linear in the
tasks near the changed region of the timeline (those whose schedule
changes, plus their successors and list neighbours), not in the graph.
When a change moves most of the timeline (an op on the critical path
early in the iteration), that region is most of the graph.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["link_edges", "unlink_edges", "remove_tasks", "full_sim", "delta_sim",
           "summarize"]


@njit(cache=True)
def link_edges(eids, esrc, edst, out_head, out_next, out_prev, in_head, in_next, in_prev):
    for e in eids:
        s, d = esrc[e], edst[e]
        h = out_head[s]
        out_next[e], out_prev[e] = h, -1
        if h >= 0:
            out_prev[h] = e
        out_head[s] = e
        h = in_head[d]
        in_next[e], in_prev[e] = h, -1
        if h >= 0:
            in_prev[h] = e
        in_head[d] = e


@njit(cache=True)
def unlink_edges(eids, esrc, edst, out_head, out_next, out_prev, in_head, in_next, in_prev):
    for e in eids:
        s, d = esrc[e], edst[e]
        n, p = out_next[e], out_prev[e]
        if p >= 0:
            out_next[p] = n
        else:
            out_head[s] = n
        if n >= 0:
            out_prev[n] = p
        n, p = in_next[e], in_prev[e]
        if p >= 0:
            in_next[p] = n
        else:
            in_head[d] = n
        if n >= 0:
            in_prev[n] = p


@njit(cache=True)
def remove_tasks(slots, res, dprev, dnext, dhead, dtail):
    """Unlink tasks from their resource lists; returns their old neighbours
    (previous and next task, -1 where none), one row per task."""
    out = np.empty((len(slots), 2), np.int64)
    for i, t in enumerate(slots):
        p, n, r = dprev[t], dnext[t], res[t]
        if p >= 0:
            dnext[p] = n
        elif dhead[r] == t:
            dhead[r] = n
        if n >= 0:
            dprev[n] = p
        elif dtail[r] == t:
            dtail[r] = p
        out[i, 0], out[i, 1] = p, n
        dprev[t] = -1
        dnext[t] = -1
    return out


@njit(cache=True, inline="always")
def _less(ra, ka, rb, kb):
    return ra < rb or (ra == rb and ka < kb)


@njit(cache=True, inline="always")
def _sift_up(hr, hk, ht, i):
    while i > 0:
        p = (i - 1) >> 1
        if _less(hr[i], hk[i], hr[p], hk[p]):
            hr[i], hr[p] = hr[p], hr[i]
            hk[i], hk[p] = hk[p], hk[i]
            ht[i], ht[p] = ht[p], ht[i]
            i = p
        else:
            break


@njit(cache=True, inline="always")
def _sift_down(hr, hk, ht, size):
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        b = a + 1
        c = a
        if b < size and _less(hr[b], hk[b], hr[a], hk[a]):
            c = b
        if _less(hr[c], hk[c], hr[i], hk[i]):
            hr[i], hr[c] = hr[c], hr[i]
            hk[i], hk[c] = hk[c], hk[i]
            ht[i], ht[c] = ht[c], ht[i]
            i = c
        else:
            break


@njit(cache=True)
def full_sim(alive, dur, res, key, esrc, edst, out_head, out_next, in_head, in_next,
             ready, start, end, dprev, dnext, dhead, dtail):
    """Algorithm 1. Fills ready/start/end and the resource lists; returns the
    number of tasks scheduled (less than the alive count means a cycle)."""
    n = len(alive)
    indeg = np.zeros(n, np.int64)
    last_end = np.zeros(len(dhead))
    dhead[:] = -1
    dtail[:] = -1
    m = 0
    for t in range(n):
        if alive[t]:
            m += 1
            ready[t] = 0.0
            e = in_head[t]
            while e >= 0:
                indeg[t] += 1
                e = in_next[e]
    hr = np.empty(m + 1)
    hk = np.empty(m + 1, np.int64)
    ht = np.empty(m + 1, np.int64)
    size = 0
    for t in range(n):
        if alive[t] and indeg[t] == 0:
            hr[size], hk[size], ht[size] = 0.0, key[t], t
            _sift_up(hr, hk, ht, size)
            size += 1
    done = 0
    while size > 0:
        t = ht[0]
        size -= 1
        hr[0], hk[0], ht[0] = hr[size], hk[size], ht[size]
        _sift_down(hr, hk, ht, size)
        r = res[t]
        s = ready[t] if ready[t] > last_end[r] else last_end[r]
        start[t] = s
        end[t] = s + dur[t]
        last_end[r] = end[t]
        p = dtail[r]
        dprev[t], dnext[t] = p, -1
        if p >= 0:
            dnext[p] = t
        else:
            dhead[r] = t
        dtail[r] = t
        done += 1
        e = out_head[t]
        while e >= 0:
            x = edst[e]
            if end[t] > ready[x]:
                ready[x] = end[t]
            indeg[x] -= 1
            if indeg[x] == 0:
                hr[size], hk[size], ht[size] = ready[x], key[x], x
                _sift_up(hr, hk, ht, size)
                size += 1
            e = out_next[e]
    return done


CLEAN, CHECKED, PENDING, BLOCKED, DONE = 0, 1, 2, 3, 4


@njit(cache=True)
def delta_sim(new, new_hint, pend, checks, alive, dur, res, key, esrc, edst, out_head,
              out_next, in_head, in_next, ready, start, end, dprev, dnext, dhead, dtail,
              st, lb, nwait, hint, cur, touched, dq, pbr, pbt, hr, hk, ht, hpos):
    """Algorithm 2 after one op's tasks were replaced (see the module
    docstring for the algorithm and why it is exact).

    ``new``: the new tasks (in no resource list, ``end`` = -1); ``new_hint``:
    for each, a task on its resource near where it belongs, or -1; ``pend``:
    surviving tasks whose predecessor set changed; ``checks``: surviving
    tasks whose resource predecessor was removed. Scratch space: per task
    ``st`` (all CLEAN on entry and on return), ``lb``, ``nwait``, ``hint``,
    ``touched``, ``dq``, ``pbr``/``pbt`` (twice as long), the indexed heap
    ``hr``/``hk``/``ht`` with ``hpos`` (all -1 on entry and on return); per
    resource ``cur``.

    Returns the number of heap pops, or a negative code if an internal
    invariant failed (the caller then reschedules with full_sim).

    (Written as one function on purpose: helpers taking the arrays cost
    reference counting on every call.)"""
    nt = 0   # touched tasks
    size = 0  # heap entries
    nd = 0   # tasks to detach (dq)
    npb = 0  # heap pushes (pbr, pbt) to apply: (r, t) -> (r, key[t], t) or lower
    cur[:] = -1
    for i in range(len(new)):
        t = new[i]
        st[t] = PENDING
        touched[nt] = t
        nt += 1
        hint[t] = new_hint[i]
        lb[t] = 0.0
        pbr[npb], pbt[npb] = 0.0, t
        npb += 1
    for t in pend:
        if st[t] == CLEAN and alive[t]:
            st[t] = PENDING
            touched[nt] = t
            nt += 1
            dq[nd] = t
            nd += 1
            lb[t] = 0.0
    for t in checks:
        if alive[t] and st[t] == CLEAN:
            st[t] = CHECKED
            touched[nt] = t
            nt += 1
            pbr[npb], pbt[npb] = ready[t], t
            npb += 1

    pops = 0
    err = 0
    lr, lk = -1.0, -1
    while True:
        # detach the tasks found changed (now PENDING or BLOCKED): unlink
        # each from its resource list, remember a neighbour to look for its
        # new place from, re-check its old next task and its successors at
        # their keys, put it in the heap at lb unless blocked
        for i in range(nd):
            t = dq[i]
            p, n, rr = dprev[t], dnext[t], res[t]
            if p >= 0:
                dnext[p] = n
            else:
                dhead[rr] = n
            if n >= 0:
                dprev[n] = p
            else:
                dtail[rr] = p
            dprev[t] = -1
            dnext[t] = -1
            hint[t] = p if p >= 0 else n
            if n >= 0 and st[n] == CLEAN:
                st[n] = CHECKED
                touched[nt] = n
                nt += 1
                pbr[npb], pbt[npb] = ready[n], n
                npb += 1
            e = out_head[t]
            while e >= 0:
                x = edst[e]
                if st[x] == CLEAN:
                    st[x] = CHECKED
                    touched[nt] = x
                    nt += 1
                    pbr[npb], pbt[npb] = ready[x], x
                    npb += 1
                e = out_next[e]
            if st[t] == PENDING:
                pbr[npb], pbt[npb] = lb[t], t
                npb += 1
        nd = 0
        # apply the pushes (one entry per task: insert, or lower its key)
        for j in range(npb):
            t = pbt[j]
            r = pbr[j]
            i = hpos[t]
            if i < 0:
                i = size
                size += 1
            elif r >= hr[i]:
                continue
            k = key[t]
            while i > 0:
                a = (i - 1) >> 1
                if _less(r, k, hr[a], hk[a]):
                    hr[i], hk[i], ht[i] = hr[a], hk[a], ht[a]
                    hpos[ht[i]] = i
                    i = a
                else:
                    break
            hr[i], hk[i], ht[i] = r, k, t
            hpos[t] = i
        npb = 0
        if size == 0:
            break
        # pop
        r0, k0, t = hr[0], hk[0], ht[0]
        hpos[t] = -1
        size -= 1
        if size > 0:
            r, k, x = hr[size], hk[size], ht[size]
            i = 0
            while True:
                a = 2 * i + 1
                if a >= size:
                    break
                if a + 1 < size and _less(hr[a + 1], hk[a + 1], hr[a], hk[a]):
                    a += 1
                if _less(hr[a], hk[a], r, k):
                    hr[i], hk[i], ht[i] = hr[a], hk[a], ht[a]
                    hpos[ht[i]] = i
                    i = a
                else:
                    break
            hr[i], hk[i], ht[i] = r, k, x
            hpos[x] = i
        pops += 1
        if _less(r0, k0, lr, lk):  # the sweep must be monotone
            err = -2
            break
        lr, lk = r0, k0
        s0 = st[t]
        # ready time from the predecessors final at the sweep key X = (r0, k0)
        R = 0.0
        cnt = 0
        e = in_head[t]
        while e >= 0:
            p = esrc[e]
            sp = st[p]
            if sp == DONE or (sp <= CHECKED and _less(ready[p], key[p], r0, k0)):
                if end[p] > R:
                    R = end[p]
            else:
                cnt += 1
                if sp == CLEAN:
                    st[p] = CHECKED
                    touched[nt] = p
                    nt += 1
                    pbr[npb], pbt[npb] = ready[p], p
                    npb += 1
            e = in_next[e]
        if cnt > 0 or R > r0:
            if s0 == CHECKED or R > lb[t]:
                lb[t] = R
            if cnt > 0:  # the last of them to finish puts t back in the heap
                nwait[t] = cnt
            if s0 == CHECKED:
                dq[nd] = t
                nd += 1
                st[t] = BLOCKED if cnt > 0 else PENDING
            elif cnt > 0:
                st[t] = BLOCKED
            else:
                pbr[npb], pbt[npb] = R, t
                npb += 1
            continue
        if R < r0:  # a lower bound was wrong
            err = -3
            break
        # t is ready at X: it is final now
        rr = res[t]
        old_end = end[t]
        if s0 == PENDING:
            # insert t into its resource list at X: start from a former
            # neighbour (h) and the last task placed there (c); walk from
            # the nearest known task on each side of the place at once
            h = hint[t]
            while h >= 0 and (st[h] == PENDING or st[h] == BLOCKED):
                h = hint[h]
            c = cur[rr]
            a, b = dhead[rr], dtail[rr]
            if h < 0 and c < 0 and a >= 0:
                h = a if R - ready[a] <= ready[b] - R else b
            lo, hi = -1, -1  # nearest known task before / after the place
            if h >= 0:
                if _less(ready[h], key[h], R, k0):
                    lo = h
                else:
                    hi = h
            if c >= 0:
                if _less(ready[c], key[c], R, k0):
                    if lo < 0 or _less(ready[lo], key[lo], ready[c], key[c]):
                        lo = c
                elif hi < 0 or _less(ready[c], key[c], ready[hi], key[hi]):
                    hi = c
            p, q = -1, -1
            if a < 0:
                pass  # empty list
            elif hi < 0 and not _less(ready[a], key[a], R, k0):
                q = a
            elif lo < 0 and _less(ready[b], key[b], R, k0):
                p = b
            else:
                while True:
                    if lo >= 0:
                        q = dnext[lo]
                        if q < 0 or not _less(ready[q], key[q], R, k0):
                            p = lo
                            break
                        lo = q
                    if hi >= 0:
                        p = dprev[hi]
                        if p < 0 or _less(ready[p], key[p], R, k0):
                            q = hi
                            break
                        hi = p
            dprev[t], dnext[t] = p, q
            if p >= 0:
                dnext[p] = t
            else:
                dhead[rr] = t
            if q >= 0:
                dprev[q] = t
            else:
                dtail[rr] = t
            ready[t] = R
        s = R
        p = dprev[t]
        if p >= 0 and end[p] > s:
            s = end[p]
        start[t] = s
        f = s + dur[t]
        end[t] = f
        st[t] = DONE
        cur[rr] = t
        changed = f != old_end
        q = dnext[t]
        if q >= 0 and (changed or s0 == PENDING) and st[q] == CLEAN:
            st[q] = CHECKED
            touched[nt] = q
            nt += 1
            pbr[npb], pbt[npb] = ready[q], q
            npb += 1
        e = out_head[t]
        while e >= 0:
            x = edst[e]
            sx = st[x]
            if sx <= CHECKED:
                if changed:
                    if sx == CLEAN:
                        touched[nt] = x
                        nt += 1
                    st[x] = PENDING
                    lb[x] = f
                    dq[nd] = x
                    nd += 1
            elif sx == PENDING:
                if f > lb[x]:
                    lb[x] = f
            elif sx == BLOCKED:
                if f > lb[x]:
                    lb[x] = f
                nwait[x] -= 1
                if nwait[x] == 0:
                    st[x] = PENDING
                    pbr[npb], pbt[npb] = lb[x], x
                    npb += 1
            e = out_next[e]
    for i in range(size):
        hpos[ht[i]] = -1
    for i in range(nt):
        t = touched[i]
        if err == 0 and st[t] != DONE:
            err = -4  # left pending: a cycle or a bug
        st[t] = CLEAN
    return pops if err == 0 else err


@njit(cache=True)
def summarize(alive, res, dur, kind, nbytes, mdev, mbytes, end, n_res, n_dev, copy_kind,
              coll_kind=-1):
    """One pass over the tasks: busy seconds and copied bytes (copies, and
    collectives: the bytes their steps move over links) per resource,
    memory per device, the last end time and the number of tasks."""
    busy = np.zeros(n_res)
    moved = np.zeros(n_res)
    mem = np.zeros(n_dev)
    last = 0.0
    n = 0
    for t in range(len(alive)):
        if alive[t]:
            n += 1
            r = res[t]
            busy[r] += dur[t]
            if kind[t] == copy_kind or kind[t] == coll_kind:
                moved[r] += nbytes[t]
            mem[mdev[t]] += mbytes[t]
            if end[t] > last:
                last = end[t]
    return busy, moved, mem, last, n
