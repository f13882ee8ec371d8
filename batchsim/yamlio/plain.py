"""Plain data: the shape and number rules every document keeps (at most :data:`MAX_DEPTH`
levels and :data:`MAX_NODES` values, string keys, finite numbers, only plain types), checked
by :func:`data_problem` on values that did not come from a file, and :func:`dump`, YAML text
of plain data that the reader reads back as the same data.
"""

from __future__ import annotations

import math
from typing import Any, cast

import yaml
from yaml.emitter import Emitter
from yaml.representer import SafeRepresenter
from yaml.serializer import Serializer

from batchsim.yamlio.schema import _Resolver

MAX_DEPTH = 100
"""Deepest nesting of mappings and lists in a YAML/JSON document (after expanding aliases)."""
MAX_NODES = 1_000_000
"""Most values (scalars, lists and mappings) in a YAML/JSON document, after expanding aliases."""


def _join(path: str, key: str) -> str:
    # a key with line breaks or other unprintable characters is shown escaped: an error
    # message stays one line
    shown = key if key.isprintable() else repr(key)
    return f"{path}.{shown}" if path else shown


def _short(text: Any, *, quote: bool = True) -> str:
    shown = repr(text) if isinstance(text, str) and quote else str(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


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


class _Dumper(Emitter, Serializer, SafeRepresenter, _Resolver):
    """PyYAML's safe dumper, quoting every string the reader would not read back as that
    string (``'8e1'``, ``'0o17'``; PyYAML's YAML 1.1 rules leave them bare)."""

    def __init__(self, stream: Any, **kwargs: Any):
        Emitter.__init__(self, stream, width=kwargs.get("width"))
        Serializer.__init__(self)
        SafeRepresenter.__init__(self, sort_keys=False)
        _Resolver.__init__(self)


def dump(data: Any) -> str:
    """YAML text of plain data that :func:`~batchsim.yamlio.loads` reads back as the same data."""
    return cast(str, yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
