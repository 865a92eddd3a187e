"""Every example in legionpy's docstrings runs and prints what it shows.

The suite collects ``tests/`` only, so the package's doctests (the sharing
model's rates, the lock shares' arithmetic, the search space's configs...)
ran nowhere and two had gone stale unnoticed (28 Nov: a config list from
before two split dims were allowed, an example that needs a runtime).
Modules whose optional dependency is missing (CuPy, torch) are left out.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import legionpy

OPTIONAL = ("cupy", "torch", "numba", "onnx", "onnxruntime", "mpi4py", "nccl")


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(legionpy.__path__, "legionpy.")
                  if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", _modules())
def test_the_docstring_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if any(dep in str(exc) for dep in OPTIONAL):
            pytest.skip(f"{name} needs an optional dependency: {exc}")
        raise
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
