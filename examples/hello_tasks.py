"""Hello, tasks: launches, futures, a region, an index launch and a fence.

Run: ``python examples/hello_tasks.py`` (add ``LEGIONPY_CPUS=4`` for four
devices, ``LEGIONPY_TRACE=hello.json`` for a Perfetto trace,
``LEGIONPY_DEBUG=2`` to see every task and copy).
"""

from __future__ import annotations

import numpy as np

import legionpy as lp


@lp.task
def square(x):
    return x * x


@lp.task
def add(a, b):
    return a + b


@lp.task(privileges=[lp.RW("x"), lp.R("y")])
def axpy(a, r):
    """r.x and r.y are arrays of this task's tile, in its device's memory."""
    r.x[...] += a * r.y
    return float(r.x.sum())


def main() -> None:
    rt = lp.runtime()
    print(f"{len(rt.devices)} devices: {', '.join(str(d) for d in rt.devices)}")

    # Plain values in, Futures out; a Future argument waits for its producer.
    total = add(square(3), square(4))
    print("3*3 + 4*4 =", total.get())

    # One task per color; each point runs on the device the mapper chose.
    squares = lp.index_launch(square, range(8), 5)
    print("index launch:", squares.get())

    # A region with two fields, split into 4 tiles.
    R = lp.Region((1024, 512), {"x": np.float32, "y": np.float32}, name="R")
    P = lp.Partition.equal(R, (4, 1))
    lp.fill(R, "x", 1.0)
    R.write("y", np.full((1024, 512), 2.0, np.float32))

    sums = lp.index_launch(axpy, P.colors, 0.5, P)   # partitions project by color
    print("tile sums:", sums.get())
    whole = axpy(1.0, R)                             # waits for the tiles, gathers them
    print("whole-region sum:", whole.get())
    lp.fence()
    x = R.read("x")
    assert np.all(x == 1.0 + 0.5 * 2.0 + 1.0 * 2.0), x
    print("x is", float(x[0, 0]), "everywhere: OK")


if __name__ == "__main__":
    main()
