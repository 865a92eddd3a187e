"""Exceptions raised by legionpy.

Every error says what was wrong, with the offending values, and what to do.
Each class also derives from the closest builtin so ``except ValueError``
keeps working in user code.
"""

from __future__ import annotations

__all__ = [
    "LegionpyError",
    "GeometryError",
    "RegionError",
    "FieldError",
    "PartitionError",
    "PrivilegeError",
    "TaskError",
    "LaunchError",
    "MappingError",
    "MachineError",
    "StrategyError",
    "GraphError",
    "GraphCaptureError",
    "ModelError",
    "RankMismatchError",
    "TraceMismatchError",
    "CheckpointError",
    "DeviceError",
    "Interrupted",
]


class LegionpyError(Exception):
    """Base class of every legionpy error."""


class GeometryError(LegionpyError, ValueError):
    """A rect or point with the wrong number of dims, or lo > hi."""


class RegionError(LegionpyError, ValueError):
    """A region built or used wrongly (bad shape, rect outside the region)."""


class FieldError(RegionError, KeyError):
    """An unknown field, or a field dtype numpy cannot represent."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class PartitionError(RegionError):
    """A partition whose degrees or tiles do not fit its parent."""


class PrivilegeError(LegionpyError, ValueError):
    """A privilege misused: a write through a read-only privilege, an unknown
    reduction op, a region argument without a privilege."""


class TaskError(LegionpyError, RuntimeError):
    """A task body raised. The message names the task, the point and the rank;
    the original exception is chained as ``__cause__``."""


class LaunchError(LegionpyError, ValueError):
    """A launch that cannot run: interfering points of an index launch with
    write privileges, wrong number of region arguments."""


class MappingError(LegionpyError, ValueError):
    """A mapper decision that is not valid for the machine."""


class MachineError(LegionpyError, ValueError):
    """A machine description with a bad field or an unreachable device."""


class DeviceError(LegionpyError, RuntimeError):
    """An array used on the wrong GPU (not the current device, or mixed with
    another device's or the host's array): what a real GPU run would reject."""


class GraphCaptureError(DeviceError):
    """Work that a CUDA stream capture cannot record (a host transfer or
    synchronisation while capturing: cudaErrorStreamCaptureUnsupported), or
    the end of a capture that such work invalidated."""


class StrategyError(LegionpyError, ValueError):
    """A parallel config that does not fit its operator or machine."""


class GraphError(LegionpyError, ValueError):
    """An operator graph built wrongly (shape mismatch, cycle, unknown op)."""


class ModelError(LegionpyError, ValueError):
    """A layer-API misuse (fit before compile, wrong data shape)."""


class RankMismatchError(LegionpyError, RuntimeError):
    """MPI ranks ran different programs (their launch sequences differ)."""


class TraceMismatchError(LaunchError):
    """A replayed trace (``lp.trace(name, strict=True)``) met a launch that
    differs from its recording; the message names both."""


class CheckpointError(ModelError):
    """A checkpoint that cannot be read (missing, truncated, not legionpy's)
    or that belongs to another model; the message names the file."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``fit`` or a search at a clean point (a step
    boundary); the message says where and what was saved. A
    ``KeyboardInterrupt``, so ``except KeyboardInterrupt`` catches it; the
    ``legionpy`` command exits with status 130."""
