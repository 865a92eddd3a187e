"""``legionpy demo``: regions and partitions in a few lines."""

from __future__ import annotations

import argparse

from ..cli import command
from .args import degrees, positive_int


def _configure_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=positive_int, default=12, help="rows of the demo region")
    p.add_argument("--cols", type=positive_int, default=8, help="columns of the demo region")
    p.add_argument("--degrees", type=degrees, default=(3, 2),
                   help="equal-partition degrees, e.g. 3x2")


@command("demo", "regions and partitions in a few lines (the first thing to run)")
def _demo(args) -> dict:
    import numpy as np

    from ..regions import Partition, Region

    degrees = args.degrees
    region = Region((args.rows, args.cols), {"x": np.float32, "y": np.float64}, name="demo")
    equal = Partition.equal(region, degrees)
    halo = Partition.restriction(region, (args.rows // degrees[0], args.cols), halo=(1, 0))
    lines = [
        f"region {region.name}: shape {region.shape}, fields "
        + ", ".join(f"{n}:{np.dtype(t).name}" for n, t in region.fields.items()),
        f"equal partition {degrees}: {len(equal)} tiles, disjoint={equal.is_disjoint}, "
        f"complete={equal.is_complete}",
    ]
    tiles = []
    for color in equal.colors:
        rect = equal[color].rect
        tiles.append({"color": list(color), "lo": list(rect.lo), "hi": list(rect.hi)})
        lines.append(f"  tile {color}: {rect}")
    lines.append(
        f"restriction with halo (1, 0): {len(halo)} aliased tiles, "
        f"disjoint={halo.is_disjoint}, complete={halo.is_complete}"
    )
    for color in halo.colors:
        lines.append(f"  tile {color}: {halo[color].rect}")
    return {
        "text": "\n".join(lines),
        "region": {"shape": list(region.shape), "fields": list(region.fields)},
        "equal": {"degrees": list(degrees), "tiles": tiles, "disjoint": equal.is_disjoint,
                  "complete": equal.is_complete},
        "restriction": {"tiles": len(halo), "disjoint": halo.is_disjoint,
                        "complete": halo.is_complete},
    }


_demo.configure = _configure_demo
