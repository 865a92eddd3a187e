"""VGG-16 at 1/8 width on synthetic 32x32 images (13 convs, 3 dense).

    python examples/vgg16.py [--steps 30] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/vgg16.py          # same losses, one device per rank

`legionpy.models.vgg16(scale="small")`; the full network has 138,357,544
parameters. Deep and without batch norm, it starts learning after ~20 steps.
"""

from _common import run

if __name__ == "__main__":
    run("vgg16", __doc__, steps=30)
