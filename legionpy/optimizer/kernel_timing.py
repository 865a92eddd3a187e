"""Kernel timing: run the real tile kernels of an operator and time them.
(Named ``optimizer/profile.py`` before issue 23.)

:func:`tile_runner` is the ``runner`` of
:class:`~legionpy.optimizer.costmodel.MeasuredCostModel`: for one operator,
one output tile and one device it builds arrays of exactly the rects the
tile task holds at run time (inputs over ``op.input_rect``, halos included,
parameters over ``op.weight_rect``; see :mod:`legionpy.ops.execute`), runs
the forward once to fill the per-tile cache, and returns two zero-argument
callables: the tile's forward and its backward (``tile_forward`` /
``tile_backward``, the very functions the training tasks call). On a GPU
device the arrays are CuPy arrays on that GPU and each call synchronises
the device, so the timed region covers the kernels, not their launch
(CuPy through the runtime's GPU backend, so the emulated backend of
``LEGIONPY_GPU_BACKEND=emulated`` runs the same path without a GPU).

:func:`profile_model` measures every distinct tile a set of strategies needs
on the local machine's device kinds and returns the cost table
(``{cost_key: [forward_s, backward_s]}``), the input of
:class:`~legionpy.optimizer.costmodel.TableCostModel`.

>>> from legionpy.optimizer import Graph, Machine, Strategy
>>> from legionpy.optimizer.costmodel import MeasuredCostModel
>>> g = Graph(8); y = g.dense(g.input((16,)), 4)
>>> m = Machine.local(2)
>>> cm = MeasuredCostModel(tile_runner)
>>> f, b = cm.op_time(y.op, y.op.output_rect, m.devices[0])   # seconds, measured
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..geometry import Rect
from ..ops.execute import Tile, tile_backward, tile_forward
from .costmodel import MeasuredCostModel, cost_key
from .machine import DeviceSpec, Machine
from .strategy import Strategy

__all__ = ["tile_runner", "tile_arrays", "profile_model", "required_tiles"]


def _shape_of_input(op: Any, i: int, out: Rect) -> tuple[int, ...]:
    """Shape of the array input ``i`` of tile ``out`` arrives as (a view's
    fixed axis dropped, like :func:`legionpy.nn.execution._drop_axis`)."""
    ref = op.inputs[i]
    shape = tuple(ref.to_base(op.input_rect(i, out)).shape)
    if ref.view is not None:
        shape = shape[:ref.view[0]] + shape[ref.view[0] + 1:]
    return shape


def tile_arrays(op: Any, out: Rect, seed: int = 0) -> tuple[list[np.ndarray], dict]:
    """``(xs, ws)``: seeded numpy arrays of the shapes tile ``out`` of ``op``
    holds at run time (float inputs ~ N(0, 1), weights ~ N(0, 0.1), integer
    inputs of an embedding: ids inside its weight tile)."""
    rng = np.random.default_rng(seed)
    ws = {}
    for pname, p in op.params.items():
        shape = op.weight_rect(pname, out).shape
        ws[pname] = (0.1 * rng.standard_normal(shape)).astype(p.dtype)
    xs = []
    for i, ref in enumerate(op.inputs):
        shape = _shape_of_input(op, i, out)
        dt = np.dtype(ref.dtype)
        if op.kind == "embedding" or dt.kind in "iu":
            hi = ws["weight"].shape[0] if "weight" in ws else 2
            xs.append(rng.integers(0, max(hi, 1), shape).astype(dt))
        else:
            xs.append(rng.standard_normal(shape).astype(dt))
    return xs, ws


def _to_device(a: Any, device: DeviceSpec) -> Any:
    """``a`` on the current GPU for a GPU device (through the runtime's GPU
    backend: CuPy, or the emulated one of ``LEGIONPY_GPU_BACKEND=emulated``)."""
    if device.kind != "gpu":
        return a
    from ..runtime.gpu import backend

    return backend().asarray(a)


def _sync(device: DeviceSpec) -> Callable[[], None]:
    if device.kind != "gpu":
        return lambda: None
    from ..runtime.gpu import backend

    gpu = backend()
    return lambda: gpu.Device().synchronize()


def tile_runner(op: Any, out: Rect, device: DeviceSpec) -> tuple[Callable[[], Any],
                                                                  Callable[[], Any]]:
    """``(forward, backward)``: zero-argument callables running the real
    kernels of tile ``out`` of ``op`` on a device of ``device.kind`` (numpy
    on a CPU, CuPy on the current GPU). The backward reuses the cache of one
    forward run, so it can be called any number of times."""
    xs, ws = tile_arrays(op, out)
    xs = [_to_device(x, device) for x in xs]
    ws = {k: _to_device(v, device) for k, v in ws.items()}
    sync = _sync(device)
    need = [ref.op.has_backward for ref in op.inputs]
    buffers: dict = {}

    def tile() -> Tile:
        return Tile(out, xs, ws, training=True, step=0, need_dx=need, buffers=buffers)

    t0 = tile()
    y = tile_forward(op, t0)
    sync()
    rng = np.random.default_rng(1)
    dy = _to_device(rng.standard_normal(tuple(out.shape)).astype(op.dtype), device)

    def forward() -> Any:
        r = tile_forward(op, tile())
        sync()
        return r

    def backward() -> Any:
        r = tile_backward(op, t0, y, dy)
        sync()
        return r

    return forward, backward


def required_tiles(graph: Any, strategies: Iterable[Strategy]) -> list[tuple[Any, Rect]]:
    """Distinct ``(op, tile)`` pairs (by cost key shape) the strategies run,
    input operators excluded (their cost is a load, not a kernel)."""
    seen: set = set()
    out = []
    for s in strategies:
        for op in graph.ops:
            if op.kind == "input":
                continue
            for tile in op.output_rect.split(s[op.name].degrees):
                key = cost_key(op, tile, "")
                if key not in seen:
                    seen.add(key)
                    out.append((op, tile))
    return out


def profile_model(graph: Any, machine: Machine, strategies: Iterable[Strategy],
                  cost_model: MeasuredCostModel | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Measure every tile ``strategies`` need on each device kind of
    ``machine`` (one device per kind: costs are keyed by kind, not id).
    Returns ``{cost_key: [forward_s, backward_s]}`` for those tiles;
    ``cost_model`` (default: a fresh MeasuredCostModel with
    :func:`tile_runner` and no disk cache) keeps its cache."""
    cm = cost_model or MeasuredCostModel(tile_runner)
    if cm.runner is None:
        cm.runner = tile_runner
    kinds: dict[str, DeviceSpec] = {}
    for d in machine.devices:
        kinds.setdefault(d.kind, d)
    tiles = required_tiles(graph, strategies)
    table = {}
    n = len(tiles) * len(kinds)
    i = 0
    for dev in kinds.values():
        for op, tile in tiles:
            f, b = cm.op_time(op, tile, dev)
            table[cost_key(op, tile, dev.kind)] = [f, b]
            i += 1
            if progress is not None:
                progress(i, n, op.name)
    return table
