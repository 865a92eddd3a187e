"""What the job has, and how fast its links are (moved from
``runtime/calibrate.py``: measuring lives in :mod:`legionpy.probe`).

``describe_job()`` returns a plain dict (JSON-ready) describing the devices
of this process or MPI job, with measured link figures::

    {"ranks": 2, "hosts": ["vm", "vm"],            # host name per rank
     "nodes": {"vm": [0, 1]},                      # ranks grouped by host
     "devices": [{"id": 0, "kind": "cpu", "rank": 0, "local_index": 0}, ...],
     "devices_per_rank": [{"kind": "cpu", "count": 1}, ...],
     "links": {
        "memcpy": {"bandwidth": 9.1e9, "latency": 2.1e-7},     # in a process
        "intra_node": {"bandwidth": 4.2e9, "latency": 3.0e-6}, # MPI, same host
        "inter_node": {...}},                                  # MPI, other hosts
     "pairs": {"0-1": {"bandwidth": ..., "latency": ...}},     # measured rank pairs
     "key": "...", "measured_s": 0.4}

Units: bandwidth in bytes/s, latency in seconds. Method: latency is half
the round trip of an 8-byte ping-pong; bandwidth is bytes / (half the round
trip - latency) at 4 MiB (MPI) or a numpy copy of 4 MiB (memcpy), best of a
few repetitions. MPI pairs measured: rank 0 with every other rank, one at
a time (each pair costs ~50 ms; the whole calibration stays < 2 s for a
few dozen ranks); the figures of a class (intra/inter node) are the median
over its pairs. GPU device memcpy is measured when CuPy devices exist.

Cached per job: in memory, and on disk as JSON under ``LEGIONPY_CACHE``
(default ``~/.cache/legionpy``), keyed by the sorted host set, the rank
count and the devices per rank; ``describe_job(refresh=True)`` measures
again. Under MPI the call is collective (every rank calls it and all return
the same dict, rank 0's measurement broadcast), so it must be called at
the same point of the program on every rank. Writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_json, cache_dir
from ..runtime import get_runtime
from ..runtime.gpu import backend, backend_name
from ..runtime.mpi import bcast_root, cluster, launched_under_mpi

__all__ = ["describe_job", "cache_dir"]

_memo: dict[str, dict] = {}
_SMALL, _BIG, _REPS = 8, 4 << 20, 5


def _memcpy() -> dict[str, float]:
    a = np.ones(_BIG, np.uint8)
    b = np.empty_like(a)
    s = np.ones(_SMALL, np.uint8)
    t = np.empty_like(s)
    big = small = float("inf")
    for _ in range(_REPS):
        t0 = time.perf_counter()
        np.copyto(b, a)
        t1 = time.perf_counter()
        np.copyto(t, s)
        t2 = time.perf_counter()
        big, small = min(big, t1 - t0), min(small, t2 - t1)
    return {"bandwidth": _BIG / max(big - small, 1e-9), "latency": small}


def _pingpong(comm: Any, peer: int, lead: bool) -> dict[str, float] | None:
    """Latency and bandwidth between this rank and ``peer``; the leader returns them."""
    out: dict[str, float] = {}
    for size in (_SMALL, _BIG):
        buf = np.zeros(size, np.uint8)
        best = float("inf")
        for _ in range(_REPS if size == _BIG else 20):
            if lead:
                t0 = time.perf_counter()
                comm.Send(buf, dest=peer, tag=7)
                comm.Recv(buf, source=peer, tag=7)
                best = min(best, (time.perf_counter() - t0) / 2)
            else:
                comm.Recv(buf, source=peer, tag=7)
                comm.Send(buf, dest=peer, tag=7)
        out[size] = best
    if not lead:
        return None
    lat = out[_SMALL]
    return {"latency": lat, "bandwidth": _BIG / max(out[_BIG] - lat, 1e-9)}


def _devices() -> list[dict]:
    return [{"id": d.id, "kind": d.kind, "rank": d.rank, "local_index": d.local_index}
            for d in get_runtime().devices]


def describe_job(refresh: bool = False) -> dict[str, Any]:
    """The job's ranks, hosts, devices and measured links (see the module doc)."""
    cl = cluster() if launched_under_mpi() else None
    devices = _devices()
    hosts = list(cl.hosts) if cl is not None else [socket.gethostname()]
    per_rank = []
    for r in range(len(hosts)):
        mine = [d for d in devices if d["rank"] == r]
        per_rank.append({"kind": mine[0]["kind"] if mine else "cpu", "count": len(mine)})
    # "gpu": 2: the GPU probe measures the memory's bandwidth (mem_bw) since 26 Nov
    ident = json.dumps([sorted(set(hosts)), len(hosts), per_rank, {"gpu": 2}], sort_keys=True)
    key = hashlib.sha1(ident.encode()).hexdigest()[:16]
    if not refresh and key in _memo:
        return _memo[key]
    path = cache_dir() / f"machine-{key}.json"
    found = None
    if not refresh and (cl is None or cl.rank == 0):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            found = None
    found = bcast_root(found)
    if found is None:
        found = _measure(cl, hosts, devices, per_rank, key)
        if cl is None or cl.rank == 0:
            _save(path, found)
    _memo[key] = found
    return found


def _measure(cl: Any, hosts: list[str], devices: list, per_rank: list, key: str) -> dict:
    t0 = time.perf_counter()
    pairs: dict[str, dict] = {}
    if cl is not None and cl.size > 1:
        comm = cl.coll
        comm.Barrier()
        for peer in range(1, cl.size):
            if cl.rank in (0, peer):
                got = _pingpong(comm, peer if cl.rank == 0 else 0, cl.rank == 0)
                if got is not None:
                    pairs[f"0-{peer}"] = got
            comm.Barrier()
        pairs = bcast_root(pairs)
    nodes: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        nodes.setdefault(h, []).append(r)
    links: dict[str, dict] = {"memcpy": _memcpy()}
    for name, same in (("intra_node", True), ("inter_node", False)):
        got = [v for k, v in pairs.items()
               if (hosts[int(k.split("-")[0])] == hosts[int(k.split("-")[1])]) == same]
        if got:
            links[name] = {f: statistics.median(g[f] for g in got)
                           for f in ("bandwidth", "latency")}
    gpu = _gpu_memcpy(devices)
    if gpu:
        links["gpu_memcpy"] = gpu
    out = {"ranks": len(hosts), "hosts": hosts, "nodes": nodes, "devices": devices,
           "devices_per_rank": per_rank, "links": links, "pairs": pairs, "key": key,
           "measured_s": time.perf_counter() - t0}
    return bcast_root(out)


#: bytes of the GPU copy probe: 4 MiB copies in ~10 us on an H200, mostly
#: the launch (it read 312 GB/s for a 4.3 TB/s memory); 256 MiB takes ~0.1 ms
_GPU_BIG = 256 << 20


def _gpu_memcpy(devices: list) -> dict | None:
    """A device-to-device copy on the first GPU: ``bandwidth`` (bytes copied
    per second, the copy links'), ``latency`` and ``mem_bw`` (the device's
    memory traffic, read and write: ``DeviceSpec.mem_bw``). The emulated
    backend copies the CPU probe's 4 MiB (host memory, not a GPU's)."""
    if not any(d["kind"] == "gpu" for d in devices):
        return None
    gpu = backend()  # CuPy, or the emulated backend (runtime/emugpu.py)
    size = _BIG if backend_name() == "emulated" else _GPU_BIG
    with gpu.Device(0) as dev:
        a = gpu.asarray(np.ones(size, np.uint8))
        b = a.copy()
        best = float("inf")
        for _ in range(_REPS):
            dev.synchronize()
            t0 = time.perf_counter()
            b[...] = a
            dev.synchronize()
            best = min(best, time.perf_counter() - t0)
        del a, b
    return {"bandwidth": size / best, "latency": 5e-6, "mem_bw": 2 * size / best}


def _save(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, data)
    except OSError:
        pass  # a read-only home: the in-memory cache still holds it
