"""The task runtime of one process: tasks, launches, coherence, FIFO devices.

Modules, in pipeline order: ``launch`` (the @task decorator, LaunchOptions,
privilege matching), ``core`` (the Runtime: launch-time analysis: dependences,
mapping, coherence planning with :mod:`legionpy.regions.coherence`, the
pure valid-instance state machine), ``instances`` (arrays per memory),
``scheduler`` (dependence counting and FIFO execution, threaded or serial),
``devices``, ``futures``, ``trace``.

>>> import numpy as np, legionpy as lp
>>> R = lp.Region((8,), {"x": np.float64})
>>> lp.fill(R, "x", 1.0)
>>> @lp.task(privileges=[lp.RW("x")])
... def double(r):
...     r.x[...] *= 2
>>> fm = lp.index_launch(double, lp.Partition.equal(R, (2,)).colors, lp.Partition.equal(R, (2,)))
>>> lp.fence(); R.read("x").tolist()
[2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
"""

from __future__ import annotations

import sys
from typing import Any

from ..regions.coherence import HOST
from ..regions.region import set_data_owner
from .core import Runtime
from .devices import Device
from .futures import Future, FutureMap, gather_maps
from .launch import LaunchOptions, TaskFunction, task

__all__ = ["task", "index_launch", "fill", "fence", "runtime", "get_runtime", "current_runtime",
           "init", "shutdown",
           "trace", "begin_trace", "end_trace", "memory_stats",
           "Future", "FutureMap", "gather_maps", "Device", "LaunchOptions", "TaskFunction",
           "Runtime", "HOST"]

_runtime: Runtime | None = None


def current_runtime() -> Runtime | None:
    """The process's Runtime as it is (None before the first, or after
    :func:`shutdown`), never a new one: for code on the runtime's own
    threads, which must not start a runtime while this one closes."""
    return _runtime


def get_runtime(reset: bool = False, **options: Any) -> Runtime:
    """The process's Runtime, created on first use. ``reset=True`` or any
    option (``cpus``, ``executor``, ``mapper``, ``trace``, ``debug``) shuts
    the current one down (after a fence) and starts a new one."""
    global _runtime
    if _runtime is None or reset or options or _runtime.closed:
        if _runtime is not None:
            _runtime.shutdown()
        _runtime = Runtime(**options)
    return _runtime


# Region.read / Region.write reach the runtime through this hook (regions
# never import the runtime)
set_data_owner(get_runtime)


def init(cpus: int | None = None, executor: str | None = None, mapper: Any = None,
         trace: str | None = None, debug: int | None = None) -> Runtime:
    """Start a fresh runtime: ``init(cpus=4, executor="serial")``."""
    return get_runtime(reset=True, cpus=cpus, executor=executor, mapper=mapper, trace=trace,
                   debug=debug)


def shutdown() -> None:
    """Fence, write the trace if requested, stop the worker threads."""
    global _runtime
    if _runtime is not None:
        _runtime.shutdown()
        _runtime = None


def index_launch(task: TaskFunction, colors: Any, *args: Any,
                 launch_options: LaunchOptions | None = None, **kwargs: Any) -> FutureMap:
    """Launch ``task`` once per color; Partition and FutureMap arguments
    project by color, everything else is passed to every point."""
    return get_runtime().index_launch(task, colors, args, kwargs, launch_options or task.options)


def fill(region: Any, field: str, value: Any) -> None:
    """Set ``field`` of ``region`` to ``value`` (lazy: no data moves)."""
    get_runtime().fill(region, field, value)


def trace(name: str, strict: bool = False, order: Any = None,
          keep_buffers: Any = ()) -> Any:
    """``with lp.trace("step"): ...``: record the block's launches the first
    time, replay them afterwards without dependence analysis, coherence
    queries or mapper calls (runtime/tracing.py). ``strict=True`` raises
    TraceMismatchError when a replayed block differs from its recording
    (default: the rest runs untraced and the trace is recorded again).
    ``order(records)`` may return ``{queue: [record ids]}``, the order each
    device and link replays its ops in (default: the recorded run's order).
    ``keep_buffers``: regions whose reduction buffers the replays keep to
    the next fence, reset in place as each replay begins, instead of
    returning them to the pool after their last reader: the task views cut
    from them stay valid (docs/memory.md)."""
    from .tracing import traced

    return traced(get_runtime(), name, strict=strict, order=order, keep_buffers=keep_buffers)


def begin_trace(name: str, strict: bool = False) -> None:
    """Legion's spelling of ``with lp.trace(name):`` (start)."""
    get_runtime().begin_trace(name, strict=strict)


def end_trace(name: str) -> None:
    """Legion's spelling of ``with lp.trace(name):`` (end)."""
    get_runtime().end_trace(name)


def memory_stats(reset: bool = False) -> dict:
    """Bytes held per memory now and at peak (:meth:`Runtime.memory_stats`)."""
    return get_runtime().memory_stats(reset)


def fence(timeout: float | None = None) -> None:
    """Wait for everything launched so far; raise the first task failure."""
    get_runtime().fence(timeout)


class _CallableModule(type(sys)):
    """``legionpy.runtime`` is both this package and the accessor function:
    importing the package binds ``legionpy.runtime`` to the module, so the
    module itself is callable and ``lp.runtime()`` works either way."""

    def __call__(self, reset: bool = False, **options: Any) -> Runtime:
        return get_runtime(reset, **options)


sys.modules[__name__].__class__ = _CallableModule
runtime = sys.modules[__name__]  # lp.runtime(), lp.runtime.init(...), from ... import runtime
