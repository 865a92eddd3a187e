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
predecessor on the device are then fixed by tasks strictly earlier in
(ready, key) order. The full simulation pops a global heap in (ready, key)
order (Algorithm 1). The delta simulation re-solves only what changed: seed
tasks go on a heap; popping a task recomputes its ready time, moves it in its
resource's list if that changed (pushing the tasks whose predecessor
changed), recomputes start/end and, when they changed, pushes its successors
and its next task on the resource (Algorithm 2's UpdateTask with the FIFO
"swap"). It stops at the fixpoint, which is the unique solution above.

Work bound: propagation in stale-priority order may revisit tasks (as
Bellman-Ford does) when a change reorders many device queues. ``delta_sim``
gives up after ``max_pops`` heap pops; the simulator then re-runs
``full_sim`` on the already-updated task graph (no rebuild), which yields the
same unique schedule. Either way the result equals a full simulation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["link_edges", "unlink_edges", "remove_tasks", "insert_tasks", "full_sim",
           "delta_sim"]


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
    """Unlink tasks from their resource lists; returns their old next tasks."""
    out = np.empty(len(slots), np.int64)
    m = 0
    for t in slots:
        p, n, r = dprev[t], dnext[t], res[t]
        if p >= 0:
            dnext[p] = n
        elif dhead[r] == t:
            dhead[r] = n
        if n >= 0:
            dprev[n] = p
            out[m] = n
            m += 1
        elif dtail[r] == t:
            dtail[r] = p
        dprev[t] = -1
        dnext[t] = -1
    return out[:m]


@njit(cache=True, inline="always")
def _less(ra, ka, rb, kb):
    return ra < rb or (ra == rb and ka < kb)


@njit(cache=True)
def insert_tasks(slots, ready, start, end, key, res, esrc, in_head, in_next,
                 dprev, dnext, dhead, dtail):
    """Give new tasks a provisional ready time and merge them into their
    resources' lists (one walk per resource)."""
    n = len(slots)
    for t in slots:
        start[t] = -1.0
        end[t] = -1.0
    for t in slots:
        r = 0.0
        e = in_head[t]
        while e >= 0:
            x = end[esrc[e]]
            if x > r:
                r = x
            e = in_next[e]
        ready[t] = r
    # sort by (res, ready, key)
    order = np.argsort(key[slots])
    s1 = slots[order]
    order = np.argsort(ready[s1], kind="mergesort")
    s2 = s1[order]
    order = np.argsort(res[s2], kind="mergesort")
    s3 = s2[order]
    i = 0
    while i < n:
        r = res[s3[i]]
        p = -1
        q = dhead[r]
        while i < n and res[s3[i]] == r:
            t = s3[i]
            while q >= 0 and _less(ready[q], key[q], ready[t], key[t]):
                p = q
                q = dnext[q]
            dprev[t], dnext[t] = p, q
            if p >= 0:
                dnext[p] = t
            else:
                dhead[r] = t
            if q >= 0:
                dprev[q] = t
            else:
                dtail[r] = t
            p = t
            i += 1


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


@njit(cache=True)
def delta_sim(seeds, alive, dur, res, key, esrc, edst, out_head, out_next, in_head, in_next,
              ready, start, end, dprev, dnext, dhead, dtail, max_pops):
    """Algorithm 2 from ``seeds`` (tasks whose inputs changed). Returns the
    number of heap pops, or -1 when more than ``max_pops`` were needed (the
    state is then inconsistent and the caller reschedules with full_sim)."""
    cap = 2 * len(seeds) + 64
    hr = np.empty(cap)
    hk = np.empty(cap, np.int64)
    ht = np.empty(cap, np.int64)
    size = 0
    pops = 0
    pend = np.empty(8, np.int64)  # tasks to push this step
    for t in seeds:
        if alive[t]:
            hr[size], hk[size], ht[size] = ready[t], key[t], t
            _sift_up(hr, hk, ht, size)
            size += 1
    while size > 0:
        t = ht[0]
        size -= 1
        hr[0], hk[0], ht[0] = hr[size], hk[size], ht[size]
        _sift_down(hr, hk, ht, size)
        pops += 1
        if pops > max_pops:
            return -1
        if not alive[t]:
            continue
        npend = 0
        r = 0.0
        e = in_head[t]
        while e >= 0:
            x = end[esrc[e]]
            if x > r:
                r = x
            e = in_next[e]
        if r != ready[t]:
            ready[t] = r
            p, n = dprev[t], dnext[t]
            bad = (p >= 0 and _less(r, key[t], ready[p], key[p])) or (
                n >= 0 and _less(ready[n], key[n], r, key[t]))
            if bad:
                rr = res[t]
                if p >= 0:
                    dnext[p] = n
                else:
                    dhead[rr] = n
                if n >= 0:
                    dprev[n] = p
                else:
                    dtail[rr] = p
                # walk from the old neighbours to the new place
                if p >= 0 and _less(r, key[t], ready[p], key[p]):
                    q = p
                    while q >= 0 and _less(r, key[t], ready[q], key[q]):
                        q = dprev[q]
                    nn = dhead[rr] if q < 0 else dnext[q]
                else:
                    nn = n
                    while nn >= 0 and _less(ready[nn], key[nn], r, key[t]):
                        nn = dnext[nn]
                    q = dtail[rr] if nn < 0 else dprev[nn]
                dprev[t], dnext[t] = q, nn
                if q >= 0:
                    dnext[q] = t
                else:
                    dhead[rr] = t
                if nn >= 0:
                    dprev[nn] = t
                else:
                    dtail[rr] = t
                if n >= 0:
                    pend[npend] = n
                    npend += 1
                if nn >= 0:
                    pend[npend] = nn
                    npend += 1
        p = dprev[t]
        s = ready[t]
        if p >= 0 and end[p] > s:
            s = end[p]
        f = s + dur[t]
        changed = s != start[t] or f != end[t]
        start[t] = s
        end[t] = f
        if changed and dnext[t] >= 0:
            pend[npend] = dnext[t]
            npend += 1
        # grow the heap for the pushes below
        need = size + npend + 1
        e = out_head[t] if changed else -1
        while e >= 0:
            need += 1
            e = out_next[e]
        if need > cap:
            cap = 2 * need
            hr2 = np.empty(cap)
            hk2 = np.empty(cap, np.int64)
            ht2 = np.empty(cap, np.int64)
            hr2[:size] = hr[:size]
            hk2[:size] = hk[:size]
            ht2[:size] = ht[:size]
            hr, hk, ht = hr2, hk2, ht2
        for i in range(npend):
            x = pend[i]
            hr[size], hk[size], ht[size] = ready[x], key[x], x
            _sift_up(hr, hk, ht, size)
            size += 1
        if changed:
            e = out_head[t]
            while e >= 0:
                x = edst[e]
                hr[size], hk[size], ht[size] = ready[x], key[x], x
                _sift_up(hr, hk, ht, size)
                size += 1
                e = out_next[e]
    return pops
