"""Data files of a workload: where they are, and strict parsing with file:line errors.

Owns :func:`resolve_data_path` (next to the experiment file, then the built-in ``workloads/``
catalog), the column and number parsers shared by the trace readers
(:mod:`batchsim.workload.traces`) and the cached integer-column reader of the ``empirical``
length distribution. Every malformed value raises a :class:`~batchsim.errors.ConfigError`
naming the file, the line and the value.

Files are read by :func:`batchsim.yamlio.read_text` (UTF-8, at most 512 MiB, not empty) and
hold at most :data:`~batchsim.validation.MAX_REQUESTS` data rows. Token counts are integers in
[1, :data:`~batchsim.validation.MAX_TOKENS`]; times are finite, >= 0 and, relative to the first
row, at most :data:`~batchsim.validation.MAX_SECONDS`.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.validation import MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS, format_value
from batchsim.yamlio import read_text

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


def read_data_text(path: str, shown: str) -> str:
    """The text of a trace or data file (UTF-8, size-capped, not empty)."""
    return read_text(Path(path), source=shown)


def _check_row_count(count: int, shown: str, line: int) -> None:
    if count > MAX_REQUESTS:
        raise ConfigError(
            f"more than {MAX_REQUESTS:,} data rows (the limit of one workload); cut the file",
            shown,
            line,
        )


def csv_rows(text: str, shown: str) -> Iterator[tuple[list[str], int]]:
    """Non-blank CSV rows of ``text`` with their 1-based line numbers."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            yield row, reader.line_num
    except csv.Error as exc:
        raise ConfigError(f"malformed CSV: {exc}", shown, reader.line_num) from None


def _read_rows(text: str, shown: str) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank rows and their 1-based line numbers of a CSV text."""
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    for row, line in csv_rows(text, shown):
        if header is None:
            header = [h.strip() for h in row]
            continue
        rows.append(row)
        lines.append(line)
        _check_row_count(len(rows), shown, line)
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
    """Parse token counts: integers in [1, MAX_TOKENS] (integral floats like ``12.0`` accepted),
    vectorised."""
    raw = np.asarray(values)
    arr: np.ndarray | None = None
    if raw.dtype.kind == "f":
        finite = bool(np.all(np.isfinite(raw)))
        in_range = finite and raw.size and raw.min() >= 1 and raw.max() <= MAX_TOKENS
        if in_range and bool(np.all(raw == np.rint(raw))):
            arr = raw.astype(np.int64)
    elif raw.dtype.kind in "iu":
        arr = raw.astype(np.int64)
    elif raw.dtype.kind == "U":
        try:  # strict: "12.5", "abc" and "1e23" raise
            arr = raw.astype(np.int64)
        except (ValueError, OverflowError):
            arr = None
    if arr is not None and arr.size and arr.min() >= 1 and arr.max() <= MAX_TOKENS:
        return arr
    for value, line in zip(values, lines, strict=True):
        if _as_positive_int(value) is None:
            raise ConfigError(
                f"{name}: expected a positive integer <= {MAX_TOKENS} (tokens), "
                f"got {format_value(value)}",
                shown,
                line,
            )
    # Every value is a valid count but not in a form numpy parses (e.g. "12.0").
    return np.array([_as_positive_int(v) for v in values], dtype=np.int64)


def _as_positive_int(value: Any) -> int | None:
    """``value`` as a token count in [1, MAX_TOKENS], or None."""
    number: int | None = None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                real = float(text)
            except ValueError:
                return None
            number = int(real) if math.isfinite(real) and real.is_integer() else None
    if number is None or not 1 <= number <= MAX_TOKENS:
        return None
    return number


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
            raise ConfigError(
                f"{name}: expected a finite number >= 0, got {format_value(value)}", shown, line
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _check_span(seconds: np.ndarray, lines: Sequence[int], name: str, shown: str) -> None:
    """Arrival times relative to the first row (s) must not exceed MAX_SECONDS."""
    over = np.flatnonzero(seconds > MAX_SECONDS)
    if over.size:
        i = int(over[0])
        raise ConfigError(
            f"{name}: {seconds[i]:.3g} s after the first row, more than the limit of "
            f"{MAX_SECONDS:g} s",
            shown,
            lines[i],
        )


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


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _read_int_column(path: str, mtime: int, column: str | None, shown: str) -> np.ndarray:
    """Positive integers from one column of a text/CSV file (see :class:`EmpiricalLength`)."""
    values: list[str] = []
    lines: list[int] = []
    index: int | None = None
    width = 1
    first = True
    for row, line in csv_rows(read_data_text(path, shown), shown):
        if not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if first:
            first = False
            if column is not None:
                header = [h.strip() for h in row]
                index = _column_index(header, column, shown)
                width = len(header)
                continue
            if len(row) == 1 and _as_positive_int(row[0]) is None and not _is_number(row[0]):
                continue  # a header line
        if column is None and len(row) != 1:
            raise ConfigError(
                f"expected one value per line, got {len(row)} fields (set column to pick one)",
                shown,
                line,
            )
        if len(row) != width and column is not None:
            raise ConfigError(f"expected {width} fields, got {len(row)}", shown, line)
        values.append(row[index if index is not None else 0])
        lines.append(line)
        _check_row_count(len(values), shown, line)
    if not values:
        raise ConfigError("no values in file", shown)
    out = _positive_ints(values, lines, column or "value", shown)
    out.setflags(write=False)
    return out
