"""Record the GPU profile a preset ships with (issue 16 item 6): the engine
of ``legionpy profile --zoo --out DIR``.
(Named ``measure/gpuprofile.py`` before issue 23.)

For each zoo model (at the paper's shapes by default) it measures, on this
machine's GPU, every distinct tile that the ``data``, ``model`` and
``expert`` strategies need on 1, 2, 4, 8 and 16 devices of the preset (a
tile's shape depends only on the degrees, so a one-GPU machine measures
the tiles of an 8-GPU strategy), with the real tile kernels
(:func:`legionpy.optimizer.kernel_timing.tile_runner`: 2 warm-up + 5 timed runs,
median, each synchronised), and writes ``DIR/PRESET-MODEL.json`` in the
format :mod:`legionpy.optimizer.recorded_profiles` loads: the cost table plus what
was measured (the device's name as the driver reports it, CuPy, CUDA
runtime and driver versions, the models, shapes, strategies and device
counts covered).

Measurements are cached per device (``$LEGIONPY_CACHE/profile-DEVICE.json``)
so a run cut short resumes where it stopped; the emulated backend
(``LEGIONPY_GPU_BACKEND=emulated``) and a CPU get caches of their own, so
their timings can never be mistaken for a GPU's. A profile recorded on the
emulated backend is marked ``"emulated": true`` and refused by the loader;
neither it nor a CPU profile may be written into the packaged folder.

    legionpy profile --zoo --out legionpy/data/profiles            # on a GPU machine
    legionpy profile --zoo --models alexnet,resnet101,rnnlm --out DIR
"""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import MachineError, StrategyError
from ..optimizer.costmodel import COSTS_FORMAT, MeasuredCostModel, default_cache_path
from ..optimizer.kernel_timing import profile_model, tile_runner
from ..optimizer.machine import DeviceSpec, Machine
from ..optimizer.recorded_profiles import (
    PROFILE_FORMAT,
    packaged_dir,
    preset_for_gpu,
    profile_file_name,
)
from ..optimizer.strategy import Strategy, atomic_write_json

__all__ = ["device_identity", "device_cost_model", "record_profile", "DEFAULT_COUNTS",
           "STRATEGIES"]

DEFAULT_COUNTS = (1, 2, 4, 8, 16)
STRATEGIES = ("data", "model", "expert")


def device_identity() -> dict[str, Any]:
    """What this machine's first GPU is (or, with none, its CPU):
    ``{"kind", "name", "backend", "emulated", "versions", ...}``."""
    from ..runtime.gpu import backend_name, visible_gpus

    versions = {"legionpy": __version__, "numpy": np.__version__,
                "python": platform.python_version()}
    if backend_name() == "emulated" and visible_gpus() > 0:
        return {"kind": "gpu", "name": "emulated GPU (numpy, runtime/emugpu.py)",
                "backend": "emulated", "emulated": True, "versions": versions}
    if visible_gpus() > 0:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        versions.update({"cupy": cupy.__version__,
                         "cuda_runtime": int(cupy.cuda.runtime.runtimeGetVersion()),
                         "cuda_driver": int(cupy.cuda.runtime.driverGetVersion())})
        return {"kind": "gpu", "name": name, "backend": "cupy", "emulated": False,
                "compute_capability": str(cupy.cuda.Device(0).compute_capability),
                "memory_bytes": int(props["totalGlobalMem"]), "versions": versions}
    from ..probe.machine import cpu_identity

    return {"kind": "cpu", "name": cpu_identity()["cpu"], "backend": "numpy",
            "emulated": False, "versions": versions}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_cost_model(cache: str | None = None,
                      device: dict[str, Any] | None = None) -> MeasuredCostModel:
    """Tile kernels timed on this machine's first GPU (or CPU), wall clock
    to a synchronised device, cached in ``cache`` (default
    ``$LEGIONPY_CACHE/profile-BACKEND-DEVICE.json``, apart for every device
    and backend: the emulated backend's timings never pass for a GPU's).
    What ``profile --zoo`` records and what the local machine model of a
    GPU machine predicts with (:func:`legionpy.measure.predict`)."""
    device = device or device_identity()
    cache = cache or os.path.join(os.path.dirname(default_cache_path()),
                                  f"profile-{_slug(device['backend'] + '-' + device['name'])}"
                                  ".json")
    os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
    return MeasuredCostModel(tile_runner, cache)


def _check_destination(out_dir: str, device: dict) -> None:
    """Only a real GPU's profile may go into the packaged folder."""
    if not os.path.isdir(out_dir):
        raise StrategyError(f"--out {out_dir!r} is not a folder; create it first (profiles "
                            "are written there as PRESET-MODEL.json)")
    packaged = Path(out_dir).resolve() == packaged_dir().resolve()
    if packaged and (device["emulated"] or device["kind"] != "gpu"):
        what = "the emulated GPU backend" if device["emulated"] else f"a {device['kind']}"
        raise StrategyError(f"refusing to write a profile recorded on {what} into the "
                            f"packaged profiles folder {out_dir}: presets would present its "
                            "timings as a GPU's; write it elsewhere (and point "
                            "LEGIONPY_PROFILES there to try it)")


def record_profile(models: Sequence[str], out_dir: str, preset: str | None = None,
                   scale: str = "full", counts: Sequence[int] = DEFAULT_COUNTS,
                   cache: str | None = None,
                   progress: Callable[[str, int, int, str], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Profile each zoo model of ``models`` on this machine's GPU (see the
    module docstring) and write ``out_dir/PRESET-MODEL.json``. ``preset``:
    default :func:`~legionpy.optimizer.recorded_profiles.preset_for_gpu` of the
    device's name. ``progress(model, done, total, op)`` after every tile.
    Returns one summary per model ``{"model", "file", "tiles", "seconds"}``."""
    from ..models import check_model, sizes_for
    from ..models import graph as zoo_graph
    from ..optimizer.machine import PRESETS

    device = device_identity()
    preset = preset or preset_for_gpu(device["name"])
    if preset is None or preset not in PRESETS or preset == "local":
        raise MachineError(f"no machine preset describes this device ({device['name']!r}); "
                           f"pass --preset with one of "
                           f"{sorted(p for p in PRESETS if p != 'local')}")
    _check_destination(out_dir, device)
    for name in models:
        check_model(name)
    counts = sorted({int(n) for n in counts})
    if not counts or counts[0] < 1:
        raise MachineError(f"device counts must be >= 1, got {list(counts)}")
    spec = DeviceSpec(0, f"{device['kind']}0", device["kind"], host_bw=1e10)
    here = Machine([spec], [], name=f"profile:{device['kind']}")
    cm = device_cost_model(cache, device)
    done = []
    for name in models:
        t0 = time.perf_counter()
        sizes = sizes_for(name, scale)
        g = zoo_graph(name, scale=scale).graph
        # the tiles of a strategy depend only on its degrees: any machine of n devices
        strategies = [Strategy.resolve(s, g, Machine.preset("h100", 1, n))
                      for n in counts for s in STRATEGIES]
        table = profile_model(g, here, strategies, cm,
                              progress=None if progress is None else
                              lambda i, n, op, name=name: progress(name, i, n, op))
        path = os.path.join(out_dir, profile_file_name(preset, name))
        took = time.perf_counter() - t0
        atomic_write_json(path, {
            "format": COSTS_FORMAT, "profile": PROFILE_FORMAT, "preset": preset,
            "emulated": device["emulated"],
            "device": {k: v for k, v in device.items() if k not in ("versions", "emulated")},
            "versions": device["versions"],
            "models": [{"model": name, "scale": scale, "batch_size": int(sizes["batch_size"]),
                        "sizes": {k: v for k, v in sizes.items() if k != "batch_size"},
                        "strategies": list(STRATEGIES), "device_counts": counts,
                        "tiles": len(table), "profile_time_s": took}],
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "costs": table})
        done.append({"model": name, "file": path, "tiles": len(table), "seconds": took})
    return done
