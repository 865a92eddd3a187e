"""Recorded GPU profiles shipped with the package (issue 16 item 6): measured
kernel times of a real GPU, so ``simulate`` and ``search`` on that GPU's
preset run on them anywhere, a laptop included (FlexFlow section 5.1: the
simulator's exeTime of a task is the measured time of its kernel on that
device kind, A1).
(Named ``optimizer/profiles.py`` before issue 23.)

Where: ``legionpy/data/profiles/`` (package data), or the folder
``$LEGIONPY_PROFILES`` names (``LEGIONPY_PROFILES=off`` turns packaged
profiles off: every preset is analytic).

Naming rule: the profile of zoo model MODEL for preset PRESET is
``PRESET-MODEL.json``; preset ``h100`` is backed by every ``h100-*.json``
there (their tables merged). ``legionpy profile --zoo --out DIR`` writes
these names: the preset comes from the GPU's name (:func:`preset_for_gpu`:
an H100 records for ``h100``, an H200 for ``h200``, a V100 for ``dgx1``) or
from ``--preset``.

A profile file is a cost table (:class:`~legionpy.optimizer.costmodel.
TableCostModel` JSON, ``format`` ``legionpy-costs/1``) with the metadata
that says what was measured::

    {"format": "legionpy-costs/1", "profile": "legionpy-gpu-profile/1",
     "preset": "h100", "emulated": false,
     "device": {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3",
                "backend": "cupy", "compute_capability": "90", "memory_bytes": ...},
     "versions": {"cupy": ..., "cuda_runtime": ..., "cuda_driver": ..., "numpy": ...,
                  "legionpy": ...},
     "models": [{"model": "alexnet", "scale": "full", "batch_size": 256,
                 "strategies": ["data", "model", "expert"], "device_counts": [1, 2, 4, 8],
                 "tiles": 61}],
     "recorded_at": "2026-...Z", "costs": {cost_key: [forward_s, backward_s]}}

Loading (:func:`preset_cost_model`): the preset's default cost model
becomes a ``TableCostModel`` over the merged tables, keyed for the preset's
device kind, with the analytic roofline of the preset's figures for every
tile the profile lacks, scaled by that operator's measured efficiency when
the profile holds it at other tile shapes (``legionpy simulate`` says how
many tiles came from each). A profile recorded on the *emulated* GPU backend (numpy timings
wearing a GPU's name) is never loaded: it is listed as refused, with the
reason, by ``legionpy machines``. A profile recorded on another device kind
(a CPU profile placed there, e.g. by a test) is re-keyed to the preset's
kind: the device says where the figures come from, and ``machines`` shows
it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StrategyError
from .costmodel import COSTS_FORMAT, TableCostModel

__all__ = ["PROFILE_FORMAT", "RecordedProfile", "PresetProfile", "profiles_dir",
           "packaged_dir", "preset_for_gpu", "profile_file_name", "read_profile",
           "preset_profile", "preset_cost_model"]

PROFILE_FORMAT = "legionpy-gpu-profile/1"

#: (pattern in the GPU's name, preset): first match wins
GPU_PRESETS = ((r"h200", "h200"), (r"h100", "h100"), (r"v100", "dgx1"), (r"p100", "p100"),
               (r"k80", "k80"))


def packaged_dir() -> Path:
    """``legionpy/data/profiles``: the profiles shipped with the package."""
    return Path(__file__).resolve().parent.parent / "data" / "profiles"


def profiles_dir() -> Path | None:
    """The folder presets load their profiles from: ``$LEGIONPY_PROFILES``
    when set (``off``: none), else :func:`packaged_dir`."""
    env = os.environ.get("LEGIONPY_PROFILES", "").strip()
    if env.lower() in ("off", "none", "0"):
        return None
    return Path(env) if env else packaged_dir()


def preset_for_gpu(name: str) -> str | None:
    """The machine preset a GPU of this device name records for (None: no
    preset describes it; pass ``--preset`` to name one)."""
    low = name.lower()
    for pattern, preset in GPU_PRESETS:
        if re.search(pattern, low):
            return preset
    return None


def profile_file_name(preset: str, model: str) -> str:
    """``PRESET-MODEL.json`` (the naming rule of the module docstring)."""
    stem = re.sub(r"[^a-z0-9_]+", "_", os.path.splitext(os.path.basename(model))[0].lower())
    return f"{preset}-{stem}.json"


@dataclass(frozen=True)
class RecordedProfile:
    """One profile file: where it is, what it measured and its table."""

    path: str
    preset: str
    device: dict
    emulated: bool
    models: list
    versions: dict
    table: dict = field(repr=False)
    recorded_at: str = ""

    @property
    def device_kind(self) -> str:
        return str(self.device.get("kind", "gpu"))

    @property
    def refusal(self) -> str | None:
        """Why a preset must not load this profile (None: it may)."""
        if self.emulated:
            return ("recorded on the emulated GPU backend (numpy timings, not a GPU's); "
                    "record it on a real GPU")
        return None

    def table_for(self, kind: str) -> dict[str, list[float]]:
        """The table keyed for devices of ``kind`` (cost keys end in ``|kind``)."""
        if kind == self.device_kind:
            return self.table
        suffix = f"|{self.device_kind}"
        return {(k[:-len(suffix)] + f"|{kind}" if k.endswith(suffix) else k): v
                for k, v in self.table.items()}

    def summary(self) -> dict[str, Any]:
        """What ``legionpy machines`` shows: file, device, models (``name``,
        or ``name[small]`` for a profile not at the paper's shapes), tiles."""
        return {"file": os.path.basename(self.path), "device": self.device.get("name", "?"),
                "device_kind": self.device_kind, "emulated": self.emulated,
                "models": [m.get("model") + ("" if m.get("scale", "full") == "full"
                                             else f"[{m.get('scale')}]") for m in self.models],
                "tiles": len(self.table), "recorded_at": self.recorded_at}


def read_profile(path: str | os.PathLike) -> RecordedProfile:
    """Read one profile file (see the module docstring); raises
    :class:`~legionpy.errors.StrategyError` naming the file and the field
    when it is not one."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise StrategyError(f"profile {path!r} cannot be read as JSON ({e}); write it with "
                            "`legionpy profile --zoo --out DIR`") from None
    if not isinstance(d, dict) or d.get("profile") != PROFILE_FORMAT:
        raise StrategyError(f"{path!r} is not a recorded GPU profile (its 'profile' field is "
                            f"{d.get('profile') if isinstance(d, dict) else None!r}, expected "
                            f"{PROFILE_FORMAT!r}); write one with `legionpy profile --zoo`")
    for f in ("preset", "device", "costs", "models"):
        if f not in d:
            raise StrategyError(f"profile {path!r} lacks the field {f!r}")
    if d.get("format") != COSTS_FORMAT or not isinstance(d["costs"], dict):
        raise StrategyError(f"profile {path!r}: 'format' must be {COSTS_FORMAT!r} with a "
                            "'costs' object")
    bad = [k for k, v in d["costs"].items() if not (isinstance(v, list) and len(v) == 2)]
    if bad:
        raise StrategyError(f"profile {path!r}: entries {bad[:3]} are not "
                            "[forward_s, backward_s] pairs")
    return RecordedProfile(path, str(d["preset"]), dict(d["device"]), bool(d.get("emulated")),
                           list(d["models"]), dict(d.get("versions", {})), d["costs"],
                           str(d.get("recorded_at", "")))


@dataclass
class PresetProfile:
    """What backs a preset: the profiles it loads and the ones it refused."""

    preset: str
    folder: str
    files: list[RecordedProfile]
    refused: list[tuple[str, str]]  # (file name, why)
    identity: str = ""  # a hash of the loaded files' contents (search caches)

    def table_for(self, kind: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for p in self.files:
            out.update(p.table_for(kind))
        return out

    @property
    def source(self) -> str:
        return "profile " + ", ".join(os.path.basename(p.path) for p in self.files)

    def describe(self) -> dict[str, Any]:
        """``{"kind": "profile" | "analytic", "folder", "files": [...],
        "models", "devices", "refused": [{"file", "why"}]}``."""
        return {"kind": "profile" if self.files else "analytic", "folder": self.folder,
                "files": [p.summary() for p in self.files],
                "models": sorted({m for p in self.files for m in p.summary()["models"]}),
                "devices": sorted({p.device.get("name", "?") if p.device_kind == "gpu" else
                                   f"{p.device_kind}: {p.device.get('name', '?')}"
                                   for p in self.files}),
                "refused": [{"file": f, "why": why} for f, why in self.refused]}


_cache: dict[tuple, PresetProfile] = {}


def _listing(folder: Path, preset: str) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(folder.glob(f"{preset}-*.json"))


def preset_profile(preset: str, folder: str | os.PathLike | None = None,
                   include_refused: bool = False) -> PresetProfile | None:
    """The profiles backing ``preset`` in ``folder`` (default
    :func:`profiles_dir`): None when it has none it may load (with
    ``include_refused``: a PresetProfile listing the refused ones too, for
    ``legionpy machines``). Cached per folder, file names and mtimes."""
    root = Path(folder) if folder is not None else profiles_dir()
    if root is None:
        return None
    paths = _listing(root, preset)
    key = (str(root), preset, tuple((str(p), p.stat().st_mtime_ns) for p in paths))
    if key not in _cache:
        files, refused, digest = [], [], hashlib.sha256()
        for p in paths:
            try:
                prof = read_profile(p)
            except StrategyError as e:
                refused.append((p.name, str(e)))
                continue
            why = prof.refusal
            if prof.preset != preset:
                why = f"recorded for preset {prof.preset!r}, not {preset!r}"
            if why:
                refused.append((p.name, why))
                continue
            files.append(prof)
            digest.update(p.read_bytes())
        _cache[key] = PresetProfile(preset, str(root), files, refused,
                                    digest.hexdigest()[:16] if files else "")
    got = _cache[key]
    if not got.files and not include_refused:
        return None
    return got


def preset_cost_model(preset: str, kind: str = "gpu") -> TableCostModel | None:
    """A TableCostModel over ``preset``'s loaded profiles, keyed for devices
    of ``kind``, analytic for the tiles they lack (None: no profile)."""
    prof = preset_profile(preset)
    if prof is None:
        return None
    cm = TableCostModel(prof.table_for(kind), fallback=True, source=prof.source,
                        scale_fallback=True)
    cm.profile = prof
    return cm
