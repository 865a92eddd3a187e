"""The task decorator, launch options and privilege matching.

``@task(privileges=[...])`` wraps a function into a :class:`TaskFunction`;
calling it launches one task and returns a Future. Region arguments
(Region or Subregion; a Partition in an index launch) are matched to the
privilege entries positionally; an entry may be a PrivilegeSet
(``RW("x") + R("y")``). If the task takes exactly one region argument, all
entries apply to it, so ``privileges=[RW("x"), R("y")]`` with one region
``r`` means ``RW("x") + R("y")`` on ``r``.

Higher layers set a trace name, a kind and a mapper tag per launch without
touching task bodies::

    opts = LaunchOptions(name="conv1.fwd", kind="compute", tag=("conv1", "fwd"))
    fm = lp.index_launch(conv_fwd, P.colors, x_part, w, y_part, launch_options=opts)
    f = axpy(2.0, R, launch_options=LaunchOptions(kind="update"))

``launch_options`` is reserved as a keyword; everything else is passed to
the body. The mapper sees ``name``, ``kind`` and ``tag`` on its MapperTask;
the trace records them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PrivilegeError
from ..regions import Privilege, PrivilegeSet

__all__ = ["task", "TaskFunction", "LaunchOptions", "KINDS"]

KINDS = ("compute", "update", "collective")


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    """Per-launch ``name`` (trace name; default the task's), ``kind``
    (compute | update | collective: runtime/collectives.py), an opaque ``tag``
    for the mapper, and ``points``: when a launch covers some of a larger
    launch space's points (a pipeline's micro-batch, docs/pipeline.md), the
    index of each domain color in that space (the trace's ``launch`` field,
    which names the point task ``F:op[k]``); default the domain position."""

    name: str | None = None
    kind: str = "compute"
    tag: Any = None
    points: tuple | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"LaunchOptions.kind must be one of {KINDS}, got {self.kind!r}")


DEFAULT_OPTIONS = LaunchOptions()


class TaskFunction:
    """A function the runtime launches as a task. ``fn`` is the body."""

    def __init__(self, fn: Callable, privileges: Sequence[Privilege | PrivilegeSet],
                 name: str | None = None, kind: str = "compute") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "task")
        for p in privileges:
            if not isinstance(p, (Privilege, PrivilegeSet)):
                raise PrivilegeError(
                    f"task {self.name!r}: privileges must be R, RW, WD, Reduce(op) or sums "
                    f"of them, got {p!r}")
        self.privileges: tuple = tuple(privileges)
        self.options = LaunchOptions(self.name, kind)
        self._cache: dict[int, list[PrivilegeSet]] = {}
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def privileges_for(self, nregions: int) -> list[PrivilegeSet]:
        """The PrivilegeSet of each of ``nregions`` region arguments."""
        got = self._cache.get(nregions)
        if got is not None:
            return got
        privs = self.privileges
        if nregions == len(privs):
            out = [p if isinstance(p, PrivilegeSet) else PrivilegeSet((p,)) for p in privs]
        elif nregions == 1 and privs:
            out = [PrivilegeSet(tuple(q for p in privs for q in p.privileges))]
        else:
            raise PrivilegeError(
                f"task {self.name!r} was launched with {nregions} region argument(s) but "
                f"declares {len(privs)} privilege entr{'y' if len(privs) == 1 else 'ies'} "
                f"{list(privs)}; give one entry per region argument (or a PrivilegeSet such "
                "as RW('x') + R('y') for several fields of one argument)")
        self._cache[nregions] = out
        return out

    def __call__(self, *args: Any, launch_options: LaunchOptions | None = None,
                 **kwargs: Any) -> Any:
        from . import get_runtime as runtime

        return runtime().launch(self, args, kwargs, launch_options or self.options)

    def __repr__(self) -> str:
        return f"<task {self.name} privileges={list(self.privileges)}>"


def task(fn: Callable | None = None, *, privileges: Sequence = (), name: str | None = None,
         kind: str = "compute") -> Any:
    """Make ``fn`` a task: ``@task`` or ``@task(privileges=[RW("x"), R("y")])``.

    >>> import legionpy as lp
    >>> @lp.task
    ... def add(a, b):
    ...     return a + b
    >>> add(1, add(2, 3)).get()    # a Future argument waits for its producer
    6
    """
    if fn is None:
        return lambda f: TaskFunction(f, privileges, name, kind)
    return TaskFunction(fn, privileges, name, kind)
