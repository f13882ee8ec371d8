"""Hardware-profile YAML: :func:`load_hardware`, :func:`list_hardware` and
:func:`hardware_table`.

Owns the hardware-profile YAML schema (``hardware_profiles/<name>.yaml``: human units in the
key names — TFLOP/s, TB/s, GB, GB/s, ms, us), its validation, and the conversion to the SI
units (FLOP/s, B/s, bytes, s) of :class:`~batchsim.catalog.hardware.HardwareProfile`.

Must not import anything from batchsim except :mod:`batchsim.errors`, :mod:`batchsim.catalog`,
:mod:`batchsim.yamlio` (the one file reader) and :mod:`batchsim.validation` (the number rules)
(stdlib, PyYAML, pydantic only): the config loader, the simulation and the CLI build on it.

Every number of a profile is finite and in a physical range (the bounds are generous: a
datasheet value is far inside them): peaks (0, 1e6] TFLOP/s, memory bandwidth (0, 1000] TB/s,
memory (0, 1e6] GB, link bandwidths (0, 1e6] GB/s, compute units [1, 1e6], fixed times and
CPU overheads [0, 1 s] in their unit, fractions (0, 1], other efficiency terms in the range
their :class:`~batchsim.catalog.hardware.EfficiencyKey` states.
"""

from __future__ import annotations

import functools
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from batchsim.catalog import catalog_dir, catalog_names, resolve
from batchsim.catalog.calibrated_range import CalibratedRange
from batchsim.catalog.gemm_table import load_gemm_table
from batchsim.catalog.hardware import (
    _PROFILE_FIELDS,
    CPU_OVERHEAD_DEFAULTS,
    DTYPES,
    EFFICIENCY_KEYS,
    HardwareProfile,
)
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

__all__ = ["hardware_table", "list_hardware", "load_hardware"]

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
    "gemm_table",
    "sources",
)

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
    fp4: _Tflops | None = None


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
    gemm_table: Annotated[str, Field(min_length=1)] | None = None
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

    gemm_table = None
    if doc.gemm_table is not None:
        table_path = Path(doc.gemm_table)
        if table_path.is_absolute() or ".." in table_path.parts:
            raise fail(
                ("gemm_table",),
                f"gemm_table must name a file beside the profile or a built-in table (no "
                f"folders up, no absolute path), got {doc.gemm_table!r}",
            )
        table_file = path.parent / table_path
        if not table_file.is_file():  # a copied built-in profile keeps the built-in table
            builtin = catalog_dir("hardware_profiles") / table_path
            if not builtin.is_file():
                raise fail(
                    ("gemm_table",),
                    f"gemm_table: no file {table_file} (nor a built-in table of that name)",
                )
            table_file = builtin
        gemm_table = load_gemm_table(table_file)

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
        gemm_table=gemm_table,
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

    Keys: name, description, bf16_tflops, fp8_tflops, fp4_tflops, int8_tops, memory_tb_s, memory_gb
    (decimal GB), interconnect_gb_s (per direction), host_link_gb_s (host<->GPU, per
    direction; None when the profile does not give it), compute_units, ridge_point_bf16
    (FLOP/B).
    """
    return [hw.summary() for hw in list_hardware()]
