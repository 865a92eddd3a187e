"""Fixed machine-model figures for tests of a prediction's plumbing.

A command that predicts (``train``, ``simulate --compare``) reads this
machine's calibrated overhead from ``$LEGIONPY_CACHE``, calibrating first
when there is none (~50 s on the 2-core CI machine, ~90 s under
``mpirun``). A test that checks what the command prints or keeps, not the
calibration, seeds the figures instead (the suite keeps two full
calibrations: ``test_ctrl_c.py``'s, the session's one-process one, and
``tests/mpi/test_one_report.py``'s first test, under ``mpirun`` from an
empty cache).
"""

from __future__ import annotations

import json
import os

from legionpy.measure.calibration import _overhead_path
from legionpy.optimizer.fidelity import RuntimeOverhead
from legionpy.probe.hostspeed import quiet_reference, speed_probe

#: the seeded ``task_s``: a calibration would rewrite the file with its own
SEEDED_TASK_S = 5e-5


def seed_overhead(cache_dir: str | os.PathLike, machine_name: str = "local:2") -> str:
    """Write fixed figures where the calibration keeps ``machine_name``'s in
    the cache folder ``cache_dir`` (``local:2``: one process, two devices;
    ``local:2r2-bound``: ``mpirun -n 2`` with the ranks bound); the path."""
    ovh = RuntimeOverhead(launch_s=2e-5, copy_launch_s=5e-6, task_s=SEEDED_TASK_S, step_s=1e-4,
                          finish_s=1e-5, finish_copy_s=1e-5, cores=2, source="layer-api",
                          machine=machine_name.removesuffix("-bound"),
                          # the host's quiet speed, as a calibration keeps it
                          calibration={"host_probe_s": quiet_reference(
                              [speed_probe() for _ in range(20)])})
    path = os.path.join(str(cache_dir), os.path.basename(_overhead_path(machine_name)))
    os.makedirs(str(cache_dir), exist_ok=True)
    with open(path, "w") as f:
        json.dump(ovh.to_dict(), f)
    return path


def still_seeded(path: str) -> bool:
    """Whether the figures at ``path`` are still the seeded ones (no
    calibration replaced them)."""
    with open(path) as f:
        return json.load(f)["task_s"] == SEEDED_TASK_S
