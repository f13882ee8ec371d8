"""Sweep axes: value specs (``1,2,4``, ``pow2:1..512``, ``lin:``, ``log:``, ``range:``), zip
groups, and their expansion into points.

An axis is one dotted key with its values, or a *zip group*: several keys that vary together
(the i-th point takes the i-th value of every key). The points of a grid are the cartesian
product of its axes, the first axis outermost.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchsim.errors import ConfigError

# batchsim.validation (pydantic) and batchsim.yamlio (yaml) are imported where they are used:
# the command line's help reads VALUES_HELP from here and must stay light.

MAX_AXIS_VALUES = 100_000
"""Values one axis may have."""
MAX_POINTS = 100_000
"""Points one study may have (seeds included): each resolved point holds its config (~7 KB)."""

RANGE_FORMS = (
    "pow2:A..B (powers of two from A to B)",
    "range:A..B[:STEP] (A, A+STEP, ... up to B; STEP 1 by default)",
    "lin:A..B:N (N evenly spaced values, both ends included)",
    "log:A..B:N (N geometrically spaced values, both ends included; lin and log give whole "
    "numbers when A and B are whole and rounding repeats no value)",
)
VALUES_HELP = (
    "VALUES is a comma-separated list of YAML values (1,2,4 or a100-80gb,h100-sxm or "
    "'{process: poisson, rate: 8},{process: poisson, rate: 16}') or one of "
    + "; ".join(RANGE_FORMS)
)

_RANGE = re.compile(r"(pow2|range|lin|log):(.*)")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_BOUNDS = re.compile(rf"\s*({_NUMBER})\s*\.\.\s*({_NUMBER})\s*(?::\s*({_NUMBER})\s*)?")


@dataclass(frozen=True)
class Axis:
    """One dimension of a grid.

    Attributes:
        keys: The dotted key, or the keys of a zip group.
        values: One tuple per position, holding a value for each key.
        origin: Where the axis was given, for error messages (``--grid``, ``sweep.grid``).
    """

    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    origin: str

    def __len__(self) -> int:
        return len(self.values)


def _number(text: str) -> int | float:
    value = float(text)
    if re.fullmatch(r"[-+]?\d+", text.strip()):
        return int(text)
    return value


def _clean(value: float) -> float:
    """``0.30000000000000004`` -> ``0.3``: 12 significant digits, as a user would type it."""
    return float(f"{value:.12g}")


def _range_values(form: str, body: str, label: str) -> list[Any]:
    match = _BOUNDS.fullmatch(body)
    if not match:
        raise ConfigError(f"{label}: expected {form}:A..B{':N' if form in ('lin', 'log') else ''}")
    lo, hi = _number(match[1]), _number(match[2])
    third = match[3]
    if not all(math.isfinite(v) for v in (lo, hi)):
        raise ConfigError(f"{label}: the bounds must be finite numbers")
    if hi < lo:
        raise ConfigError(f"{label}: the upper bound {hi} is below the lower bound {lo}")
    integers = isinstance(lo, int) and isinstance(hi, int)
    if form == "pow2":
        if third is not None:
            raise ConfigError(f"{label}: pow2:A..B takes no third part")
        if lo <= 0:
            raise ConfigError(f"{label}: pow2 bounds must be > 0")
        start = math.ceil(math.log2(lo) - 1e-12)
        stop = math.floor(math.log2(hi) + 1e-12)
        values: list[Any] = [2**k if k >= 0 else 2.0**k for k in range(start, stop + 1)]
        if not values:
            raise ConfigError(f"{label}: no power of two between {lo} and {hi}")
    elif form == "range":
        step = _number(third) if third is not None else 1
        if not step > 0 or not math.isfinite(step):
            raise ConfigError(f"{label}: STEP must be a number > 0")
        count = math.floor((hi - lo) / step + 1e-9) + 1
        if count > MAX_AXIS_VALUES:
            raise ConfigError(f"{label}: {count:,} values; an axis may have {MAX_AXIS_VALUES:,}")
        if integers and isinstance(step, int):
            values = list(range(lo, hi + 1, step))  # type: ignore[arg-type]
        else:
            values = [_clean(lo + i * step) for i in range(count)]
    else:
        if third is None or not re.fullmatch(r"\s*\d+\s*", third) or int(third) < 1:
            raise ConfigError(f"{label}: {form}:A..B:N needs N, a whole number >= 1")
        n = int(third)
        if n > MAX_AXIS_VALUES:
            raise ConfigError(f"{label}: {n:,} values; an axis may have {MAX_AXIS_VALUES:,}")
        if n == 1 and lo != hi:
            raise ConfigError(f"{label}: N = 1 needs A = B")
        if form == "log" and lo <= 0:
            raise ConfigError(f"{label}: log bounds must be > 0")
        if form == "lin":
            raw = [lo + (hi - lo) * i / max(n - 1, 1) for i in range(n)]
        else:
            ratio = math.log(hi / lo)
            raw = [lo * math.exp(ratio * i / max(n - 1, 1)) for i in range(n)]
        raw[-1] = hi
        rounded = [round(v) for v in raw]
        # integer bounds: whole numbers, unless rounding would repeat one
        values = rounded if integers and len(set(rounded)) == n else [_clean(v) for v in raw]
    if len(values) > MAX_AXIS_VALUES:
        raise ConfigError(f"{label}: {len(values):,} values; an axis may have {MAX_AXIS_VALUES:,}")
    return values


def parse_values(spec: Any, label: str) -> list[Any]:
    """The values of one axis.

    Args:
        spec: A list (from YAML or Python: used as is), or text: a range form
            (``pow2:1..512``, ``range:0..100:10``, ``lin:0..1:5``, ``log:1..1000:4``) or a
            comma-separated list of YAML values, where a value may be a whole block
            (``{process: poisson, rate: 8},{process: poisson, rate: 16}``).
        label: Names the axis in error messages (``--grid scheduler.max_num_seqs=...``).

    Raises:
        ConfigError: Malformed text, an empty list, or too many values.
    """
    if isinstance(spec, (list, tuple)):
        values = list(spec)
    elif isinstance(spec, str):
        match = _RANGE.fullmatch(spec.strip())
        if match:
            return _checked(_range_values(match[1], match[2], label), label, spec.strip())
        text = spec.strip()
        if not text:
            raise ConfigError(f"{label}: no values; {VALUES_HELP}")
        from batchsim.yamlio import loads

        try:
            parsed = loads(text if text.startswith("[") else f"[{text}]")
        except ConfigError as exc:
            raise ConfigError(f"{label}: {exc.message}; {VALUES_HELP}") from None
        values = parsed if isinstance(parsed, list) else [parsed]
    else:
        values = [spec]
    if not values:
        raise ConfigError(f"{label}: no values; {VALUES_HELP}")
    if len(values) > MAX_AXIS_VALUES:
        raise ConfigError(f"{label}: {len(values):,} values; an axis may have {MAX_AXIS_VALUES:,}")
    return _checked(values, label)


MAX_CELL_INT = 2**63 - 1
"""The largest integer a value of an axis may be: a column of the study's tables holds it."""


def _checked(values: list[Any], label: str, form: str = "") -> list[Any]:
    """The values of an axis, each one a number a table cell holds and none twice (two equal
    values would be two rows of one point folder)."""
    seen: dict[str, int] = {}
    given = f" ({form})" if form else ""
    for i, value in enumerate(values):
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_CELL_INT:
                shown = f"{item:.3g}" if item.bit_length() < 1000 else f"2**{item.bit_length()}"
                raise ConfigError(
                    f"{label}{given}: the value {shown} is beyond the integers a table holds "
                    "(|value| <= 2**63 - 1); give smaller bounds"
                )
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{label}{given}: the value {item} is not a finite number")
        key = json.dumps(value, sort_keys=True, default=repr)
        if key in seen:
            raise ConfigError(
                f"{label}{given}: the value {cell(value)} is given twice (values {seen[key] + 1} "
                f"and {i + 1}); give each value of an axis once"
            )
        seen[key] = i
    return values


def parse_grid_item(item: str, option: str = "--grid") -> tuple[str, list[Any]]:
    """``"scheduler.max_num_seqs=pow2:1..8"`` -> ``("scheduler.max_num_seqs", [1, 2, 4, 8])``."""
    key, sep, spec = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"{option} {item!r}: expected KEY.PATH=VALUES, e.g. scheduler.max_num_seqs=1,2,4"
        )
    check_key(key, f"{option} {key}")
    return key, parse_values(spec, f"{option} {key}")


def check_key(key: str, label: str) -> None:
    """A dotted key path: non-empty parts separated by dots."""
    if not key or not all(part.strip() and part == part.strip() for part in key.split(".")):
        raise ConfigError(f"{label}: {key!r} is not a dotted key path like scheduler.max_num_seqs")


def zip_axis(group: Mapping[str, Sequence[Any]], origin: str) -> Axis:
    """A zip group: keys whose values vary together (all lists of one length)."""
    keys = tuple(group)
    lengths = {key: len(values) for key, values in group.items()}
    if len(set(lengths.values())) > 1:
        sizes = ", ".join(f"{key} has {n}" for key, n in lengths.items())
        raise ConfigError(f"{origin}: the keys of a zip group need as many values each ({sizes})")
    return Axis(keys, tuple(_checked(list(zip(*group.values())), origin)), origin)


def combine_axes(axes: Sequence[Axis]) -> list[Axis]:
    """Check that no key appears on two axes and that the grid is not too large."""
    seen: dict[str, str] = {}
    for axis in axes:
        for key in axis.keys:
            for other, origin in seen.items():
                if key == other or key.startswith(other + ".") or other.startswith(key + "."):
                    raise ConfigError(
                        f"{axis.origin}: {key} is already varied by {origin} {other}; "
                        "vary a key (or a block and a key inside it) on one axis"
                    )
            seen[key] = axis.origin
    total = math.prod(len(axis) for axis in axes)
    if total > MAX_POINTS:
        raise ConfigError(f"the grid has {total:,} points; a sweep may have {MAX_POINTS:,}")
    return list(axes)


def expand(axes: Sequence[Axis]) -> Iterator[dict[str, Any]]:
    """The points of the grid: one ``{dotted key: value}`` per point, first axis outermost."""
    for combo in itertools.product(*(axis.values for axis in axes)):
        point: dict[str, Any] = {}
        for axis, values in zip(axes, combo):
            point.update(zip(axis.keys, values))
        yield point


def varied_keys(axes: Sequence[Axis]) -> list[str]:
    """Every key the grid varies, in axis order."""
    return [key for axis in axes for key in axis.keys]


def cell(value: Any) -> Any:
    """A value as a table cell: scalars as they are, blocks and lists as compact JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, separators=(", ", ": "), sort_keys=False)


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def label_part(value: Any) -> str:
    """A value as part of a folder name: letters, digits and ``._+-`` only."""
    if isinstance(value, str):
        text = value.rsplit("/", 1)[-1] if "/" in value else value
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        text = repr(value)
    else:
        from batchsim.validation import format_value

        text = format_value(value) if not isinstance(value, (dict, list)) else cell(value)
    return _UNSAFE.sub("_", text).strip("_") or "_"


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Folder-name prefix of each key: its last part, or the whole path where two collide."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: (short if last.count(short) == 1 else key) for key, short in zip(keys, last)}
