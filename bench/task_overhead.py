"""Empty-task throughput of legionpy against Dask on the same 10,000 no-op tasks.

Prints microseconds per task for single launches and index launches of 1000
points, independent and chained, on the serial and threaded executors, and
Dask's synchronous and threaded schedulers, with the ratio legionpy / Dask
synchronous. Then the region-launch scaling case: index launches of a task
with R / RW / WD / Reduce privileges over an equal partition of 10, 100, 1000
and 4000 tiles, in microseconds per point (should not grow with the tile count).
Last the traced case: the same kind of launch (three region arguments)
untraced and replayed from a trace (``lp.trace``), with the ratio.
Run: ``python bench/task_overhead.py [--tasks 10000] [--cpus 2] [--tiles 10,100,1000,4000]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import legionpy as lp
import legionpy.runtime as lr


def noop(*args):
    return None


def bench_legion(executor: str, n: int, cpus: int) -> dict[str, float]:
    lr.init(cpus=cpus, executor=executor)
    t = lp.task(noop, name="noop")
    out = {}

    def timed(fn):
        lp.fence()
        t0 = time.perf_counter()
        fn()
        lp.fence()
        return (time.perf_counter() - t0) / n * 1e6

    def single_indep():
        for _ in range(n):
            t()

    def single_chain():
        f = t()
        for _ in range(n - 1):
            f = t(f)

    def index_indep():
        for _ in range(n // 1000):
            lp.index_launch(t, range(1000))

    def index_chain():
        fm = lp.index_launch(t, range(1000))
        for _ in range(n // 1000 - 1):
            fm = lp.index_launch(t, range(1000), fm)

    timed(single_indep)  # warm up
    for name, fn in [
        ("single independent", single_indep),
        ("single chained", single_chain),
        ("index x1000 independent", index_indep),
        ("index x1000 chained", index_chain),
    ]:
        out[name] = min(timed(fn) for _ in range(3))
    lr.shutdown()
    return out


def bench_region_launch(executor: str, tiles: int, cpus: int, points: int = 4000) -> float:
    """Microseconds per point of index launches over a ``tiles``-tile equal
    partition, each point holding R(x) + RW(y) + WD(z) + Reduce(+, w) on its
    tile; blocks of launches end in a fence (which resets the analysis)."""
    lr.init(cpus=cpus, executor=executor)
    A = lp.Region((4 * tiles, 8), {f: np.float64 for f in "xyzw"}, name="A")
    P = lp.Partition.equal(A, (tiles, 1))
    t = lp.task(noop, name="step", privileges=[lp.R("x") + lp.RW("y") + lp.WD("z")
                                               + lp.Reduce("+", "w")])
    per_block = max(2, min(10, 4000 // tiles))
    blocks = max(1, points // (per_block * tiles))

    def run() -> float:
        lp.fence()
        t0 = time.perf_counter()
        for _ in range(blocks):
            for _ in range(per_block):
                lp.index_launch(t, P.colors, P)
            lp.fence()
        return (time.perf_counter() - t0) / (blocks * per_block * tiles) * 1e6

    run()  # warm up
    best = min(run() for _ in range(3))
    lr.shutdown()
    return best


def bench_traced(executor: str, tiles: int, cpus: int, points: int = 20000) -> tuple[float, float]:
    """Microseconds per point, untraced and replayed, of index launches of
    an empty task with three region arguments (R, RW and WD on the tiles of
    three regions): 10 launches per block, the block inside ``lp.trace``
    (the first runs record, later ones replay); a fence after each block."""
    lr.init(cpus=cpus, executor=executor)
    regs = [lp.Region((4 * tiles, 8), {"v": np.float64}, name=n) for n in "ABC"]
    parts = [lp.Partition.equal(r, (tiles, 1)) for r in regs]
    t = lp.task(noop, name="three", privileges=[lp.R("v"), lp.RW("v"), lp.WD("v")])
    per_block = 10
    blocks = max(3, points // (per_block * tiles))
    colors = parts[0].colors

    def block() -> None:
        for _ in range(per_block):
            lp.index_launch(t, colors, *parts)

    def run(traced: bool) -> float:
        lp.fence()
        t0 = time.perf_counter()
        for _ in range(blocks):
            if traced:
                with lp.trace("block"):
                    block()
            else:
                block()
            lp.fence()
        return (time.perf_counter() - t0) / (blocks * per_block * tiles) * 1e6

    run(False)
    untraced = min(run(False) for _ in range(3))
    run(True)  # records (twice: the first block's state differs) and replays
    replayed = min(run(True) for _ in range(3))
    lr.shutdown()
    return untraced, replayed


def bench_dask(n: int, workers: int) -> dict[str, float]:
    import dask
    import dask.threaded

    indep = {f"t{i}": (noop,) for i in range(n)}
    chain = {"t0": (noop,)}
    chain.update({f"t{i}": (noop, f"t{i - 1}") for i in range(1, n)})
    out = {}
    for gname, g in [("independent", indep), ("chained", chain)]:
        keys = list(g)
        for sname, get in [
            ("sync", dask.get),
            ("threaded", lambda g, k: dask.threaded.get(g, k, num_workers=workers)),
        ]:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                get(g, keys)
                best = min(best, time.perf_counter() - t0)
            out[f"dask {sname} {gname}"] = best / n * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--tiles", default="10,100,1000,4000",
                    help="tile counts of the region-launch scaling case ('' to skip)")
    ap.add_argument("--only-regions", action="store_true", help="skip the no-op cases")
    ap.add_argument("--only-traced", action="store_true", help="only the traced case")
    a = ap.parse_args()
    tiles = [int(x) for x in a.tiles.split(",") if x]
    if a.only_traced:
        _print_traced(tiles, a.cpus)
        return
    if a.only_regions:
        _print_regions(tiles, a.cpus)
        return
    dask_res = bench_dask(a.tasks, a.cpus)
    print(f"{a.tasks} no-op tasks, {a.cpus} devices / workers (us per task)")
    for k, v in dask_res.items():
        print(f"  {k:38s} {v:8.2f}")
    for ex in ("serial", "threads"):
        for k, v in bench_legion(ex, a.tasks, a.cpus).items():
            ref = dask_res["dask sync chained" if "chained" in k else "dask sync independent"]
            print(f"  legionpy {ex:7s} {k:28s} {v:8.2f}   x{v / ref:.2f} of dask sync")
    _print_regions(tiles, a.cpus)
    _print_traced(tiles, a.cpus)


def _print_traced(tiles: list[int], cpus: int) -> None:
    print("index launch, three region arguments (R, RW, WD): untraced vs replayed trace "
          "(us per point; target: replayed <= 10 us and <= 0.1x untraced)")
    for ex in ("serial", "threads"):
        for n in tiles:
            u, r = bench_traced(ex, n, cpus)
            print(f"  legionpy {ex:7s} {n:5d} tiles   untraced {u:8.2f}   replayed {r:8.2f}"
                  f"   x{r / u:.3f}")


def _print_regions(tiles: list[int], cpus: int) -> None:
    if not tiles:
        return
    print("index launch with R/RW/WD/Reduce region arguments (us per point)")
    for ex in ("serial", "threads"):
        for n in tiles:
            v = bench_region_launch(ex, n, cpus)
            print(f"  legionpy {ex:7s} {n:5d} tiles {v:28.2f}")


if __name__ == "__main__":
    main()
