"""legionpy: a Legion-style task runtime that finds and runs fast
parallelization strategies for deep networks.

The public API lives here; everything else is internal. Names resolve lazily
so ``import legionpy`` is cheap and the optimizer can be used without
starting the runtime.

>>> import numpy as np, legionpy as lp
>>> R = lp.Region((8, 4), {"x": np.float32})
>>> P = lp.Partition.equal(R, (2, 1))
>>> P[1, 0].rect
Rect(lo=(4, 0), hi=(8, 4))
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # geometry
    "Rect": "legionpy.geometry",
    # regions
    "Region": "legionpy.regions",
    "FieldSpace": "legionpy.regions",
    "Partition": "legionpy.regions",
    "Subregion": "legionpy.regions",
    "R": "legionpy.regions",
    "RW": "legionpy.regions",
    "WD": "legionpy.regions",
    "Reduce": "legionpy.regions",
    # runtime
    "task": "legionpy.runtime",
    "index_launch": "legionpy.runtime",
    "fill": "legionpy.runtime",
    "fence": "legionpy.runtime",
    "trace": "legionpy.runtime",
    "begin_trace": "legionpy.runtime",
    "end_trace": "legionpy.runtime",
    "runtime": "legionpy.runtime",
    "Future": "legionpy.runtime",
    "FutureMap": "legionpy.runtime",
    "gather_maps": "legionpy.runtime",
    "Device": "legionpy.runtime",
    "LaunchOptions": "legionpy.runtime",
    "init": "legionpy.runtime",
    "shutdown": "legionpy.runtime",
    # the mapper interface (the runtime's; application mappers: legionpy.mapper)
    "Mapper": "legionpy.runtime.mapping",
    "DefaultMapper": "legionpy.runtime.mapping",
    "TaskOptions": "legionpy.runtime.mapping",
    "Mapping": "legionpy.runtime.mapping",
}
_SUBMODULES = ("errors", "geometry", "regions", "runtime", "mapper", "ops", "optimizer",
               "nn", "models", "data", "frontends")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        if _EXPORTS[name] == "legionpy.regions":
            # a Region's data lives in the runtime: loading it installs the
            # hook Region.read / write use (legionpy.regions.region)
            importlib.import_module("legionpy.runtime")
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        if name == "regions":
            importlib.import_module("legionpy.runtime")  # the data owner, as above
        module = importlib.import_module(f"legionpy.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'legionpy' has no attribute {name!r}")


def __dir__():
    return __all__
