"""Accelerators: :class:`HardwareProfile`, one GPU in SI units, and the realism terms a profile
may set (:data:`EFFICIENCY_KEYS`).

Profiles are read from YAML by :mod:`batchsim.catalog.hardware_files`
(:func:`~batchsim.catalog.hardware_files.load_hardware`), which converts the human units of the
YAML to the SI units (FLOP/s, B/s, bytes, s) that the rest of batchsim uses. The shapes a
calibrated profile's terms were fitted on are a
:class:`~batchsim.catalog.calibrated_range.CalibratedRange`.

Must not import anything from batchsim except :mod:`batchsim.errors`, :mod:`batchsim.catalog`
and :mod:`batchsim.validation` (the number rules): the cost model, the config loader and the
CLI build on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from batchsim.catalog.calibrated_range import CalibratedRange
from batchsim.catalog.gemm_table import GemmTable
from batchsim.errors import ConfigError
from batchsim.validation import MAX_STEP_MS

__all__ = [
    "CPU_OVERHEAD_DEFAULTS",
    "DTYPES",
    "EFFICIENCY_KEYS",
    "EfficiencyKey",
    "HardwareProfile",
]

DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
"""Compute dtypes a profile lists under ``peak_tflops`` (ints are TOPS)."""


@dataclass(frozen=True)
class EfficiencyKey:
    """One realism term of the ``efficiency:`` block.

    Attributes:
        default: Value (in the YAML unit) used when a profile omits the key.
        per_si: YAML units per SI unit (1e6 for ``_us``, 1e3 for ``_ms``, 1 for fractions);
            the SI value is ``yaml_value / per_si``.
        ideal: SI value :meth:`HardwareProfile.ideal` uses (1 for fractions, 0 for overheads).
        fraction: True: value must be in (0, 1]; False: value must be in
            [``minimum``, ``maximum``].
        si_name: Name of the SI value: key of ``HardwareProfile.efficiency`` and, when
            :class:`HardwareProfile` has a field of that name, that field too.
        doc: What the term means.
        minimum: Smallest value (YAML unit) of a non-fraction term.
        maximum: Largest value (YAML unit) of a non-fraction term; default: one second in
            the term's unit for times (``per_si`` != 1), 1000 for other terms.
    """

    default: float
    per_si: float
    ideal: float
    fraction: bool
    si_name: str
    doc: str
    minimum: float = 0.0
    maximum: float | None = None

    @property
    def upper(self) -> float:
        """The largest value a profile may give (YAML unit)."""
        if self.maximum is not None:
            return self.maximum
        return self.per_si * MAX_STEP_MS / 1e3 if self.per_si != 1.0 else 1e3


# The known keys of the `efficiency:` block, with defaults. This is the ONE place to edit to add
# a realism term: add an entry here (default in the YAML unit, unit factor, ideal value), and the
# loader accepts the key, validates it, fills the default when a profile omits it, converts it to
# SI in `HardwareProfile.efficiency[si_name]` and sets it to `ideal` in `HardwareProfile.ideal()`.
# If HardwareProfile also has a field named `si_name`, that field is filled too. The calibration
# owner decides the final set and values (see docs/calibration.md); other keys are YAML errors.
# Defaults are the values derived for the A100 by benchmarks/calibrate_a100.py.
EFFICIENCY_KEYS: dict[str, EfficiencyKey] = {
    "compute": EfficiencyKey(
        default=0.72,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="compute_efficiency",
        doc="achievable fraction of dense peak FLOP/s on large GEMMs",
    ),
    "memory": EfficiencyKey(
        default=0.80,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="memory_efficiency",
        doc="achievable fraction of memory bandwidth on large streaming reads",
    ),
    "interconnect": EfficiencyKey(
        default=0.91,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="interconnect_efficiency",
        doc="achievable fraction of link bandwidth in all-reduce",
    ),
    "min_kernel_time_us": EfficiencyKey(
        default=5.0,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="min_kernel_time",
        doc="fixed time added to every GEMM kernel (launch, pipeline fill and drain)",
    ),
    "launch_overhead_ms": EfficiencyKey(
        default=0.1,
        per_si=1e3,
        ideal=0.0,
        fraction=False,
        si_name="launch_overhead",
        doc="fixed GPU-side cost per forward pass not priced per kernel (graph launch, gathers)",
    ),
    "interconnect_latency_us": EfficiencyKey(
        default=31.0,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="interconnect_latency",
        doc="latency term per all-reduce",
    ),
    "attention": EfficiencyKey(
        default=0.44,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="attention_efficiency",
        doc="achievable fraction of dense peak FLOP/s in the attention kernel (causal FLOPs)",
    ),
    "attention_masked_fraction": EfficiencyKey(
        default=1.45,
        per_si=1.0,
        ideal=0.0,
        fraction=False,
        si_name="attention_masked_fraction",
        doc="share of a prefill chunk's causally masked (query, key) pairs the attention kernel "
        "still computes (1: whole tiles, no causal skipping; 0: perfect skipping)",
        maximum=100.0,
    ),
    "attention_kernel_time_us": EfficiencyKey(
        default=6.3,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="attention_kernel_time",
        doc="fixed time of one attention kernel call (launch, split-KV combine), per layer",
    ),
    "attention_sm_bandwidth": EfficiencyKey(
        default=1.19,
        per_si=1.0,
        ideal=1.0,
        fraction=False,
        si_name="attention_sm_bandwidth",
        doc="memory bandwidth one SM streams in decode attention, as a multiple of its share "
        "(memory bandwidth / num_compute_units): bytes in flight / memory latency",
        minimum=0.01,
        maximum=1000.0,
    ),
    "attention_cta_time_us": EfficiencyKey(
        default=1.0,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="attention_cta_time",
        doc="fixed time of each round of decode-attention CTAs on an SM (query load, page-table "
        "lookups, output write)",
    ),
    "attention_combine_time_us": EfficiencyKey(
        default=4.0,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="attention_combine_time",
        doc="fixed time of the split-KV combine kernel that merges partial attention outputs",
    ),
    "attention_prefill_time_us": EfficiencyKey(
        default=16.4,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="attention_prefill_time",
        doc="extra fixed time of an attention call that has prefill rows (the profiled kernel "
        "appends the new keys/values to the paged cache and rotates them in its prologue)",
    ),
    "elementwise": EfficiencyKey(
        default=0.55,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="elementwise_efficiency",
        doc="achievable fraction of memory bandwidth in norm/activation/rotary/add kernels",
    ),
    "elementwise_kernel_time_us": EfficiencyKey(
        default=3.0,
        per_si=1e6,
        ideal=0.0,
        fraction=False,
        si_name="elementwise_kernel_time",
        doc="fixed time added to every elementwise kernel (norm, activation, rotary, KV write)",
    ),
    "gemm_tile_m": EfficiencyKey(
        default=128.0,
        per_si=1.0,
        ideal=1.0,
        fraction=False,
        si_name="gemm_tile_m",
        doc="GEMM output tile rows (tokens) of the large tensor-core kernels",
        minimum=16.0,  # the smallest tensor-core tile height (mma m16)
        maximum=4096.0,
    ),
    "gemm_tile_n": EfficiencyKey(
        default=128.0,
        per_si=1.0,
        ideal=1.0,
        fraction=False,
        si_name="gemm_tile_n",
        doc="GEMM output tile columns (output features) of the large tensor-core kernels",
        minimum=8.0,
        maximum=4096.0,
    ),
    "transition_exponent": EfficiencyKey(
        default=2.0,
        per_si=1.0,
        ideal=1.0,
        fraction=False,
        si_name="transition_exponent",
        doc="p of the p-norm (t_c^p + t_m^p)^(1/p) joining compute and memory time of a kernel",
        minimum=1.0,  # a p-norm needs p >= 1
        maximum=100.0,
    ),
    "moe_compute": EfficiencyKey(
        default=1.0,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="moe_compute_efficiency",
        doc="fraction of the GEMM compute rate (peak x compute) the grouped expert GEMMs of a "
        "fused MoE kernel reach",
    ),
    "host_transfer": EfficiencyKey(
        default=0.8,
        per_si=1.0,
        ideal=1.0,
        fraction=True,
        si_name="host_transfer_efficiency",
        doc="achievable fraction of the host link for KV-cache swap copies (pinned-memory DMA)",
    ),
}

CPU_OVERHEAD_DEFAULTS: dict[str, float] = {"base_ms": 0.81, "per_seq_ms": 0.042}
"""Defaults (ms) of the ``cpu_overhead:`` block: engine CPU time per iteration."""


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator (a single GPU), in SI units.

    Attributes:
        name: Catalog name, e.g. ``a100-80gb``.
        description: Free text.
        peak_flops: Dense (no 2:4 sparsity) tensor peak per dtype in FLOP/s (OP/s for ints);
            None when the dtype is not supported. Keys: bf16, fp16, fp8, int8, int4.
        memory_bandwidth: HBM/GDDR bandwidth, B/s.
        memory_capacity: Device memory, bytes.
        interconnect_bandwidth: GPU-to-GPU bandwidth per GPU per direction, B/s.
        host_bandwidth: Host<->GPU link bandwidth per direction (PCIe; NVLink-C2C on Grace
            parts), B/s, for KV-cache swapping; None when the profile does not give it.
        num_compute_units: SMs (NVIDIA) or CUs (AMD).
        compute_efficiency: Achievable fraction of peak FLOP/s.
        memory_efficiency: Achievable fraction of memory bandwidth.
        interconnect_efficiency: Achievable fraction of interconnect bandwidth.
        min_kernel_time: Fixed time added to every GEMM kernel (launch, pipeline fill and
            drain), s; an additive cost, not a floor.
        launch_overhead: Fixed GPU-side cost per forward pass, s.
        interconnect_latency: Latency per all-reduce, s.
        cpu_overhead_base: Engine CPU time per iteration, s.
        cpu_overhead_per_seq: Extra engine CPU time per sequence in the batch, s.
        efficiency: Every :data:`EFFICIENCY_KEYS` term by its ``si_name``, in SI units
            (fractions; seconds).
        sources: Key path -> source of the number.
        calibrated_range: The shapes ``batchsim calibrate`` fitted the terms on, or None
            (built-in profiles: see ``docs/calibration.md``).
        gemm_table: Measured corrections of the GEMM model (:mod:`batchsim.catalog.gemm_table`),
            or None.
    """

    name: str
    description: str
    peak_flops: dict[str, float | None] = field(hash=False)
    memory_bandwidth: float
    memory_capacity: float
    interconnect_bandwidth: float
    num_compute_units: int
    compute_efficiency: float
    memory_efficiency: float
    interconnect_efficiency: float
    min_kernel_time: float
    launch_overhead: float
    interconnect_latency: float
    cpu_overhead_base: float
    cpu_overhead_per_seq: float
    host_bandwidth: float | None = None
    efficiency: dict[str, float] = field(default_factory=dict, hash=False)
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    calibrated_range: CalibratedRange | None = field(default=None, compare=False, hash=False)
    gemm_table: GemmTable | None = None

    def peak_flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``.

        Raises:
            ConfigError: The dtype is unknown or this hardware does not support it; the message
                names the dtypes it does support.
        """
        value = self.peak_flops.get(dtype)
        if value is None:
            allowed = ", ".join(d for d, v in self.peak_flops.items() if v is not None)
            why = "is not supported by" if dtype in self.peak_flops else "is unknown for"
            raise ConfigError(f"dtype {dtype!r} {why} hardware {self.name}; allowed: {allowed}")
        return value

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Datasheet ridge point, FLOP/byte: peak FLOP/s of ``dtype`` / memory bandwidth."""
        return self.peak_flops_for(dtype) / self.memory_bandwidth

    def ideal(self) -> HardwareProfile:
        """Same hardware with every efficiency 1, every floor/overhead (GPU and CPU) 0 and no
        measured GEMM corrections.

        Datasheet numbers (peaks, bandwidths including ``host_bandwidth``, capacity) are kept.
        """
        eff = {spec.si_name: spec.ideal for spec in EFFICIENCY_KEYS.values()}
        # field name -> float; typed Any because mypy checks **kwargs against every field
        attrs: dict[str, Any] = {k: v for k, v in eff.items() if k in _PROFILE_FIELDS}
        return dataclasses.replace(
            self,
            efficiency=eff,
            cpu_overhead_base=0.0,
            cpu_overhead_per_seq=0.0,
            gemm_table=None,
            **attrs,
        )

    def summary(self) -> dict[str, Any]:
        """Key numbers for ``batchsim list hardware`` (units in the key names)."""

        def tflops(dtype: str) -> float | None:
            value = self.peak_flops.get(dtype)
            return value / 1e12 if value is not None else None

        return {
            "name": self.name,
            "description": self.description,
            "bf16_tflops": tflops("bf16"),
            "fp8_tflops": tflops("fp8"),
            "fp4_tflops": tflops("fp4"),
            "int8_tops": tflops("int8"),
            "memory_tb_s": self.memory_bandwidth / 1e12,
            "memory_gb": self.memory_capacity / 1e9,
            "interconnect_gb_s": self.interconnect_bandwidth / 1e9,
            "host_link_gb_s": (
                self.host_bandwidth / 1e9 if self.host_bandwidth is not None else None
            ),
            "compute_units": self.num_compute_units,
            "ridge_point_bf16": (
                self.ridge_point("bf16") if self.peak_flops.get("bf16") is not None else None
            ),
        }


_PROFILE_FIELDS = frozenset(f.name for f in dataclasses.fields(HardwareProfile))
