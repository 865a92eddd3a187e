"""Machine model: compute devices, directed links and routing (paper section
5: "we treat each hardware connection between devices as a communication
device").

A :class:`Machine` is a list of compute devices (:class:`DeviceSpec`: kind,
node, peak FLOP/s, memory bandwidth and capacity), a list of *switches*
(hosts, PCIe switches, NICs: endpoints that compute nothing) and a list of
*directed* links (:class:`LinkSpec`: bandwidth in bytes/s, latency in s). A
full-duplex cable is two directed links. ``route(src, dst)`` is the list of
link ids a copy from compute device ``src`` to ``dst`` occupies, found by the
fewest-seconds path for a 1 MiB message (ties: fewer hops, then lower ids);
a multi-hop route occupies every link on it.

Presets (figures from REFERENCE.md and vendor sheets):

========== ==================================================================
p100:NxG   N nodes x G P100 (9.3 TFLOP/s, 732 GB/s, 16 GiB); NVLink 18.52 GB/s
           1 us between every GPU pair of a node; PCIe 12.58 GB/s 1 us to the
           host; 100 Gb/s EDR InfiniBand (10.94 GB/s, 0.5 us) host <-> switch
k80:NxG    N x G K80 dies (4.37 TFLOP/s, 240 GB/s, 12 GiB); GPU pairs on a
           PCIe switch (12.58 GB/s), one shared link switch <-> host, 56 Gb/s
           InfiniBand (6.13 GB/s, 0.5 us)
dgx1       8 V100 (15.7 TFLOP/s, 900 GB/s, 16 GiB), NVLink2 hybrid cube mesh
           (25 GB/s per link), PCIe to the host; ``nodes=`` joins several by IB
h100:NxG   H100 SXM (67 TFLOP/s fp32, 3.35 TB/s, 80 GiB); NVSwitch inside a
           node (450 GB/s per GPU per direction), 400 Gb/s (50 GB/s) per GPU
           to the network switch, PCIe 5 (55 GB/s) to the host
h200:NxG   H200 SXM: the h100 machine with HBM3e (4.8 TB/s, 141 GB)
local      the CPU devices of this process: one direct directed link per
           ordered pair, bandwidth = measured memcpy rate (DESIGN contracts)
========== ==================================================================

A preset machine remembers its preset (``machine.preset``): its default
cost model is the recorded GPU profile packaged for that preset when there
is one (:mod:`legionpy.optimizer.recorded_profiles`), else the analytic roofline.
"""

from __future__ import annotations

import heapq
import json
import os
import re
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import MachineError

__all__ = ["DeviceSpec", "LinkSpec", "Machine", "PRESETS"]

GB = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """A compute device. ``flops``: peak FLOP/s; ``mem_bw``: bytes/s;
    ``memory``: bytes; ``host_bw``: bytes/s of its host-to-device path
    (``inf`` for a CPU, whose host memory it uses directly)."""

    id: int
    name: str
    kind: str = "gpu"
    node: int = 0
    flops: float = 9.3e12
    mem_bw: float = 732e9
    memory: float = 16 * 2**30
    host_bw: float = 12.58e9


@dataclass(frozen=True)
class LinkSpec:
    """A directed link between two endpoints (device or switch names)."""

    id: int
    src: str
    dst: str
    bandwidth: float
    latency: float = 0.0
    name: str = ""


class Machine:
    """Devices, switches and directed links. See the module docstring."""

    def __init__(self, devices, links, switches=(), name: str = "machine",
                 calibration: str = "") -> None:
        self.name = name
        #: for a measured machine (:meth:`local`): the identity of the cached
        #: calibration records its figures come from ("" for a described one)
        self.calibration = calibration
        #: the preset this machine was built from ("" for any other): its
        #: packaged GPU profile, if any, is its default cost model
        self.preset = ""
        self.devices: list[DeviceSpec] = list(devices)
        self.switches: list[str] = list(switches)
        self.links: list[LinkSpec] = list(links)
        self._validate()
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._out_links: dict | None = None

    # -- validation -----------------------------------------------------------
    def _validate(self) -> None:
        if not self.devices:
            raise MachineError(f"machine {self.name!r} has no devices")
        names: dict[str, int] = {}
        for i, d in enumerate(self.devices):
            if d.id != i:
                raise MachineError(f"device {d.name!r} has id {d.id}, expected {i} "
                                   f"(devices are numbered 0..n-1 in order)")
            for f in ("flops", "mem_bw", "memory", "host_bw"):
                v = getattr(d, f)
                if not (isinstance(v, (int, float)) and v > 0):
                    raise MachineError(f"device {d.name!r}: field {f!r} must be > 0, got {v!r}")
            if d.kind not in ("cpu", "gpu"):
                raise MachineError(f"device {d.name!r}: kind must be 'cpu' or 'gpu', "
                                   f"got {d.kind!r}")
            names[d.name] = i
        for j, s in enumerate(self.switches):
            if s in names:
                raise MachineError(f"endpoint name {s!r} is used twice")
            names[s] = len(self.devices) + j
        self._node_of = names
        for i, ln in enumerate(self.links):
            if ln.id != i:
                raise MachineError(f"link {ln.name!r} has id {ln.id}, expected {i}")
            for end in ("src", "dst"):
                if getattr(ln, end) not in names:
                    raise MachineError(f"link {i} ({ln.name!r}): field {end!r} names an "
                                       f"unknown endpoint {getattr(ln, end)!r}")
            if not ln.bandwidth > 0:
                raise MachineError(f"link {i} ({ln.name!r}): field 'bandwidth' must be > 0, "
                                   f"got {ln.bandwidth!r}")
            if ln.latency < 0:
                raise MachineError(f"link {i} ({ln.name!r}): field 'latency' must be >= 0, "
                                   f"got {ln.latency!r}")

    # -- queries ------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_links(self) -> int:
        return len(self.links)

    @property
    def num_nodes(self) -> int:
        return len({d.node for d in self.devices})

    def devices_of_node(self, node: int) -> list[int]:
        return [d.id for d in self.devices if d.node == node]

    def check_device(self, dev: int) -> None:
        if not (isinstance(dev, (int, np.integer)) and 0 <= dev < len(self.devices)):
            raise MachineError(f"device id {dev!r} is outside machine {self.name!r} "
                               f"(devices 0..{len(self.devices) - 1})")

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Directed link ids a copy ``src -> dst`` occupies (empty when equal)."""
        self.check_device(src)
        self.check_device(dst)
        if src == dst:
            return ()
        key = (int(src), int(dst))
        r = self._routes.get(key)
        if r is None:
            self._dijkstra(key[0])
            r = self._routes.get(key)
            if r is None:
                raise MachineError(f"machine {self.name!r}: no route from device {src} "
                                   f"({self.devices[src].name}) to device {dst} "
                                   f"({self.devices[dst].name})")
        return r

    def _dijkstra(self, src: int) -> None:
        """Routes from ``src`` to every device (one shortest-path tree; the
        same paths as a search stopped at each destination, since a popped
        endpoint's predecessor never changes afterwards), into the cache."""
        out = self._out_links
        if out is None:
            out = self._out_links = {}
            for ln in self.links:
                out.setdefault(self._node_of[ln.src], []).append(ln)
        best = {src: (0.0, 0)}
        prev: dict[int, LinkSpec] = {}
        heap = [(0.0, 0, src)]
        while heap:
            cost, hops, u = heapq.heappop(heap)
            if (cost, hops) > best.get(u, (np.inf, 0)):
                continue
            for ln in out.get(u, ()):
                v = self._node_of[ln.dst]
                c = (cost + ln.latency + 2**20 / ln.bandwidth, hops + 1)
                if c < best.get(v, (np.inf, 0)):
                    best[v], prev[v] = c, ln
                    heapq.heappush(heap, (c[0], c[1], v))
        for dst in range(len(self.devices)):
            if dst == src or dst not in prev:
                continue
            path, v = [], dst
            while v != src:
                ln = prev[v]
                path.append(ln.id)
                v = self._node_of[ln.src]
            self._routes[(src, dst)] = tuple(reversed(path))

    def route_table(self) -> tuple[np.ndarray, np.ndarray]:
        """``(length[D, D], links[D, D, max_hops])`` for vectorised lookups
        (-1 pads unused hops)."""
        n = len(self.devices)
        routes = [[self.route(a, b) for b in range(n)] for a in range(n)]
        h = max(1, max(len(r) for row in routes for r in row))
        length = np.zeros((n, n), np.int32)
        links = np.full((n, n, h), -1, np.int32)
        for a in range(n):
            for b in range(n):
                r = routes[a][b]
                length[a, b] = len(r)
                links[a, b, :len(r)] = r
        return length, links

    def with_bandwidth_scale(self, factor: float) -> Machine:
        """The same machine with every link's bandwidth multiplied by ``factor``."""
        links = [LinkSpec(ln.id, ln.src, ln.dst, ln.bandwidth * factor, ln.latency, ln.name)
                 for ln in self.links]
        m = Machine(self.devices, links, self.switches, f"{self.name}*bw{factor:g}")
        m.preset = self.preset  # the same devices: the same kernel times
        return m

    def spec(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return (f"Machine({self.name!r}, {len(self.devices)} devices, {len(self.switches)} "
                f"switches, {len(self.links)} directed links)")

    # -- JSON ---------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"name": self.name, "devices": [asdict(d) for d in self.devices],
             "switches": list(self.switches), "links": [asdict(ln) for ln in self.links]}
        if self.calibration:
            d["calibration"] = self.calibration
        return d

    def cache_key(self) -> dict:
        """What identifies this machine model in on-disk caches (the search's
        strategies): every figure of a described machine (a preset, a JSON
        file); for a measured one (:meth:`local`) its topology and the
        identity of the calibration records its figures come from -- never the
        measured figures themselves, so a cache entry keeps hitting for as
        long as the calibration it was made with is the one in use."""
        if not self.calibration:
            d = self.to_dict()
            if self.preset:  # strategies found on a recorded profile differ
                from .recorded_profiles import preset_profile

                prof = preset_profile(self.preset)
                if prof is not None:
                    d["cost_profile"] = prof.identity
            return d
        return {"name": self.name, "calibration": self.calibration,
                "devices": [(d.name, d.kind, d.node) for d in self.devices],
                "switches": list(self.switches),
                "links": [(ln.src, ln.dst) for ln in self.links]}

    @classmethod
    def from_dict(cls, d: dict) -> Machine:
        if not isinstance(d, dict):
            raise MachineError(f"a machine description must be a JSON object, got {type(d)}")
        for f in ("devices", "links"):
            if f not in d:
                raise MachineError(f"machine description lacks the field {f!r}")
        devs, links = [], []
        for i, x in enumerate(d["devices"]):
            x = dict(x)
            x.setdefault("id", i)
            x.setdefault("name", f"dev{i}")
            try:
                devs.append(DeviceSpec(**x))
            except TypeError as e:
                raise MachineError(f"devices[{i}]: {e}") from None
        for i, x in enumerate(d["links"]):
            x = dict(x)
            x.setdefault("id", i)
            try:
                links.append(LinkSpec(**x))
            except TypeError as e:
                raise MachineError(f"links[{i}]: {e}") from None
        return cls(devs, links, d.get("switches", ()), d.get("name", "machine"),
                   d.get("calibration", ""))

    def save(self, path: str) -> None:
        from .strategy import atomic_write_json
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str) -> Machine:
        if not os.path.isfile(path):
            raise MachineError(f"no machine file {path!r}; pass an existing JSON file written "
                               "by Machine.save(), or a preset such as p100:4x4")
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except json.JSONDecodeError as e:
            raise MachineError(f"{path}: not valid JSON ({e})") from None

    # -- presets ------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, nodes: int = 1, gpus_per_node: int | None = None) -> Machine:
        """``preset("p100", nodes=4)``: see the module docstring for the list."""
        key = name.lower()
        if key not in PRESETS:
            raise MachineError(f"unknown machine preset {name!r}; presets: {sorted(PRESETS)}")
        if key == "local":
            return cls.local()
        if int(nodes) < 1:
            raise MachineError(f"nodes must be >= 1, got {nodes}")
        m = PRESETS[key](int(nodes), gpus_per_node)
        m.preset = key
        return m

    @classmethod
    def parse(cls, spec: str) -> Machine:
        """``'p100:4x4'`` (nodes x GPUs), ``'dgx1'``, ``'local'`` or a JSON path."""
        if spec.endswith(".json") or os.path.sep in spec:
            return cls.from_json(spec)
        m = re.fullmatch(r"([a-z0-9]+)(?::(\d+)(?:x(\d+))?)?", spec.strip().lower())
        if not m:
            raise MachineError(f"machine spec {spec!r} is not PRESET[:NODESxGPUS] or a path")
        name, n, g = m.group(1), m.group(2), m.group(3)
        if (n is not None and int(n) < 1) or (g is not None and int(g) < 1):
            raise MachineError(f"machine spec {spec!r} asks for zero nodes or GPUs; "
                               "use at least 1 of each, e.g. p100:4x4")
        if name == "local":
            return cls.local(int(n) if n else None)
        return cls.preset(name, nodes=int(n) if n else 1, gpus_per_node=int(g) if g else None)

    @classmethod
    def local(cls, n_cpu_devices: int | None = None, refresh: bool = False) -> Machine:
        """The real devices of this process or MPI job.

        With ``n_cpu_devices`` (simulation and tests): that many CPU devices of
        one process. Without it: exactly the runtime's devices (``LEGIONPY_CPUS``
        / ``LEGIONPY_GPUS`` per rank, every rank of an ``mpirun`` job), nodes
        grouped by host name, with one direct directed link per ordered pair of
        devices whose bandwidth and latency come from the job's calibration
        (:func:`legionpy.probe.job.describe_job`: memcpy inside a
        process, MPI ping-pong between ranks of a host and between hosts),
        cached per job. Under MPI this is collective: call it on every rank.
        Device ``i`` of the machine is runtime device ``i``, and each link is
        the runtime's link worker for that ordered pair.

        The CPU figures (:func:`legionpy.probe.machine.cpu_figures`: medians
        of repeated runs) and the link figures are measured once per machine
        and cached on disk,
        so identical runs build the identical model; :meth:`cache_key` names
        those records, not their figures. ``refresh``: measure again.

        The optimizer never measures: this is
        :func:`legionpy.probe.machine.local_machine`, kept here because it is
        the documented spelling."""
        from ..probe.machine import local_machine

        return local_machine(n_cpu_devices, refresh)


class _Builder:
    def __init__(self, name: str) -> None:
        self.name, self.devs, self.links, self.switches = name, [], [], []

    def dev(self, name, node, kind, flops, mem_bw, memory, host_bw):
        self.devs.append(DeviceSpec(len(self.devs), name, kind, node, flops, mem_bw, memory,
                                    host_bw))

    def duplex(self, a, b, bw, lat, tag):
        for s, d in ((a, b), (b, a)):
            self.links.append(LinkSpec(len(self.links), s, d, bw, lat, f"{tag}:{s}->{d}"))

    def gpus(self, nodes, g, flops, mem_bw, memory, host_bw, switches=("ib",)):
        """``g`` identical GPUs ``n{n}gpu{k}`` per node; switches: one ``host{n}``
        per node, then ``switches``."""
        for n in range(nodes):
            for k in range(g):
                self.dev(f"n{n}gpu{k}", n, "gpu", flops, mem_bw, memory, host_bw)
        self.switches = [f"host{n}" for n in range(nodes)] + list(switches)

    def build(self) -> Machine:
        return Machine(self.devs, self.links, self.switches, self.name)


def _p100(nodes: int, g: int | None) -> Machine:
    g = g or 4
    b = _Builder(f"p100:{nodes}x{g}")
    b.gpus(nodes, g, 9.3e12, 732e9, 16 * 2**30, 12.58e9)
    for n in range(nodes):
        gs = [f"n{n}gpu{k}" for k in range(g)]
        for i in range(g):
            for j in range(i + 1, g):
                b.duplex(gs[i], gs[j], 18.52 * GB, 1e-6, "nvlink")
            b.duplex(gs[i], f"host{n}", 12.58 * GB, 1e-6, "pcie")
        if nodes > 1:
            b.duplex(f"host{n}", "ib", 10.94 * GB, 0.5e-6, "ib")
    return b.build()


def _k80(nodes: int, g: int | None) -> Machine:
    g = g or 4
    b = _Builder(f"k80:{nodes}x{g}")
    b.gpus(nodes, g, 4.37e12, 240e9, 12 * 2**30, 12.58e9)
    for n in range(nodes):
        for s in range((g + 1) // 2):
            sw = f"n{n}plx{s}"
            b.switches.append(sw)
            for k in (2 * s, 2 * s + 1):
                if k < g:
                    b.duplex(f"n{n}gpu{k}", sw, 12.58 * GB, 1e-6, "pcie")
            b.duplex(sw, f"host{n}", 12.58 * GB, 1e-6, "pcie-host")
        if nodes > 1:
            b.duplex(f"host{n}", "ib", 6.13 * GB, 0.5e-6, "ib")
    return b.build()


_CUBE = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7),
         (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]


def _dgx1(nodes: int, g: int | None) -> Machine:
    if g not in (None, 8):
        raise MachineError(f"dgx1 has 8 GPUs per node, got gpus_per_node={g}")
    b = _Builder("dgx1" if nodes == 1 else f"dgx1:{nodes}")
    b.gpus(nodes, 8, 15.7e12, 900e9, 16 * 2**30, 12.58e9)
    for n in range(nodes):
        for i, j in _CUBE:
            b.duplex(f"n{n}gpu{i}", f"n{n}gpu{j}", 25 * GB, 1e-6, "nvlink2")
        for k in range(8):
            b.duplex(f"n{n}gpu{k}", f"host{n}", 12.58 * GB, 1e-6, "pcie")
        if nodes > 1:
            b.duplex(f"host{n}", "ib", 4 * 10.94 * GB, 0.5e-6, "ib")
    return b.build()


def _h100(nodes: int, g: int | None, name: str = "h100", mem_bw: float = 3.35e12,
          memory: float = 80 * 2**30) -> Machine:
    g = g or 8
    b = _Builder(f"{name}:{nodes}x{g}")
    b.gpus(nodes, g, 67e12, mem_bw, memory, 55e9,
           switches=[f"nvswitch{n}" for n in range(nodes)] + ["ib"])
    for n in range(nodes):
        for k in range(g):
            gpu = f"n{n}gpu{k}"
            b.duplex(gpu, f"nvswitch{n}", 450 * GB, 1e-6, "nvlink4")
            b.duplex(gpu, f"host{n}", 55 * GB, 1e-6, "pcie5")
            if nodes > 1:
                b.duplex(gpu, "ib", 50 * GB, 1e-6, "ndr")
    return b.build()


def _h200(nodes: int, g: int | None) -> Machine:
    return _h100(nodes, g, "h200", 4.8e12, 141e9)


PRESETS = {"p100": _p100, "k80": _k80, "dgx1": _dgx1, "h100": _h100, "h200": _h200,
           "local": None}
