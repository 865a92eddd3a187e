"""Two ranks on one node, one GPU each (emulated with LEGIONPY_GPU_BACKEND=emulated,
else CuPy's, both ranks sharing GPU 0 on a one-GPU machine):
halo copies between the ranks' GPUs go through the CUDA IPC path; each peer
instance's handle is opened once however many copies use it, and closed at
shutdown. Rank 0 prints the counters of every rank."""

import numpy as np
from mpi4py import MPI

import legionpy as lp
import legionpy.runtime as lr
from legionpy.runtime import emugpu, gpu

comm = MPI.COMM_WORLD
rt = lr.init()
assert [d.kind for d in rt.devices] == ["gpu", "gpu"], rt.devices


@lp.task(privileges=[lp.R("u"), lp.WD("v")])
def shift(halo, tile):
    if gpu.backend_name() == "emulated":
        assert tile.v.device.id == emugpu.current()
    lo = tile.rect.lo[0] - halo.rect.lo[0]
    tile.v[...] = halo.u[lo:lo + tile.v.shape[0]] + 1


@lp.task(privileges=[lp.RW("u")])
def bump(t):
    t.u[...] += 1


R = lp.Region((16,), {"u": np.float32, "v": np.float32})
P = lp.Partition.equal(R, (2,))
H = lp.Partition.restriction(R, (8,), halo=(1,))
R.write("u", np.arange(16, dtype=np.float32))
lp.index_launch(bump, P.colors, P)  # u lives on the GPUs: the halos come from the peer
for _ in range(3):
    lp.index_launch(shift, P.colors, H, P)
    lp.index_launch(bump, P.colors, P)
got = R.read("v")
want = np.arange(16, dtype=np.float32) + 3 + 1  # the last shift saw u bumped 3 times
lr.fence()
lr.shutdown()
c = gpu.ipc_counts
counts = comm.gather((c["exported"], c["opened"], c["closed"]), root=0)
if comm.rank == 0:
    np.testing.assert_array_equal(got, want)
    print("COUNTS", counts)
    print("OK ipc")
