"""LeNet-5 on synthetic 28x28 images whose class is a coarse pattern.

    python examples/lenet.py [--steps 40] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/lenet.py          # same losses, one device per rank

Builds `legionpy.models.lenet` (two 5x5 convs, three dense layers) and trains it
with Adam on `legionpy.data.images`; the loss falls from ln(10) towards 0.
"""

from _common import run

if __name__ == "__main__":
    run("lenet", __doc__, steps=40)
