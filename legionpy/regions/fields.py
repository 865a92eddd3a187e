"""Field spaces: the ordered, typed columns every point of a region holds.

A :class:`FieldSpace` maps field name -> ``numpy.dtype``. Fields hold numbers
(bool, integer, unsigned, float, complex) so that both numpy and cupy can store
them; anything else (``object``, strings, records, a name numpy does not know)
raises :class:`~legionpy.errors.FieldError` naming the field and the dtype.

>>> import numpy as np
>>> fs = FieldSpace({"x": np.float32, "n": "int64"})
>>> list(fs), fs["n"]
(['x', 'n'], dtype('int64'))
>>> fs.resolve(("n",))
('n',)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import FieldError

__all__ = ["FieldSpace"]

# numpy dtype kinds a field may have: bool, int, uint, float, complex.
_NUMERIC_KINDS = "biufc"


def _field_dtype(name: str, dtype: Any) -> np.dtype:
    if dtype is None:
        raise FieldError(f"field {name!r} has dtype None; give a numpy dtype such as np.float32")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise FieldError(
            f"field {name!r} has dtype {dtype!r}, which numpy cannot represent; "
            "give a numpy dtype such as np.float32"
        ) from exc
    if dt.kind == "O":
        raise FieldError(
            f"field {name!r} has dtype {dt!r}: object dtype is not allowed; "
            "fields must be numeric (bool, int, uint, float or complex)"
        )
    if dt.kind not in _NUMERIC_KINDS:
        raise FieldError(
            f"field {name!r} has dtype {dt!r} (kind {dt.kind!r}); fields must be numeric "
            "(bool, int, uint, float or complex) so numpy and cupy can store them"
        )
    return dt


class FieldSpace(Mapping[str, np.dtype]):
    """Ordered, immutable mapping ``field name -> numpy.dtype``.

    Built from a mapping or from ``(name, dtype)`` pairs; equality is by
    contents and order, and it is hashable.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any] | Iterable[tuple[str, Any]] | FieldSpace = ()):
        items = fields.items() if isinstance(fields, Mapping) else fields
        out: dict[str, np.dtype] = {}
        try:
            pairs = list(items)
        except TypeError as exc:
            raise FieldError(f"fields must be a mapping name -> dtype, got {fields!r}") from exc
        for pair in pairs:
            try:
                name, dtype = pair
            except (TypeError, ValueError) as exc:
                raise FieldError(f"fields must be (name, dtype) pairs, got {pair!r}") from exc
            if not isinstance(name, str) or not name:
                raise FieldError(f"field names must be non-empty strings, got {name!r}")
            if name in out:
                raise FieldError(f"field {name!r} appears twice")
            out[name] = _field_dtype(name, dtype)
        self._fields = out

    def __getitem__(self, name: str) -> np.dtype:
        try:
            return self._fields[name]
        except KeyError:
            raise FieldError(
                f"unknown field {name!r}; the fields are {list(self._fields)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FieldSpace):
            return list(self._fields.items()) == list(other._fields.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._fields.items()))

    @property
    def names(self) -> tuple[str, ...]:
        """Field names in declaration order."""
        return tuple(self._fields)

    def itemsize(self, name: str) -> int:
        """Bytes per point of one field."""
        return self[name].itemsize

    def resolve(self, names: Iterable[str], where: str = "") -> tuple[str, ...]:
        """Check ``names`` against this space; empty means every field.

        Raises FieldError naming the unknown field (and ``where``, e.g. the
        region) and listing the known ones.
        """
        names = tuple(names)
        if not names:
            return self.names
        for n in names:
            if n not in self._fields:
                loc = f" of {where}" if where else ""
                raise FieldError(
                    f"unknown field {n!r}{loc}; the fields are {list(self._fields)}"
                )
        return names

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v.name}" for k, v in self._fields.items())
        return f"FieldSpace({{{inner}}})"
