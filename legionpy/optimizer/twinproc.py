"""A tile kernel's twin in another process: the lock shares' control (issue 26).

:func:`legionpy.optimizer.lockshare.lock_share` reads a kernel's hold on its
process's interpreter lock from how much a second thread running the same
kernel slows it. Two threads of one process share more than the lock: the
cores, the caches and the memory system. A large kernel that releases the
lock throughout (alexnet's first convolution, an im2col copy and one GEMM
of 1-4 ms) was read slowed 1.0-1.4x beside its twin on the project's
2-core machine from one process to the next, and a ratio just over
``MIN_RATIO`` turned into a share of 0.55: the model then let it hold the
lock for half its time and predicted alexnet's model-parallel step 20.3 or
25.2 ms for one configuration (measured 20.2).

The same kernel running in *another process* shares all of that but the
lock. So :class:`TwinProcess` runs the twin there while the kernel is timed
again: the thread twin's slowdown over the process twin's is the lock's
alone, and a kernel slowed alike by both holds none of it (the control
every interference measurement needs: the same load with one factor
removed: Jain, "The Art of Computer Systems Performance Analysis",
1991, part IV, experimental design). Measured on alexnet's model-parallel tiles (28 Nov,
2-core machine): the first convolution's forward read 0.8-2.0x beside the
thread twin and 1.1-2.4x beside the process twin (the memory system, not
the lock); the middle convolutions 1.3-2.7x and 0.8-1.2x; the pools and
dense layers 2-6x and about 1x.

The helper is one ``python -m legionpy.optimizer.twinproc`` per process,
started on first use and kept until exit, fed pickled ``(op, rect,
device, phase)`` frames on its stdin: it builds the tile's kernel with
:func:`legionpy.optimizer.kernel_timing.tile_runner` (the very kernel the
parent times), answers ready, runs it in a loop until the next frame and
answers stopped; every answer carries the CPU seconds it has spent in all
(imports and kernel builds included), which the parent counts as its own
when it checks that nothing else kept the cores busy. It starts without
the MPI launcher's variables (it is no rank), with one BLAS thread, on the
cores the parent had when it was started.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from ..affinity import unbound

__all__ = ["TwinProcess", "TwinError", "child_env"]

#: environment variables of MPI launchers (MPICH's hydra, Open MPI, PMIx,
#: Slurm's PMI) a helper must not inherit: it would take itself for a rank
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_", "OMPI_", "MPI_LOCAL",
                      "I_MPI_", "SLURM_PMI")
#: how long a helper may take to import numpy and build a kernel
START_TIMEOUT_S = 60.0


class TwinError(RuntimeError):
    """The helper could not build or run the kernel it was sent."""


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) without an MPI launcher's
    variables and with one BLAS/OpenMP thread.

    >>> e = child_env({"PMI_RANK": "0", "HOME": "/h", "OMPI_COMM_WORLD_SIZE": "2"})
    >>> sorted(e)[:2], e["OMP_NUM_THREADS"]
    (['HOME', 'MKL_NUM_THREADS'], '1')
    """
    out = {k: v for k, v in (os.environ if env is None else env).items()
           if not k.startswith(_LAUNCHER_PREFIXES)}
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        out[k] = "1"
    return out


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _recv(stream: BinaryIO) -> Any:
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError("the twin process closed its pipe")
    (n,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(n))


class TwinProcess:
    """A helper process running one tile kernel at a time in a loop
    (module doc). ``with twin.running(op, rect, device, phase):`` the
    kernel runs there; :attr:`cpu_s`: the CPU seconds it has spent in all,
    as of its last answer (it idles between answers). Returns once the
    helper has started (its imports done)."""

    _shared: TwinProcess | None = None

    def __init__(self) -> None:
        self.cpu_s = 0.0
        with unbound():  # on the node's cores, not the one an MPI rank is bound to
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "legionpy.optimizer.twinproc"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env())
        atexit.register(self.close)
        self._answer()  # started: what it spent importing is counted from here on

    @classmethod
    def shared(cls) -> TwinProcess:
        """This process's helper, started on first use (restarted if it died)."""
        if cls._shared is None or cls._shared._proc.poll() is not None:
            cls._shared = cls()
        return cls._shared

    def _answer(self, timeout: float = START_TIMEOUT_S) -> Any:
        """The helper's next answer ``(what, its CPU seconds so far)``: the what."""
        out = self._proc.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            self.close()
            raise TimeoutError(f"the twin process did not answer in {timeout:.0f} s")
        what, self.cpu_s = _recv(out)
        return what

    @contextmanager
    def running(self, op: Any, rect: Any, device: Any, phase: int) -> Iterator[None]:
        """The kernel ``tile_runner(op, rect, device)[phase]`` running in a
        loop in the helper for the ``with`` block's duration."""
        _send(self._proc.stdin, (op, rect, device, phase))
        got = self._answer()
        if got != "ready":
            raise TwinError(f"the twin process could not run the kernel: {got}")
        try:
            yield
        finally:
            _send(self._proc.stdin, "stop")
            self._answer()

    def close(self) -> None:
        """Stop the helper (at exit; idempotent)."""
        p = self._proc
        if p.poll() is None:
            try:
                _send(p.stdin, None)
                p.wait(timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                p.kill()
                p.wait()
        if TwinProcess._shared is self:
            TwinProcess._shared = None


def _loop(fn: Any, stdin: BinaryIO) -> None:
    """Call ``fn`` until a frame waits on ``stdin`` (polled every ~0.5 ms)."""
    fd = stdin.fileno()
    polled = time.perf_counter()
    while True:
        fn()
        now = time.perf_counter()
        if now - polled >= 5e-4:
            polled = now
            if select.select([fd], [], [], 0)[0]:
                return


def main() -> None:
    """The helper's side: frames in on stdin, answers out on the original
    stdout (anything the kernels print goes to stderr)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    from threadpoolctl import threadpool_limits

    from .kernel_timing import tile_runner

    def answer(what: Any) -> None:
        _send(out, (what, time.process_time()))

    answer("up")
    with threadpool_limits(1):
        while True:
            try:
                msg = _recv(stdin)
            except EOFError:
                return
            if msg is None:
                return
            op, rect, device, phase = msg
            try:
                fn = tile_runner(op, rect, device)[phase]
                fn()
            except Exception as e:  # noqa: BLE001 - reported to the parent, which raises
                answer(f"{type(e).__name__}: {e}")
                continue
            answer("ready")
            _loop(fn, stdin)
            if _recv(stdin) != "stop":
                return
            answer("stopped")


if __name__ == "__main__":
    main()
