"""ResNet (bottleneck blocks, 1 per stage) at 1/8 width on 32x32 images.

    python examples/resnet101.py [--steps 20] [--strategy data|model|owt|search|FILE]
                          [--batch-size B] [--size KEY=VALUE] [--scale small|full]
    mpirun -n 2 python examples/resnet101.py          # same losses, one device per rank

`legionpy.models.resnet101(scale="small")`; `--size blocks=3,4,23,3` gives
all 101 layers (the full model has 44,549,160 parameters).
"""

from _common import run

if __name__ == "__main__":
    run("resnet101", __doc__, steps=20)
