"""Suite-wide setup.

Hermetic: the suite never reads or writes the user's cache or home. Before
legionpy is imported, everything that persists between runs is pointed at
one fresh temporary folder per test session (``LEGIONPY_TEST_TMP`` chooses
where it is made; `.ci/run` sets it and checks afterwards that the folder
was used, that ``~/.cache/legionpy`` was not touched and that nothing was
written under the run's fresh ``$HOME/.cache``):

- ``LEGIONPY_CACHE``: calibrations, measured kernel costs, search caches;
- ``MPLCONFIGDIR``: matplotlib's font cache and config;
- ``XDG_CACHE_HOME``: other libraries' caches (onnxruntime writes a device
  id and a database under ``~/.cache/Microsoft`` on its first session);
- hypothesis's example database (off: every run draws the same examples
  from its seed, not from what an earlier run found).

Subprocesses the tests start (the CLI, ``mpirun``) inherit the variables.
A test that needs a warm cache builds it inside that folder.

Shared test helper modules live beside the tests that use them most
(tests/unit/simhelpers.py, kernel_refs.py; tests/runtime/tiny_models.py);
they are importable from every tier, also when one tier runs alone.
"""

import os
import signal
import sys
import tempfile
from pathlib import Path

# A suite started in the background by a non-interactive shell (`cmd &`)
# inherits an ignored SIGINT, which legionpy rightly leaves alone (Ctrl-C is
# then off) and which the CLI subprocesses would inherit too: the Ctrl-C
# tests need the default, so the suite restores it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SESSION_TMP = tempfile.mkdtemp(prefix="legionpy-tests-", dir=os.environ.get("LEGIONPY_TEST_TMP"))
os.environ["LEGIONPY_CACHE"] = os.path.join(SESSION_TMP, "cache")
os.environ["MPLCONFIGDIR"] = os.path.join(SESSION_TMP, "matplotlib")
os.environ["XDG_CACHE_HOME"] = os.path.join(SESSION_TMP, "xdg-cache")

try:
    from hypothesis import settings

    settings.register_profile("hermetic", database=None)
    settings.load_profile("hermetic")
except ImportError:  # hypothesis is in the test extra; tests that use it skip without
    pass

for tier in ("unit", "runtime"):
    path = str(Path(__file__).parent / tier)
    if path not in sys.path:
        sys.path.insert(0, path)

# Recorded GPU profiles shipped in legionpy/data/profiles change the default
# cost model of their presets: the suite tests behaviour, not which profiles
# ship, so it runs every preset analytic unless a test points
# LEGIONPY_PROFILES at a folder of its own (tests/unit/test_recorded_profiles.py).
os.environ["LEGIONPY_PROFILES"] = "off"
