"""Measuring this machine: everything that runs real work to find out how
fast the devices, the links, the kernels and the runtime itself are.

The optimizer's models (:class:`~legionpy.optimizer.Machine`,
:class:`~legionpy.optimizer.fidelity.RuntimeOverhead`) are pure: they take
figures; this package measures them, running tasks on the runtime where
that is what it measures (so it sits above both halves, DESIGN.md section 1):

- :mod:`.job`: the job's ranks, hosts, devices and measured links
  (``describe_job``; memcpy, MPI ping-pong), cached per job;
- :mod:`.machine`: CPU figures (``cpu_figures``) and the local machine model
  (``local_machine``, spelled ``Machine.local()`` in the public API);
- :mod:`.overhead`: the runtime's own per-task and per-copy overhead with
  empty tasks, kernel slowdown when every device runs at once, and the cores
  other programs keep busy.
"""

from __future__ import annotations
