"""The region model: logical regions, partitions, privileges, the
dependence analysis between operations that use them, and the coherence
state machine (:mod:`.coherence`: which instance holds valid data where),
shared by the runtime and the optimizer's task-graph builder.

>>> import numpy as np
>>> from legionpy.regions import Region, Partition, RW, RegionRequirement, DependenceAnalyzer
>>> A = Region((8,), {"x": np.float32})
>>> P = Partition.equal(A, (2,))
>>> dep = DependenceAnalyzer()
>>> dep.analyze(0, [RegionRequirement(P[0], RW("x"))])
[]
>>> dep.analyze(1, [RegionRequirement(A, RW("x"))])
[0]
"""

from __future__ import annotations

from .dependence import DependenceAnalyzer, check_dependences, conflicting_pairs, ops_conflict
from .fields import FieldSpace
from .partition import Partition
from .privileges import MODES, REDOPS, RW, WD, Privilege, PrivilegeSet, R, Reduce
from .region import Region, Subregion
from .requirement import RegionArg, RegionRequirement, interferes, requirements

__all__ = [
    "Region",
    "Subregion",
    "FieldSpace",
    "Partition",
    "Privilege",
    "PrivilegeSet",
    "R",
    "RW",
    "WD",
    "Reduce",
    "MODES",
    "REDOPS",
    "RegionArg",
    "RegionRequirement",
    "interferes",
    "requirements",
    "DependenceAnalyzer",
    "check_dependences",
    "conflicting_pairs",
    "ops_conflict",
]
