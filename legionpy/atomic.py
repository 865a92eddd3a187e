"""Atomic file writes: checkpoints, strategies, traces and caches are written
to a temporary file in the same folder, flushed to disk, then renamed over
the target, so a crash mid-write leaves the previous file intact (DESIGN.md
invariant 6) and a concurrent reader never sees half a file. The file gets
the mode ``open()`` would give it (0666 less the umask; an existing file
keeps its mode), not the temporary file's 0600.

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
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "atomic_write_json", "cache_dir"]


def cache_dir() -> Path:
    """Where legionpy keeps what it measured (calibrations, kernel costs,
    searched strategies): ``$LEGIONPY_CACHE``, default ``~/.cache/legionpy``.
    The one place that decides it; the test suite points it at a temporary
    folder (tests/conftest.py)."""
    return Path(os.environ.get("LEGIONPY_CACHE") or Path.home() / ".cache" / "legionpy")


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *,
                 binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it and
    rename it to ``path``; on any error the temporary file is removed and
    ``path`` is untouched."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1]
    if not os.path.isdir(folder):  # name the target, not the temporary file
        import errno

        raise FileNotFoundError(errno.ENOENT, f"folder {folder!r} does not exist; create it "
                                "first, or write somewhere else", path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=suffix)
    try:
        os.chmod(tmp, _mode(path))
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """This process's umask (read without changing it where Linux allows)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore
    os.umask(mask)
    return mask


def _mode(path: str) -> int:
    """The mode the file gets: an existing file's, else 0666 less the umask
    (0644 typically), as ``open(path, "w")`` would give it."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def atomic_write_json(path: str | os.PathLike, obj: Any, **dump_options: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (``json.dump`` options pass through)."""
    atomic_write(path, lambda f: json.dump(obj, f, **dump_options))
