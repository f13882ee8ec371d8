"""Data files of a workload: where they are, and strict parsing with file:line errors.

Owns :func:`resolve_data_path` (next to the experiment file, then the built-in ``workloads/``
catalog), the column and number parsers shared by the trace readers
(:mod:`batchsim.workload.traces`) and the cached integer-column reader of the ``empirical``
length distribution. Every malformed value raises a :class:`~batchsim.errors.ConfigError`
naming the file, the line and the value.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.validation import format_value

_DATA_SUFFIXES = (".csv", ".jsonl", ".txt")


def resolve_data_path(path: str, base_dir: Path | None, key: str) -> Path:
    """Find a trace or data file.

    A relative path is tried against ``base_dir`` (the experiment file's directory; the current
    directory when None), then against the built-in ``workloads/`` catalog.

    Raises:
        ConfigError: Not found; names the places looked in and the built-in files.
    """
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        if candidate.is_file():
            return candidate
        raise ConfigError(f"{key}: file not found: {path}")
    base = base_dir if base_dir is not None else Path.cwd()
    builtin_dir = catalog_dir("workloads")
    for place in (base, builtin_dir):
        if (place / candidate).is_file():
            return place / candidate
    builtins = sorted(p.name for p in builtin_dir.glob("*") if p.suffix in _DATA_SUFFIXES)
    listing = ", ".join(builtins) or "(none)"
    raise ConfigError(
        f"{key}: file not found: {path} (looked in {base} and in the built-in workloads: {listing})"
    )


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


def _read_rows(path: str, shown: str) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank rows and their 1-based line numbers of a CSV file."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header: list[str] | None = None
            rows: list[list[str]] = []
            lines: list[int] = []
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [h.strip() for h in row]
                    continue
                rows.append(row)
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read CSV: {exc}", shown) from exc
    if header is None or not rows:
        raise ConfigError("empty trace: no data rows", shown)
    return header, rows, lines


def _column_index(header: list[str], name: str, shown: str) -> int:
    try:
        return header.index(name)
    except ValueError:
        columns = format_value(", ".join(header)).strip("'\"")
        raise ConfigError(f"missing column {name!r}; header has {columns}", shown, 1) from None


def _take(rows: list[list[str]], lines: list[int], idx: int, width: int, shown: str) -> list[str]:
    try:
        return [row[idx] for row in rows]
    except IndexError:
        for row, line in zip(rows, lines, strict=True):
            if len(row) != width:
                raise ConfigError(f"expected {width} fields, got {len(row)}", shown, line) from None
        raise  # pragma: no cover


def _positive_ints(
    values: Sequence[Any], lines: Sequence[int], name: str, shown: str
) -> np.ndarray:
    """Parse positive integers (integral floats like ``12.0`` accepted), vectorised."""
    raw = np.asarray(values)
    arr: np.ndarray | None = None
    integral_floats = raw.dtype.kind == "f" and bool(np.all(raw == np.rint(raw)))
    if raw.dtype.kind in "iu" or integral_floats:
        arr = raw.astype(np.int64)
    elif raw.dtype.kind == "U":
        try:  # strict: "12.5" and "abc" raise
            arr = raw.astype(np.int64)
        except (ValueError, OverflowError):
            arr = None
    if arr is not None and arr.size and arr.min() >= 1:
        return arr
    for value, line in zip(values, lines, strict=True):
        if _as_positive_int(value) is None:
            raise ConfigError(f"{name}: expected a positive integer, got {value!r}", shown, line)
    # Every value is a positive integer but not in a form numpy parses (e.g. "12.0").
    return np.array([_as_positive_int(v) for v in values], dtype=np.int64)


def _as_positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 1 else None
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                real = float(text)
            except ValueError:
                return None
            return int(real) if math.isfinite(real) and real.is_integer() and real >= 1 else None
        return number if number >= 1 else None
    return None


def _nonnegative_floats(
    values: Sequence[Any], lines: Sequence[int], name: str, shown: str
) -> np.ndarray:
    try:
        arr = np.asarray(values).astype(np.float64)
        if np.all(np.isfinite(arr)) and (arr.size == 0 or arr.min() >= 0):
            return arr
    except (ValueError, TypeError):
        pass
    for value, line in zip(values, lines, strict=True):
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number >= 0):
            raise ConfigError(f"{name}: expected a number >= 0, got {value!r}", shown, line)
    raise AssertionError("unreachable")  # pragma: no cover


def _check_sorted(times: np.ndarray, lines: Sequence[int], name: str, shown: str) -> None:
    back = np.flatnonzero(np.diff(times) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise ConfigError(
            f"{name} goes backwards ({times[i - 1]:g} s then {times[i]:g} s after the start); "
            "sort the rows by time",
            shown,
            lines[i],
        )


@functools.lru_cache(maxsize=16)
def _read_int_column(path: str, mtime: int, column: str | None, shown: str) -> np.ndarray:
    """Positive integers from one column of a text/CSV file (see :class:`EmpiricalLength`)."""
    values: list[str] = []
    lines: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            index: int | None = None
            width = 1
            first = True
            for row in reader:
                if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                    continue
                if first:
                    first = False
                    if column is not None:
                        header = [h.strip() for h in row]
                        index = _column_index(header, column, shown)
                        width = len(header)
                        continue
                    if len(row) == 1 and _as_positive_int(row[0]) is None:
                        continue  # a header line
                if column is None and len(row) != 1:
                    raise ConfigError(
                        f"expected one value per line, got {len(row)} fields "
                        "(set column to pick one)",
                        shown,
                        reader.line_num,
                    )
                if len(row) != width and column is not None:
                    raise ConfigError(
                        f"expected {width} fields, got {len(row)}", shown, reader.line_num
                    )
                values.append(row[index if index is not None else 0])
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read file: {exc}", shown) from exc
    if not values:
        raise ConfigError("no values in file", shown)
    out = _positive_ints(values, lines, column or "value", shown)
    out.setflags(write=False)
    return out
