"""AlexNet (the paper's CNN) at a small width on synthetic 67x67 images.

    python examples/alexnet.py [--steps 30] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/alexnet.py          # same losses, one device per rank

`legionpy.models.alexnet(scale="small")`: the five convs, three pools and three
dense layers of AlexNet, channels x 1/8, 4 classes. `--scale full` builds the
61.1M-parameter network at 224x224 (slow on a CPU).
"""

from _common import run

if __name__ == "__main__":
    run("alexnet", __doc__, steps=30)
