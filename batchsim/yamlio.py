"""Reading YAML/JSON files into mappings, with line numbers for error messages.

This module imports nothing from batchsim but :mod:`batchsim.errors`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from batchsim.errors import ConfigError


def line_of(text: str, path: tuple[str, ...] | list[str]) -> int | None:
    """1-based line of the deepest key of ``path`` found in a YAML/JSON document."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == str(part):
                line = key_node.start_mark.line + 1
                node = value_node
                break
        else:
            break
    return line


def read_mapping(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a YAML or JSON file whose top level is a mapping.

    Returns:
        The mapping and the file's text (for :func:`line_of`).

    Raises:
        ConfigError: Unreadable file, malformed document (with its line), or not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", str(path)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"malformed JSON: {exc.msg}", str(path), exc.lineno) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"malformed YAML: {problem}", str(path), line) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys to values at the top level, got {type(data).__name__}",
            str(path),
        )
    return data, text
