"""A Transformer encoder stack as a next-token model (multi-head, causal).

    python examples/transformer.py [--steps 40] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/transformer.py          # same losses, one device per rank

`legionpy.models.transformer(scale="small")`: 2 encoder layers of width 32, 4 heads, over
8 positions, trained on the Markov-chain sequences of `legionpy.data`.
"""

from _common import run

if __name__ == "__main__":
    run("transformer", __doc__, steps=40)
