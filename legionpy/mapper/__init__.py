"""Mappers that know the application, above the runtime's mapper interface.

The interface (:class:`Mapper`, :class:`MapperTask`, :class:`TaskOptions`,
:class:`Mapping`) and the :class:`DefaultMapper` belong to the runtime
(:mod:`legionpy.runtime.mapping`, as Legion's ``legion_mapping.h`` and its
default mapper do); they are re-exported here under their documented names.
This package adds the :class:`StrategyMapper` (places each operator's tiles
as a ParallelConfig says), the ConsultingMapper (:mod:`.consult`) and the
:class:`AdaptiveMapper` (:mod:`.adaptive`, imported on first use so that
``Runtime()`` never loads the optimizer).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..runtime.mapping import (
    DefaultMapper,
    Mapper,
    MapperTask,
    Mapping,
    RandomMapper,
    TaskOptions,
)
from .strategy import (  # noqa: F401
    StrategyMapper,
    WeightTile,
    param_tiles,
    update_points,
    update_shards,
    weight_tiles,
)

__all__ = ["Mapper", "MapperTask", "Mapping", "TaskOptions", "DefaultMapper", "RandomMapper",
           "StrategyMapper", "AdaptiveMapper"]


def __getattr__(name: str) -> Any:
    if name == "AdaptiveMapper":
        value = importlib.import_module(".adaptive", __name__).AdaptiveMapper
        globals()[name] = value
        return value
    raise AttributeError(f"module 'legionpy.mapper' has no attribute {name!r}")
