"""``--set KEY.PATH=VALUE`` and :func:`batchsim.run`'s keyword arguments: dotted-key overrides
of an experiment, applied in order, and errors that name the override they come from."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from batchsim.config.experiment import ExperimentConfig
from batchsim.config.resolve import _absolutize, _error_key, _expand_workload, _related
from batchsim.errors import ConfigError
from batchsim.validation import format_value
from batchsim.yamlio import loads


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
