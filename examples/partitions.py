"""Partitions: a 1-d stencil over an aliased (halo) partition, and a
reduction from overlapping tiles, checked against plain numpy.

Each step reads its tile plus one halo row on each side from an aliased
``restriction`` partition (R) and writes the disjoint tile of another field
(WD); the runtime copies exactly the halo rows that live on other devices.
Run: ``python examples/partitions.py`` (``LEGIONPY_DEBUG=1`` prints the
tasks, copies and bytes per fence).
"""

from __future__ import annotations

import numpy as np

import legionpy as lp

N, TILES, STEPS = 64, 4, 5


@lp.task(privileges=[lp.R("u"), lp.WD("v")])
def smooth(halo, tile):
    """tile.v = 3-point average of u; halo.u holds the tile plus its neighbours."""
    off = halo.rect.lo[0]
    i = np.arange(tile.rect.lo[0], tile.rect.hi[0])
    left, right = np.maximum(i - 1, 0), np.minimum(i + 1, N - 1)
    tile.v[...] = (halo.u[left - off] + halo.u[i - off] + halo.u[right - off]) / 3.0


@lp.task(privileges=[lp.R("v"), lp.WD("u")])
def copy_back(src, dst):
    dst.u[...] = src.v


@lp.task(privileges=[lp.Reduce("+", "count")])
def count_cover(r):
    r.count[...] += 1


def reference(u):
    for _ in range(STEPS):
        p = np.concatenate([u[:1], u, u[-1:]])
        u = (p[:-2] + p[1:-1] + p[2:]) / 3.0
    return u


def main() -> None:
    R = lp.Region((N,), {"u": np.float64, "v": np.float64, "count": np.int64}, name="rod")
    tiles = lp.Partition.equal(R, (TILES,))
    halos = lp.Partition.restriction(R, (N // TILES,), halo=(1,))
    u0 = np.sin(np.linspace(0, 3, N))
    R.write("u", u0)
    for _ in range(STEPS):
        lp.index_launch(smooth, tiles.colors, halos, tiles)
        lp.index_launch(copy_back, tiles.colors, tiles, tiles)
    lp.index_launch(count_cover, halos.colors, halos)   # overlapping tiles reduce with +
    lp.fence()
    np.testing.assert_allclose(R.read("u"), reference(u0), rtol=1e-12)
    print("stencil matches numpy after", STEPS, "steps")
    print("halo coverage:", R.read("count").tolist())


if __name__ == "__main__":
    main()
