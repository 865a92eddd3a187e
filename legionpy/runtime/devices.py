"""Devices, memories and links of one process.

A :class:`Device` is a processor with its own memory: memory id ==
device id (the host memory, where ``Region.write`` lands and ``Region.read``
gathers, is :data:`~legionpy.regions.coherence.HOST` = -1). Devices are
numbered globally ``0..n-1``, rank-major then local index, so under MPI every
rank sees the same list (contracts.md, "runtime devices and links").

A copy between two memories runs on the directed link ``(src, dst)``; a link
is a queue of its own, like a device, so communication overlaps computation.

Under MPI (``machine_devices``) each rank contributes its local devices and
every rank builds the same global list from an allgather: rank r's devices
follow rank r-1's. ``LEGIONPY_CPUS`` then counts devices *per rank*
(default 1, so N ranks on N cores do not oversubscribe). With CuPy
importable and a GPU visible, a rank's devices are GPUs instead
(``LEGIONPY_GPUS``: GPUs per rank; default 1 per rank under MPI, every
visible GPU in one process; 0 disables), see runtime/gpu.py; an explicit
``cpus=`` always gives CPU devices.

On CPU the default is one device per core (``os.cpu_count()``), overridden by
``LEGIONPY_CPUS=4`` or ``legionpy.runtime.init(cpus=4)``; tests use 4 devices
on 2 cores. Each CPU device worker runs BLAS with one thread
(:func:`limit_blas`), since the devices already use every core.

>>> cpu_devices(2)
[Device(id=0, kind='cpu', rank=0, local_index=0), Device(id=1, kind='cpu', rank=0, local_index=1)]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import MachineError

__all__ = ["Device", "cpu_devices", "default_cpu_count", "limit_blas", "queue_name",
           "machine_devices"]


@dataclass(frozen=True, slots=True)
class Device:
    """One processor and its memory. ``id`` is global; ``rank`` is the MPI
    rank owning it (0 in one process); ``local_index`` its index on the rank."""

    id: int
    kind: str
    rank: int = 0
    local_index: int = 0

    @property
    def memory(self) -> int:
        """Id of the device's memory (equal to the device id)."""
        return self.id

    def __str__(self) -> str:
        return f"{self.kind}{self.id}"


def default_cpu_count() -> int:
    env = os.environ.get("LEGIONPY_CPUS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise MachineError(f"LEGIONPY_CPUS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise MachineError(f"LEGIONPY_CPUS must be a positive integer, got {env!r}")
        return n
    return os.cpu_count() or 1


def cpu_devices(n: int, rank: int = 0, first_id: int = 0) -> list[Device]:
    if not isinstance(n, int) or n < 1:
        raise MachineError(f"the number of CPU devices must be a positive integer, got {n!r}")
    return [Device(first_id + i, "cpu", rank, i) for i in range(n)]


def machine_devices(cpus: int | None, cl: Any = None) -> list[Device]:
    """Every device of the job, numbered globally rank-major. ``cl`` is the
    MPI Cluster (None in one process); collective when it has several ranks."""
    multi = cl is not None and cl.size > 1
    kind, n = "cpu", cpus
    if cpus is None:
        from .gpu import gpus_per_rank

        g = gpus_per_rank(cl)
        if g:
            kind, n = "gpu", g
        elif multi and not os.environ.get("LEGIONPY_CPUS"):
            n = 1
        else:
            n = default_cpu_count()
    if not isinstance(n, int) or n < 1:
        raise MachineError(f"the number of CPU devices must be a positive integer, got {n!r}")
    if not multi:
        return [Device(i, kind, 0, i) for i in range(n)]
    out: list[Device] = []
    for r, (k, m) in enumerate(cl.world.allgather((kind, n))):
        base = len(out)
        out.extend(Device(base + i, k, r, i) for i in range(m))
    return out


def queue_name(queue: Any) -> str:
    """Printable name of a device id or a (src, dst) link (memory -1 is the
    replicated host memory, -2 - r rank r's own host memory)."""
    if isinstance(queue, tuple):
        src, dst = (("host" if m == -1 else f"host{-2 - m}" if m < -1 else f"mem{m}")
                    for m in queue)
        return f"link {src}->{dst}"
    if isinstance(queue, str):  # a communicator (runtime/collectives.py)
        return queue
    return "untimed" if queue is None else f"device {queue}"


_blas_limiter: Any = None


def limit_blas(threads: int | None) -> None:
    """Limit BLAS/OpenMP pools to ``threads`` (None restores the originals).

    BLAS pools are process-wide, so "one BLAS thread per device worker"
    means one thread for the whole process while devices run in parallel."""
    global _blas_limiter
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return
    if _blas_limiter is not None:
        _blas_limiter.restore_original_limits()
        _blas_limiter = None
    if threads is not None:
        _blas_limiter = threadpool_limits(limits=threads)
