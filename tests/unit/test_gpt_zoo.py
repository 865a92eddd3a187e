"""Issue 25 item 1, as a user runs it: the GPT zoo names (with '-' and '.')
work on the command line, and the small gpt2 learns in 20 steps on the CPU
(counts and the tied kernel: tests/unit/test_gpt.py)."""

from __future__ import annotations

import numpy as np

from legionpy.cli import main


def test_cli_takes_the_names(capsys):
    assert main(["simulate", "gpt3-1.3b", "--scale", "small", "--machine", "h100:1x2",
                 "--strategy", "megatron"]) == 0
    assert "gpt3-1.3b" in capsys.readouterr().out
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gpt3-13b" in out and "12,853,386,240" in out


def test_small_gpt2_learns_in_20_steps():
    import legionpy.runtime as lr
    from legionpy.models.training import train

    lr.init(cpus=1)
    try:
        losses = train("gpt2", steps=20)["losses"]
    finally:
        lr.shutdown()
    assert np.mean(losses[-5:]) < 0.95 * np.mean(losses[:3]), losses
