"""Shared test helper modules live beside the tests that use them most
(tests/unit/simhelpers.py, kernel_refs.py; tests/runtime/tiny_models.py);
make them importable from every tier, also when one tier runs alone."""

import os
import sys
from pathlib import Path

for tier in ("unit", "runtime"):
    path = str(Path(__file__).parent / tier)
    if path not in sys.path:
        sys.path.insert(0, path)

# Recorded GPU profiles shipped in legionpy/data/profiles change the default
# cost model of their presets: the suite tests behaviour, not which profiles
# ship, so it runs every preset analytic unless a test points
# LEGIONPY_PROFILES at a folder of its own (tests/unit/test_profiles.py).
os.environ["LEGIONPY_PROFILES"] = "off"
