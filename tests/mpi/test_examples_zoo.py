"""Zoo examples under ``mpirun -n 2`` (one CPU device per rank) print the
same losses as one process with 2 devices: the strategy sees the same two
devices, and control replication makes the ranks one program."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .mpirun import REPO, run_mpi

pytestmark = pytest.mark.mpi


def _losses(text: str) -> list[str]:
    return re.findall(r"loss (\d+\.\d+)", text)


@pytest.mark.parametrize("example,strategy", [("lenet", "model"), ("rnntc", "data")])
def test_example_same_losses_on_two_ranks(example, strategy):
    args = [f"examples/{example}.py", "--steps", "3", "--strategy", strategy]
    one = subprocess.run([sys.executable, *args, "--devices", "2"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_mpi(2, args, timeout=120)
    assert _losses(one.stdout) and _losses(two.stdout) == _losses(one.stdout), \
        (one.stdout, two.stdout)
    assert "on 2 rank(s)" in two.stdout and two.stdout.count("samples/s") == 1
