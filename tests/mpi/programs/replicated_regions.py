"""Every rank builds the same regions and partitions; rank 0 checks that all
ranks agree on uids and rects (control replication needs this determinism)."""

import numpy as np
from mpi4py import MPI

import legionpy as lp

comm = MPI.COMM_WORLD
R = lp.Region((37, 11), {"x": np.float32})
P = lp.Partition.equal(R, (comm.size, 2))
H = lp.Partition.restriction(R, (8, 11), halo=(2, 0))
mine = (R.uid, [(c, P[c].rect.lo, P[c].rect.hi) for c in P.colors],
        [(c, H[c].rect.lo, H[c].rect.hi) for c in H.colors])
everyone = comm.gather(mine, root=0)
if comm.rank == 0:
    assert all(v == everyone[0] for v in everyone), everyone
    assert P.is_disjoint and P.is_complete and not H.is_disjoint and H.is_complete
    print(f"OK {comm.size} ranks agree on {len(P)} + {len(H)} tiles")
