"""Vectorised task-graph blocks of replicated parameters (the data-parallel
case), built with numpy instead of replaying the coherence state machine.
(Named ``optimizer/replicated.py`` before issue 23.)

A parameter block (docs/taskgraph.md, "Sharded weight updates") is the bulk
of a data-parallel task graph: with ``n`` replicas and ``s`` update shards
it has about ``2 n s`` copies (every replica fetches every shard it does not
home; every shard's home folds every replica's gradient buffer). Profiling
ResNet-101 on ``h100:16x8`` (128 GPUs) showed 20 of the 26 s of a full
simulation in :meth:`TaskGraph._param_block`, one ``FieldState`` access or
one Python copy chain at a time.

When the parameter has ONE weight tile and every forward read and every
backward reduction covers that whole tile (replicas: data parallelism,
or any split that needs the whole weight), the coherence replay has a
closed form, which :func:`replicated_block` builds in arrays:

- forward (field ``w``; pieces = the shards, valid on their homes): the
  first read on device ``d`` copies every shard ``c`` not homed on ``d``
  from its home (``choose_source``: the owner), one copy per shard (homes
  are distinct, so no merging), ``n``-th copy keyed ``key0 + 16 n`` in shard
  order, its last hop feeding the reader; each later read on ``d`` depends
  on the last hops of those copies (the data is valid there: no copy);
- backward (field ``g``): each device's reducers accumulate into one buffer
  (one per memory: they all reduce the same rect); the update ``U(w, t)`` on
  shard ``t``'s home depends on its local reducers and gets one copy per
  remote buffer (in the order the buffers were opened: reverse op order,
  then tile), each after every reducer of that buffer.

The tasks and edges are exactly those of the general replay (same keys,
durations, resources, bytes, memory and dependences; the order of tasks
inside the block differs, which nothing depends on).
tests/unit/test_replica_blocks.py checks that on random strategies.
"""

from __future__ import annotations

import numpy as np

__all__ = ["replicated_block", "copy_chains", "route_table"]

COPY = 2  # taskgraph.COPY (not imported: taskgraph imports this module)


def copy_chains(tg, src, dst, nbytes, key0, mem_bytes):
    """Tasks of copies ``src[i] -> dst[i]`` of ``nbytes[i]`` (every hop of its
    route; hop ``h`` keyed ``key0[i] + h``; the last hop holds ``mem_bytes[i]``
    on ``dst[i]``). Returns ``(cols, first, last, chain_edges)``: the task
    columns (key, dur, res, kind, nbytes, mdev, mbytes, ends), the index of
    each copy's first and last hop, and the (hop, next hop) edges."""
    m = len(src)
    pair = src * tg.D + dst
    rlen, rlinks = route_table(tg, pair)
    hc = rlen[pair]
    off = np.zeros(m + 1, np.int64)
    np.cumsum(hc, out=off[1:])
    H = int(off[-1])
    ci = np.repeat(np.arange(m), hc)
    h = np.arange(H) - off[ci]
    link = rlinks[pair[ci], h].astype(np.int64)
    nb = nbytes[ci]
    dur = _copy_times(tg, link, nb)
    first, last = off[:-1], off[1:] - 1
    is_last = np.zeros(H, np.bool_)
    is_last[last] = True
    cols = (key0[ci] + h, dur, tg.D + link, np.full(H, COPY, np.int8), nb,
            np.where(is_last, dst[ci], 0), np.where(is_last, mem_bytes[ci], 0.0),
            src[ci] * 65536 + dst[ci])
    inner = np.flatnonzero(~is_last)
    return cols, first, last, np.stack([inner, inner + 1], 1)


def route_table(tg, pairs):
    """``(length[D*D], links[D*D, hops])`` of the machine's routes, indexed by
    ``src * D + dst``, filled for ``pairs`` (and every pair asked before) --
    one :meth:`Machine.route` call per pair per task graph."""
    D = tg.D
    if tg._rtab is None:
        tg._rtab = (np.full(D * D, -1, np.int32), np.full((D * D, 2), -1, np.int32))
    rlen, rlinks = tg._rtab
    miss = np.unique(pairs[rlen[pairs] < 0])
    if len(miss):
        routes = [tg.machine.route(int(p // D), int(p % D)) for p in miss]
        h = max(len(r) for r in routes)
        if h > rlinks.shape[1]:
            grown = np.full((D * D, h), -1, np.int32)
            grown[:, :rlinks.shape[1]] = rlinks
            rlinks = grown
        for p, r in zip(miss.tolist(), routes):
            rlen[p] = len(r)
            rlinks[p, :len(r)] = r
        tg._rtab = (rlen, rlinks)
    return rlen, rlinks


def _copy_times(tg, link, nb):
    """``cost.copy_time`` of every (link, bytes), one call per distinct pair."""
    u, inv = np.unique(np.stack([link.astype(np.float64), nb], 1), axis=0,
                       return_inverse=True)
    links = tg.machine.links
    cache = tg._copy_cache
    t = np.empty(len(u))
    for i, (ln, b) in enumerate(u):
        k = (int(ln), float(b))
        v = cache.get(k)
        if v is None:
            v = cache[k] = tg.cost.copy_time(float(b), links[int(ln)])
        t[i] = v
    return t[inv.ravel()]


def replicated_block(tg, shards, reads, reducers, L, item, updates):
    """Columns and edges of a replicated parameter's block (see the module
    docstring). ``shards``: ``(rect, home)`` in rect order; ``reads``:
    ``(device, op code, key0)`` of the forward reads in launch order;
    ``reducers``: ``(device, op code)`` of the backward reductions in order;
    ``updates``: the U task rows (one per shard, in point order); ``L``: the
    update launch. Returns ``(tasks columns, edges)`` with edge codes as in
    :class:`TaskGraph` (>= 0 local, < 0 external)."""
    from .taskgraph import pack_key

    home = np.array([hm for _, hm in shards], np.int64)
    nb = np.array([float(r.volume * item) for r, _ in shards])
    first: dict[int, int] = {}
    fdev, fopc, fkey, later = [], [], [], []
    for dev, opc, key0 in reads:
        if dev in first:
            later.append((first[dev], opc))
        else:
            first[dev] = len(fdev)
            fdev.append(dev)
            fopc.append(opc)
            fkey.append(key0)
    fdev_a = np.array(fdev, np.int64)
    ii, cc = np.nonzero(fdev_a[:, None] != home[None, :])
    n = np.arange(len(ii)) - np.searchsorted(ii, ii)
    fcols, _, flast, fchain = copy_chains(
        tg, home[cc], fdev_a[ii], nb[cc], np.array(fkey, np.int64)[ii] + 16 * n, nb[cc])
    nf = len(fcols[0])
    edges = [fchain, np.stack([flast, np.array(fopc, np.int64)[ii]], 1)]
    for i, opc in later:  # data already valid on the device: depend on its copies
        lasts = flast[ii == i]
        edges.append(np.stack([lasts, np.full(len(lasts), opc, np.int64)], 1))
    # backward: one buffer per memory, opened in reduction order
    bufs: dict[int, list[int]] = {}
    for dev, code in reducers:
        bufs.setdefault(dev, []).append(code)
    bmem = np.array(list(bufs), np.int64)
    s = len(shards)
    u_idx = nf + np.arange(s)
    ucols = [np.array(c) for c in zip(*updates)] if updates else [np.zeros(0)] * 8
    tt, jj = np.nonzero(home[:, None] != bmem[None, :]) if len(bmem) else (
        np.zeros(0, np.int64), np.zeros(0, np.int64))
    n = np.arange(len(tt)) - np.searchsorted(tt, tt)
    key0 = np.array([pack_key(L, 1, t, 0) for t in range(s)], np.int64)
    bcols, bfirst, blast, bchain = copy_chains(tg, bmem[jj], home[tt], nb[tt],
                                               key0[tt] + 16 * n, np.zeros(len(tt)))
    base = nf + s
    edges += [bchain + base, np.stack([blast + base, u_idx[tt]], 1)]
    # every reducer of a remote buffer -> the first hop of that buffer's copies
    prods = [np.array(bufs[int(m)], np.int64) for m in bmem]
    plen = np.array([len(p) for p in prods], np.int64)
    if len(jj):
        cnt = plen[jj]
        pcat = np.concatenate(prods)
        poff = np.concatenate([[0], np.cumsum(plen)])[:-1]
        rep = np.repeat(np.arange(len(jj)), cnt)
        within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        edges.append(np.stack([pcat[poff[jj[rep]] + within], bfirst[rep] + base], 1))
    # local reducers -> the update on their own device
    for t in range(s):
        loc = bufs.get(int(home[t]))
        if loc:
            edges.append(np.stack([np.array(loc, np.int64), np.full(len(loc), u_idx[t])], 1))
    cols = [np.concatenate([np.asarray(f), np.asarray(u).astype(np.asarray(f).dtype), b])
            for f, u, b in zip(fcols, ucols, bcols)]
    e = np.concatenate(edges) if edges else np.zeros((0, 2), np.int64)
    return cols, e
