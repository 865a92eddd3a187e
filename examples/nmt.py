"""NMT: LSTM encoder-decoder with Luong attention learns to reverse sequences.

    python examples/nmt.py [--steps 40] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/nmt.py          # same losses, one device per rank

`legionpy.models.nmt(scale="small")`: encoder and decoder LSTMs (the paper:
2 + 2 layers of 1024, 40 steps, 32k words), attention over the encoder
states at every decoder step, a softmax over the vocabulary.
"""

from _common import run

if __name__ == "__main__":
    run("nmt", __doc__, steps=40)
