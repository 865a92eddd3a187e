"""Mappers decide where tasks run and where their data lives.

See :mod:`legionpy.mapper.base` for the interface, and
:mod:`legionpy.mapper.default` for the DefaultMapper policy.
"""

from __future__ import annotations

from .adaptive import AdaptiveMapper  # noqa: F401
from .base import Mapper, MapperTask, Mapping, TaskOptions
from .default import DefaultMapper, RandomMapper
from .strategy import (  # noqa: F401
    StrategyMapper,
    WeightTile,
    param_tiles,
    update_points,
    update_shards,
    weight_tiles,
)

__all__ = ["Mapper", "MapperTask", "Mapping", "TaskOptions", "DefaultMapper", "RandomMapper"]
