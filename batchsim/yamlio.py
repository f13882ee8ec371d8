"""Reading YAML/JSON files and data files: the one reader every input file goes through.

Experiment, workload, hardware-profile and model files (YAML, or a Hugging Face
``config.json``) are read by :func:`read_mapping`; trace and data files by :func:`read_text`.
Both apply the same rules, and break them with a one-line :class:`~batchsim.errors.ConfigError`
naming the file (and the line, where there is one):

- **Size**: at most :data:`MAX_CONFIG_BYTES` (64 MiB) for YAML/JSON files, at most
  :data:`MAX_DATA_BYTES` (512 MiB) for trace and data files. An empty file is an error.
- **Encoding**: UTF-8 (a UTF-8 byte-order mark is skipped). UTF-16/UTF-32 text, NUL bytes
  (binary files) and invalid UTF-8 are errors.
- **Shape** (YAML/JSON): at most :data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES`
  values, both counted after expanding YAML aliases (a "billion laughs" document is refused
  before anything expands it); no alias inside its own anchor; mapping keys are strings and
  appear once per mapping; only the standard tags (``!!str``, ``!!int``, ``!!float``,
  ``!!bool``, ``!!null``, ``!!seq``, ``!!map``) and merge keys (``<<``).
- **Scalars** follow the YAML 1.2 core schema: ``true``/``false`` are booleans (``yes``,
  ``no``, ``on``, ``off`` are strings), ``8e1``, ``1e3`` and ``.5e-1`` are numbers (PyYAML's
  YAML 1.1 rules read them as strings), ``012`` is twelve, ``0x1f`` and ``0o17`` are integers,
  ``_`` may separate digits, there are no timestamps. Every number must be finite:
  ``.nan``, ``.inf``, JSON ``NaN``/``Infinity`` and overflowing literals like ``1e400`` are
  errors naming the key path.

:func:`data_problem` applies the shape and number rules to values that did not come from a file
(mappings given to the Python API, free-form ``scheduler.options``).

This module imports nothing from batchsim but :mod:`batchsim.errors`.
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
from yaml.emitter import Emitter
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.representer import SafeRepresenter
from yaml.resolver import BaseResolver
from yaml.serializer import Serializer

from batchsim.errors import ConfigError

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


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DATA_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "data_problem",
    "dump",
    "line_of",
    "loads",
    "read_mapping",
    "read_text",
]

MAX_CONFIG_BYTES = 64 * 2**20
"""Largest YAML/JSON file read (experiment, workload, hardware, model, config.json)."""
MAX_DATA_BYTES = 512 * 2**20
"""Largest trace or data file read."""
MAX_DEPTH = 100
"""Deepest nesting of mappings and lists in a YAML/JSON document (after expanding aliases)."""
MAX_NODES = 1_000_000
"""Most values (scalars, lists and mappings) in a YAML/JSON document, after expanding aliases."""

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"

_DIGITS = r"[0-9](?:_?[0-9])*"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL_RE = re.compile(r"^(?:~|null|Null|NULL|)$")
_INT_RE = re.compile(rf"^[-+]?(?:{_DIGITS}|0o[0-7](?:_?[0-7])*|0x[0-9a-fA-F](?:_?[0-9a-fA-F])*)$")
_FLOAT_RE = re.compile(
    rf"^(?:[-+]?(?:\.{_DIGITS}|{_DIGITS}(?:\.(?:{_DIGITS})?)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_MAX_INT_CHARS = 1000  # longer integer literals are refused (Python parses at most 4300 digits)
_SCALAR_RULES = {_BOOL: _BOOL_RE, _NULL: _NULL_RE, _INT: _INT_RE, _FLOAT: _FLOAT_RE}
_SCALAR_WORDS = {_BOOL: "true or false", _NULL: "null", _INT: "an integer", _FLOAT: "a number"}


class _Problem(Exception):
    """A broken rule found while reading a document (becomes a ConfigError naming the file)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


def _line(node_or_event: Any) -> int | None:
    mark = getattr(node_or_event, "start_mark", None)
    return mark.line + 1 if mark is not None else None


def _to_int(text: str) -> int:
    if re.match(r"^[-+]?0[xo]", text):
        return int(text, 0)
    return int(text, 10)


def _to_float(text: str) -> float:
    lower = text.lower()
    if lower.endswith(".inf"):
        return -math.inf if lower.startswith("-") else math.inf
    if lower == ".nan":
        return math.nan
    return float(text)


# ------------------------------------------------------------------------------- YAML loader


class _Resolver(BaseResolver):
    """YAML 1.2 core schema scalars (plus ``_`` digit separators and ``<<`` merge keys)."""


# Own tables, so PyYAML's YAML 1.1 resolvers (yes/no booleans, 1.1 floats, timestamps) are gone.
_Resolver.yaml_implicit_resolvers = {}
_Resolver.yaml_path_resolvers = {}

_Resolver.add_implicit_resolver(_BOOL, _BOOL_RE, list("tTfF"))
_Resolver.add_implicit_resolver(_NULL, _NULL_RE, ["~", "n", "N", ""])
_Resolver.add_implicit_resolver(_INT, _INT_RE, list("-+0123456789"))
_Resolver.add_implicit_resolver(_FLOAT, _FLOAT_RE, list("-+.0123456789"))
_Resolver.add_implicit_resolver(_MERGE, re.compile(r"^(?:<<)$"), ["<"])


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


def _join(path: str, key: str) -> str:
    # a key with line breaks or other unprintable characters is shown escaped: an error
    # message stays one line
    shown = key if key.isprintable() else repr(key)
    return f"{path}.{shown}" if path else shown


def _short(text: Any, *, quote: bool = True) -> str:
    shown = repr(text) if isinstance(text, str) and quote else str(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


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


# ------------------------------------------------------------------------------- plain data


def check_plain_data(value: Any) -> Any:
    """``value`` if it keeps every rule of :func:`data_problem`; otherwise raise the
    :class:`~batchsim.validation.FieldError` that names the first rule it breaks (a pydantic
    validator of free-form settings: a policy's or a router's ``options``)."""
    from batchsim.validation import FieldError

    problem = data_problem(value)
    if problem is not None:
        raise FieldError(*problem)
    return value


def data_problem(value: Any) -> tuple[str, str] | None:
    """The first shape or number rule (nesting, size, string keys, finite numbers, plain
    types) that ``value`` breaks: ``(key path, rest of the sentence)``, or None.

    For values that did not come from a file (mappings given to the Python API, free-form
    ``scheduler.options``). The rest of the sentence reads after the key path:
    ``must be a finite number, got nan`` or ``: nesting deeper than 100 levels``.
    """
    count = 0
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, level, path = stack.pop()
        if len(path) > 80:
            path = path[:77] + "..."
        count += 1
        if count > MAX_NODES:
            return path, f": more than {MAX_NODES:,} values"
        if level > MAX_DEPTH:
            return path, f": nesting deeper than {MAX_DEPTH} levels"
        if isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if not isinstance(key, str):
                    return path, f": mapping keys must be strings, got {_short(key)}"
                stack.append((child, level + 1, _join(path, key)))
        elif isinstance(item, (list, tuple)):
            for i in reversed(range(len(item))):
                stack.append((item[i], level + 1, f"{path}[{i}]"))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, f"must be a finite number, got {item}"
        elif not (item is None or isinstance(item, (str, int, bool))):
            return path, (
                ": must hold only strings, numbers, true/false, null, lists and mappings, "
                f"got a value of type {type(item).__name__}"
            )
    return None


def _sentence(path: str, tail: str) -> str:
    if tail.startswith(":"):
        return f"{path}{tail}" if path else tail[1:].lstrip()
    return f"{path or 'value'} {tail}"


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
    """The text of a file after the size and encoding rules (see the module docstring).

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
    """Parse a YAML (or JSON) document with the rules of the module docstring.

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
            its line), a broken rule of the module docstring, or not a mapping.
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


class _Dumper(Emitter, Serializer, SafeRepresenter, _Resolver):
    """PyYAML's safe dumper, quoting every string the reader would not read back as that
    string (``'8e1'``, ``'0o17'``; PyYAML's YAML 1.1 rules leave them bare)."""

    def __init__(self, stream: Any, **kwargs: Any):
        Emitter.__init__(self, stream, width=kwargs.get("width"))
        Serializer.__init__(self)
        SafeRepresenter.__init__(self, sort_keys=False)
        _Resolver.__init__(self)


def dump(data: Any) -> str:
    """YAML text of plain data that :func:`loads` reads back as the same data."""
    return cast(str, yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True))


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
