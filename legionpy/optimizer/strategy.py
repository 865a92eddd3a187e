"""Parallel configs and strategies (paper section 4: a configuration gives a
degree of parallelism per parallelizable dim and a device per task; a
strategy gives a configuration per operator).

``ParallelConfig(degrees, devices)``: ``degrees[d]`` tiles along output dim
``d`` (``Rect.split`` row-major), tile ``k`` runs on ``devices[k]``. Frozen
and hashable, so it keys caches.

Strategy files (DESIGN.md section 3)::

    {"ops": {"conv1": {"degrees": {"0": 4, "1": 1, "2": 1, "3": 1},
                       "devices": [0, 1, 2, 3]}, ...},
     "model": "alexnet", "machine": "p100:1x4"}

Writes are atomic (temp file + ``os.replace``), so a crash leaves the previous
file intact.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..atomic import atomic_write_json as _atomic_write_json
from ..errors import StrategyError
from ..pipeline import (
    Pipeline,
    cut_points,
    device_major,
    expand_config,
    max_microbatches,
    segment_cuts,
)

__all__ = ["ParallelConfig", "Strategy", "atomic_write_json", "largest_divisor",
           "megatron_pairs"]


def atomic_write_json(path: str, obj) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    _atomic_write_json(path, obj, indent=1)


def largest_divisor(n: int, at_most: int) -> int:
    """Largest ``k <= at_most`` dividing ``n``."""
    for k in range(min(n, at_most), 0, -1):
        if n % k == 0:
            return k
    return 1


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees per output dim and one device per tile (row-major tiles).

    ``reduce`` (issue 18): the op's *reduction* dim (a dense layer's input
    features, a convolution's input channels, an embedding's vocabulary;
    :meth:`Operator.reduce_extent`) is split ``reduce`` ways too:
    every output tile ``k`` has ``reduce`` points ``(k, r)`` -- point ``m =
    k * reduce + r`` on ``devices[m]`` -- each computing a partial result
    from slice ``r`` of the reduction dim; the output tile is their sum, a
    ``Reduce("+")`` (Megatron-LM's row-parallel layer)."""

    degrees: tuple[int, ...]
    devices: tuple[int, ...]
    reduce: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", tuple(int(k) for k in self.degrees))
        object.__setattr__(self, "devices", tuple(int(k) for k in self.devices))
        object.__setattr__(self, "reduce", int(self.reduce))
        if any(k < 1 for k in self.degrees) or self.reduce < 1:
            raise StrategyError(f"degrees {self.degrees} and reduce {self.reduce} must all "
                                "be >= 1")
        n = math.prod(self.degrees) * self.reduce
        if n != len(self.devices):
            what = f"{n} tiles" if self.reduce == 1 else \
                f"{n} points with reduce {self.reduce}"
            raise StrategyError(f"degrees {self.degrees} make {what} but "
                                f"{len(self.devices)} devices were given: {self.devices}")

    @property
    def num_tiles(self) -> int:
        return len(self.devices)

    @classmethod
    def single(cls, ndim: int, device: int = 0) -> ParallelConfig:
        return cls((1,) * ndim, (device,))

    @classmethod
    def along(cls, ndim: int, dim: int, degree: int, devices) -> ParallelConfig:
        deg = [1] * ndim
        deg[dim] = degree
        return cls(tuple(deg), tuple(devices)[:degree])

    def validate(self, op, machine=None) -> None:
        """Raise StrategyError naming the op, dim, degree or device at fault."""
        shape = op.output_shape
        if len(self.degrees) != len(shape):
            raise StrategyError(f"op {op.name!r}: config has {len(self.degrees)} degrees "
                                f"{self.degrees} but the output has {len(shape)} dims {shape}")
        for d, (k, n) in enumerate(zip(self.degrees, shape)):
            if k > 1 and op.dims[d] is None:
                raise StrategyError(f"op {op.name!r} ({op.kind}): dim {d} is not "
                                    f"parallelizable but has degree {k} (dims {op.dims})")
            if n % k:
                raise StrategyError(f"op {op.name!r}: degree {k} does not divide dim {d} "
                                    f"of size {n} (output {shape})")
        if self.reduce > 1:
            ext = op.reduce_extent()
            if not ext or ext % self.reduce:
                raise StrategyError(
                    f"op {op.name!r} ({op.kind}): reduce {self.reduce} " + (
                        f"does not divide its reduction dim of size {ext}" if ext else
                        "is not allowed: it has no reduction dim to split (dense layers and "
                        "ungrouped convolutions without a fused activation, and embeddings, "
                        "have one)"))
        if machine is not None:
            nd = machine.num_devices
            if self.devices and 0 <= min(self.devices) and max(self.devices) < nd:
                return
            for dev in self.devices:
                if not 0 <= dev < nd:
                    raise StrategyError(f"op {op.name!r}: device id {dev} is outside machine "
                                        f"{machine.name!r} (0..{machine.num_devices - 1})")

    def to_dict(self) -> dict:
        d = {"degrees": {str(d): k for d, k in enumerate(self.degrees)},
             "devices": list(self.devices)}
        if self.reduce > 1:
            d["reduce"] = self.reduce
        return d

    def points(self, op) -> list:
        """``(output tile, r)`` of every point, in point order (``m = k *
        reduce + r``)."""
        return [(t, r) for t in op.output_rect.split(self.degrees) for r in range(self.reduce)]

    @classmethod
    def from_dict(cls, d: Mapping, ndim: int | None = None, name: str = "?") -> ParallelConfig:
        try:
            degs = {int(k): int(v) for k, v in d["degrees"].items()}
            devices = tuple(int(x) for x in d["devices"])
            red = int(d.get("reduce", 1))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StrategyError(f"op {name!r}: bad config {d!r} ({e}); expected "
                                f'{{"degrees": {{dim: n}}, "devices": [ids]}}') from None
        n = ndim if ndim is not None else (max(degs) + 1 if degs else 1)
        if any(k >= n or k < 0 for k in degs):
            raise StrategyError(f"op {name!r}: degrees name dims {sorted(degs)} but the "
                                f"output has {n} dims")
        return cls(tuple(degs.get(i, 1) for i in range(n)), devices, red)


class Strategy(Mapping[str, ParallelConfig]):
    """A config per op name; a read-only mapping plus ``with_config``.

    ``pipeline`` (a :class:`legionpy.pipeline.Pipeline`, or None): stages,
    their device blocks, micro-batches and schedule (docs/pipeline.md); the
    per-op configs then give each stage's data/tensor degrees inside its
    block, and :meth:`micro` the configs both halves run (micro-batches as
    tiles). On the class, ``Strategy.pipeline(graph, machine, ...)`` builds
    the even-cut pipeline baseline."""

    def __init__(self, configs: Mapping[str, ParallelConfig], model: str | None = None,
                 machine: str | None = None, pipeline: Pipeline | None = None) -> None:
        self._configs = dict(configs)
        self.model, self.machine = model, machine
        self.pipeline = pipeline  # an instance attribute: shadows the classmethod
        self._micro: Strategy | None = None

    def __getitem__(self, name: str) -> ParallelConfig:
        try:
            return self._configs[name]
        except KeyError:
            raise StrategyError(f"the strategy has no config for op {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._configs)

    def __len__(self) -> int:
        return len(self._configs)

    def __eq__(self, other) -> bool:
        return (isinstance(other, Strategy) and self._configs == other._configs
                and self.pipeline == other.pipeline)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._configs.items())), self.pipeline))

    def with_config(self, name: str, config: ParallelConfig) -> Strategy:
        c = dict(self._configs)
        c[name] = config
        return Strategy(c, self.model, self.machine, self.pipeline)

    def with_pipeline(self, pipeline: Pipeline | None) -> Strategy:
        return Strategy(self._configs, self.model, self.machine, pipeline)

    def validate(self, graph, machine) -> None:
        """Every op configured, every config valid, no config for unknown ops;
        a pipeline's stages, micro-batches and schedule valid."""
        for name in self._configs:
            if name not in graph:
                raise StrategyError(f"the strategy has a config for op {name!r}, which graph "
                                    f"{graph.name!r} lacks")
        for op in graph.ops:
            if op.name not in self._configs:
                raise StrategyError(f"the strategy has no config for op {op.name!r}")
            self._configs[op.name].validate(op, machine)
        if self.pipeline is not None:
            self.pipeline.validate(graph, self._configs, machine.num_devices)

    def micro(self, graph) -> Strategy:
        """The configs both halves run: without a pipeline, ``self``; with
        one, every op's sample degree times the micro-batch count, the
        devices repeated (:func:`legionpy.pipeline.expand_config`), and no
        ``pipeline`` (the caller keeps ``self.pipeline``: the schedule)."""
        if self.pipeline is None:
            return self
        if self._micro is None:
            m = self.pipeline.microbatches
            major = device_major(graph, self)
            self._micro = Strategy({op.name: ParallelConfig(*expand_config(op, self[op.name], m,
                                                                           major))
                                    for op in graph.ops}, self.model, self.machine)
        return self._micro

    # -- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"ops": {k: c.to_dict() for k, c in self._configs.items()},
             "model": self.model, "machine": self.machine}
        if self.pipeline is not None:
            d["pipeline"] = self.pipeline.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping, graph=None) -> Strategy:
        if not isinstance(d, Mapping) or "ops" not in d:
            raise StrategyError('a strategy file must be a JSON object with an "ops" field')
        configs = {}
        for name, c in d["ops"].items():
            ndim = len(graph.op(name).output_shape) if graph is not None and name in graph \
                else None
            configs[name] = ParallelConfig.from_dict(c, ndim, name)
        pipe = d.get("pipeline")
        return cls(configs, d.get("model"), d.get("machine"),
                   None if pipe is None else Pipeline.from_dict(pipe))

    def save(self, path: str) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str, graph=None) -> Strategy:
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f), graph)
        except json.JSONDecodeError as e:
            raise StrategyError(f"{path}: not valid JSON ({e})") from None

    def named_as(self, graph, machine) -> str | None:
        """The name in :data:`NAMED` whose strategy this one is on ``graph``
        and ``machine`` (what a search picked, in a user's words), or None."""
        for name in NAMED:
            try:
                if type(self).resolve(name, graph, machine) == self:
                    return name
            except Exception:  # noqa: BLE001 - a named strategy that does not fit
                continue
        return None

    # -- constructors ------------------------------------------------------------
    @classmethod
    def resolve(cls, spec, graph, machine) -> Strategy:
        """A strategy from what a user typed: a Strategy (validated), a name in
        :data:`NAMED` (``data``, ``model``, ``owt``, ``expert``) or a JSON path.
        ``search`` is not resolved here (it needs the search package)."""
        if isinstance(spec, Strategy):
            strategy = spec
        elif isinstance(spec, str) and spec in NAMED:
            strategy = getattr(cls, NAMED[spec])(graph, machine)
        elif isinstance(spec, (str, os.PathLike)) and os.path.exists(spec):
            strategy = cls.load(os.fspath(spec), graph)
        else:
            raise StrategyError(
                f"strategy {spec!r} is neither a Strategy, one of {sorted(NAMED)} "
                f"(or 'search'), nor an existing JSON file")
        strategy.validate(graph, machine)
        return strategy

    @classmethod
    def expert(cls, graph, machine) -> Strategy:
        """The expert baseline of the paper: ``rnn_expert`` for graphs with
        recurrent cells, ``owt`` (one weird trick) otherwise."""
        if any(op.kind == "lstm" for op in graph.ops):
            return cls.rnn_expert(graph, machine)
        return cls.owt(graph, machine)

    @classmethod
    def data_parallel(cls, graph, machine, num_devices: int | None = None) -> Strategy:
        """Split every op's sample dim over the first ``num_devices`` devices (by
        the largest degree that divides the batch). Ops whose sample dim cannot
        be split (a batch smaller than the device count) split their first
        parallelizable dim instead."""
        n = num_devices or machine.num_devices
        devs = list(range(n))
        out = {}
        for op in graph.ops:
            out[op.name] = split_first(op, ("sample", "parameter", "attribute"), devs)
        return cls(out, graph.name, machine.name)

    @classmethod
    def single_device(cls, graph, machine) -> Strategy:
        """Every op whole on the first device: the baseline that more
        devices must beat. On a CPU of a few cores the interpreter lock
        makes it the fastest for small models (lenet on 2 cores: 2.8 ms per
        step on one device, 4.6-6.8 ms data-parallel on two)."""
        return cls({op.name: ParallelConfig.single(len(op.output_shape), 0)
                    for op in graph.ops}, graph.name, machine.name)

    @classmethod
    def hybrid(cls, graph, machine) -> Strategy:
        """Data parallel across nodes, tensor parallel inside each: an op
        whose sample dim divides by the node count ``N`` and whose parameter
        dim (after it) by the GPUs per node ``G`` gets degrees ``N`` and
        ``G`` (tile ``(m, j)`` on GPU ``j`` of node ``m``); every other op is
        data parallel. Every node does the same work and only the weight
        collectives cross nodes (node-symmetric: docs/seam.md section 4)."""
        n = machine.num_devices
        N = machine.num_nodes
        G = n // N
        devs = list(range(n))
        out = {}
        for op in graph.ops:
            dims, shape = op.dims, op.output_shape
            s = dims.index("sample") if "sample" in dims else None
            p = dims.index("parameter") if "parameter" in dims else None
            if (N > 1 and G > 1 and s is not None and p is not None and s < p
                    and shape[s] % N == 0 and shape[p] % G == 0):
                degs = [1] * len(shape)
                degs[s], degs[p] = N, G
                out[op.name] = ParallelConfig(tuple(degs), tuple(devs))
            else:
                out[op.name] = split_first(op, ("sample", "parameter", "attribute"), devs)
        return cls(out, graph.name, machine.name)

    @classmethod
    def model_parallel(cls, graph, machine, num_devices: int | None = None) -> Strategy:
        """Split every op's parameter dim (else an attribute dim) over the devices;
        ops with neither run whole on device 0."""
        devs = list(range(num_devices or machine.num_devices))
        out = {}
        for op in graph.ops:
            out[op.name] = split_first(op, ("parameter", "attribute"), devs)
        return cls(out, graph.name, machine.name)

    @classmethod
    def owt(cls, graph, machine, num_devices: int | None = None) -> Strategy:
        """Krizhevsky's "one weird trick": data-parallel everywhere except dense
        layers, which split their parameter dim."""
        devs = list(range(num_devices or machine.num_devices))
        out = {}
        for op in graph.ops:
            order = ("parameter", "sample") if op.kind == "dense" else (
                "sample", "parameter", "attribute")
            out[op.name] = split_first(op, order, devs)
        return cls(out, graph.name, machine.name)

    @classmethod
    def rnn_expert(cls, graph, machine) -> Strategy:
        """The paper's RNN expert strategy: data parallel across nodes, each
        layer (ops sharing parameters) on its own GPU within a node, round
        robin; ops without parameters follow their first input's layer."""
        layer_of: dict[str, int] = {}
        groups: dict[int, int] = {}
        for op in graph.ops:
            if op.params:
                pid = id(next(iter(op.params.values())))
                layer_of[op.name] = groups.setdefault(pid, len(groups))
            elif op.inputs:
                layer_of[op.name] = layer_of[op.inputs[0].op.name]
            else:
                layer_of[op.name] = 0
        nodes = sorted({d.node for d in machine.devices})
        per_node = [machine.devices_of_node(n) for n in nodes]
        out = {}
        for op in graph.ops:
            devs = [p[layer_of[op.name] % len(p)] for p in per_node]
            out[op.name] = split_first(op, ("sample", "parameter"), devs)
        return cls(out, graph.name, machine.name)

    @classmethod
    def pipeline(cls, graph, machine, stages: int | None = None,  # noqa: F811
                 microbatches: int | None = None, schedule: str = "1f1b",
                 recompute=()) -> Strategy:
        """The even-cut pipeline baseline (docs/pipeline.md): ``stages``
        (default: the machine's nodes, or its devices on one node) contiguous
        ranges of graph order, starting where one tensor crosses
        (:func:`legionpy.pipeline.cut_points`), with about equal simulated
        compute (the default cost model on device 0), stage ``s`` on the ``s``-th equal
        block of devices, data parallel inside it, ``microbatches`` (default:
        the largest divisor of the batch <= 4 x stages that leaves every
        device of a block a sample, and at most
        :func:`legionpy.pipeline.max_microbatches`) under ``schedule``."""
        from .costmodel import default_cost_model

        D = machine.num_devices
        S = stages or (machine.num_nodes if machine.num_nodes > 1 else D)
        S = min(S, len(graph.ops))
        if S < 1 or D % S:
            raise StrategyError(f"{S} pipeline stages do not divide the machine's {D} "
                                "devices into equal blocks")
        per = D // S
        batch = graph.batch_size
        if microbatches is None:
            top = min(4 * S, max_microbatches(graph, per))
            ok = [m for m in range(1, top + 1) if batch % m == 0 and batch // m >= per]
            microbatches = max(ok) if ok else 1
        cost, spec = default_cost_model(machine), machine.devices[0]
        weights = []
        for op in graph.ops:
            f, b = cost.op_time(op, op.output_rect, spec)
            weights.append(f + (b if op.has_backward else 0.0))
        cuts = segment_cuts(weights, S, cut_points(graph))
        return cls.staged(graph, machine, cuts, microbatches, schedule, recompute)

    @classmethod
    def staged(cls, graph, machine, cuts, microbatches: int, schedule: str = "1f1b",
               recompute=()) -> Strategy:
        """A pipelined strategy from ``cuts`` (``(first, last)`` op indices
        of each stage, in graph order): stage ``s`` on the ``s``-th equal
        block of the machine's devices, each op data parallel inside it (its
        sample dim split by the largest divisor of a micro-batch that the
        block allows; an op without one whole on the block's first device)."""
        per = machine.num_devices // len(cuts)
        batch, ops = graph.batch_size, graph.ops
        blocks = [tuple(range(s * per, (s + 1) * per)) for s in range(len(cuts))]
        out = {}
        for s, (a, z) in enumerate(cuts):
            for op in ops[a:z + 1]:
                nd = len(op.output_shape)
                sd = list(op.dims).index("sample") if "sample" in op.dims else None
                if sd is None or batch % microbatches:
                    out[op.name] = ParallelConfig.single(nd, blocks[s][0])
                    continue
                k = largest_divisor(op.output_shape[sd] // microbatches, per)
                out[op.name] = ParallelConfig.along(nd, sd, k, blocks[s][:k])
        pipe = Pipeline(tuple((ops[a].name, ops[z].name) for a, z in cuts), tuple(blocks),
                        microbatches, schedule, tuple(recompute))
        return cls(out, graph.name, machine.name, pipe)

    @classmethod
    def megatron(cls, graph, machine, num_devices: int | None = None) -> Strategy:
        """Megatron-LM's tensor parallelism for MLP blocks (Shoeybi et al. 2019,
        section 3): in every :func:`megatron_pairs` pair the first dense layer is
        split by output columns over the devices and the second by rows -- a
        reduction split (``ParallelConfig.reduce``) on the same devices, so row
        slice ``r`` reads column tile ``r`` where it lives and the partial
        outputs are summed (``Reduce("+")``); every other op is data parallel."""
        n = num_devices or machine.num_devices
        out = dict(cls.data_parallel(graph, machine, n))
        for first, second in megatron_pairs(graph):
            units = first.output_shape[-1]
            k = largest_divisor(units, n)
            if k < 2 or second.reduce_extent() % k:
                continue
            nd = len(first.output_shape)
            out[first.name] = ParallelConfig.along(nd, nd - 1, k, range(k))
            out[second.name] = ParallelConfig((1,) * len(second.output_shape), tuple(range(k)), k)
        return cls(out, graph.name, machine.name)


def megatron_pairs(graph) -> list[tuple]:
    """``(first, second)`` dense pairs of Megatron-LM's MLP: ``second`` has no
    fused activation (a reduction dim, :meth:`Operator.reduce_extent`) and
    reads ``first``'s output, which nothing else reads."""
    readers: dict[int, int] = {}
    for op in graph.ops:
        for r in op.inputs:
            readers[r.op.index] = readers.get(r.op.index, 0) + 1
    out = []
    for op in graph.ops:
        if op.kind == "dense" and op.reduce_extent() and op.inputs[0].view is None:
            first = op.inputs[0].op
            if first.kind == "dense" and readers.get(first.index) == 1:
                out.append((first, op))
    return out


def split_first(op, labels, devs) -> ParallelConfig:
    """Split the first dim whose label comes first in ``labels`` by the largest
    divisor of its size that is <= len(devs)."""
    nd = len(op.output_shape)
    for lab in labels:
        for d, dl in enumerate(op.dims):
            if dl == lab:
                k = largest_divisor(op.output_shape[d], len(devs))
                return ParallelConfig.along(nd, d, k, devs)
    return ParallelConfig.single(nd, devs[0])


#: strategy names a user can type -> Strategy constructor
NAMED = {"data": "data_parallel", "model": "model_parallel", "owt": "owt", "expert": "expert",
         "megatron": "megatron", "hybrid": "hybrid", "pipeline": "pipeline",
         "single": "single_device"}
