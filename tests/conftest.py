"""Shared test helper modules live beside the tests that use them most
(tests/unit/simhelpers.py, kernel_refs.py; tests/runtime/tiny_models.py);
make them importable from every tier, also when one tier runs alone."""

import sys
from pathlib import Path

for tier in ("unit", "runtime"):
    path = str(Path(__file__).parent / tier)
    if path not in sys.path:
        sys.path.insert(0, path)
