"""From a raw experiment mapping to a validated :class:`~batchsim.config.experiment.
ExperimentConfig` (:func:`validate_experiment`): named workloads and relative paths resolved,
the serving-engine preset applied, the schema checked, then every check that needs more than
one block; or one line naming the file, the line and the dotted key."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from batchsim.catalog import catalog_dir
from batchsim.catalog.frameworks import apply_framework
from batchsim.catalog.model_files import load_model
from batchsim.config.experiment import ExperimentConfig
from batchsim.config.groups import check_cluster
from batchsim.errors import ConfigError
from batchsim.scheduler.registry import load_policy
from batchsim.validation import config_error_from_pydantic
from batchsim.yamlio import MAX_DEPTH, line_of, read_mapping


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
        _apply_checkpoint(raw)
    except ConfigError as exc:
        if exc.source:  # about the model's own file
            raise
        raise _located(exc.message, source, text, overridden) from None
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


def _apply_checkpoint(data: dict[str, Any]) -> None:
    """The precision of a quantized checkpoint (its ``quantization_config``,
    :mod:`batchsim.catalog.quantization`) for the ``engine`` keys ``data`` does not set, as
    an engine loads it; the resolved ``config.yaml`` then records them."""
    name, engine = data.get("model"), data.get("engine", {})
    if not isinstance(name, str) or not isinstance(engine, dict):
        return  # the schema reports it
    model = load_model(name)
    if model.checkpoint_dtype is None:
        return
    engine = data.setdefault("engine", engine)
    engine.setdefault("dtype", model.checkpoint_dtype)
    # vLLM's kv_cache_dtype "auto" is the model's 16-bit activation dtype for a quantized
    # checkpoint, unless the checkpoint carries an FP8 KV-cache scheme
    engine.setdefault("kv_cache_dtype", model.checkpoint_kv_cache_dtype or "bf16")


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
