"""RNNTC: LSTM text classification, one LSTM cell op per time step.

    python examples/rnntc.py [--steps 40] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
                          [--text]
    mpirun -n 2 python examples/rnntc.py          # same losses, one device per rank

`legionpy.models.rnntc(scale="small")`: embedding, 2 LSTM layers of 32 units
over 8 steps (the paper: 4 x 1024 over 40), a softmax over the last state.
Synthetic data: a class shows in its token mix; `--text` classifies windows
of stdlib docstrings by module (json vs re).
"""

from _common import run

if __name__ == "__main__":
    run("rnntc", __doc__, steps=40)
