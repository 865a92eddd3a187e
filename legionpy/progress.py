"""Progress bars (tqdm) on stderr, for a person watching: shown only when
stderr is a terminal, never with ``--json``, and only on MPI rank 0.

>>> enabled(as_json=True)
False
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["enabled", "bar", "Stages"]

RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def enabled(as_json: bool = False) -> bool:
    """Whether to draw bars: not ``--json``, stderr a terminal, MPI rank 0."""
    if as_json or not getattr(sys.stderr, "isatty", lambda: False)():
        return False
    return all(os.environ.get(v, "0") == "0" for v in RANK_VARS)


def bar(as_json: bool = False, **kwargs: Any) -> Any:
    """A ``tqdm`` on stderr (``kwargs`` pass through), or None when not :func:`enabled`."""
    if not enabled(as_json):
        return None
    from tqdm.auto import tqdm

    return tqdm(file=sys.stderr, **kwargs)


class Stages:
    """A bar over named stages of one long call (``simulate``: task graph,
    schedule): ``with Stages(["a", "b"], "simulate") as st: st("a") ...``.
    Does nothing when bars are off."""

    def __init__(self, names: list[str], desc: str, as_json: bool = False) -> None:
        self.names, self.desc = names, desc
        self.bar = bar(as_json, total=len(names), desc=desc, leave=False,
                       bar_format="{desc} [{elapsed}] {n_fmt}/{total_fmt}")
        self._started = False

    def __call__(self, name: str) -> None:
        if self.bar is None:
            return
        if self._started:
            self.bar.update(1)
        self._started = True
        self.bar.set_description_str(f"{self.desc}: {name}")

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
