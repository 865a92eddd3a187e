"""Cost models: the exeTime of each task (paper section 5.1, assumptions A1
and A2).

- :class:`AnalyticCostModel`: roofline ``overhead + max(flops / peak,
  bytes / mem_bw)`` per compute task, so any preset machine can be simulated
  without its hardware.
- :class:`MeasuredCostModel`: times a callable that runs the op's real kernel
  for a tile (2 warm-up + 5 timed runs, median) and caches seconds on disk,
  keyed by op kind + attrs + input/output tile shapes + dtype + device kind
  (not device id), like FlexFlow's cost cache.
- :class:`TableCostModel`: a recorded JSON profile (same keys), so a profile
  taken on a GPU can drive simulation elsewhere.

:meth:`MeasuredCostModel.local` connects the measured model to the real
tile kernels (:func:`legionpy.optimizer.kernel_timing.tile_runner`: numpy on a CPU,
CuPy on a GPU) with the on-disk cache :func:`default_cache_path`
(``$LEGIONPY_CACHE/costs-v2.json``, default ``~/.cache/legionpy/costs-v2.json``).
:func:`cost_model_from_spec` turns ``"analytic" | "measured" | FILE.json``
(the ``--cost`` option of ``legionpy simulate``) into a model.

Profile files (``legionpy profile --out FILE``) are either a bare table
``{cost_key: [forward_s, backward_s]}`` or ``{"format": "legionpy-costs/1",
"costs": {...}, ...metadata}``; :meth:`TableCostModel.from_json` reads both.

Copies cost ``latency + bytes / bandwidth`` on each link they occupy
(assumption A2). Every duration is at least ``MIN_DURATION`` seconds, which
keeps the simulated schedule unique (see :mod:`legionpy.optimizer.simulator`).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable

from ..errors import StrategyError
from ..geometry import Rect
from .machine import DeviceSpec, LinkSpec
from .strategy import atomic_write_json

__all__ = ["CostModel", "AnalyticCostModel", "MeasuredCostModel", "TableCostModel",
           "cost_key", "NOGRAD", "MIN_DURATION", "default_cache_path", "cost_model_from_spec",
           "COSTS_FORMAT", "default_cost_model", "read_table", "merge_table",
           "cached_table"]

MIN_DURATION = 1e-9  # seconds
COSTS_FORMAT = "legionpy-costs/1"


#: the measured tables' cache generation, in their file names: tables of
#: an earlier one may hold a later layer's time under the first layer's
#: key (before :data:`NOGRAD`), so they are measured again
TABLES = "v2"


def default_cache_path() -> str:
    """``$LEGIONPY_CACHE/costs-v2.json`` (default ``~/.cache/legionpy/``; the
    name carries :data:`TABLES`)."""
    from ..atomic import cache_dir

    return str(cache_dir() / f"costs-{TABLES}.json")


def read_table(path: str) -> dict[str, list[float]]:
    """The cost table of a JSON file: bare, or wrapped as ``{"costs": {...}}``."""
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict):
        raise StrategyError(f"cost file {path!r} holds a {type(d).__name__}, expected a JSON "
                            "object {cost_key: [forward_s, backward_s]}")
    table = d["costs"] if isinstance(d.get("costs"), dict) else d
    bad = [k for k, v in table.items() if not (isinstance(v, list) and len(v) == 2)]
    if bad:
        raise StrategyError(f"cost file {path!r}: entries {bad[:3]} are not "
                            "[forward_s, backward_s] pairs")
    return table


def cost_model_from_spec(spec: str | None, concurrency: int | None = None,
                         machine=None) -> CostModel:
    """None -> :func:`default_cost_model` of ``machine`` (a preset's packaged
    GPU profile, else analytic); ``"analytic"`` -> AnalyticCostModel; ``"measured"`` ->
    :meth:`MeasuredCostModel.local` (real kernels, disk cache);
    ``"contended"`` -> the same timed while ``concurrency - 1`` other devices
    run (:class:`~legionpy.optimizer.calibration.ContendedCostModel`; default:
    this process's cores); ``"worker"`` -> timed as a device's worker runs
    it in a step: in its thread's CPU seconds, one BLAS thread, a strategy's
    tiles in the step's order (:class:`~legionpy.optimizer.calibration.
    StepCostModel`, the local machine model's kernels); a path ->
    :meth:`TableCostModel.from_json`."""
    if spec is None:
        return default_cost_model(machine)
    if spec == "analytic":
        return AnalyticCostModel()
    if spec == "measured":
        return MeasuredCostModel.local()
    if spec == "contended":
        from .calibration import ContendedCostModel, local_cores

        return ContendedCostModel.local(concurrency or local_cores())
    if spec == "worker":
        from .calibration import StepCostModel

        return StepCostModel.local()
    if os.path.exists(spec):
        return TableCostModel.from_json(spec)
    raise StrategyError(f"unknown cost model {spec!r}: use 'analytic', 'measured', "
                        "'worker', 'contended' or the path of a profile JSON written by "
                        "`legionpy profile --out FILE`")


#: marks an input of a cost key whose producer has no backward (the data):
#: the backward computes no gradient for it
NOGRAD = "/nograd"


def cost_key(op, out: Rect, device_kind: str) -> str:
    """Cache key of one tile's cost: kind + attrs + tile shapes + dtype + device
    kind. An input whose producer has no backward is marked :data:`NOGRAD`:
    the same shapes cost more when the backward also computes that input's
    gradient (a 384-wide dense layer on a 128 batch: its backward timed
    0.32 ms without it, 0.62 ms with it), and the first layer of a stack
    used to set the time of every later one (issue 26)."""
    ins = ";".join(str(op.input_rect(i, out).shape)
                   + ("" if ref.op.has_backward else NOGRAD)
                   for i, ref in enumerate(op.inputs))
    attrs = ",".join(f"{k}={op.attrs[k]!r}" for k in sorted(op.attrs) if k != "seed")
    return f"{op.kind}({attrs})|in={ins}|out={out.shape}|{op.dtype}|{device_kind}"


def cached_table(path: str) -> dict[str, list[float]]:
    """The table a cache file at ``path`` holds; empty when there is none or
    it cannot be read (a cache is measured again, never trusted broken)."""
    if not os.path.exists(path):
        return {}
    try:
        return read_table(path)
    except (OSError, ValueError, StrategyError):
        return {}


def merge_table(path: str, table: dict) -> None:
    """Write ``table`` into the JSON table cached at ``path``, merged with
    what other processes cached there meanwhile (an unreadable file is
    replaced), atomically."""
    atomic_write_json(path, {**cached_table(path), **table})


class CostModel:
    """Interface: seconds of the tasks of one op tile, one update, one copy hop."""

    def op_time(self, op, out: Rect, device: DeviceSpec) -> tuple[float, float]:
        """(forward, backward) seconds of the tile ``out`` of ``op`` on ``device``."""
        raise NotImplementedError

    def update_time(self, param, rect: Rect, device: DeviceSpec) -> float:
        """Seconds to apply the optimizer to the weight tile ``rect`` (SGD:
        read weight and gradient, write weight)."""
        b = 3.0 * rect.volume * 4
        return max(MIN_DURATION, self.launch_overhead(device) + b / device.mem_bw)

    def copy_time(self, nbytes: float, link: LinkSpec) -> float:
        """Seconds for ``nbytes`` on one directed link."""
        return max(MIN_DURATION, link.latency + nbytes / link.bandwidth)

    def load_time(self, nbytes: float, device: DeviceSpec) -> float:
        """Seconds to bring ``nbytes`` of input from the host to ``device``."""
        return self.launch_overhead(device) + nbytes / device.host_bw

    def launch_overhead(self, device: DeviceSpec) -> float:
        return 5e-6 if device.kind == "gpu" else 2e-5


class AnalyticCostModel(CostModel):
    """Roofline: ``overhead + max(flops / (peak * efficiency), bytes / mem_bw)``.

    ``gpu_overhead_s`` / ``cpu_overhead_s``: per-kernel launch overhead in
    seconds; ``efficiency``: fraction of peak FLOP/s a kernel reaches."""

    def __init__(self, gpu_overhead_s: float = 5e-6, cpu_overhead_s: float = 2e-5,
                 efficiency: float = 0.6) -> None:
        self.gpu_overhead_s, self.cpu_overhead_s = gpu_overhead_s, cpu_overhead_s
        self.efficiency = efficiency
        self._memo: dict = {}

    def launch_overhead(self, device: DeviceSpec) -> float:
        return self.gpu_overhead_s if device.kind == "gpu" else self.cpu_overhead_s

    def op_time(self, op, out, device):
        key = (id(op), out, device.kind, device.flops, device.mem_bw)
        r = self._memo.get(key)
        if r is None:
            (ff, fb), (bf, bb) = op.flops(out), op.bytes(out)
            peak = device.flops * self.efficiency
            ov = self.launch_overhead(device)
            r = (max(MIN_DURATION, ov + max(ff / peak, bf / device.mem_bw)),
                 max(MIN_DURATION, ov + max(fb / peak, bb / device.mem_bw)))
            self._memo[key] = r
        return r


class MeasuredCostModel(AnalyticCostModel):
    """Measured tile costs, cached on disk.

    ``runner(op, out_rect, device) -> (forward_fn, backward_fn)`` returns two
    zero-argument callables running the real kernels on one tile (built by
    the operators layer); each is run 2 times to warm up and 5 timed times,
    and the median is kept. ``cache_path``: a JSON file (atomic writes).
    Without a runner, unmeasured tiles fall back to the analytic model."""

    warmup, repeats = 2, 5

    def __init__(self, runner: Callable | None = None, cache_path: str | None = None,
                 **analytic) -> None:
        super().__init__(**analytic)
        self.runner = runner
        self.cache_path = cache_path
        self.table: dict[str, list[float]] = {}
        if cache_path and os.path.exists(cache_path):
            self.table = read_table(cache_path)

    @classmethod
    def local(cls, cache_path: str | None = None, **analytic) -> MeasuredCostModel:
        """Measured with the real tile kernels on this machine's devices
        (:func:`legionpy.optimizer.kernel_timing.tile_runner`), cached in
        ``cache_path`` (default :func:`default_cache_path`)."""
        from .kernel_timing import tile_runner

        path = cache_path or default_cache_path()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return cls(tile_runner, path, **analytic)

    @staticmethod
    def time_callable(fn: Callable[[], object], warmup: int = 2, repeats: int = 5,
                      clock: Callable[[], float] = time.perf_counter) -> float:
        """Median seconds of ``fn()`` after ``warmup`` untimed runs, on
        ``clock`` (wall clock by default)."""
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(repeats):
            t = clock()
            fn()
            ts.append(clock() - t)
        return float(statistics.median(ts))

    def op_time(self, op, out, device):
        key = cost_key(op, out, device.kind)
        hit = self.table.get(key)
        if hit is None:
            if self.runner is None:
                return super().op_time(op, out, device)
            fwd, bwd = self.runner(op, out, device)
            hit = [self.time_callable(fwd, self.warmup, self.repeats),
                   self.time_callable(bwd, self.warmup, self.repeats)]
            self.table[key] = hit
            if self.cache_path:
                self._write_cache()
        return max(MIN_DURATION, hit[0]), max(MIN_DURATION, hit[1])

    def _write_cache(self) -> None:
        merge_table(self.cache_path, self.table)

    def save(self, path: str, **metadata) -> None:
        """Write the table (``metadata`` given: wrapped with ``format``)."""
        if metadata:
            atomic_write_json(path, {"format": COSTS_FORMAT, **metadata, "costs": self.table})
        else:
            atomic_write_json(path, self.table)


class TableCostModel(MeasuredCostModel):
    """A recorded profile ``{cost_key: [forward_s, backward_s]}``. Missing tiles
    use the analytic model when ``fallback=True``, else raise.

    ``source``: what the table is (a file name, a packaged profile) for the
    reports. The model counts the distinct tiles it was asked for:
    :meth:`coverage` says how many came from the table and how many from
    the analytic fallback (``legionpy simulate`` prints it).

    ``scale_fallback``: a missing tile of an operator whose configuration
    (kind, attributes, dtype, device kind) the table holds at other tile
    shapes costs the analytic time times the median measured/analytic ratio
    of those entries (forward and backward apart): the op's measured
    efficiency carried to the shapes nobody measured. Without it a search
    would favour exactly the tiles the profile lacks, whose roofline times
    are optimistic next to measured ones. It depends only on the table and
    the op, so every simulation of a strategy gets the same times."""

    def __init__(self, table: dict, fallback: bool = True, source: str = "",
                 scale_fallback: bool = False, **analytic) -> None:
        super().__init__(None, None, **analytic)
        self.table = dict(table)
        self.fallback = fallback
        self.source = source
        self.scale_fallback = scale_fallback
        self.hits: set[str] = set()
        self.misses: set[str] = set()
        self.scaled: set[str] = set()
        self._lookups: dict = {}
        self._configs: dict | None = None

    @classmethod
    def from_json(cls, path: str, fallback: bool = True) -> TableCostModel:
        """Load a profile (bare table or ``{"costs": ...}``, see module docstring)."""
        return cls(read_table(path), fallback, source=os.path.basename(path))

    def op_time(self, op, out, device):
        memo = (id(op), out, device.kind, device.flops, device.mem_bw)
        r = self._lookups.get(memo)
        if r is not None:
            return r
        key = cost_key(op, out, device.kind)
        hit = self.table.get(key)
        if hit is None and NOGRAD in key:
            # a table recorded before inputs without a gradient were marked
            hit = self.table.get(key.replace(NOGRAD, ""))
        if hit is None:
            if not self.fallback:
                raise StrategyError(f"cost table {self.source or ''} has no entry for {key}; "
                                    "profile that tile (`legionpy profile`) or allow the "
                                    "analytic fallback")
            self.misses.add(key)
            r = AnalyticCostModel.op_time(self, op, out, device)
            ratio = self._efficiency(op, key, device) if self.scale_fallback else None
            if ratio is not None:
                self.scaled.add(key)
                r = (max(MIN_DURATION, r[0] * ratio[0]), max(MIN_DURATION, r[1] * ratio[1]))
        else:
            self.hits.add(key)
            r = (max(MIN_DURATION, hit[0]), max(MIN_DURATION, hit[1]))
        self._lookups[memo] = r
        return r

    def _efficiency(self, op, key: str, device: DeviceSpec) -> tuple[float, float] | None:
        """Median (forward, backward) measured/analytic ratios of the table's
        entries for ``op``'s configuration at other tile shapes (None: none)."""
        if self._configs is None:
            self._configs = {}
            for k, v in self.table.items():
                parts = k.rsplit("|", 4)
                if len(parts) == 5 and parts[2].startswith("out="):
                    try:
                        shape = tuple(int(x) for x in parts[2][5:-1].split(",") if x.strip())
                    except ValueError:
                        continue
                    self._configs.setdefault((parts[0], parts[3], parts[4]), []).append(
                        (shape, v))
        parts = key.rsplit("|", 4)
        entries = self._configs.get((parts[0], parts[3], parts[4]))
        if not entries:
            return None
        rf, rb = [], []
        for shape, (f, b) in entries:
            if len(shape) != len(op.output_shape):
                continue
            fa, ba = AnalyticCostModel.op_time(self, op, Rect((0,) * len(shape), shape), device)
            rf.append(max(f, MIN_DURATION) / fa)
            rb.append(max(b, MIN_DURATION) / ba)
        if not rf:
            return None
        return float(statistics.median(rf)), float(statistics.median(rb))

    def coverage(self) -> dict[str, int]:
        """``{"table": n, "analytic": m, "scaled": k}``: distinct tiles asked
        for so far that the table held, that fell back to the analytic model,
        and how many of those were scaled by their op's measured efficiency."""
        return {"table": len(self.hits), "analytic": len(self.misses),
                "scaled": len(self.scaled)}


def default_cost_model(machine=None) -> CostModel:
    """The cost model of ``machine`` when the caller names none (the
    Simulator's and the search's default): for a preset backed by a recorded
    GPU profile packaged with legionpy (:mod:`legionpy.optimizer.recorded_profiles`),
    a :class:`TableCostModel` over it with the analytic model for tiles it
    lacks; else :class:`AnalyticCostModel`."""
    preset = getattr(machine, "preset", "")
    if preset:
        from .recorded_profiles import preset_cost_model

        cm = preset_cost_model(preset)
        if cm is not None:
            return cm
    return AnalyticCostModel()
