"""Experiment YAML -> a validated, frozen :class:`ExperimentConfig`.

Owns the experiment schema (every block's keys, defaults, bounds and units), ``--set``
overrides, and the mapping of validation errors to one line naming the file, the line and the
dotted key path. Unknown keys are errors. This module builds nothing: it does not load models
or hardware and does not import simpy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.scheduler.interface import SchedulerConfig
from batchsim.scheduler.registry import load_policy
from batchsim.validation import (
    MAX_GB,
    MAX_MS,
    MAX_SECONDS,
    MAX_STEP_MS,
    MAX_TOKENS,
    ConfigModel,
    StrictBool,
    StrictFloat,
    StrictInt,
    config_error_from_pydantic,
)
from batchsim.workload import WorkloadConfig
from batchsim.yamlio import line_of, read_mapping

WeightDtype = Literal["fp16", "bf16", "fp8", "int8", "int4"]
KvDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]


class ParallelConfig(ConfigModel):
    """``parallel:`` — how the model is split across GPUs."""

    tensor_parallel_size: StrictInt = Field(1, ge=1, le=65536)
    """GPUs sharing every layer (weights, FLOPs and KV heads split; two all-reduces per layer)."""


class EngineConfig(ConfigModel):
    """``engine:`` — memory, precision and the step loop."""

    gpu_memory_utilization: StrictFloat = Field(0.9, gt=0, le=1)
    """Fraction of GPU memory the engine may use (weights + activations + KV cache)."""
    block_size: StrictInt = Field(16, ge=1, le=MAX_TOKENS)
    """Tokens per KV-cache block."""
    dtype: WeightDtype = "bf16"
    """Weight precision (int8/int4 are weight-only quantization computing in bf16)."""
    kv_cache_dtype: KvDtype = "auto"
    """KV-cache precision; ``auto`` = same as ``dtype`` (fp16 for int weights)."""
    max_model_len: StrictInt | None = Field(None, ge=1, le=2 * MAX_TOKENS)
    """Longest prompt + output accepted (tokens); default: the model's context length."""
    num_gpu_blocks: StrictInt | None = Field(None, ge=1, le=2**40)
    """Override the KV-cache size in blocks (default: computed from memory)."""
    activation_reserve_gb: StrictFloat | None = Field(None, ge=0, le=MAX_GB)
    """Memory kept for activations (GB); default: estimated from the token budget."""
    cpu_overhead_ms: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS)
    """CPU time per iteration (ms); default: the hardware profile's ``cpu_overhead.base_ms``."""
    cpu_overhead_per_seq_ms: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS)
    """Extra CPU time per request in the iteration (ms); default: from the hardware profile."""
    swap_space_gib: StrictFloat = Field(4.0, ge=0, le=MAX_GB)
    """Host memory per GPU for KV blocks preempted by swapping (GiB; vLLM's ``swap_space``).
    Used with ``scheduler.preemption_mode: swap``."""
    async_scheduling: StrictBool = False
    """Overlap the CPU work of an iteration with the previous GPU step (vLLM V1 async)."""
    fast_forward: StrictBool = True
    """Advance decode-only stretches in one step (same results; off only to cross-check)."""


class SloConfig(ConfigModel):
    """``slo:`` — latency objectives for ``request_goodput`` (ms)."""

    ttft_ms: StrictFloat | None = Field(None, gt=0, le=MAX_MS)
    tpot_ms: StrictFloat | None = Field(None, gt=0, le=MAX_MS)
    e2el_ms: StrictFloat | None = Field(None, gt=0, le=MAX_MS)


class MetricsConfig(ConfigModel):
    """``metrics:`` — what the summary counts."""

    warmup_s: StrictFloat = Field(0.0, ge=0, le=MAX_SECONDS)
    """Leave out requests arriving in the first ``warmup_s`` seconds."""
    cooldown_s: StrictFloat = Field(0.0, ge=0, le=MAX_SECONDS)
    """Leave out requests arriving in the last ``cooldown_s`` seconds."""


class ExperimentConfig(ConfigModel):
    """A whole experiment: one simulated engine, one workload."""

    name: str = "experiment"
    description: str = ""
    seed: StrictInt = Field(0, ge=0, le=2**64 - 1)
    """Seed of every random stream of the run (same seed -> identical outputs)."""
    hardware: str
    """Built-in profile name (``batchsim list hardware``) or path to a profile YAML."""
    model: str
    """Built-in model name (``batchsim list models``), a model YAML or a HF config.json."""
    parallel: ParallelConfig = ParallelConfig()
    engine: EngineConfig = EngineConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    workload: WorkloadConfig
    slo: SloConfig | None = None
    metrics: MetricsConfig = MetricsConfig()

    @field_validator("hardware", "model")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


def parse_override(item: str) -> tuple[str, Any]:
    """``"scheduler.max_num_seqs=8"`` -> ``("scheduler.max_num_seqs", 8)`` (YAML value syntax)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=8")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted-path overrides applied.

    A mapping value given for a top-level key is merged into that block
    (``scheduler={"max_num_seqs": 8}``); a dotted key replaces one value.
    """
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        parts = key.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                path = ".".join(parts[: i + 1])
                raise ConfigError(f"--set {key}: {path} is not a mapping (it is {child!r})")
            node = child
        last = parts[-1]
        if isinstance(value, Mapping) and isinstance(node.get(last), dict):
            merged = dict(node[last])
            merged.update(value)
            node[last] = merged
        else:
            node[last] = value
    return out


def _absolutize(data: dict[str, Any], base_dir: Path) -> None:
    """Make relative file references absolute against the experiment's directory, so the
    resolved ``config.yaml`` reruns from anywhere. Built-in names are left alone."""
    for key in ("hardware", "model"):
        value = data.get(key)
        if isinstance(value, str) and ("/" in value or value.endswith((".yaml", ".yml", ".json"))):
            candidate = base_dir / value
            if candidate.is_file():
                data[key] = str(candidate.resolve())
    workload = data.get("workload")
    if isinstance(workload, dict):
        trace = workload.get("trace")
        if isinstance(trace, dict) and isinstance(trace.get("path"), str):
            candidate = base_dir / trace["path"]
            if candidate.is_file():
                trace["path"] = str(candidate.resolve())


def _expand_workload(data: dict[str, Any], base_dir: Path, source: str | None) -> None:
    """``workload: NAME`` or ``workload: path.yaml`` -> that file's mapping."""
    value = data.get("workload")
    if not isinstance(value, str):
        return
    path = base_dir / value
    if not path.is_file():
        name = value if value.endswith((".yaml", ".yml")) else f"{value}.yaml"
        path = catalog_dir("workloads") / name
    if not path.is_file():
        raise ConfigError(f"workload: no workload file or built-in workload {value!r}", source)
    loaded, _ = read_mapping(path)
    loaded.pop("name", None)
    loaded.pop("description", None)
    if isinstance(loaded.get("trace"), dict):
        trace_path = path.parent / str(loaded["trace"].get("path", ""))
        if trace_path.is_file():
            loaded["trace"]["path"] = str(trace_path.resolve())
    data["workload"] = loaded


def validate_experiment(
    data: Mapping[str, Any],
    *,
    source: str | None = None,
    text: str | None = None,
    base_dir: Path | None = None,
    overridden: Iterable[str] = (),
) -> ExperimentConfig:
    """Validate a raw experiment mapping.

    Args:
        data: The parsed YAML (overrides already applied).
        source: File name for error messages.
        text: The file's text, to point errors at a line.
        base_dir: Directory that relative paths are relative to (default: current directory).
        overridden: Dotted keys set by overrides (errors about them name ``--set``, not a line).
    """
    base = base_dir if base_dir is not None else Path.cwd()
    raw = copy.deepcopy(dict(data))
    _expand_workload(raw, base, source)
    _absolutize(raw, base)
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        err = config_error_from_pydantic(exc, "", None, model=ExperimentConfig)
        raise _located(err.message, source, text, overridden) from None
    try:
        load_policy(config.scheduler.policy)
    except ConfigError as exc:
        raise _located(exc.message, source, text, overridden) from None
    return config


def _located(
    message: str, source: str | None, text: str | None, overridden: Iterable[str]
) -> ConfigError:
    """A ConfigError pointing at the line of the offending key, or at ``--set`` if the value
    came from the command line."""
    key = message.split(" ", 1)[0].rstrip(":")
    for item in overridden:
        if key == item or key.startswith(item + ".") or item.startswith(key + "."):
            return ConfigError(f"{message} (from --set {item})", source)
    line = line_of(text, key.split(".")) if text else None
    return ConfigError(message, source, line)


def load_experiment(
    path_or_data: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> ExperimentConfig:
    """Read, override and validate an experiment.

    Args:
        path_or_data: Path to an experiment YAML, a built-in experiment name, or a mapping.
        overrides: Dotted keys -> values (``{"scheduler.max_num_seqs": 8}``).
    """
    if isinstance(path_or_data, Mapping):
        data, text, source, base = dict(path_or_data), None, None, Path.cwd()
    else:
        path = Path(path_or_data)
        if not path.is_file():
            builtin = catalog_dir("experiments") / f"{path_or_data}.yaml"
            if builtin.is_file() and path.suffix == "":
                path = builtin
            else:
                raise ConfigError(f"experiment file not found: {path_or_data}")
        data, text = read_mapping(path)
        source, base = str(path), path.parent
    if overrides:
        # A named workload becomes a mapping first, so --set workload.x=... can reach into it.
        _expand_workload(data, base, source)
        data = apply_overrides(data, overrides)
    return validate_experiment(
        data, source=source, text=text, base_dir=base, overridden=list(overrides or ())
    )


def unused_scheduler_keys(config: ExperimentConfig, used: frozenset[str]) -> list[str]:
    """``scheduler.*`` keys the experiment set that its policy does not read."""
    return sorted(k for k in config.scheduler.model_fields_set if k not in used and k != "options")


def dump_config(config: ExperimentConfig) -> str:
    """The resolved experiment as YAML (every default filled in): enough to rerun it."""
    data = config.model_dump(mode="json", exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False)
