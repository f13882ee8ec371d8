"""Mixture-of-experts layers: which experts a batch touches and what their GEMMs cost.

Owns :func:`expected_experts` (the expected union of experts ``T`` tokens route to, uniform
top-k routing: ``E (1 - (1 - k/E)^T)``) and :class:`MoeLayer`, the per-GPU GEMMs of one MoE
MLP — router, routed experts, shared experts — and how they are priced: FLOPs use top-k, weight
bytes the touched experts only, and the grouped expert GEMM pays tile quantization per touched
expert. Experts are sharded by tensor parallelism (no expert parallelism).

Must not import anything from batchsim but :mod:`batchsim.cost.costs`, :mod:`batchsim.cost.gemm`
and :mod:`batchsim.catalog.model`.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchsim.catalog.model import ModelSpec
from batchsim.cost.costs import CostSum
from batchsim.cost.gemm import Gemm, GemmPricing

__all__ = ["MoeLayer", "expected_experts"]


def expected_experts(num_experts: float, top_k: float, tokens: float) -> float:
    """Expected number of distinct experts ``tokens`` tokens touch, each routed uniformly to
    ``top_k`` of ``num_experts``."""
    if num_experts > top_k:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return num_experts


@dataclass(frozen=True, slots=True)
class MoeLayer:
    """The MLP of one MoE layer on one GPU.

    Attributes:
        num_experts: Routed experts.
        top_k: Experts per token.
        router: The gating GEMM (replicated on every rank).
        experts: Up (gate and up) and down GEMMs of one routed expert, ``groups`` = experts.
        shared: Up and down GEMMs of the shared experts (empty when there are none).
        expert_width: Intermediate width of one routed expert on this GPU.
        shared_width: Intermediate width of all shared experts on this GPU.
    """

    num_experts: float
    top_k: float
    router: Gemm
    experts: tuple[Gemm, ...]
    shared: tuple[Gemm, ...]
    expert_width: float
    shared_width: float

    @classmethod
    def from_model(cls, model: ModelSpec, tp: int) -> MoeLayer:
        """The MoE MLP of ``model`` (which must be MoE) split over ``tp`` GPUs."""
        h, gate = model.hidden_size, 2 if model.gated_mlp else 1
        num_experts = float(model.num_local_experts or 0)
        ew = model.moe_intermediate_size / tp
        sw = model.num_shared_experts * model.moe_intermediate_size / tp
        return cls(
            num_experts=num_experts,
            top_k=float(model.num_experts_per_tok),
            router=Gemm(h, int(num_experts)),
            experts=(Gemm(h, int(gate * ew), num_experts), Gemm(int(ew), h, num_experts)),
            shared=(Gemm(h, int(gate * sw)), Gemm(int(sw), h)) if sw else (),
            expert_width=ew,
            shared_width=sw,
        )

    def add_gemms(
        self,
        acc: CostSum,
        gemm: GemmPricing,
        tokens: float,
        layers: float,
        experts: GemmPricing | None = None,
    ) -> None:
        """Add the GEMMs of ``layers`` MoE layers over ``tokens`` rows (> 0) to ``acc``: the
        router and shared experts priced by ``gemm``, the routed experts by ``experts`` (the
        fused MoE kernel's grouped GEMMs; default ``gemm``)."""
        touched = expected_experts(self.num_experts, self.top_k, tokens)
        rows_per_expert = tokens * self.top_k / touched
        gemm.add(acc, (self.router,), tokens, layers, kernels=2.0)  # + the top-k/align kernel
        grouped = gemm if experts is None else experts
        grouped.add(acc, self.experts, rows_per_expert, layers, weight_groups=touched)
        gemm.add(acc, self.shared, tokens, layers)

    def activation_elems(self, tokens: float) -> float:
        """Activation outputs of one layer's routed (top-k per token) and shared experts."""
        return tokens * self.top_k * self.expert_width + tokens * self.shared_width

    @property
    def activation_kernels(self) -> int:
        """Activation kernels per layer: routed experts, and shared experts if any."""
        return 2 if self.shared else 1
