"""The roofline cost model: what one iteration (one forward pass) costs on one GPU.

- :mod:`.shapes`: :class:`BatchShape`, the aggregates of one iteration;
- :mod:`.model`: :class:`RooflineCostModel`, a pure function ``BatchShape -> IterationCost``.
"""

from batchsim.cost.model import (
    OP_NAMES,
    WEIGHT_DTYPES,
    DecodeSlopes,
    IterationCost,
    OpCost,
    RooflineCostModel,
)
from batchsim.cost.shapes import BatchShape

__all__ = [
    "OP_NAMES",
    "WEIGHT_DTYPES",
    "BatchShape",
    "DecodeSlopes",
    "IterationCost",
    "OpCost",
    "RooflineCostModel",
]
