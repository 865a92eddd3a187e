"""Machine.local() under mpirun: one device per rank, every ordered pair
linked with the calibrated figures, identical on every rank."""

from mpi4py import MPI

from legionpy.optimizer import Machine

comm = MPI.COMM_WORLD
m = Machine.local()
assert m.num_devices == comm.size, (m.num_devices, comm.size)
assert m.num_links == comm.size * (comm.size - 1)
assert all(link.bandwidth > 0 and link.latency >= 0 for link in m.links)
assert [d.node for d in m.devices] == [0] * comm.size      # one host
everyone = comm.allgather(m.to_dict())
assert all(d == everyone[0] for d in everyone)
if comm.rank == 0:
    print(f"OK local machine {m.name} with {m.num_links} links")
