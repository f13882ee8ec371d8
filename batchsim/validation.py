"""Turn pydantic validation errors into one-line :class:`~batchsim.errors.ConfigError` messages.

Every config block of batchsim (workload, scheduler, engine, the whole experiment) is a frozen
pydantic v2 model that rejects unknown keys. Pydantic's own error text is multi-line and names
locations like ``('arrival', 'poisson', 'rate')``, where ``poisson`` is the tag pydantic inserts
for a discriminated union. :func:`config_error_from_pydantic` removes those tags (by walking the
model class), joins the path with dots under a prefix and writes one line in batchsim's style::

    workload.arrival.rate must be > 0, got -1
    workload.arrival.process must be one of 'poisson', 'gamma', ...; got 'poison'
    workload.arrivl: unknown key; allowed keys: arrival, concurrency, ...

:class:`ConfigModel` is the base class every config model should use (``extra="forbid"``,
frozen, strict: no coercion of ``true`` to 1 or ``'8'`` to 8). Cross-field checks in a model
validator raise :class:`FieldError` to name the key at fault (``workload.prompt_tokens.max must
be >= min (10), got 5``).

It also owns the number rules every input shares: the field types :data:`StrictInt`,
:data:`StrictFloat` (finite) and :data:`StrictBool`, the physical upper bounds (``MAX_*``), and
:func:`number_problem`, the same rules for readers that do not use pydantic (model files).
This module imports nothing from batchsim but :mod:`batchsim.errors`.
"""

from __future__ import annotations

import math
import numbers
import reprlib
import types
import typing
from typing import Annotated, Any, Union

from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Strict, ValidationError
from pydantic.fields import FieldInfo

from batchsim.errors import ConfigError

__all__ = [
    "MAX_BATCH_TOKENS",
    "MAX_GB",
    "MAX_MS",
    "MAX_REQUESTS",
    "MAX_SECONDS",
    "MAX_STEP_MS",
    "MAX_TOKENS",
    "ConfigModel",
    "FieldError",
    "StrictBool",
    "StrictFloat",
    "StrictInt",
    "config_error_from_pydantic",
    "format_value",
    "number_problem",
]

_MAX_VALUE_CHARS = 60

# --------------------------------------------------------------------------------------------
# Number rules shared by every input (experiment, workload, hardware and model files, traces).
# Every number is finite; these are the upper bounds of the physical quantities. They are
# generous (far above any real engine or GPU) and keep downstream arithmetic exact and finite.

MAX_TOKENS = 2**24
"""Tokens of one request (prompt or output), a context length, a KV block (16,777,216)."""
MAX_REQUESTS = 10_000_000
"""Requests of one workload (also: closed-loop users, sequences in a batch, trace rows)."""
MAX_BATCH_TOKENS = 2**30
"""Tokens of one iteration (``scheduler.max_num_batched_tokens``)."""
MAX_SECONDS = 1e9
"""Any time or duration, s (about 31.7 years)."""
MAX_MS = MAX_SECONDS * 1e3
"""Any time or duration, ms."""
MAX_STEP_MS = 1e3
"""A fixed cost paid every iteration or kernel (CPU overhead, launch, kernel floors), ms."""
MAX_GB = 1e6
"""An amount of memory, GB or GiB (activation reserve, swap space, GPU memory)."""


def _plain_number(value: Any) -> Any:
    """Numbers of other types (numpy scalars, fractions) as int or float; the rest as is."""
    if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _whole_number(value: Any) -> Any:
    """``1e6`` (a YAML float) -> ``1000000`` for integer keys; anything else is left as is."""
    value = _plain_number(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Strict() constrains the int/float schema itself; the before-validator wraps it (pydantic
# 2.6 cannot apply Strict() to a function-before schema).
StrictInt = Annotated[int, Strict(), BeforeValidator(_whole_number)]
"""An integer: ints and whole floats (``1e6``); not booleans, strings or 1.5."""
StrictFloat = Annotated[float, Strict(), AllowInfNan(False), BeforeValidator(_plain_number)]
"""A finite number: ints and floats; not booleans, strings, nan or inf."""
StrictBool = Annotated[bool, Strict()]
"""``true`` or ``false``; not 1, 'yes' or 'true'."""


class ConfigModel(BaseModel):
    """Base of batchsim's config models: unknown keys are errors, instances are immutable, and
    values are not coerced (strict mode: ``true`` is no integer, ``'8'`` no number)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class FieldError(ValueError):
    """Raise from a model validator to blame one key of the model being validated.

    ``FieldError("max", "must be >= min (10), got 5")`` raised while validating
    ``workload.prompt_tokens`` reads ``workload.prompt_tokens.max must be >= min (10), got 5``.

    Args:
        key: Dotted path of the offending key, relative to the model ("" for the field
            itself, in a field validator).
        message: The rest of the sentence, starting with a verb ("must be", "is required"),
            or with ": " for a statement about the key (": nesting deeper than 100 levels").
    """

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = 4
_REPR.maxstring = _REPR.maxother = _MAX_VALUE_CHARS
_REPR.maxlong = 40


def format_value(value: Any) -> str:
    """Short, one-line rendering of an offending input value for an error message.

    Bounded work whatever the value: at most two levels and four items of a container are
    looked at (a "billion laughs" document or a huge list is not rendered in full).
    """
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = _REPR.repr(value)
    text = " ".join(text.split())
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


def number_problem(
    value: Any,
    *,
    integer: bool = False,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
) -> str | None:
    """The number rule ``value`` breaks, as the rest of a sentence after its key, or None.

    The same rules and words as the pydantic fields (:data:`StrictInt`, :data:`StrictFloat`
    with ``Field(gt=..., ge=..., le=...)``), for readers that do not use pydantic:
    ``must be an integer, got 1.5``, ``must be a finite number, got nan``, ``must be >= 1, got
    0``, ``must be <= 16777216, got 1e+20``.
    """
    shown = format_value(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be {'an integer' if integer else 'a number'}, got {shown}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {shown}"
    if integer and isinstance(value, float) and not value.is_integer():
        return f"must be an integer, got {shown}"
    if gt is not None and not value > gt:
        return f"must be > {_number(gt)}, got {shown}"
    if ge is not None and not value >= ge:
        return f"must be >= {_number(ge)}, got {shown}"
    if le is not None and not value <= le:
        return f"must be <= {_number(le)}, got {shown}"
    return None


def config_error_from_pydantic(
    exc: ValidationError,
    prefix: str,
    source: str | None = None,
    *,
    model: type[BaseModel] | None = None,
) -> ConfigError:
    """Convert a pydantic ``ValidationError`` into a one-line ``ConfigError``.

    Only the first error is described; the number of further errors is appended.

    Args:
        exc: The error raised by ``Model.model_validate``.
        prefix: Dotted key path of the validated block, e.g. ``"workload"`` (may be ``""``).
        source: File the values came from, if any (becomes the ``ConfigError`` source).
        model: The model class that was validated. Used to drop discriminated-union tags from
            error locations and to list allowed keys; found from ``exc.title`` when omitted.

    Returns:
        A ``ConfigError`` whose message names the dotted key path, the rule and the value.
    """
    errors: list[dict[str, Any]] = [dict(e) for e in exc.errors(include_url=False)]
    if not errors:  # pragma: no cover - pydantic never raises an empty ValidationError
        return ConfigError(f"{prefix or 'config'}: invalid value", source)
    root = model if model is not None else _find_model(exc.title)
    message = _describe(errors[0], prefix, root)
    if len(errors) > 1:
        more = len(errors) - 1
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(message, source)


# --------------------------------------------------------------------------------------------
# location cleaning: walk the model's annotations alongside the error location


def _describe(err: dict[str, Any], prefix: str, root: type[BaseModel] | None) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    path_parts, parent, last_type = _clean_loc(root, tuple(err["loc"]))
    path = _join(prefix, path_parts)
    where = path or "config"
    value = format_value(err.get("input"))
    if kind == "extra_forbidden":
        allowed = _allowed_keys(parent)
        tail = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"{where}: unknown key{tail}"
    if kind == "missing":
        return f"{where} is required"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        disc = str(ctx.get("discriminator", "")).strip("'\"")
        expected = ctx.get("expected_tags") or _union_tags(last_type, disc)
        key = f"{where}.{disc}" if disc else where
        if kind == "union_tag_not_found":
            return f"{key} is required; one of {expected}"
        return f"{key} must be one of {expected}; got {format_value(ctx.get('tag'))}"
    bounds = {
        "greater_than": ">",
        "greater_than_equal": ">=",
        "less_than": "<",
        "less_than_equal": "<=",
    }
    if kind in bounds:
        limit = next(iter(ctx.values())) if ctx else "?"
        return f"{where} must be {bounds[kind]} {_number(limit)}, got {value}"
    if kind == "finite_number":
        return f"{where} must be a finite number, got {value}"
    if kind == "literal_error":
        return f"{where} must be one of {ctx.get('expected', '?')}; got {value}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{where} must be an integer, got {value}"
    if kind in ("float_parsing", "float_type"):
        return f"{where} must be a number, got {value}"
    if kind in ("bool_parsing", "bool_type"):
        return f"{where} must be true or false, got {value}"
    if kind in ("string_type",):
        return f"{where} must be a string, got {value}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where} must be a mapping of keys to values, got {value}"
    if kind in ("list_type", "tuple_type"):
        return f"{where} must be a list, got {value}"
    if kind in ("too_short", "too_long"):
        return f"{where}: {_lower_first(err['msg'])}"
    error = ctx.get("error")
    if kind == "value_error" and isinstance(error, FieldError):
        key = _join(path, [error.key]) if error.key else path
        joined = error.message.startswith((":", "[", "."))  # a statement, or a deeper key
        return f"{key}{'' if joined else ' '}{error.message}"
    if kind in ("value_error", "assertion_error"):
        msg = str(err["msg"])
        for lead in ("Value error, ", "Assertion failed, "):
            if msg.startswith(lead):
                msg = msg[len(lead) :]
        return f"{where}: {msg}"
    return f"{where}: {_lower_first(str(err['msg']))}, got {value}"


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _join(prefix: str, parts: list[str | int]) -> str:
    out = prefix
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _clean_loc(
    root: type[BaseModel] | None, loc: tuple[Any, ...]
) -> tuple[list[str | int], type[BaseModel] | None, Any]:
    """Drop union tags from ``loc``.

    Returns:
        The cleaned path, the model owning the last key (for "allowed keys") and the annotation
        at the end of the path (for listing union tags).
    """
    parts: list[str | int] = []
    current: Any = root
    parent: type[BaseModel] | None = root
    i = 0
    while i < len(loc):
        seg = loc[i]
        model = _as_model(current)
        if model is not None and isinstance(seg, str):
            parent = model
            parts.append(seg)
            field = model.model_fields.get(seg)
            current = _field_type(field) if field is not None else None
            i += 1
            continue
        union = _as_tagged_union(current)
        if union is not None and isinstance(seg, str):
            current = union[1].get(seg)
            i += 1  # the tag itself is not part of the user's key path
            continue
        seq_item = _sequence_item(current)
        if seq_item is not None and isinstance(seg, int):
            parts.append(seg)
            current = seq_item
            i += 1
            continue
        # Unknown structure: keep the rest of the location as it is.
        parts.extend(s if isinstance(s, int) else str(s) for s in loc[i:])
        current = None
        break
    return parts, parent, current


def _field_type(field: FieldInfo) -> Any:
    annotation = field.annotation
    if field.discriminator is not None:
        return typing.Annotated[annotation, field]
    return annotation


def _strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _as_model(tp: Any) -> type[BaseModel] | None:
    tp = _strip_optional(tp)
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
        tp = _strip_optional(tp)
    # A real class only: on Python 3.10 a generic alias such as tuple[int, ...] passes
    # isinstance(alias, type), and issubclass(alias, BaseModel) then raises TypeError.
    if issubclass(type(tp), type) and issubclass(tp, BaseModel):
        return tp
    return None


def _as_tagged_union(tp: Any) -> tuple[str, dict[str, Any]] | None:
    """``(discriminator, {tag: member})`` if ``tp`` is a discriminated union, else None."""
    tp = _strip_optional(tp)
    if typing.get_origin(tp) is not typing.Annotated:
        return None
    inner, *metadata = typing.get_args(tp)
    disc = None
    for meta in metadata:
        if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
            disc = meta.discriminator
    inner = _strip_optional(inner)
    if typing.get_origin(inner) is typing.Annotated:  # Optional[Annotated[Union, Field(...)]]
        nested = _as_tagged_union(inner)
        if nested is not None:
            return nested
    if disc is None:
        return None
    members: dict[str, Any] = {}
    for member in typing.get_args(inner):
        model = _as_model(member)
        if model is None or disc not in model.model_fields:
            continue
        for tag in typing.get_args(model.model_fields[disc].annotation):
            members[str(tag)] = model
    return disc, members


def _sequence_item(tp: Any) -> Any:
    tp = _strip_optional(tp)
    if typing.get_origin(tp) is typing.Annotated:
        tp = _strip_optional(typing.get_args(tp)[0])
    origin = typing.get_origin(tp)
    if origin in (list, tuple, set, frozenset):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return args[0] if args else Any
    return None


def _union_tags(tp: Any, disc: str) -> str:
    union = _as_tagged_union(tp)
    if union is None:
        return "(see the documentation)"
    return ", ".join(repr(tag) for tag in union[1])


def _allowed_keys(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return [field.alias or name for name, field in model.model_fields.items()]


def _find_model(title: str) -> type[BaseModel] | None:
    """The unique loaded ``BaseModel`` subclass named ``title``, if there is exactly one."""
    found: list[type[BaseModel]] = []
    stack: list[type] = list(BaseModel.__subclasses__())
    seen: set[type] = set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__name__ == title:
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return found[0] if len(found) == 1 else None
