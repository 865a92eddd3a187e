"""A failed task ends the program with its message and status 1 at exit
when nothing awaited it (issue 15 item 5); one that ``get`` raised is the
caller's to handle."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import numpy as np, legionpy as lp
lp.init(cpus=2)
R = lp.Region((4,), {"x": np.float32})

@lp.task(privileges=[lp.RW("x")])
def bad(r):
    raise ValueError("boom in bad")

f = bad(R)
%s
print("end of script")
"""


def run(tail: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM % tail], capture_output=True,
                          text=True, timeout=120)


def test_unawaited_failure_ends_the_program_non_zero():
    p = run("")
    assert p.returncode == 1 and "end of script" in p.stdout
    assert "boom in bad" in p.stderr and "nothing awaited it" in p.stderr
    assert "Traceback" not in p.stderr


def test_awaited_and_handled_failure_exits_0():
    p = run("try:\n    f.get()\nexcept lp.errors.TaskError:\n    print('handled')")
    assert p.returncode == 0 and "handled" in p.stdout, p.stderr


def test_fence_reports_it_once():
    p = run("try:\n    lp.fence()\nexcept lp.errors.TaskError as e:\n    print('fence:', e)")
    assert p.returncode == 0 and "fence:" in p.stdout and "boom in bad" in p.stdout
