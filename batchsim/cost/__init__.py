"""The roofline cost model: what one iteration (one forward pass) costs on one GPU.

- :mod:`.shapes`: :class:`BatchShape`, the aggregates of one iteration;
- :mod:`.costs`: the results (:class:`OpCost`, :class:`IterationCost`, :class:`DecodeSlopes`)
  and the compute/memory transition every kernel model shares;
- :mod:`.terms`: what the cost model reads from a hardware profile;
- :mod:`.layers`: the kernels of a model's forward pass on one GPU (geometry only);
- :mod:`.gemm`, :mod:`.elementwise`, :mod:`.attention`, :mod:`.moe`, :mod:`.comm`: how each
  kind of kernel is priced (GEMMs; norms, activations and the KV-cache write; the attention
  kernel; MoE expert union; tensor-parallel all-reduce);
- :mod:`.model`: :class:`RooflineCostModel`, a pure function ``BatchShape -> IterationCost``.
"""

from batchsim.cost.costs import OP_NAMES, DecodeSlopes, IterationCost, OpCost
from batchsim.cost.model import RooflineCostModel
from batchsim.cost.shapes import BatchShape
from batchsim.cost.terms import WEIGHT_DTYPES

__all__ = [
    "OP_NAMES",
    "WEIGHT_DTYPES",
    "BatchShape",
    "DecodeSlopes",
    "IterationCost",
    "OpCost",
    "RooflineCostModel",
]
