"""Layouts: ONNX tensors that are a reshaped and transposed legionpy tensor.

PyTorch exports ``nn.MultiheadAttention`` time-major and with the batch
merged into the heads: ``(N, S, D) -> (S, N, D) -> (S, N*h, d) -> (N*h, S,
d) -> (N, h, S, d)`` and back. legionpy tensors keep the batch first, so the
importer describes such an ONNX tensor as a :class:`Lay` over a batch-first
``base`` ref: the base's dims are factored into *atoms* (``dims``), and
each ONNX axis is a group of atoms (``groups``), i.e. the ONNX tensor is
``reshape(transpose(reshape(base, atoms), order), group sizes)``.

Transpose, Reshape, Squeeze and Unsqueeze only rearrange the groups
(splitting atoms where a Reshape divides one); element-wise ops, a
contraction over the last ONNX axis (MatMul with weights, Gemm), Softmax
and LayerNormalization apply to the base directly when the last ONNX axis
is the base's last dim; everything else *materialises* the layout: one
``reshape -> transpose -> reshape`` of the base into the ONNX axis order,
the batch pulled in front (legionpy ``reshape``/``transpose`` ops). For the
attention above this gives exactly the batch-first graph of
:meth:`legionpy.optimizer.Graph.multihead_attention`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..ops import TensorRef
from .onnx_import import Unsupported

__all__ = ["Lay", "lay", "value", "materialize", "as_last_dim", "relayout", "take",
           "reshape", "resolve_target", "transpose", "squeeze", "unsqueeze"]

_ids = itertools.count()


@dataclass
class Lay:
    """ONNX tensor over ``base``: ``dims[d]`` are the atoms of base dim ``d``,
    ``groups[j]`` the atoms of ONNX axis ``j``, ``size`` atom -> extent.
    ``dims[0]`` is the batch atom alone; atoms of size 1 may be in no group."""

    base: TensorRef
    dims: list
    groups: list
    size: dict

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(math.prod(self.size[a] for a in g) for g in self.groups)

    @property
    def ndim(self) -> int:
        return len(self.groups)

    @property
    def batch(self) -> int:
        return self.dims[0][0]

    @property
    def canonical(self) -> bool:
        return self.groups == self.dims


def lay(v: TensorRef | Lay) -> Lay:
    """The Lay of a value (a plain ref: one atom per dim, groups = dims)."""
    if isinstance(v, Lay):
        return v
    atoms = [next(_ids) for _ in v.shape]
    return Lay(v, [[a] for a in atoms], [[a] for a in atoms], dict(zip(atoms, v.shape)))


def value(x: Lay) -> TensorRef | Lay:
    """A plain ref when the layout is the base's own."""
    return x.base if x.canonical else x


def relayout(x: Lay, base: TensorRef, last: int | None = None) -> Lay:
    """The same layout over a new ``base`` of the same shape (an element-wise
    result), or with the last dim replaced by a new atom of extent ``last``."""
    if last is None:
        return Lay(base, x.dims, x.groups, x.size)
    p = next(_ids)
    old = x.dims[-1]
    return Lay(base, x.dims[:-1] + [[p]], [g for g in x.groups[:-1]] + [[p]],
               {**x.size, p: last}) if x.groups[-1] == old else _bad(x)


def _bad(x: Lay):
    raise Unsupported(f"a contraction over an axis that is not the last dim of {x.shape}")


def transpose(x: Lay, perm) -> Lay:
    return Lay(x.base, x.dims, [x.groups[p] for p in perm], x.size)


def _split_atom(x: Lay, a: int, first: int) -> tuple[Lay, int, int]:
    """Factor atom ``a`` into ``first * rest`` (two new consecutive atoms)."""
    s = x.size[a]
    if s % first:
        raise Unsupported(f"a Reshape that splits an extent {s} by {first}")
    a1, a2 = next(_ids), next(_ids)
    size = {**x.size, a1: first, a2: s // first}

    def sub(lst):
        return [[b for c in g for b in ((a1, a2) if c == a else (c,))] for g in lst]

    return Lay(x.base, sub(x.dims), sub(x.groups), size), a1, a2


def resolve_target(x: Lay, target, export_batch: int | None) -> list[int]:
    """ONNX Reshape's target with 0 (copy) and -1 (infer) resolved; an
    extent computed at export time from another batch size (``export_batch``)
    is rescaled to the model's batch."""
    target = [int(v) for v in target]
    shape, t = x.shape, list(target)
    t = [shape[j] if v == 0 else v for j, v in enumerate(t)]
    n = x.size[x.batch]
    if export_batch and export_batch != n and t and t[0] == export_batch and \
            x.shape[0] == n and x.batch in x.groups[0]:
        t[0] = n  # the batch, as a number baked in at export (dynamo's views)
    known = math.prod(v for v in t if v != -1)
    fits = math.prod(shape) % known == 0 if -1 in t else known == math.prod(shape)
    if export_batch and export_batch != n and not fits:  # computed from the real shape: keep
        seq = [a for g in x.groups for a in g]
        before = math.prod(x.size[a] for a in seq[:seq.index(x.batch)])
        cum = 1
        for j, v in enumerate(t):
            if v != -1 and cum * v > before:
                if v % export_batch == 0:
                    t[j] = v // export_batch * n
                break
            cum *= max(v, 1)
    if -1 not in t and math.prod(t) != math.prod(shape) and \
            math.prod(t[1:]) * n == math.prod(shape):
        t[0] = n  # a batch fixed at export time (a symbolic input batch)
    if -1 in t:
        known = math.prod(v for v in t if v != -1)
        t[t.index(-1)] = math.prod(shape) // max(known, 1)
    if math.prod(t) != math.prod(shape):
        raise Unsupported(f"Reshape to {list(target)} of {shape}")
    return t


def reshape(x: Lay, target) -> Lay:
    """Regroup the atoms (in ONNX order) into axes of extents ``target``."""
    target = [int(v) for v in target]
    seq = [a for g in x.groups for a in g]
    groups, i = [], 0
    for t in target:
        g, prod = [], 1
        while prod < t:
            if i >= len(seq):
                raise Unsupported(f"Reshape to {list(target)} of {x.shape}")
            a = seq[i]
            s = x.size[a]
            if prod * s > t:
                if a == x.batch or t % prod or t // prod == 1:
                    raise Unsupported(f"Reshape to {list(target)} of {x.shape} (it splits "
                                      "the batch dim, or an extent unevenly)")
                x, a1, a2 = _split_atom(x, a, t // prod)
                seq[i:i + 1] = [a1, a2]
                continue
            g.append(a)
            prod *= s
            i += 1
        if prod != t:
            raise Unsupported(f"Reshape to {list(target)} of {x.shape}")
        while i < len(seq) and x.size[seq[i]] == 1 and seq[i] != x.batch:
            g.append(seq[i])
            i += 1
        groups.append(g)
    if i != len(seq) and any(x.size[a] != 1 for a in seq[i:]):
        raise Unsupported(f"Reshape to {list(target)} of {x.shape}")
    if not any(x.batch in g for g in groups):
        raise Unsupported("a Reshape that drops the batch dim")
    return Lay(x.base, x.dims, groups, x.size)


def squeeze(x: Lay, axes) -> Lay:
    if any(x.shape[a] != 1 or x.batch in x.groups[a] for a in axes):
        raise Unsupported(f"squeezing axes {list(axes)} of {x.shape}")
    return Lay(x.base, x.dims, [g for j, g in enumerate(x.groups) if j not in axes], x.size)


def unsqueeze(x: Lay, axes) -> Lay:
    groups = list(x.groups)
    for a in sorted(axes):
        groups.insert(a, [])
    return Lay(x.base, x.dims, groups, x.size)


def materialize(imp, node, x: Lay) -> Lay:
    """Rewrite the base into ONNX axis order (batch first, alone): returns a
    Lay whose base dims are ``[batch]`` then each ONNX group without it."""
    if x.canonical:
        return x
    n = x.batch
    new = [[n]] + [[a for a in g if a != n] for g in x.groups if [a for a in g if a != n]]
    if new == x.dims:
        return Lay(x.base, new, x.groups, x.size)
    seq = [a for d in x.dims for a in d]
    placed = [a for d in new for a in d]
    order = placed + [a for a in seq if a not in placed]  # ungrouped size-1 atoms last
    r, m = x.base, imp.model
    if len(seq) != len(x.dims):
        r = m.reshape(r, tuple(x.size[a] for a in seq[1:]), name=imp.name(node, ".atoms"))
    perm = tuple(seq.index(a) for a in order)
    if perm != tuple(range(len(perm))):
        r = m.transpose(r, perm, name=imp.name(node, ".order"))
    if len(order) != len(new):
        r = m.reshape(r, tuple(math.prod(x.size[a] for a in d) for d in new[1:]),
                      name=imp.name(node, ".merge"))
    return Lay(r, new, x.groups, x.size)


def as_last_dim(imp, node, x: Lay) -> Lay:
    """A layout whose last ONNX axis is the base's last dim (materialised
    if needed), for ops over the last axis."""
    if x.groups and x.groups[-1] == x.dims[-1] and x.batch not in x.groups[-1]:
        return x
    x = materialize(imp, node, x)
    if x.groups[-1] != x.dims[-1]:
        raise Unsupported(f"an op over the batch axis of {x.shape}")
    return x


def _fuse_atoms(x: Lay, atoms: list) -> Lay:
    """The atoms of one whole base dim (in its order) as a single new atom
    (a ShuffleNet channel shuffle, materialised, then split)."""
    a = next(_ids)
    size = {**x.size, a: math.prod(x.size[b] for b in atoms)}

    def sub(lst):
        return [[a] if g == atoms else [b for b in g if b not in atoms] for g in lst]

    return Lay(x.base, sub(x.dims), sub(x.groups), size)


def take(imp, node, x: Lay, axis: int, lo: int, hi: int, keep: bool) -> Lay:
    """ONNX ``x[..., lo:hi, ...]`` along ``axis`` (a slice op on the base);
    ``keep=False`` drops the axis (Gather of one index)."""
    if len(x.groups[axis]) != 1 or x.batch in x.groups[axis]:
        x = materialize(imp, node, x)
        if x.batch not in x.groups[axis] and x.groups[axis] in x.dims:
            x = _fuse_atoms(x, x.groups[axis])  # a whole base dim: one atom now
        if len(x.groups[axis]) != 1 or x.batch in x.groups[axis]:
            raise Unsupported(f"indexing axis {axis} of {x.shape} (the batch, or merged axes)")
    a = x.groups[axis][0]
    d = next(i for i, dd in enumerate(x.dims) if a in dd)
    if x.dims[d][0] != a:
        x = materialize(imp, node, x)
        d = next(i for i, dd in enumerate(x.dims) if a in dd)
    inner = math.prod(x.size[b] for b in x.dims[d][1:])
    if (lo, hi) == (0, x.size[a]):
        return x
    r = imp.model.slice(x.base, d, lo * inner, hi * inner, name=imp.name(node))
    b = next(_ids)
    size = {**x.size, b: hi - lo}
    dims = [[b if c == a else c for c in dd] for dd in x.dims]
    groups = [[b if c == a else c for c in g] for g in x.groups]
    if not keep:
        groups.pop(axis)
    return Lay(r, dims, groups, size)
