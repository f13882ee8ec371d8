"""What the cost model reads from a hardware profile: one GPU's achievable rates and fixed times.

Owns :class:`HardwareTerms`, every term the kernel models need, in SI units, for one weight
dtype (with ``ideal=True``: datasheet peaks and bandwidths, no floors or overheads), the rule
that picks the tensor-core peak a weight dtype runs at (:func:`compute_dtype`), the weight
dtypes the cost model accepts (:data:`WEIGHT_DTYPES`, whose list lives in :mod:`batchsim.dtypes`
for the command line's help), and the validation of the GEMM terms.

Compute dtype: bf16/fp16 use their peak; fp8 uses the fp8 peak when the GPU has one, else the
16-bit peak (weight-only W8A16, as vLLM's Marlin kernels on Ampere); int8 and int4 are
weight-only (W8A16 / W4A16) and use the 16-bit peak.

Must not import anything from batchsim but :mod:`batchsim.catalog.hardware`,
:mod:`batchsim.errors`, :mod:`batchsim.dtypes`, :mod:`batchsim.cost.gemm` and
:mod:`batchsim.cost.attention` (the pricings it builds from the terms).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.cost.attention import AttentionGeometry, AttentionPricing
from batchsim.cost.gemm import MIN_TILE_M, MIN_TILE_N, GemmPricing
from batchsim.dtypes import WEIGHT_DTYPES  # defined there for the command line's help
from batchsim.errors import ConfigError

__all__ = ["WEIGHT_DTYPES", "HardwareTerms", "compute_dtype", "gemm_correction"]


def compute_dtype(hardware: HardwareProfile, dtype: str) -> str:
    """The dtype whose tensor-core peak weights of ``dtype`` run at on ``hardware``.

    Raises:
        ConfigError: ``dtype`` is bf16 or fp16 and the GPU cannot run it.
    """

    def has(d: str) -> bool:
        return hardware.peak_flops.get(d) is not None

    sixteen = "bf16" if has("bf16") else "fp16"
    if dtype in ("bf16", "fp16"):
        hardware.peak_flops_for(dtype)  # ConfigError if the GPU cannot run it
        return dtype
    if dtype == "fp8" and has("fp8"):
        return "fp8"
    if dtype == "nvfp4" and has("fp4"):
        return "fp4"
    return sixteen  # weight-only quantization: dequantize and run 16-bit tensor cores


def gemm_correction(
    hardware: HardwareProfile, dtype: str, cdtype: str
) -> Callable[[float, float, float], float] | None:
    """The measured GEMM correction ``(rows, n, k) -> ln factor`` of ``hardware``'s GEMM table
    for weights of ``dtype`` computed in ``cdtype``, or None: the table's 16-bit entries serve
    bf16 and fp16, its fp8 entries fp8 weights on fp8 tensor cores (W8A8); weight-only paths
    (int8, int4, fp8 on a GPU without fp8) have no entries."""
    table = hardware.gemm_table
    if table is None:
        return None
    key = "bf16" if cdtype in ("bf16", "fp16") and dtype in ("bf16", "fp16") else None
    if dtype == "fp8" and cdtype == "fp8":
        key = "fp8"
    if dtype == "nvfp4" and cdtype == "fp4":
        key = "nvfp4"
    if key is None or key not in table.values:
        return None
    return functools.partial(table.log_factor, key)


def _eff(hardware: HardwareProfile, key: str) -> float:
    """SI value of an ``efficiency:`` term, falling back to its documented default."""
    spec = EFFICIENCY_KEYS[key]
    value = hardware.efficiency.get(spec.si_name)
    if value is None:
        value = getattr(hardware, spec.si_name, None)
    return float(value) if value is not None else spec.default / spec.per_si


@dataclass(frozen=True, slots=True)
class HardwareTerms:
    """One GPU's terms for the kernel models, SI units (see ``docs/calibration.md``).

    Attributes:
        compute_dtype: Dtype of the tensor-core peak in use (:func:`compute_dtype`).
        peak: Achievable FLOP/s of GEMMs (dense peak x ``compute``).
        bandwidth: Achievable device-memory B/s (x ``memory``).
        num_sms: SMs (CUs).
        min_kernel_time: Fixed time per GEMM kernel, s.
        transition_exponent: p of the compute/memory transition of a kernel.
        tile_m: GEMM output tile rows.
        tile_n: GEMM output tile columns.
        attention_peak: Achievable FLOP/s of the attention kernel (x ``attention``).
        attention_sm_bandwidth: B/s one SM streams the KV cache at (its share of the memory
            bandwidth x ``attention_sm_bandwidth``).
        attention_kernel_time: Fixed time per attention call, s.
        attention_cta_time: Fixed time per round of decode CTAs, s.
        attention_combine_time: Split-KV combine kernel, s.
        attention_prefill_time: Extra fixed time of an attention call with prefill rows, s.
        attention_masked_fraction: Masked pairs of a prefill chunk the kernel pays for.
        elementwise_bandwidth: Achievable B/s of elementwise kernels.
        elementwise_kernel_time: Fixed time per elementwise kernel, s.
        link_bandwidth: Achievable GPU-to-GPU B/s per direction.
        link_latency: Fixed time per all-reduce, s.
        launch_overhead: Fixed GPU-side cost per forward pass, s.
        moe_peak: Achievable FLOP/s of the grouped expert GEMMs of a fused MoE kernel
            (``peak`` x ``moe_compute``).
    """

    compute_dtype: str
    peak: float
    bandwidth: float
    num_sms: int
    min_kernel_time: float
    transition_exponent: float
    tile_m: float
    tile_n: float
    attention_peak: float
    attention_sm_bandwidth: float
    attention_kernel_time: float
    attention_cta_time: float
    attention_combine_time: float
    attention_prefill_time: float
    attention_masked_fraction: float
    elementwise_bandwidth: float
    elementwise_kernel_time: float
    link_bandwidth: float
    link_latency: float
    launch_overhead: float
    moe_peak: float

    def gemm_pricing(
        self,
        weight_bytes: float,
        *,
        ideal: bool = False,
        correction: Callable[[float, float, float], float] | None = None,
        peak: float | None = None,
    ) -> GemmPricing:
        """The GEMM pricing of these terms for weights of ``weight_bytes`` bytes (at ``peak``
        FLOP/s when given, else :attr:`peak`)."""
        return GemmPricing(
            peak=self.peak if peak is None else peak,
            bandwidth=self.bandwidth,
            num_sms=self.num_sms,
            min_kernel_time=self.min_kernel_time,
            transition_exponent=self.transition_exponent,
            tile_m=self.tile_m,
            tile_n=self.tile_n,
            weight_bytes=weight_bytes,
            ideal=ideal,
            correction=correction,
        )

    def expert_gemm_pricing(self, weight_bytes: float, *, ideal: bool = False) -> GemmPricing:
        """The pricing of a fused MoE kernel's grouped expert GEMMs: the GEMM terms at
        ``moe_peak``, with no measured correction (the grid is of ungrouped GEMMs)."""
        return self.gemm_pricing(weight_bytes, ideal=ideal, peak=self.moe_peak)

    def attention_pricing(
        self, geometry: AttentionGeometry, kv_dtype_bytes: float, *, ideal: bool = False
    ) -> AttentionPricing:
        """The attention pricing of these terms for one layer of ``geometry``."""
        return AttentionPricing(
            geometry,
            kv_dtype_bytes=kv_dtype_bytes,
            peak=self.attention_peak,
            bandwidth=self.bandwidth,
            num_sms=self.num_sms,
            sm_bandwidth=self.attention_sm_bandwidth,
            kernel_time=self.attention_kernel_time,
            cta_time=self.attention_cta_time,
            combine_time=self.attention_combine_time,
            prefill_time=self.attention_prefill_time,
            masked_fraction=self.attention_masked_fraction,
            transition_exponent=self.transition_exponent,
            ideal=ideal,
        )

    @classmethod
    def from_profile(
        cls, hardware: HardwareProfile, dtype: str, *, ideal: bool = False
    ) -> HardwareTerms:
        """The terms of ``hardware`` for weights of ``dtype`` (``ideal``: datasheet roofline).

        Raises:
            ConfigError: The GPU cannot run ``dtype``, or (not ``ideal``) a GEMM term is out
                of range.
        """
        cdtype = compute_dtype(hardware, dtype)
        hw = hardware.ideal() if ideal else hardware
        peak = hardware.peak_flops_for(cdtype)
        sms = max(1, int(hardware.num_compute_units))
        p = _eff(hw, "transition_exponent")
        tile_m, tile_n = _eff(hw, "gemm_tile_m"), _eff(hw, "gemm_tile_n")
        if not ideal:
            if p < 1:
                raise ConfigError(
                    f"hardware {hardware.name}: efficiency.transition_exponent must be >= 1, "
                    f"got {p!r}"
                )
            if tile_m < MIN_TILE_M or tile_n < MIN_TILE_N:
                raise ConfigError(
                    f"hardware {hardware.name}: efficiency.gemm_tile_m must be >= {MIN_TILE_M} "
                    f"and gemm_tile_n >= {MIN_TILE_N}, got {tile_m!r} x {tile_n!r}"
                )
        return cls(
            compute_dtype=cdtype,
            peak=peak * _eff(hw, "compute"),
            bandwidth=hardware.memory_bandwidth * _eff(hw, "memory"),
            num_sms=sms,
            min_kernel_time=_eff(hw, "min_kernel_time_us"),
            transition_exponent=p,
            tile_m=tile_m,
            tile_n=tile_n,
            attention_peak=peak * _eff(hw, "attention"),
            attention_sm_bandwidth=hardware.memory_bandwidth
            / sms
            * _eff(hw, "attention_sm_bandwidth"),
            attention_kernel_time=_eff(hw, "attention_kernel_time_us"),
            attention_cta_time=_eff(hw, "attention_cta_time_us"),
            attention_combine_time=_eff(hw, "attention_combine_time_us"),
            attention_prefill_time=_eff(hw, "attention_prefill_time_us"),
            attention_masked_fraction=_eff(hw, "attention_masked_fraction"),
            elementwise_bandwidth=hardware.memory_bandwidth * _eff(hw, "elementwise"),
            elementwise_kernel_time=_eff(hw, "elementwise_kernel_time_us"),
            link_bandwidth=hardware.interconnect_bandwidth * _eff(hw, "interconnect"),
            link_latency=_eff(hw, "interconnect_latency_us"),
            launch_overhead=_eff(hw, "launch_overhead_ms"),
            moe_peak=peak * _eff(hw, "compute") * _eff(hw, "moe_compute"),
        )
