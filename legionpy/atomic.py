"""Atomic file writes: checkpoints, strategies, traces and caches are written
to a temporary file in the same folder, flushed to disk, then renamed over
the target, so a crash mid-write leaves the previous file intact (DESIGN.md
invariant 6) and a concurrent reader never sees half a file.

>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "s.json")
>>> atomic_write_json(p, {"ok": True}); open(p).read()
'{"ok": true}'
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import IO, Any

__all__ = ["atomic_write", "atomic_write_json"]


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *,
                 binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it and
    rename it to ``path``; on any error the temporary file is removed and
    ``path`` is untouched."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any, **dump_options: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (``json.dump`` options pass through)."""
    atomic_write(path, lambda f: json.dump(obj, f, **dump_options))
