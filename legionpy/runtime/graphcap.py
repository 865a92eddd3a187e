"""What CUDA graphs (runtime/graphs.py) need from the GPU backend and from
the instances.

Capture backends: :class:`EmuCapture` (runtime/emugraph.py, the emulated
GPUs) and :class:`CupyCapture` (``cupy.cuda.Stream.begin_capture`` /
``end_capture``, ``cupy.cuda.Graph.launch``; allocations during a capture
come from a private pool kept for the graph's life through
``cupy.cuda.using_allocator``, since the graph writes them at every
launch). Each offers ``capture(k, stream, run) -> (graph, keep)``,
``launch(graph, stream, k)`` and, where the backend can tell, ``probe(k,
run)``: the host synchronisation a capture of ``run`` would refuse.

Reduction buffers (docs/memory.md): :func:`take_out` and :func:`reclaim` put
the array a graph captured back in place of the one the pool would hand out;
:func:`buffer_keys` lists the buffers a body accumulates into or folds from.
"""

from __future__ import annotations

from typing import Any

from ..errors import GraphCaptureError
from .body import PointBody

__all__ = ["EmuCapture", "CupyCapture", "take_out", "reclaim", "buffer_keys", "cuda_refusal"]


def cuda_refusal(exc: BaseException) -> str | None:
    """Why CUDA (through CuPy) refused work while a stream captured, or None
    for any other error: a ``CUDARuntimeError`` of the stream-capture family
    (``cudaErrorStreamCapture*``: a host synchronisation, a wait on uncaptured
    work, an invalidated capture), CuPy's own refusal of a host transfer
    (``RuntimeError: the current stream is capturing, ...``) or of a
    library call (``NotImplementedError: calling cuBLAS API during stream
    capture is currently unsupported``, CuPy 14)."""
    text = str(exc)
    if type(exc).__name__ == "CUDARuntimeError" and "StreamCapture" in text:
        return text
    if isinstance(exc, RuntimeError) and "is capturing" in text:
        return text
    if isinstance(exc, NotImplementedError) and "during stream capture" in text:
        return text
    return None


def take_out(inst: Any, buf: Any, memory: int) -> Any:
    """Take array ``buf`` out of the buffer pool of ``inst`` (runtime/
    instances.py) if it is free there, its last user waited for
    (``streams.BufferPool.take_this``). Returns the pool entry, or None
    when it is not free."""
    return inst.pool.take_this(memory, buf)


def reclaim(inst: Any, key: Any, buf: Any, rect: Any, memory: int) -> bool:
    """Install ``buf`` as reduction buffer ``key`` over ``rect`` when it is
    free in the pool: what ``Instances.reduction_view`` does with a pooled
    buffer, with the graph's array instead of the last one freed. The graph
    refills it with the identity (the capture made it)."""
    if take_out(inst, buf, memory) is None:
        return False
    inst.redbufs[key] = (buf, rect)
    inst.redmem[key] = memory
    inst._account(memory, buf.nbytes, "reduction")
    return True


def buffer_keys(body: PointBody) -> list:
    """The reduction buffers a body accumulates into or folds from."""
    keys = [buf[0] for _, _, specs in body.views or () for _, _, _, buf in specs
            if buf is not None]
    for _, _, acts in body.prologues or ():
        keys += [a.buffer for a in acts if getattr(a, "buffer", None) is not None
                 and getattr(a, "staged", None) is None]
    return keys


class EmuCapture:
    """runtime/emugraph.py: the emulated GPUs' streams, capture and graphs."""

    def __init__(self) -> None:
        from . import emugpu, emugraph
        self.emu, self.g = emugpu, emugraph

    def capture(self, k: int, stream: Any, run: Any) -> tuple[Any, list]:
        g = self.g
        with self.emu.Device(k):
            g.begin_capture(stream, k)
            try:
                run()
            except BaseException:
                g.abort()
                raise
            return g.end_capture(stream), []

    can_probe = True

    @staticmethod
    def unsupported() -> str | None:
        return None

    @staticmethod
    def refusal(exc: BaseException) -> str | None:
        """The emulation refuses with GraphCaptureError (runtime/emugraph.py)."""
        return str(exc) if isinstance(exc, GraphCaptureError) else None

    def probe(self, k: int, run: Any) -> str | None:
        """Run ``run()`` live; the first host sync a capture would refuse."""
        with self.emu.Device(k):
            return self.g.probe(run)

    def launch(self, graph: Any, stream: Any, k: int) -> None:
        graph.launch(stream)


class CupyCapture:
    """CuPy: ``Stream.begin_capture`` / ``end_capture``, ``Graph.launch``.
    Allocations during a capture come from a private pool and are kept for
    the graph's life (``cupy.cuda.using_allocator``): the graph writes them."""

    can_probe = False  # CUDA has no way to ask; a failed capture runs its bodies again
    refusal = staticmethod(cuda_refusal)
    _why: Any = ()  # unsupported(), once per process: () not asked yet

    def __init__(self) -> None:
        import cupy
        self.cp = cupy

    def unsupported(self) -> str | None:
        """Why CuPy cannot capture a matrix product (cuBLAS), which nearly
        every task issues, or None. CuPy 14.2 refuses every cuBLAS call
        during a capture (NotImplementedError, seen on an H100; cupy/cupy
        issue 6290): each task would then fail its capture and run live, so
        graphs would add captures and save nothing. Asked once, by capturing
        one small product on a scratch stream."""
        cls = type(self)
        if cls._why == ():
            cls._why = self._try_cublas()
        return cls._why

    def _try_cublas(self) -> str | None:
        cp = self.cp
        try:
            a = cp.ones((16, 16), cp.float32)
            out = cp.empty_like(a)
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                s.begin_capture()
                try:
                    cp.matmul(a, a, out=out)
                finally:
                    graph = s.end_capture()
            graph.launch(stream=s)
            s.synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure: no graphs, said why
            return (f"CuPy {cp.__version__} cannot capture a cuBLAS call "
                    f"({type(exc).__name__}: {exc})")
        return None

    def capture(self, k: int, stream: Any, run: Any) -> tuple[Any, list]:
        cp = self.cp
        pool = cp.cuda.MemoryPool()
        keep: list = []

        def malloc(nbytes: int) -> Any:
            p = pool.malloc(nbytes)
            keep.append(p)
            return p
        with cp.cuda.Device(k), stream, cp.cuda.using_allocator(malloc):
            stream.begin_capture()
            try:
                run()
            except cp.cuda.runtime.CUDARuntimeError as exc:
                _end_quietly(stream)
                raise GraphCaptureError(f"CUDA refused work during capture: {exc}") from exc
            except BaseException:
                _end_quietly(stream)
                raise
            try:
                graph = stream.end_capture()
            except cp.cuda.runtime.CUDARuntimeError as exc:
                raise GraphCaptureError(f"the capture was invalidated: {exc}") from exc
        return graph, keep + [pool]

    def launch(self, graph: Any, stream: Any, k: int) -> None:
        with self.cp.cuda.Device(k):
            graph.launch(stream=stream)


def _end_quietly(stream: Any) -> None:
    try:
        stream.end_capture()
    except Exception:  # noqa: BLE001 - the capture is being abandoned anyway
        pass
