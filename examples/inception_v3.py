"""Inception-v3 at 1/16 width on synthetic 75x75 images.

    python examples/inception_v3.py [--steps 10] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/inception_v3.py          # same losses, one device per rank

`legionpy.models.inception_v3(scale="small")`: every Inception block of the
paper's network (222 ops, batch norm after each conv). Batch norm normalises
each sample tile with its own statistics under data parallelism.
"""

from _common import run

if __name__ == "__main__":
    run("inception_v3", __doc__, steps=10)
