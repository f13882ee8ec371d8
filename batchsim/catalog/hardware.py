"""Accelerators: :class:`HardwareProfile`, :func:`load_hardware` and :func:`list_hardware`.

Owns the hardware-profile YAML schema (``hardware_profiles/<name>.yaml``: human units in the
key names — TFLOP/s, TB/s, GB, GB/s, ms, us), its validation, and the conversion to SI units
(FLOP/s, B/s, bytes, s) that the rest of batchsim uses. Also owns the list of realism terms a
profile may set (:data:`EFFICIENCY_KEYS`).

Must not import anything from batchsim except :mod:`batchsim.errors`, :mod:`batchsim.catalog`,
:mod:`batchsim.yamlio` (the one file reader) and :mod:`batchsim.validation` (the number rules)
(stdlib, PyYAML, pydantic only): the cost model, the config loader and the CLI build on it.

Every number of a profile is finite and in a physical range (the bounds are generous: a
datasheet value is far inside them): peaks (0, 1e6] TFLOP/s, memory bandwidth (0, 1000] TB/s,
memory (0, 1e6] GB, link bandwidths (0, 1e6] GB/s, compute units [1, 1e6], fixed times and
CPU overheads [0, 1 s] in their unit, fractions (0, 1], other efficiency terms in the range
their :class:`EfficiencyKey` states.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from batchsim.catalog import catalog_names, resolve
from batchsim.errors import ConfigError
from batchsim.validation import (
    MAX_BATCH_TOKENS,
    MAX_GB,
    MAX_STEP_MS,
    StrictFloat,
    StrictInt,
    format_value,
    number_problem,
)
from batchsim.yamlio import line_of, read_mapping

__all__ = [
    "CPU_OVERHEAD_DEFAULTS",
    "DTYPES",
    "EFFICIENCY_KEYS",
    "CalibratedRange",
    "EfficiencyKey",
    "HardwareProfile",
    "hardware_table",
    "list_hardware",
    "load_hardware",
]

DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")
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

_TOP_LEVEL_KEYS = (
    "name",
    "description",
    "peak_tflops",
    "memory_bandwidth_tb_s",
    "memory_gb",
    "interconnect_bandwidth_gb_s",
    "host_bandwidth_gb_s",
    "num_compute_units",
    "efficiency",
    "cpu_overhead",
    "calibrated_range",
    "sources",
)


@dataclass(frozen=True)
class CalibratedRange:
    """The shapes a profile's terms were fitted on: its ``calibrated_range:`` block, written by
    ``batchsim calibrate``. A run outside it uses the fitted terms beyond the data (``batchsim
    run`` warns). Each range is ``(lowest, highest)``, inclusive; None: not measured.

    Attributes:
        models: Names of the models whose kernels were measured.
        hidden_size: Hidden sizes of those models.
        tensor_parallel_size: The tensor-parallel degrees measured (not a range: the sharded
            shapes of another degree were not).
        tokens: Tokens (GEMM rows) per iteration of the per-layer operator measurements.
        batch_size: Requests per iteration (decode attention batches, CPU overhead batches).
        context_tokens: Cached tokens per request of the attention measurements.
    """

    models: tuple[str, ...] = ()
    hidden_size: tuple[int, int] | None = None
    tensor_parallel_size: tuple[int, ...] | None = None
    tokens: tuple[int, int] | None = None
    batch_size: tuple[int, int] | None = None
    context_tokens: tuple[int, int] | None = None

    def outside(
        self,
        *,
        model: str,
        hidden_size: int,
        tensor_parallel_size: int,
        tokens: tuple[int, int] | None,
        batch_size: tuple[int, int] | None,
        context_tokens: int | None,
    ) -> list[str]:
        """What of a run lies outside the range, one line each (empty: all inside).

        Args:
            model: The run's model name (named in the message).
            hidden_size: Its hidden size.
            tensor_parallel_size: The run's tensor-parallel degree.
            tokens: Fewest and most tokens of an iteration (None: no iteration).
            batch_size: Fewest and most requests of an iteration.
            context_tokens: Longest context of a request (prompt + output tokens); only
                contexts longer than the range are reported.
        """
        out = []

        def beyond(key: str, what: str, unit: str, lo: int, hi: int) -> None:
            span = getattr(self, key)
            if span is None or (span[0] <= lo and hi <= span[1]):
                return
            seen = f"{lo:,}-{hi:,}" if lo != hi else f"{lo:,}"
            out.append(
                f"calibrated_range.{key}: the profile's terms were fitted on {what} of "
                f"{span[0]:,}-{span[1]:,} {unit}; this run has {what} of {seen} {unit}: "
                "their times are extrapolated"
            )

        if self.hidden_size is not None and not (
            self.hidden_size[0] <= hidden_size <= self.hidden_size[1]
        ):
            out.append(
                "calibrated_range.hidden_size: the profile's terms were fitted on models of "
                f"hidden size {self.hidden_size[0]:,}-{self.hidden_size[1]:,} "
                f"({', '.join(self.models)}); this run's model {model} has {hidden_size:,}: "
                "its times are extrapolated"
            )
        tps = self.tensor_parallel_size
        if tps is not None and tensor_parallel_size not in tps:
            out.append(
                "calibrated_range.tensor_parallel_size: the profile's terms were fitted at "
                f"tensor-parallel degrees {', '.join(str(t) for t in tps)}; this run uses "
                f"{tensor_parallel_size}: its sharded shapes were not measured"
            )
        if tokens is not None:
            beyond("tokens", "iterations", "tokens", *tokens)
        if batch_size is not None:
            beyond("batch_size", "batches", "requests", *batch_size)
        span = self.context_tokens
        if context_tokens is not None and span is not None and context_tokens > span[1]:
            out.append(
                "calibrated_range.context_tokens: the profile's terms were fitted on contexts "
                f"of {span[0]:,}-{span[1]:,} tokens per request; this run has contexts of up to "
                f"{context_tokens:,} tokens: their attention times are extrapolated"
            )
        return out

    def to_yaml(self) -> dict[str, Any]:
        """The ``calibrated_range:`` block (measured entries only, lists for YAML)."""
        out: dict[str, Any] = {}
        if self.models:
            out["models"] = list(self.models)
        for key in ("hidden_size", "tensor_parallel_size", "tokens", "batch_size"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value)
        if self.context_tokens is not None:
            out["context_tokens"] = list(self.context_tokens)
        return out


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
        """Same hardware with every efficiency 1 and every floor/overhead (GPU and CPU) 0.

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

# --------------------------------------------------------------------------- YAML schema

_Tflops = Annotated[StrictFloat, Field(gt=0, le=1e6)]
_GbPerS = Annotated[StrictFloat, Field(gt=0, le=1e6)]
_StepMs = Annotated[StrictFloat, Field(ge=0, le=MAX_STEP_MS)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _PeakTflops(_Schema):
    bf16: _Tflops | None = None
    fp16: _Tflops | None = None
    fp8: _Tflops | None = None
    int8: _Tflops | None = None
    int4: _Tflops | None = None


class _CpuOverhead(_Schema):
    base_ms: _StepMs = CPU_OVERHEAD_DEFAULTS["base_ms"]
    per_seq_ms: _StepMs = CPU_OVERHEAD_DEFAULTS["per_seq_ms"]


_Count = Annotated[StrictInt, Field(ge=0, le=MAX_BATCH_TOKENS)]
_Range = Annotated[list[_Count], Field(min_length=2, max_length=2)]


class _CalibratedRange(_Schema):
    models: list[Annotated[str, Field(min_length=1)]] = []
    hidden_size: _Range | None = None
    tensor_parallel_size: list[Annotated[StrictInt, Field(ge=1, le=1_000_000)]] | None = None
    tokens: _Range | None = None
    batch_size: _Range | None = None
    context_tokens: _Range | None = None


_RANGE_KEYS = ("hidden_size", "tokens", "batch_size", "context_tokens")


class _ProfileYaml(_Schema):
    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    peak_tflops: _PeakTflops
    memory_bandwidth_tb_s: Annotated[StrictFloat, Field(gt=0, le=1e3)]
    memory_gb: Annotated[StrictFloat, Field(gt=0, le=MAX_GB)]
    interconnect_bandwidth_gb_s: _GbPerS
    host_bandwidth_gb_s: _GbPerS | None = None
    num_compute_units: Annotated[StrictInt, Field(ge=1, le=1_000_000)]
    efficiency: dict[str, Any] = {}
    cpu_overhead: _CpuOverhead = _CpuOverhead()
    calibrated_range: _CalibratedRange | None = None
    sources: dict[str, str] = {}


_SCHEMA_FIELDS: dict[str, tuple[str, ...]] = {
    "": _TOP_LEVEL_KEYS,
    "peak_tflops": DTYPES,
    "cpu_overhead": tuple(CPU_OVERHEAD_DEFAULTS),
    "calibrated_range": (
        "models",
        "hidden_size",
        "tensor_parallel_size",
        "tokens",
        "batch_size",
        "context_tokens",
    ),
}


def _num(value: Any) -> Any:
    """0.0 -> 0 for messages."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _describe_error(err: ErrorDetails) -> tuple[tuple[str, ...], str]:
    """Turn one pydantic error into (key path, one-line message)."""
    loc = tuple(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    path = ".".join(loc)
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = format_value(err.get("input"))
    if kind == "missing":
        return loc, f"{path}: required key is missing"
    if kind == "extra_forbidden":
        parent = ".".join(loc[:-1])
        allowed = ", ".join(_SCHEMA_FIELDS.get(parent, ()))
        return loc, f"{path}: unknown key; allowed keys here: {allowed}"
    if kind == "greater_than":
        return loc, f"{path} must be > {_num(ctx.get('gt'))}, got {value}"
    if kind == "finite_number":
        return loc, f"{path} must be a finite number, got {value}"
    if kind == "greater_than_equal":
        return loc, f"{path} must be >= {_num(ctx.get('ge'))}, got {value}"
    if kind == "less_than_equal":
        return loc, f"{path} must be <= {_num(ctx.get('le'))}, got {value}"
    if kind in ("float_type", "int_type", "float_parsing", "int_parsing", "int_from_float"):
        want = "an integer" if kind.startswith("int") else "a number"
        return loc, f"{path} must be {want}, got {value}"
    if kind in ("string_type", "string_too_short"):
        return loc, f"{path} must be a non-empty string, got {value}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return loc, f"{path or 'top level'} must be a mapping, got {value}"
    return loc, f"{path}: {err['msg']}, got {value}"


def _si(value: float, exponent: int) -> float:
    """``value * 10**exponent`` rounded once (2.039 TB/s -> exactly 2.039e12 B/s)."""
    return float(Decimal(repr(value)).scaleb(exponent))


def _parse(path: Path) -> HardwareProfile:
    source = str(path)
    raw, text = read_mapping(path)

    try:
        doc = _ProfileYaml.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        loc, message = _describe_error(errors[0])
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more errors)"
        raise ConfigError(message, source, line_of(text, loc)) from None

    def fail(loc: tuple[str, ...], message: str) -> ConfigError:
        return ConfigError(message, source, line_of(text, loc))

    # efficiency: only the known keys, each validated against its kind.
    efficiency: dict[str, float] = {}
    for key, spec in EFFICIENCY_KEYS.items():
        value = doc.efficiency.get(key, spec.default)
        where = ("efficiency", key)
        if spec.fraction:
            problem = number_problem(value)
            if problem is None and not 0 < value <= 1:
                problem = f"must be in (0, 1], got {format_value(value)}"
        else:
            problem = number_problem(value, ge=spec.minimum, le=spec.upper)
        if problem is not None:
            raise fail(where, f"efficiency.{key} {problem}")
        efficiency[spec.si_name] = float(value) / spec.per_si
    unknown = sorted(set(doc.efficiency) - set(EFFICIENCY_KEYS))
    if unknown:
        allowed = ", ".join(EFFICIENCY_KEYS)
        raise fail(
            ("efficiency", unknown[0]),
            f"efficiency.{unknown[0]}: unknown key; allowed keys here: {allowed}",
        )

    peaks = doc.peak_tflops.model_dump()
    if peaks["bf16"] is None and peaks["fp16"] is None:
        raise fail(("peak_tflops",), "peak_tflops: needs at least one of bf16, fp16")

    for key in doc.sources:
        if key.split(".")[0] not in _TOP_LEVEL_KEYS:
            allowed = ", ".join(_TOP_LEVEL_KEYS)
            raise fail(
                ("sources", key), f"sources.{key}: names no key of the profile; keys: {allowed}"
            )

    calibrated = None
    if doc.calibrated_range is not None:
        block = doc.calibrated_range
        for key in _RANGE_KEYS:
            pair = getattr(block, key)
            if pair is not None and pair[0] > pair[1]:
                raise fail(
                    ("calibrated_range", key),
                    f"calibrated_range.{key} must be [lowest, highest], got {list(pair)}",
                )
        tps = block.tensor_parallel_size

        def pair(key: str) -> tuple[int, int] | None:
            value = getattr(block, key)
            return (value[0], value[1]) if value is not None else None

        calibrated = CalibratedRange(
            models=tuple(block.models),
            hidden_size=pair("hidden_size"),
            tensor_parallel_size=tuple(sorted(set(tps))) if tps is not None else None,
            tokens=pair("tokens"),
            batch_size=pair("batch_size"),
            context_tokens=pair("context_tokens"),
        )

    attrs = {name: value for name, value in efficiency.items() if name in _PROFILE_FIELDS}
    return HardwareProfile(
        name=doc.name,
        description=doc.description,
        peak_flops={d: (_si(v, 12) if v is not None else None) for d, v in peaks.items()},
        memory_bandwidth=_si(doc.memory_bandwidth_tb_s, 12),
        memory_capacity=_si(doc.memory_gb, 9),
        interconnect_bandwidth=_si(doc.interconnect_bandwidth_gb_s, 9),
        host_bandwidth=(
            _si(doc.host_bandwidth_gb_s, 9) if doc.host_bandwidth_gb_s is not None else None
        ),
        num_compute_units=doc.num_compute_units,
        cpu_overhead_base=doc.cpu_overhead.base_ms / 1e3,
        cpu_overhead_per_seq=doc.cpu_overhead.per_seq_ms / 1e3,
        efficiency=efficiency,
        sources=dict(doc.sources),
        calibrated_range=calibrated,
        **attrs,
    )


@functools.lru_cache(maxsize=64)
def _load_path(path: str, mtime_ns: int) -> HardwareProfile:
    return _parse(Path(path))


def load_hardware(name_or_path: str, key: str = "hardware") -> HardwareProfile:
    """Load a hardware profile by built-in name or YAML path.

    Results are cached per file and modification time.

    Args:
        name_or_path: ``a100-80gb`` or ``path/to/profile.yaml``.
        key: Config key that held the value, for error messages.

    Raises:
        ConfigError: Unknown name (lists the built-ins), unreadable or malformed YAML, missing,
            unknown, wrong-typed, zero or negative value. One line naming the file and key path.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError(f"{key}: expected a hardware name or a file path, got {name_or_path!r}")
    path = resolve("hardware_profiles", name_or_path, key)
    return _load_path(str(path), path.stat().st_mtime_ns)


def list_hardware() -> list[HardwareProfile]:
    """Every built-in hardware profile, sorted by name."""
    return [load_hardware(name) for name in catalog_names("hardware_profiles")]


def hardware_table() -> list[dict[str, Any]]:
    """One row of key numbers per built-in profile, for ``batchsim list hardware``.

    Keys: name, description, bf16_tflops, fp8_tflops, int8_tops, memory_tb_s, memory_gb
    (decimal GB), interconnect_gb_s (per direction), host_link_gb_s (host<->GPU, per
    direction; None when the profile does not give it), compute_units, ridge_point_bf16
    (FLOP/B).
    """
    return [hw.summary() for hw in list_hardware()]
