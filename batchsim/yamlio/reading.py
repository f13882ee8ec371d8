"""The one reader of input files: :func:`read_text` (the size and encoding rules of every file),
:func:`loads` (a YAML or JSON document, with the shape, key, tag and number rules, each broken
rule named with its line), :func:`read_mapping` (a file whose top level is a mapping) and
:func:`line_of` (the line of a key, for errors found later). The rules are listed in
:mod:`batchsim.yamlio`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from batchsim.errors import ConfigError
from batchsim.yamlio.plain import MAX_DEPTH, MAX_NODES, _join, _sentence, _short, data_problem
from batchsim.yamlio.schema import (
    _BOOL,
    _FLOAT,
    _INT,
    _MAP,
    _MAX_INT_CHARS,
    _MERGE,
    _NULL,
    _SCALAR_RULES,
    _SCALAR_WORDS,
    _SEQ,
    _STR,
    _Resolver,
    _to_float,
    _to_int,
)

try:  # libyaml's parser (events only; the composer below is Python): ~4x faster
    from yaml._yaml import CParser as _EventSource
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser as _PyParser
    from yaml.reader import Reader as _PyReader
    from yaml.scanner import Scanner as _PyScanner

    class _EventSource(_PyReader, _PyScanner, _PyParser):  # type: ignore[no-redef]
        def __init__(self, stream: str):
            _PyReader.__init__(self, stream)
            _PyScanner.__init__(self)
            _PyParser.__init__(self)


MAX_CONFIG_BYTES = 64 * 2**20
"""Largest YAML/JSON file read (experiment, workload, hardware, model, config.json)."""
MAX_DATA_BYTES = 512 * 2**20
"""Largest trace or data file read."""


class _Problem(Exception):
    """A broken rule found while reading a document (becomes a ConfigError naming the file)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


def _line(node_or_event: Any) -> int | None:
    mark = getattr(node_or_event, "start_mark", None)
    return mark.line + 1 if mark is not None else None


# ------------------------------------------------------------------------------- YAML loader


class _Constructor(SafeConstructor):
    """Builds only plain data: str, int, float, bool, None, list, dict."""

    def construct_core_int(self, node: ScalarNode) -> int:
        return _to_int(node.value)

    def construct_core_float(self, node: ScalarNode) -> float:
        return _to_float(node.value)

    def construct_core_bool(self, node: ScalarNode) -> bool:
        return node.value.lower() == "true"


_Constructor.yaml_constructors = {
    _NULL: SafeConstructor.construct_yaml_null,
    _BOOL: _Constructor.construct_core_bool,
    _INT: _Constructor.construct_core_int,
    _FLOAT: _Constructor.construct_core_float,
    _STR: SafeConstructor.construct_yaml_str,
    _SEQ: SafeConstructor.construct_yaml_seq,
    _MAP: SafeConstructor.construct_yaml_map,
    None: SafeConstructor.construct_undefined,
}
_Constructor.yaml_multi_constructors = {}


class _LimitedComposer(Composer):
    """PyYAML's composer with a nesting limit, a node budget and no recursive aliases."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._count = 0
        self._open: set[str] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()  # type: ignore[attr-defined]
        self._count += 1
        if self._count > MAX_NODES:
            raise _Problem(f"more than {MAX_NODES:,} values in one document", _line(event))
        if isinstance(event, AliasEvent):
            if event.anchor in self._open:
                raise _Problem(
                    f"recursive alias *{event.anchor}: a value cannot contain itself", _line(event)
                )
            return cast(Node, super().compose_node(parent, index))
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Problem(f"nesting deeper than {MAX_DEPTH} levels", _line(event))
        anchor = event.anchor if isinstance(event, CollectionStartEvent) else None
        if anchor is not None:
            self._open.add(anchor)
        try:
            return cast(Node, super().compose_node(parent, index))
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.discard(anchor)


class _Loader(_LimitedComposer, _EventSource, _Constructor, _Resolver):
    """Events from libyaml (or PyYAML's Python parser), nodes from the limited composer (first
    in the bases: the C parser has a composer of its own), plain data from the constructor."""

    def __init__(self, stream: str):
        _EventSource.__init__(self, stream)
        _LimitedComposer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


def _compose(text: str) -> Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def _check_nodes(root: Node) -> None:
    """Rules on the composed document: size and depth after alias expansion, keys, tags and
    finite numbers. Raises :class:`_Problem`."""
    seen: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, height)
    total = 0

    def visit(node: Node, level: int, path: str) -> tuple[int, int]:
        nonlocal total
        known = seen.get(id(node))
        if known is not None:  # an alias: count its expansion again
            size, height = known
            total += size
            if total > MAX_NODES:
                raise _Problem(
                    f"more than {MAX_NODES:,} values after expanding aliases", _line(node)
                )
            if level + height - 1 > MAX_DEPTH:
                raise _Problem(
                    f"nesting deeper than {MAX_DEPTH} levels after expanding aliases", _line(node)
                )
            return known
        if level > MAX_DEPTH:
            raise _Problem(f"nesting deeper than {MAX_DEPTH} levels", _line(node))
        total += 1
        if total > MAX_NODES:
            raise _Problem(f"more than {MAX_NODES:,} values after expanding aliases", _line(node))
        size, height = 1, 1
        if isinstance(node, ScalarNode):
            _check_scalar(node, path)
        elif isinstance(node, SequenceNode):
            if node.tag != _SEQ:
                raise _Problem(f"unsupported YAML tag {_tag(node.tag)}", _line(node))
            for i, child in enumerate(node.value):
                s, h = visit(child, level + 1, f"{path}[{i}]")
                size, height = size + s, max(height, h + 1)
        elif isinstance(node, MappingNode):
            if node.tag != _MAP:
                raise _Problem(f"unsupported YAML tag {_tag(node.tag)}", _line(node))
            keys: set[str] = set()
            for key, value in node.value:
                if not (isinstance(key, ScalarNode) and key.tag in (_STR, _MERGE)):
                    shown = _short(key.value, quote=False) if key.id == "scalar" else f"a {key.id}"
                    where = f"{path}: " if path else ""
                    raise _Problem(f"{where}mapping keys must be strings, got {shown}", _line(key))
                if key.tag == _MERGE:
                    raise _Problem(
                        f"{path + ': ' if path else ''}merge keys (<<) are YAML 1.1, which "
                        "batchsim does not read (it reads YAML 1.2): write the keys out",
                        _line(key),
                    )
                if key.tag == _STR:
                    if key.value in keys:
                        raise _Problem(
                            f"{_join(path, key.value)}: duplicate key (a key may appear once per "
                            "mapping)",
                            _line(key),
                        )
                    keys.add(key.value)
                child_path = _join(path, key.value) if key.tag == _STR else path
                s1, _ = visit(key, level + 1, child_path)
                s2, h = visit(value, level + 1, child_path)
                size, height = size + s1 + s2, max(height, h + 1)
        seen[id(node)] = (size, height)
        return size, height

    visit(root, 1, "")


def _check_scalar(node: ScalarNode, path: str) -> None:
    tag = node.tag
    if tag in (_STR, _MERGE):
        return
    rule = _SCALAR_RULES.get(tag)
    if rule is None:
        raise _Problem(f"unsupported YAML tag {_tag(tag)}", _line(node))
    if not rule.match(node.value):
        word = _SCALAR_WORDS[tag]
        raise _Problem(
            f"{path or 'value'}: {_short(node.value)} tagged {_tag(tag)} is not {word}",
            _line(node),
        )
    if tag in (_INT, _FLOAT) and "_" in node.value:
        raise _Problem(
            f"{path or 'value'}: {_short(node.value)}: digit separators (_) are YAML 1.1, which "
            f"batchsim does not read (it reads YAML 1.2): write {node.value.replace('_', '')}",
            _line(node),
        )
    if tag == _INT and len(node.value) > _MAX_INT_CHARS:
        raise _Problem(
            f"{path or 'value'}: an integer of {len(node.value)} characters is too long "
            f"(at most {_MAX_INT_CHARS})",
            _line(node),
        )
    if tag == _FLOAT and not math.isfinite(number := _to_float(node.value)):
        raise _Problem(f"{path or 'value'} must be a finite number, got {number}", _line(node))


def _tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:") :] if tag.startswith("tag:yaml.org,2002:") else tag


def _load_yaml(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


# ------------------------------------------------------------------------------- JSON


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


_JSON_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}\[\],:\n]')


def _json_duplicate_line(text: str) -> int | None:
    """Line of the first key that repeats a key of its object (error path only)."""
    line = 1
    stack: list[set[str] | None] = []
    expect_key = False
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
        elif token == "{":
            stack.append(set())
            expect_key = True
        elif token == "[":
            stack.append(None)
            expect_key = False
        elif token in "}]":
            if stack:
                stack.pop()
            expect_key = False
        elif token == ",":
            expect_key = bool(stack) and stack[-1] is not None
        elif token == ":":
            expect_key = False
        elif expect_key and stack and stack[-1] is not None:
            key = json.loads(token)
            if key in stack[-1]:
                return line
            stack[-1].add(key)
            expect_key = False
    return None


def _load_json(text: str) -> Any:
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise _Problem(f"malformed JSON: {exc.msg}", exc.lineno) from None
    except _DuplicateKey as exc:
        raise _Problem(
            f"duplicate key {_short(exc.key)} (a key may appear once per object)",
            _json_duplicate_line(text),
        ) from None
    except RecursionError:
        raise _Problem(f"nesting deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer literal longer than Python parses (4300 digits)
        raise _Problem(f"malformed JSON: {str(exc).split(':')[0]}") from None
    problem = data_problem(data)
    if problem is not None:
        path, tail = problem
        raise _Problem(_sentence(path, tail), line_of(text, _key_parts(path)))
    return data


def _key_parts(path: str) -> list[str]:
    return [part.split("[", 1)[0] for part in path.split(".") if part]


# ------------------------------------------------------------------------------- files


_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\xfe\xff", "UTF-16"),
    (b"\xff\xfe", "UTF-16"),
)


def _read_bytes(path: Path, limit: int, source: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror or exc}", source) from None
    if len(data) > limit:
        raise ConfigError(
            f"file is larger than {limit // 2**20} MiB, the limit for this kind of file", source
        )
    return data


def _decode(data: bytes, source: str) -> str:
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise ConfigError(
                f"file is {name} text (byte-order mark); batchsim reads UTF-8: save it as UTF-8",
                source,
            )
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ConfigError(
            "NUL byte: not a text file, or UTF-16/UTF-32 text; batchsim reads UTF-8 text",
            source,
            data.count(b"\n", 0, nul) + 1,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} is not valid UTF-8; "
            "batchsim reads UTF-8",
            source,
            data.count(b"\n", 0, exc.start) + 1,
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def read_text(path: Path, *, limit: int | None = None, source: str | None = None) -> str:
    """The text of a file after the size and encoding rules (see :mod:`batchsim.yamlio`).

    Args:
        path: The file.
        limit: Largest size in bytes (default :data:`MAX_DATA_BYTES`, for traces and data
            files).
        source: How to name the file in errors (default: ``path``).

    Raises:
        ConfigError: Unreadable, too large, empty, or not UTF-8 text.
    """
    shown = source if source is not None else str(path)
    limit = MAX_DATA_BYTES if limit is None else limit
    text = _decode(_read_bytes(path, limit, shown), shown)
    if not text.strip():
        raise ConfigError("empty file", shown)
    return text


def loads(text: str, *, is_json: bool = False) -> Any:
    """Parse a YAML (or JSON) document with the rules of :mod:`batchsim.yamlio`.

    Raises:
        ConfigError: The rule broken (no source; the caller adds it with ``with_source``).
    """
    try:
        return _load_json(text) if is_json else _load_yaml(text)
    except _Problem as exc:
        raise ConfigError(exc.message, None, exc.line) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        line = mark.line + 1 if mark is not None else None
        if "maximum nesting depth" in problem:  # libyaml's own limit (1000)
            raise ConfigError(f"nesting deeper than {MAX_DEPTH} levels", None, line) from None
        raise ConfigError(f"malformed YAML: {problem}", None, line) from None


def read_mapping(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a YAML or JSON (``.json``) file whose top level is a mapping.

    Returns:
        The mapping and the file's text (for :func:`line_of`).

    Raises:
        ConfigError: Unreadable, too large, empty or non-UTF-8 file, malformed document (with
            its line), a broken rule of :mod:`batchsim.yamlio`, or not a mapping.
    """
    source = str(path)
    text = read_text(path, limit=MAX_CONFIG_BYTES, source=source)
    try:
        data = loads(text, is_json=path.suffix == ".json")
    except ConfigError as exc:
        raise ConfigError(exc.message, source, exc.line) from None
    if data is None:
        raise ConfigError("empty document: expected a mapping of keys to values", source)
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys to values at the top level, got {type(data).__name__}",
            source,
        )
    return data, text


def line_of(text: str, path: Sequence[str]) -> int | None:
    """1-based line of the deepest key of ``path`` found in a YAML/JSON document."""
    try:
        node = _compose(text)
    except (yaml.YAMLError, _Problem):
        return None
    line = None
    for part in path:
        if not isinstance(node, MappingNode):
            break
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == str(part):
                line = key_node.start_mark.line + 1
                node = value_node
                break
        else:
            break
    return line
