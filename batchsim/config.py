"""Experiment YAML -> a validated, frozen :class:`ExperimentConfig`.

Owns the experiment schema (every block's keys, defaults, bounds and units), ``--set``
overrides, and the mapping of validation errors to one line naming the file, the line and the
dotted key path. Unknown keys are errors. This module builds nothing: it does not load models
or hardware and does not import simpy.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from batchsim.catalog import catalog_dir
from batchsim.catalog.frameworks import apply_framework
from batchsim.cluster.config import ClusterConfig, check_cluster
from batchsim.errors import ConfigError
from batchsim.scheduler.config import SchedulerConfig, SpeculativeConfig
from batchsim.scheduler.registry import load_policy
from batchsim.validation import (
    MAX_GB,
    MAX_MS,
    MAX_SECONDS,
    MAX_STEP_MS,
    MAX_TOKENS,
    ConfigModel,
    FieldError,
    StrictBool,
    StrictFloat,
    StrictInt,
    config_error_from_pydantic,
    format_value,
    number_problem,
)
from batchsim.workload import WorkloadConfig
from batchsim.yamlio import MAX_DEPTH, dump, line_of, loads, read_mapping

MAX_NAME_CHARS = 100
_NAME_PATTERN = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")

WeightDtype = Literal["fp16", "bf16", "fp8", "int8", "int4"]
KvDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]
FrameworkName = Literal["vllm-v0", "vllm-v1", "sglang", "tensorrt-llm", "lmdeploy"]


class ParallelConfig(ConfigModel):
    """``parallel:`` — how the model is split across GPUs."""

    tensor_parallel_size: StrictInt = Field(1, ge=1, le=65536)
    """GPUs sharing every layer (weights, FLOPs and KV heads split; two all-reduces per layer)."""
    pipeline_parallel_size: StrictInt = Field(1, ge=1, le=1024)
    """Pipeline stages P: the layers are split into P consecutive stages of
    ``tensor_parallel_size`` GPUs each (TP x PP GPUs per engine); up to P batches are in
    flight, one per stage (see :mod:`batchsim.engine.pipeline`). 1: no pipeline."""


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
    watermark: StrictFloat = Field(0.01, ge=0, lt=1)
    """Fraction of KV blocks admission keeps free (vLLM's block-manager watermark): a waiting
    request is admitted, or a swapped one resumed, only if this many blocks stay free after
    its allocation; running requests may grow into them."""
    swap_space_gib: StrictFloat = Field(4.0, ge=0, le=MAX_GB)
    """Host memory per GPU for KV blocks preempted by swapping (GiB; vLLM's ``swap_space``).
    Used with ``scheduler.preemption_mode: swap``."""
    async_scheduling: StrictBool = False
    """Overlap the CPU work of an iteration with the previous GPU step (vLLM V1 async)."""
    framework: FrameworkName | None = None
    """Serving-engine preset (``frameworks/NAME.yaml``, ``batchsim list frameworks``): fills
    every ``engine.*`` and ``scheduler.*`` key it sets that the experiment does not set.
    Precedence: experiment key (or ``--set``) > preset > hardware profile."""
    all_reduce_latency_us: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS * 1e3)
    """Fixed time per tensor-parallel all-reduce (us); default: the hardware profile's
    ``efficiency.interconnect_latency_us`` (NCCL)."""
    launch_overhead_ms: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS)
    """Fixed GPU-side time per forward pass (ms); default: the hardware profile's
    ``efficiency.launch_overhead_ms``."""
    cuda_graph_max_batch_size: StrictInt | None = Field(None, ge=0, le=MAX_TOKENS)
    """Largest CUDA-graph batch size: a decode-only iteration of n <= this requests runs as
    the next captured size (1, 2, 4, then multiples of 8, vLLM) and the added rows count as
    padding tokens; larger batches run unpadded. None or 0: no padding."""
    fast_forward: StrictBool = True
    """Advance decode-only stretches in one step, for policies that declare
    ``decode_stretches`` (same results; off only to cross-check)."""
    enable_prefix_caching: StrictBool = False
    """Automatic prefix caching (vLLM's ``enable_prefix_caching``): full KV blocks of content
    that requests share (the workload's prefix segments) stay cached after their requests
    leave, and a request starting with cached blocks skips computing them
    (:mod:`batchsim.engine.prefix_cache`). Not with a sliding-window model."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (:mod:`batchsim.scheduler.speculative`); null: none."""


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
    record_slots: StrictBool = False
    """Record which request sits in which batch slot in every iteration (``slots.csv``, for
    ``batchsim plot timeline`` and the ITL distribution); costs time per iteration."""


OUTPUT_FORMATS = ("csv", "parquet")
MAX_ITERATION_SAMPLE = 1_000_000_000
"""Most iteration rows ``output.iterations: {sample: N}`` may ask for."""


class IterationSample(ConfigModel):
    """``output.iterations: {sample: N}`` — N iteration rows, evenly spaced over the run."""

    sample: StrictInt = Field(ge=2, le=MAX_ITERATION_SAMPLE)


class OutputConfig(ConfigModel):
    """``output:`` — how the run's tables are written (the summary is the same whatever)."""

    format: Literal["csv", "parquet"] = "csv"
    """File format of the request, iteration and slot tables (``requests.csv`` or
    ``requests.parquet``, ...); ``summary.json`` and ``config.yaml`` are always JSON and YAML."""
    iterations: Literal["all", "none"] | IterationSample = "all"
    """Rows of the iteration table: ``all``, ``none`` (no file), or ``{sample: N}``: N rows
    evenly spaced over the run, the first and the last included (their ``iteration`` column
    keeps the numbers of the full run)."""

    @field_validator("iterations", mode="before")
    @classmethod
    def _iterations(cls, value: Any) -> Any:
        # One message for the three forms (a union would report one error per form).
        if isinstance(value, IterationSample) or (
            isinstance(value, str) and value in ("all", "none")
        ):
            return value
        if isinstance(value, Mapping) and set(value) == {"sample"}:
            problem = number_problem(value["sample"], integer=True, ge=2, le=MAX_ITERATION_SAMPLE)
            if problem:
                raise FieldError("sample", problem)
            return IterationSample(sample=int(value["sample"]))
        raise FieldError(
            "",
            "must be all, none or {sample: N} (N iteration rows evenly spaced over the run); "
            f"got {format_value(value)}",
        )

    @property
    def iteration_sample(self) -> int | None:
        """N of ``iterations: {sample: N}``, else None."""
        return self.iterations.sample if isinstance(self.iterations, IterationSample) else None


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
    output: OutputConfig = OutputConfig()
    cluster: ClusterConfig | None = None
    """Replicas of the engine behind a router (:mod:`batchsim.cluster`); None: one engine.
    Left out of the resolved config when None."""

    @model_serializer(mode="wrap")
    def _without_cluster(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # an experiment without replicas dumps as it did before cluster: existed
        data = handler(self)
        if data.get("cluster", 0) is None:
            del data["cluster"]
        return data

    @property
    def num_gpus(self) -> int:
        """GPUs one run of this experiment occupies (``parallel.tensor_parallel_size`` x
        ``parallel.pipeline_parallel_size``; the sum over the replicas of a cluster)."""
        if self.cluster is None:
            return self.parallel.tensor_parallel_size * self.parallel.pipeline_parallel_size
        total = 0
        for group in self.cluster.groups:
            parallel = (group.parallel or {}).get("tensor_parallel_size")
            tp = parallel if isinstance(parallel, int) else self.parallel.tensor_parallel_size
            total += group.count * tp
        return total

    @field_validator("hardware", "model")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        # The default output directory is runs/<name>: a name must not reach outside runs/.
        if not _NAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"must be a folder name of 1 to {MAX_NAME_CHARS} letters, digits, '.', '-' or "
                f"'_', not starting with '.'; got {format_value(value)}"
            )
        return value


def parse_override(item: str) -> tuple[str, Any]:
    """``"scheduler.max_num_seqs=8"`` -> ``("scheduler.max_num_seqs", 8)`` (YAML value syntax)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=8")
    if not raw.strip():
        return key, ""
    try:
        value = loads(raw)  # the rules of experiment files: YAML 1.2 core schema, finite
    except ConfigError as exc:
        if exc.message.startswith("malformed YAML"):
            return key, raw  # not YAML: the text itself (a path with ': ', ...)
        raise ConfigError(f"--set {item}: {exc.message}") from None
    return key, value


_MAX_LABEL_VALUE_CHARS = 60


def override_label(key: str, value: Any, origin: str = "--set") -> str:
    """How an override is named in error messages: ``--set workload.arrival.rate=8``."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (Mapping, list)):
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip()
    else:
        text = json.dumps(value)
    text = " ".join(text.split())
    if len(text) > _MAX_LABEL_VALUE_CHARS:
        text = text[: _MAX_LABEL_VALUE_CHARS - 3] + "..."
    return f"{origin} {key}={text}"


def keyword_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`batchsim.run`'s keyword arguments as dotted overrides.

    A mapping given for a top-level block merges into that block
    (``scheduler={"max_num_seqs": 8}`` sets one key and keeps the others); any other value,
    and every dotted key, replaces what is there.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if "." not in key and isinstance(value, Mapping):
            out.update({f"{key}.{sub}": item for sub, item in value.items()})
        else:
            out[key] = value
    return out


# Keys whose string value may be a file; an override's file is relative to the working
# directory (a file's own values are relative to the file).
_FILE_KEYS = ("hardware", "model", "workload", "workload.trace.path")


def _absolutize_override(data: dict[str, Any], key: str) -> None:
    for file_key in _FILE_KEYS:
        if file_key != key and not file_key.startswith(key + "."):
            continue
        *parents, last = file_key.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        value = node.get(last) if isinstance(node, dict) else None
        if not isinstance(value, str):
            continue
        if file_key != "workload.trace.path" and not (
            "/" in value or value.endswith((".yaml", ".yml", ".json"))
        ):
            continue  # a built-in name
        candidate = Path.cwd() / value
        if candidate.is_file():
            node[last] = str(candidate.resolve())


def apply_overrides(
    data: Mapping[str, Any],
    overrides: Mapping[str, Any],
    *,
    origin: str = "--set",
    base_dir: Path | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted-key overrides applied, in order.

    Each value replaces what is at its key, a mapping included:
    ``workload.arrival={process: all_at_once}`` replaces the whole ``arrival`` block. A named
    workload (``workload: sharegpt-like``) becomes its mapping before a key inside it is set,
    so ``workload=sharegpt-like`` followed by ``workload.num_requests=20`` works. File paths
    given as override values are relative to the working directory.

    Args:
        data: The experiment mapping (not modified).
        overrides: Dotted key -> value.
        origin: How the overrides were given, for error messages (``--set``).
        base_dir: Directory of the experiment file (for a named workload in it).
        source: The experiment file, for error messages about it.

    Raises:
        ConfigError: A key that is not a dotted path, or one that reaches into a value that is
            not a mapping; the message names the override.
    """
    out = copy.deepcopy(dict(data))
    base = base_dir if base_dir is not None else Path.cwd()
    named_by: str | None = None  # the override that set workload to a name, if any
    for key, value in overrides.items():
        label = override_label(key, value, origin)
        parts = key.split(".")
        if not all(part.strip() for part in parts):
            raise ConfigError(
                f"{key!r} is not a dotted key path like scheduler.max_num_seqs", label
            )
        if len(parts) > 1 and parts[0] == "workload":
            _expand_named_workload(out, base, source, named_by)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                path = ".".join(parts[: i + 1])
                raise ConfigError(f"{path} is not a mapping (it is {format_value(child)})", label)
            node = child
        node[parts[-1]] = copy.deepcopy(value)
        _absolutize_override(out, key)
        if key == "workload":
            named_by = label if isinstance(value, str) else None
    if named_by is not None:
        _expand_named_workload(out, base, source, named_by)
    return out


def _expand_named_workload(
    data: dict[str, Any], base_dir: Path, source: str | None, named_by: str | None
) -> None:
    try:
        _expand_workload(data, base_dir, source)
    except ConfigError as exc:
        if named_by is None:
            raise
        raise ConfigError(exc.message, named_by) from None


def _absolutize(data: dict[str, Any], base_dir: Path) -> None:
    """Make relative file references absolute against the experiment's directory, so the
    resolved ``config.yaml`` reruns from anywhere. Built-in names are left alone."""
    for key in ("hardware", "model"):
        value = data.get(key)
        if isinstance(value, str) and ("/" in value or value.endswith((".yaml", ".yml", ".json"))):
            candidate = base_dir / value
            if candidate.is_file():
                data[key] = str(candidate.resolve())
    cluster = data.get("cluster")
    groups = cluster.get("replicas") if isinstance(cluster, dict) else None
    groups = list(groups) if isinstance(groups, list) else []
    pools = cluster.get("disaggregation") if isinstance(cluster, dict) else None
    if isinstance(pools, dict):
        groups += [pools.get("prefill"), pools.get("decode")]
    for group in groups:
        value = group.get("hardware") if isinstance(group, dict) else None
        if isinstance(value, str) and ("/" in value or value.endswith((".yaml", ".yml"))):
            candidate = base_dir / value
            if candidate.is_file():
                group["hardware"] = str(candidate.resolve())
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
    try:
        raw = copy.deepcopy(dict(data))
    except RecursionError:  # a Python object nested without end (files are checked on reading)
        raise ConfigError(f"experiment: nesting deeper than {MAX_DEPTH} levels", source) from None
    _expand_workload(raw, base, source)
    _absolutize(raw, base)
    try:
        apply_framework(raw, _policy_keys)
    except ConfigError as exc:
        raise _located(exc.message, source, text, overridden) from None
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        err = config_error_from_pydantic(exc, "", None, model=ExperimentConfig)
        raise _located(err.message, source, text, overridden) from None
    try:
        load_policy(config.scheduler.policy).check_config(config.scheduler)
        check_cluster(config)
        check_pipeline(config)
    except ConfigError as exc:
        raise _located(exc.message, source, text, overridden) from None
    return config


def _policy_keys(policy: Any) -> frozenset[str] | None:
    """The scheduler keys ``policy`` reads, or None if it cannot be loaded (the schema then
    reports the policy)."""
    try:
        return load_policy(policy).config_keys
    except (ConfigError, TypeError, ValueError):
        return None


PIPELINE_POLICIES = ("continuous", "chunked_prefill")
"""Policies that run with ``parallel.pipeline_parallel_size`` > 1."""


def check_pipeline(config: ExperimentConfig) -> None:
    """Reject a pipeline (``parallel.pipeline_parallel_size`` > 1) with what it cannot run
    with: a policy other than :data:`PIPELINE_POLICIES` (request-level batches and policies
    written elsewhere assume one batch at a time) or replicas of a cluster."""
    pp = config.parallel.pipeline_parallel_size
    groups = config.cluster.groups if config.cluster is not None else []
    if pp == 1 and not any(
        (g.parallel or {}).get("pipeline_parallel_size", 1) != 1 for g in groups
    ):
        return
    if config.cluster is not None:
        raise ConfigError(
            "parallel.pipeline_parallel_size must be 1 with cluster: replicas (a pipeline "
            "runs as one engine)"
        )
    if config.scheduler.policy not in PIPELINE_POLICIES:
        raise ConfigError(
            f"scheduler.policy must be one of {', '.join(PIPELINE_POLICIES)} with "
            f"parallel.pipeline_parallel_size {pp}, got {config.scheduler.policy!r}"
        )


def _error_key(message: str) -> str:
    """The dotted key an error message starts with (``workload.arrival.rate``)."""
    return re.sub(r"\[\d+\]", "", message.split(" ", 1)[0].rstrip(":"))


def _related(item: str, key: str) -> bool:
    return item == key or key.startswith(item + ".") or item.startswith(key + ".")


def _located(
    message: str, source: str | None, text: str | None, overridden: Iterable[str]
) -> ConfigError:
    """A ConfigError pointing at the line of the offending key, or at ``--set`` if the value
    came from the command line."""
    key = _error_key(message)
    for item in overridden:
        if _related(item, key):
            return ConfigError(message, f"--set {item}")
    line = line_of(text, key.split(".")) if text else None
    return ConfigError(message, source, line)


def name_override(
    error: ConfigError, overrides: Mapping[str, Any], origin: str = "--set"
) -> ConfigError:
    """``error`` naming the override it is about (``--set hardware=h100: hardware: ...``) when
    it names no file and its key is an override's key, inside one or around one; else
    ``error`` itself."""
    if error.source:
        return error
    key = _error_key(error.message)
    related = [item for item in overrides if _related(item, key)]
    if not related:
        return error
    item = max(reversed(related), key=lambda k: k.count("."))  # the most specific, then the last
    return ConfigError(error.message, override_label(item, overrides[item], origin))


def _validation_errors(data: Mapping[str, Any], base_dir: Path) -> list[tuple[Any, ...]] | None:
    """(location, type) of each schema error of ``data``; None if it cannot even be read."""
    raw = copy.deepcopy(dict(data))
    try:
        _expand_workload(raw, base_dir, None)
        _absolutize(raw, base_dir)
        ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        return [(tuple(e["loc"]), e["type"]) for e in exc.errors(include_url=False)]
    except ConfigError:
        return None
    return []


def _blame_overrides(
    error: ConfigError,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    overrides: Mapping[str, Any],
    origin: str,
    base_dir: Path,
) -> ConfigError:
    """Name the override behind ``error`` (raised validating ``after``) instead of the file.

    An error about an override's key, or a schema error the file alone does not have (a
    sibling key the new value needs, a combination it forbids), is the override's; other
    errors stay the file's, with its line.
    """
    named = name_override(ConfigError(error.message), overrides, origin)
    if named.source:
        return named
    new = _validation_errors(after, base_dir)
    if not new or new[0] in (_validation_errors(before, base_dir) or ()):
        return error
    key = _error_key(error.message).split(".")

    def shared(item: str) -> int:
        parts = item.split(".")
        return next((i for i, (a, b) in enumerate(zip(parts, key)) if a != b), len(parts))

    item = max(reversed(list(overrides)), key=shared)  # closest to the key, then the last
    return ConfigError(error.message, override_label(item, overrides[item], origin))


STUDY_BLOCKS = ("sweep",)
"""Top-level blocks read by ``batchsim sweep`` and ``batchsim capacity``, not by one run."""


@dataclass(frozen=True)
class ExperimentSource:
    """An experiment as read, before overrides and validation: read once, resolved many times
    (a sweep resolves one config per point).

    Attributes:
        data: The raw mapping, without the study blocks (``sweep:``).
        text: The file's text (to point errors at a line), or None for a mapping.
        source: The file name for error messages, or None.
        base_dir: The directory relative paths in it are relative to.
        studies: The study blocks found in it (``{"sweep": {...}}``), raw.
    """

    data: dict[str, Any]
    text: str | None
    source: str | None
    base_dir: Path
    studies: dict[str, Any]

    @classmethod
    def read(cls, path_or_data: str | Path | Mapping[str, Any]) -> ExperimentSource:
        """Read an experiment YAML, a built-in experiment name, or a mapping."""
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
        studies = {key: data.pop(key) for key in STUDY_BLOCKS if key in data}
        return cls(data, text, source, base, studies)

    def load(
        self, overrides: Mapping[str, Any] | None = None, *, origin: str = "--set"
    ) -> ExperimentConfig:
        """Apply dotted-key overrides (see :func:`apply_overrides`) and validate.

        Errors caused by an override name it with ``origin``
        (``--set scheduler.max_num_seqs=0: ...``); others name the file and line.
        """
        if not overrides:
            return validate_experiment(
                self.data, source=self.source, text=self.text, base_dir=self.base_dir
            )
        changed = apply_overrides(
            self.data, overrides, origin=origin, base_dir=self.base_dir, source=self.source
        )
        try:
            return validate_experiment(
                changed, source=self.source, text=self.text, base_dir=self.base_dir
            )
        except ConfigError as exc:
            raise _blame_overrides(
                exc, self.data, changed, overrides, origin, self.base_dir
            ) from None

    def with_overrides(
        self, overrides: Mapping[str, Any], *, origin: str = "--set"
    ) -> ExperimentSource:
        """The source with ``overrides`` applied to its raw mapping (validated later)."""
        if not overrides:
            return self
        changed = apply_overrides(
            self.data, overrides, origin=origin, base_dir=self.base_dir, source=self.source
        )
        return ExperimentSource(changed, self.text, self.source, self.base_dir, self.studies)

    def block_error(self, message: str, path: Sequence[str]) -> ConfigError:
        """A ConfigError about a key of a study block, pointing at its line."""
        line = line_of(self.text, list(path)) if self.text else None
        return ConfigError(message, self.source, line)


def load_experiment(
    path_or_data: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    *,
    origin: str = "--set",
) -> ExperimentConfig:
    """Read, override and validate an experiment.

    Args:
        path_or_data: Path to an experiment YAML, a built-in experiment name, or a mapping.
        overrides: Dotted keys -> values, applied in order; each value replaces what is at its
            key (see :func:`apply_overrides`), e.g. ``{"scheduler.max_num_seqs": 8}``.
        origin: How the overrides were given; errors they cause name them with it
            (``--set scheduler.max_num_seqs=0: ...``).

    A ``sweep:`` block is read by ``batchsim sweep`` and ``batchsim capacity`` and left out
    here: the experiment is its base point.
    """
    return ExperimentSource.read(path_or_data).load(overrides, origin=origin)


def unused_scheduler_keys(config: ExperimentConfig, used: frozenset[str]) -> list[str]:
    """``scheduler.*`` keys the policy does not read whose value is not the default.

    Keys left at their default say nothing, so rerunning a resolved ``config.yaml`` (which
    spells out every default) reports only what the user changed.
    """
    scheduler = config.scheduler
    return sorted(
        key
        for key, field in type(scheduler).model_fields.items()
        if key not in used
        and key not in ("policy", "options")
        and getattr(scheduler, key) != field.get_default(call_default_factory=True)
    )


def dump_config(config: ExperimentConfig) -> str:
    """The resolved experiment as YAML, every default filled in (nulls included): enough to
    rerun it."""
    return dump(config.model_dump(mode="json"))
