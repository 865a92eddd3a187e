"""The collectives rule (legionpy/collectives.py): buckets, groups, the steps
of ring / hierarchical / tree, their numerical effect and the alpha-beta cost."""

from __future__ import annotations

import numpy as np
import pytest

from legionpy import collectives as C


def node4(d):
    return d // 4


def _run(kind, group, algorithm, n_elems=37, node_of=None, seed=0):
    rng = np.random.default_rng(seed)
    size = n_elems if algorithm == "tree" else C.padded(n_elems, len(group))
    bufs = {d: rng.standard_normal(size) for d in group}
    orig = {d: b.copy() for d, b in bufs.items()}
    st = C.steps(kind, group, size * 8, algorithm, node_of)
    n_chunks = 1 if algorithm == "tree" else len(group)
    bounds = C.chunk_bounds(n_elems, n_chunks)
    C.apply_steps(bufs, st, bounds)
    return orig, bufs, bounds, st


@pytest.mark.parametrize("algorithm,group", [
    ("ring", (0, 1, 2, 3, 4)), ("ring", (3, 7)), ("hierarchical", tuple(range(12))),
    ("hierarchical", (4, 5, 8, 9)), ("tree", tuple(range(6))), ("tree", (2, 5, 9))])
def test_all_reduce_sums_everywhere(algorithm, group):
    orig, bufs, _, _ = _run("all_reduce", group, algorithm, node_of=node4)
    total = sum(orig.values())
    for d in group:
        np.testing.assert_allclose(bufs[d], total, rtol=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_reduce_scatter_then_all_gather(algorithm):
    group = tuple(range(8))
    orig, bufs, bounds, _ = _run("reduce_scatter", group, algorithm, node_of=node4)
    total = sum(orig.values())
    for p, d in enumerate(group):  # position p owns chunk p, fully reduced
        lo, hi = bounds[p]
        np.testing.assert_allclose(bufs[d][lo:hi], total[lo:hi], rtol=1e-12)
    # all-gather of the owned chunks: everyone ends with every chunk
    start = {d: np.zeros_like(total) for d in group}
    for p, d in enumerate(group):
        lo, hi = bounds[p]
        start[d][lo:hi] = bufs[d][lo:hi]
    C.apply_steps(start, C.steps("all_gather", group, total.size * 8, algorithm, node4), bounds)
    for d in group:
        np.testing.assert_allclose(start[d], total, rtol=1e-12)


def test_ring_shape_and_dependences():
    st = C.steps("reduce_scatter", (0, 1, 2, 3), 4096, "ring")
    assert len(st) == 4 * 3 and {s.round for s in st} == {0, 1, 2}
    assert st[0] == C.Step(0, 0, 1, range(3, 4), 1024.0, "reduce", ())
    for i, s in enumerate(st):
        assert s.dst == (s.src + 1) % 4
        for a in s.after:  # forwards what it received in the round before
            assert a < i and st[a].dst == s.src and st[a].round == s.round - 1
    ar = C.steps("all_reduce", (0, 1, 2, 3), 4096, "ring")
    assert len(ar) == 2 * 4 * 3 and sum(s.op == "copy" for s in ar) == 12
    assert C.steps("all_reduce", (5,), 4096, "ring") == []  # one device: a no-op


def test_hierarchical_message_counts():
    group = tuple(range(16))  # 4 nodes x 4
    st = C.steps("all_reduce", group, 16 * 1024, "hierarchical", node4)
    intra = [s for s in st if node4(s.src) == node4(s.dst)]
    inter = [s for s in st if node4(s.src) != node4(s.dst)]
    assert len(intra) == 2 * 4 * (4 * 3) and len(inter) == 2 * 4 * (4 * 3)
    assert all(s.nbytes == 4 * 1024 for s in intra)  # 1/g of the buffer
    assert all(s.nbytes == 1024 for s in inter)  # 1/n
    with pytest.raises(ValueError, match="node-major"):
        C.steps("all_reduce", (0, 4, 1, 5), 1024, "hierarchical", node4)


def test_phases_match_steps():
    for alg, kind, group in [("ring", "all_reduce", tuple(range(6))),
                             ("hierarchical", "all_reduce", tuple(range(12))),
                             ("hierarchical", "reduce_scatter", tuple(range(8))),
                             ("tree", "all_reduce", tuple(range(7)))]:
        st = C.steps(kind, group, 1 << 20, alg, node4)
        ph = C.phases(kind, group, 1 << 20, alg, node4)
        assert sum(p.rounds * len(p.edges) for p in ph) == len(st)
        assert sum(p.rounds * sum(e[2] for e in p.edges) for p in ph) == pytest.approx(
            sum(s.nbytes for s in st))


def _links(intra_bw=100e9, inter_bw=10e9, alpha=1e-5):
    """Devices 4 per node: one direct link per pair inside a node; across
    nodes a route d -> nic(node) -> d' (NIC shared by the node's devices)."""
    def route(a, b):
        if node4(a) == node4(b):
            return (("nv", a, b),)
        return (("up", node4(a)), ("down", node4(b)))

    def link_time(lk, nb):
        bw = intra_bw if lk[0] == "nv" else inter_bw
        return alpha + nb / bw
    return route, link_time


def test_alpha_beta_cost_and_choice():
    route, lt = _links()
    # 4 devices on one node, ring all-reduce: 2(n-1) rounds of (alpha + (b/n)/bw)
    t = C.collective_time("all_reduce", (0, 1, 2, 3), 4e6, "ring", route, lt)
    assert t == pytest.approx(6 * (1e-5 + 1e6 / 100e9))
    # across nodes the NIC is shared: a flat ring over 4 nodes x 4 has one
    # cross-node message per node per round; hierarchical sends 1/g as much
    g16 = tuple(range(16))
    big = 256e6
    ring = C.collective_time("all_reduce", g16, big, "ring", route, lt, node4)
    hier = C.collective_time("all_reduce", g16, big, "hierarchical", route, lt, node4)
    assert ring == pytest.approx(30 * 2 * (1e-5 + big / 16 / 10e9))
    assert hier < ring
    assert C.choose_algorithm("all_reduce", g16, big, route, lt, node4)[0] == "hierarchical"
    # tiny message, many devices in one node: latency bound, the tree wins
    g = tuple(range(4))
    _, lt_slow = _links(alpha=1e-3)
    assert C.choose_algorithm("all_reduce", g, 8.0, route, lt_slow, node4)[0] == "tree"
    assert C.choose_algorithm("reduce_scatter", g, 8.0, route, lt_slow, node4)[0] == "ring"
    assert C.choose_algorithm("all_reduce", (3,), 1e9, route, lt) == ("ring", 0.0)


def test_buckets_and_groups():
    mb = 2**20
    assert C.buckets([10 * mb, 10 * mb, 10 * mb, 30 * mb, mb]) == [[0, 1], [2], [3], [4]]
    assert C.buckets([]) == []
    # a flat buffer has one element type: a change of dtype starts a bucket
    assert C.buckets([mb, mb, mb, mb], kinds=["<f4", "<f4", "<f2", "<f4"]) == [[0, 1], [2], [3]]

    class P:  # a parameter: shape and dtype
        def __init__(self, shape, dtype="float32"):
            self.shape, self.dtype = shape, dtype

    # first-use order in, reverse first-use packing out, as parameter indices
    ps = [P((1024, 1024, 2)), P((1024, 1024, 2)), P((2,), "float16"), P((10,))]
    assert C.parameter_buckets(ps) == [[3], [2], [1, 0]]
    tiles = [("a", (1, 0), 8.0), ("b", (2,), 4.0), ("c", (0, 1), 16.0)]
    assert C.bucket_groups(tiles) == [((0, 1), [0, 2], 24.0), ((2,), [1], 4.0)]
    assert C.chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert C.padded(10, 4) == 12 and C.padded(12, 4) == 12


def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match="'broadcast'"):
        C.steps("broadcast", (0, 1), 8)
    with pytest.raises(ValueError, match="'tree' runs all_reduce only"):
        C.steps("reduce_scatter", (0, 1, 2), 8, "tree")
    with pytest.raises(ValueError, match="twice"):
        C.steps("all_reduce", (0, 0), 8)


def test_one_sync_setting_reaches_both_halves(monkeypatch):
    monkeypatch.delenv("LEGIONPY_SYNC", raising=False)
    assert C.resolve_sync() == C.DEFAULT_SYNC == "collective"
    assert C.resolve_sync("shards") == "shards"
    monkeypatch.setenv("LEGIONPY_SYNC", "shards")
    assert C.resolve_sync() == "shards" and C.resolve_sync("collective") == "collective"
    monkeypatch.setenv("LEGIONPY_SYNC", "allreduce")
    with pytest.raises(ValueError, match="'allreduce' .LEGIONPY_SYNC=allreduce. is not one of"):
        C.resolve_sync()


def test_the_bucket_cap_is_one_setting_for_both_halves(monkeypatch):
    """LEGIONPY_BUCKET_MB (DDP's bucket_cap_mb) reaches the rule, so the
    simulator's buckets and the runtime's (nn/sync.py) change together."""
    from legionpy import models
    from legionpy.optimizer import Machine, Simulator, Strategy

    mb = 2**20
    monkeypatch.delenv("LEGIONPY_BUCKET_MB", raising=False)
    assert C.bucket_bytes() == C.BUCKET_BYTES == 25 * mb
    assert C.buckets([10 * mb, 10 * mb]) == [[0, 1]]
    g = models.lenet(batch_size=8).graph
    m = Machine.parse("p100:1x2")
    one = Simulator(g, m)
    one.run(Strategy.data_parallel(g, m))
    monkeypatch.setenv("LEGIONPY_BUCKET_MB", "0.05")
    assert C.bucket_bytes() == 0.05 * mb
    assert C.buckets([10 * mb, 10 * mb]) == [[0], [1]]
    many = Simulator(g, m)
    many.run(Strategy.data_parallel(g, m))
    assert len(one.tg.buckets) == 1 < len(many.tg.buckets)
    monkeypatch.setenv("LEGIONPY_BUCKET_MB", "zero")
    with pytest.raises(ValueError, match="LEGIONPY_BUCKET_MB='zero'"):
        C.bucket_bytes()
