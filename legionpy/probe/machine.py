"""The model of this machine, measured: CPU figures and the local machine
(moved from ``optimizer/machine.py``: the optimizer's :class:`Machine` takes
figures, this package measures them).

:func:`cpu_figures`: memcpy bandwidth and float32 GEMM FLOP/s of one device
worker (one BLAS thread), medians of repeated runs, cached per CPU identity
under ``$LEGIONPY_CACHE``. :func:`local_machine` (``Machine.local``): that
many CPU devices of one process with those figures, or exactly the runtime's
devices with the job's measured links (:func:`legionpy.probe.job.describe_job`).

>>> m = local_machine(2)
>>> m.num_devices, m.devices[0].kind
(2, 'cpu')
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from ..affinity import node_cores
from ..atomic import atomic_write_json, cache_dir
from ..errors import MachineError
from ..optimizer.machine import DeviceSpec, LinkSpec, Machine

__all__ = ["local_machine", "cpu_figures", "cpu_identity", "measure_cpu"]


def local_machine(n_cpu_devices: int | None = None, refresh: bool = False) -> Machine:
    """The real devices of this process or MPI job: see :meth:`Machine.local`."""
    if n_cpu_devices is not None:
        n = int(n_cpu_devices)
        if n < 1:
            raise MachineError(f"n_cpu_devices must be >= 1, got {n_cpu_devices}")
        cpu = cpu_figures(refresh)
        flops, bw = cpu["flops"], cpu["bandwidth"]
        devs = [DeviceSpec(i, f"cpu{i}", "cpu", 0, flops, bw, _host_memory(), float("inf"))
                for i in range(n)]
        link = {(a, b): (bw, 2e-6) for a in range(n) for b in range(n) if a != b}
        return Machine(devs, _pair_links(devs, link), (), f"local:{n}",
                       _calibration_id(cpu))

    from ..runtime import get_runtime
    from ..runtime.mpi import bcast_root, cluster, launched_under_mpi
    from .job import describe_job

    runtime_devices = get_runtime().devices
    job = describe_job(refresh)
    # rank 0 measures (or reads): every rank builds its machine from its figures
    lead = not launched_under_mpi() or cluster().rank == 0
    cpu = bcast_root(cpu_figures(refresh) if lead else None)
    flops = cpu["flops"]
    figures = job["links"]
    hosts = job["hosts"]
    node_of_host = {h: i for i, h in enumerate(sorted(set(hosts)))}
    memcpy = figures["memcpy"]
    devs = []
    for d in runtime_devices:
        node = node_of_host[hosts[d.rank]]
        if d.kind == "gpu":
            gpu = figures.get("gpu_memcpy", memcpy)
            devs.append(DeviceSpec(d.id, f"gpu{d.id}", "gpu", node, _GPU_FLOPS,
                                   gpu.get("mem_bw", gpu["bandwidth"]), 16 * 2**30,
                                   memcpy["bandwidth"]))
        else:
            devs.append(DeviceSpec(d.id, f"cpu{d.id}", "cpu", node, flops,
                                   memcpy["bandwidth"], _host_memory(), float("inf")))
    link = {}
    for a in runtime_devices:
        for b in runtime_devices:
            if a.id == b.id:
                continue
            if a.rank == b.rank:
                f = figures.get("gpu_memcpy", memcpy) if "gpu" in (a.kind, b.kind) else memcpy
            elif hosts[a.rank] == hosts[b.rank]:
                f = figures.get("intra_node", memcpy)
            else:
                f = figures.get("inter_node", figures.get("intra_node", memcpy))
            link[a.id, b.id] = (f["bandwidth"], f["latency"])
    ranks = job["ranks"]
    name = f"local:{len(devs)}" if ranks == 1 else f"local:{ranks}r{len(devs)}"
    return Machine(devs, _pair_links(devs, link), (), name, _calibration_id(cpu, job))

def _calibration_id(cpu: dict, job: dict | None = None) -> str:
    """The identity of the calibration records a local machine is built from:
    their keys and measurement stamps (a new measurement is a new identity),
    not their figures."""
    parts = [f"cpu-{cpu['key']}@{cpu.get('measured_at', 0):.6f}"]
    if job is not None:
        parts.append(f"job-{job.get('key', '')}@{job.get('measured_s', 0)!r}")
    return "/".join(parts)


#: nominal FP32 peak for a GPU the calibration did not time (used only for
#: the analytic cost model; measured profiles replace it)
_GPU_FLOPS = 50e12


def _pair_links(devs: list[DeviceSpec], figures: dict) -> list[LinkSpec]:
    """One directed link per ordered pair ``(a, b)`` in ``figures`` ->
    ``(bandwidth, latency)``, in row-major pair order."""
    links = []
    for a in devs:
        for b in devs:
            if (a.id, b.id) in figures:
                bw, lat = figures[a.id, b.id]
                links.append(LinkSpec(len(links), a.name, b.name, float(bw), float(lat),
                                      f"{a.name}->{b.name}"))
    return links


_CPU_FORMAT = 2  # bump when the method changes: older records are measured again
_cpu_memo: dict[str, dict] = {}


def cpu_identity() -> dict:
    """What the CPU figures depend on, never what they measured: host, CPU
    model, cores this process may use, numpy and its BLAS (the measurement
    runs with one BLAS thread, as each device worker does)."""
    import platform
    import socket

    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), model)
    except OSError:
        pass
    cores = node_cores()  # an MPI rank bound to its share counts the node's
    return {"host": socket.gethostname(), "machine": platform.machine(), "cpu": model,
            "cores": cores, "numpy": np.__version__, "format": _CPU_FORMAT}


def measure_cpu(repeats: int = 31) -> dict:
    """Median memcpy bytes/s (4 MiB) and float32 GEMM FLOP/s (256 x 256, one
    BLAS thread) over ``repeats`` runs after a warm-up: ~50 ms. The median,
    not the best, so one lucky or one preempted run does not move it."""
    from threadpoolctl import threadpool_limits

    a = np.ones(4 * 2**20 // 8)
    b = np.empty_like(a)
    m = np.ones((256, 256), np.float32)
    copy_s, mm_s = [], []
    with threadpool_limits(1):
        for i in range(repeats + 3):
            t0 = time.perf_counter()
            np.copyto(b, a)
            t1 = time.perf_counter()
            m @ m
            t2 = time.perf_counter()
            if i >= 3:  # warm-up: page faults, BLAS initialisation
                copy_s.append(t1 - t0)
                mm_s.append(t2 - t1)
    return {"bandwidth": float(a.nbytes / max(float(np.median(copy_s)), 1e-9)),
            "flops": float(2 * 256**3 / max(float(np.median(mm_s)), 1e-9)),
            "repeats": repeats, "measured_at": time.time()}


def cpu_figures(refresh: bool = False) -> dict:
    """This CPU's memcpy bandwidth (bytes/s) and GEMM FLOP/s per device, as
    ``{"bandwidth", "flops", "key", "measured_at", ...}``: measured once
    (:func:`measure_cpu`, medians) and cached in memory and on disk under
    ``$LEGIONPY_CACHE/cpu-KEY.json`` (default ``~/.cache/legionpy``), ``KEY``
    a hash of :func:`cpu_identity`, so identical runs on one machine build
    the identical local machine model. ``refresh``: measure again."""
    ident = cpu_identity()
    key = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    if not refresh and key in _cpu_memo:
        return _cpu_memo[key]
    path = cache_dir() / f"cpu-{key}.json"
    found = None
    if not refresh:
        try:
            found = json.loads(path.read_text())
            if not (found.get("flops", 0) > 0 and found.get("bandwidth", 0) > 0):
                found = None
        except (OSError, ValueError, AttributeError):
            found = None
    if found is None:
        found = {**measure_cpu(), "key": key, "identity": ident}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, found)
        except OSError:
            pass  # a read-only cache: this process keeps its figures in memory
    _cpu_memo[key] = found
    return found


def _host_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 16.0 * 2**30

