"""Each rank of the node on its own cores (legionpy/affinity.py): every
thread of a rank, those it starts later too, on its block; the blocks of
the ranks disjoint when the node has a core per rank; the machine figures
still count the node's cores. ``LEGIONPY_BIND=0``: nothing bound. A rank
left with one core yields it while it launches (runtime/scheduler.py)."""

import os
import threading

from mpi4py import MPI

import legionpy.runtime as lr
from legionpy.affinity import binding, core_blocks, node_cores
from legionpy.optimizer.calibration import local_cores
from legionpy.runtime.mpi import cluster

comm = MPI.COMM_WORLD
cl = cluster()
before = comm.allgather(sorted(os.sched_getaffinity(0)))
seen: list = []
t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
t.start()
t.join()

def _affinities() -> dict:
    """Each live thread's cores (one that ends between the listing and the
    read is skipped: the runtime's and MPI's helper threads come and go)."""
    out = {}
    for x in os.listdir("/proc/self/task"):
        try:
            out[int(x)] = os.sched_getaffinity(int(x))
        except ProcessLookupError:
            pass
    return out


threads = _affinities()
if os.environ.get("LEGIONPY_BIND") == "0":
    assert binding() is None and cl.cores is None
    print(f"OK rank {comm.rank} not bound", flush=True)
else:
    mine = binding()
    allowed = node_cores()
    if allowed < 2:  # one core: nothing to split
        assert mine is None
    else:
        assert mine is not None and mine == cl.cores
        want = core_blocks(range(allowed), comm.size)[comm.rank]
        assert sorted(mine) == sorted(want) or len(mine) == len(want), (mine, want)
        assert all(a == mine for a in threads.values()), threads
        assert seen == [mine], seen  # a thread started later inherits it
        blocks = comm.allgather(sorted(mine))
        if allowed >= comm.size:
            assert all(set(a).isdisjoint(b) for i, a in enumerate(blocks)
                       for b in blocks[i + 1:]), blocks
        assert local_cores() == allowed  # the model still sees the node's cores
    print(f"OK rank {comm.rank} bound to {sorted(mine) if mine else None}", flush=True)
sched = lr.get_runtime().sched
assert sched.one_core == (len(os.sched_getaffinity(0)) == 1)
# and there small copies' waits sleep while the device is busy (Cluster.wait, copy_bytes)
assert cl.sched_ref() is sched
assert cl._device_idle() is (sched.device_idle.event if sched.one_core else None)
comm.Barrier()
