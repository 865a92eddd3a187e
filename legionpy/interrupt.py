"""Ctrl-C at a clean point: training and search stop between steps, never
in the middle of one.

Inside :func:`deferred_interrupt` the first SIGINT only sets a flag and
prints one line; the loop polls :meth:`StopFlag.agreed` at each step
boundary, finishes the step, saves what it was asked to save and raises
:class:`legionpy.errors.Interrupted` (a ``KeyboardInterrupt``), which the
``legionpy`` command turns into exit status 130. A second Ctrl-C raises
``KeyboardInterrupt`` at once.

Under ``mpirun`` every rank must stop after the same step (the ranks replay
the same program), so :meth:`StopFlag.agreed` combines the flags of all
ranks with a non-blocking ``MAX`` all-reduce started at one boundary and
read at the next: a Ctrl-C that reaches any rank stops every rank, one step
later, at the same step.

>>> with deferred_interrupt("demo") as stop:
...     stop.agreed()
False
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StopFlag", "deferred_interrupt"]


class StopFlag:
    """Whether Ctrl-C asked the loop to stop (``requested``: this rank;
    :meth:`agreed`: every rank's decision, the same on all of them)."""

    def __init__(self) -> None:
        self.requested = False
        self.stopped = False  # set by the loop that stopped on the agreed flag
        self._mpi: Any = None
        self._req: Any = None
        self._bufs: Any = None

    def agreed(self) -> bool:
        """Call at every step boundary, on every rank, the same number of
        times: True when the loop should stop here."""
        if self._mpi is None:
            from .runtime.mpi import launched_under_mpi

            self._mpi = False
            if launched_under_mpi():
                from .runtime.mpi import cluster

                c = cluster()
                if c.size > 1:
                    self._mpi = (c, c.world.Dup())
        if not self._mpi:
            return self.requested
        import numpy as np

        from .runtime.mpi import WAIT_BOUNDARY_NAP_S

        c, comm = self._mpi
        result = False
        if self._req is not None:
            c.wait([self._req], lambda: "the other ranks at a step boundary (Ctrl-C agreement)",
                   nap_max=WAIT_BOUNDARY_NAP_S)
            result = bool(self._bufs[1][0])
        self._bufs = (np.array([int(self.requested)], np.int32), np.zeros(1, np.int32))
        self._req = comm.Iallreduce(self._bufs[0], self._bufs[1], op=c.MPI.MAX)
        return result

    def close(self) -> None:
        """Complete the last all-reduce (every rank calls this at the same point)."""
        if self._mpi and self._req is not None:
            c, comm = self._mpi
            c.wait([self._req], lambda: "the other ranks at the end of the loop")
            self._req = None
            comm.Free()
            self._mpi = None


@contextmanager
def deferred_interrupt(what: str, when: str = "after this step") -> Iterator[StopFlag]:
    """Turn the first Ctrl-C into ``flag.requested = True`` while the block
    runs (main thread only; elsewhere the flag is never set). Nested blocks
    share the outermost flag (``train`` around its ``fit`` calls)."""
    global _active
    if _active is not None:
        yield _active
        return
    flag = _active = StopFlag()
    usable = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGINT) if usable else None
    if old in (signal.SIG_IGN, None):
        usable = False

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:  # the second Ctrl-C: stop now
            signal.signal(signal.SIGINT, old)
            raise KeyboardInterrupt
        flag.requested = True
        from .progress import RANK_VARS

        if any(os.environ.get(v, "0") != "0" for v in RANK_VARS):
            return  # rank 0 says it for the job
        print(f"\nlegionpy: Ctrl-C: {what} stops {when} (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)

    if usable:
        signal.signal(signal.SIGINT, handler)
    try:
        yield flag
        flag.close()
    finally:
        _active = None
        if usable:
            signal.signal(signal.SIGINT, old)


_active: StopFlag | None = None
