"""RNNLM: an LSTM language model, one cell op per time step.

    python examples/rnnlm.py [--steps 40] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
                          [--text]
    mpirun -n 2 python examples/rnnlm.py          # same losses, one device per rank

`legionpy.models.rnnlm(scale="small")`: 2 LSTM layers of 64 units over 8
steps (the paper: 2 x 2048 over 40), one projection to the vocabulary for
every step. Synthetic data from a sparse Markov chain; `--text` trains a
character model on the docstrings of stdlib modules (nothing downloaded).
"""

from _common import run

if __name__ == "__main__":
    run("rnnlm", __doc__, steps=40)
