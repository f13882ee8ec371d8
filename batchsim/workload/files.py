"""Data files of a workload: where they are, and strict parsing with file:line errors.

Owns :func:`resolve_data_path` (next to the experiment file, then the built-in ``workloads/``
catalog), the column and number parsers shared by the trace readers
(:mod:`batchsim.workload.traces`) and the cached integer-column reader of the ``empirical``
length distribution. Every malformed value raises a :class:`~batchsim.errors.ConfigError`
naming the file, the line and the value.

Files follow the rules of :func:`batchsim.yamlio.read_text` (UTF-8, at most 512 MiB, not
empty) and hold at most :data:`~batchsim.validation.MAX_REQUESTS` data rows. Token counts are
integers in [1, :data:`~batchsim.validation.MAX_TOKENS`]; times are finite, >= 0 and, relative
to the first row, at most :data:`~batchsim.validation.MAX_SECONDS`.

A trace may be read only in part: :func:`read_data_bytes` with ``lines`` stops after the line
that completes the first ``lines`` non-blank lines, and the rules then apply to those lines
alone (what comes after is not read).
"""

from __future__ import annotations

import csv
import functools
import io
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.validation import MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS, format_value
from batchsim.yamlio import read_text, reading

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


def decode_data(data: bytes, shown: str) -> str:
    """The text of ``data``, the bytes of a trace file or of its start, under the rules of
    :func:`batchsim.yamlio.read_text` (UTF-8, no NUL byte, not empty)."""
    text = reading._decode(data, shown)
    if not text.strip():
        raise ConfigError("empty file", shown)
    return text


_UTF8_BOM = b"\xef\xbb\xbf"
_SPACES = "".join(c for c in map(chr, range(0x3001)) if c.isspace() and c != "\n").encode()
"""Every character but ``\\n`` that ``str.strip()`` removes (the last is U+3000), in UTF-8."""
_SPACE_BYTES = bytes(sorted(set(_SPACES)))
_STARTS_SPACE = np.zeros(256, dtype=bool)  # first bytes of those characters
_STARTS_SPACE[[c.encode()[0] for c in _SPACES.decode()]] = True
_CHUNK = 1 << 16
_MAX_CHUNK = 1 << 24


def blank(line: bytes) -> bool:
    """Whether a line (UTF-8, without its ``\\n``) is blank to the row readers: nothing but
    white space (``str.strip()``). Undecodable bytes are not blank."""
    try:
        return not line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


def read_data_bytes(path: str, shown: str, lines: int | None = None) -> tuple[bytes, bool]:
    """The bytes of a trace file: all of them, or with ``lines`` only its start.

    Args:
        path: The file.
        shown: How to name it in errors.
        lines: Read up to the end of the line (split at ``\\n``) that completes the first
            ``lines`` non-blank lines (see :func:`blank`), or to the end of a shorter file.

    Returns:
        The bytes, and whether they are the whole file.

    Raises:
        ConfigError: Unreadable, or larger than :data:`batchsim.yamlio.MAX_DATA_BYTES` (a part
            is read only from a file within the limit).
    """
    limit = reading.MAX_DATA_BYTES
    if lines is None:
        return reading._read_bytes(Path(path), limit, shown), True
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > limit:
                raise ConfigError(
                    f"file is larger than {limit // 2**20} MiB, the limit for this kind of file",
                    shown,
                )
            return _read_lines(f, lines)
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror or exc}", shown) from None


def _read_lines(f: io.BufferedReader, lines: int) -> tuple[bytes, bool]:
    """Read blocks (growing) until ``lines`` non-blank lines are complete; cut after that."""
    parts: list[bytes] = []
    size = 0  # bytes in parts
    found = 0  # non-blank lines completed so far
    pending: bytes | None = b""  # the unfinished line, None once it is surely not blank
    chunk = _CHUNK
    while True:
        block = f.read(chunk)
        if not block:
            return b"".join(parts), True
        skip = len(_UTF8_BOM) if not parts and block.startswith(_UTF8_BOM) else 0
        parts.append(block)
        ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
        if ends.size == 0:
            pending = _open_line(pending, block[skip:])
        else:
            starts = np.concatenate(([skip], ends[:-1] + 1))
            nonblank = _nonblank(block, starts, ends)
            if pending is None:
                nonblank[0] = True
            elif pending:
                nonblank[0] = not blank(pending + block[skip : int(ends[0])])
            counts = np.cumsum(nonblank)
            if found + int(counts[-1]) >= lines:
                last = int(np.searchsorted(counts, lines - found))
                return b"".join(parts)[: size + int(ends[last]) + 1], False
            found += int(counts[-1])
            pending = _open_line(b"", block[int(ends[-1]) + 1 :])
        size += len(block)
        chunk = min(chunk * 2, _MAX_CHUNK)


def _open_line(pending: bytes | None, more: bytes) -> bytes | None:
    """The unfinished line so far, or None once it holds a byte of no white-space character
    (kept only while it may still be blank)."""
    if pending is None or more.strip(_SPACE_BYTES):
        return None
    return pending + more


def _nonblank(data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which lines ``data[starts[i]:ends[i]]`` are not :func:`blank` (vectorised but for the
    lines that begin with a white-space character, decoded one by one)."""
    first = np.frombuffer(data, dtype=np.uint8)[starts]  # starts[i] <= ends[i] < len(data)
    out = ends > starts
    for i in np.flatnonzero(out & _STARTS_SPACE[first]):
        out[i] = not blank(data[int(starts[i]) : int(ends[i])])
    return out


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


def _read_rows(
    text: str, shown: str, limit: int | None = None
) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank rows (the first ``limit`` ones) and their 1-based line numbers of a
    CSV text."""
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
        if len(rows) == limit:
            break
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
    values: Sequence[Any], lines: Sequence[int], name: str, shown: str, minimum: int = 1
) -> np.ndarray:
    """Parse token counts: integers in [minimum, MAX_TOKENS] (integral floats like ``12.0``
    accepted), vectorised. ``minimum`` is 1 (a prompt or an output) or 0 (a shared prefix)."""
    raw = np.asarray(values)
    arr: np.ndarray | None = None
    if raw.dtype.kind == "f":
        finite = bool(np.all(np.isfinite(raw)))
        in_range = finite and raw.size and raw.min() >= minimum and raw.max() <= MAX_TOKENS
        if in_range and bool(np.all(raw == np.rint(raw))):
            arr = raw.astype(np.int64)
    elif raw.dtype.kind in "iu":
        arr = raw.astype(np.int64)
    elif raw.dtype.kind == "U":
        try:  # strict: "12.5", "abc" and "1e23" raise
            arr = raw.astype(np.int64)
        except (ValueError, OverflowError):
            arr = None
    if arr is not None and arr.size and arr.min() >= minimum and arr.max() <= MAX_TOKENS:
        return arr
    rule = (
        f"a positive integer <= {MAX_TOKENS}"
        if minimum == 1
        else f"an integer from {minimum} to {MAX_TOKENS}"
    )
    for value, line in zip(values, lines, strict=True):
        if _as_positive_int(value, minimum) is None:
            raise ConfigError(
                f"{name}: expected {rule} (tokens), got {format_value(value)}", shown, line
            )
    # Every value is a valid count but not in a form numpy parses (e.g. "12.0").
    return np.array([_as_positive_int(v, minimum) for v in values], dtype=np.int64)


def _as_positive_int(value: Any, minimum: int = 1) -> int | None:
    """``value`` as a token count in [minimum, MAX_TOKENS], or None."""
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
    if number is None or not minimum <= number <= MAX_TOKENS:
        return None
    return number


def group_ids(
    groups: Sequence[str],
    tokens: np.ndarray,
    lines: Sequence[int],
    name: str,
    tokens_name: str,
    shown: str,
) -> np.ndarray:
    """Content ids of a trace's shared-prefix groups: rows whose group text is the same (as
    written, spaces included) get the same id, numbered 0, 1, ... in order of first appearance
    among the rows that share a prefix (``tokens`` > 0); -1 where ``tokens`` is 0.

    Raises:
        ConfigError: An empty group in a row with ``tokens`` > 0 (names the line).
    """
    ids = np.full(len(groups), -1, dtype=np.int64)
    seen: dict[str, int] = {}
    for i in np.flatnonzero(tokens > 0).tolist():
        text = groups[i]
        if not text:
            raise ConfigError(
                f"{name}: empty, but {tokens_name} is {int(tokens[i])}; name the group or set "
                f"{tokens_name} to 0",
                shown,
                lines[i],
            )
        ids[i] = seen.setdefault(text, len(seen))
    return ids


def check_prefix_fits(
    prefix: np.ndarray, prompt: np.ndarray, lines: Sequence[int], name: str, shown: str
) -> None:
    """A row's shared prefix is part of its prompt: at most as many tokens."""
    over = np.flatnonzero(prefix > prompt)
    if over.size:
        i = int(over[0])
        raise ConfigError(
            f"{name}: {int(prefix[i])} tokens, more than the row's {int(prompt[i])} prompt "
            "tokens (the shared prefix is the start of the prompt)",
            shown,
            lines[i],
        )


def _nonnegative_floats(
    values: Sequence[Any], lines: Sequence[int], name: str, shown: str
) -> np.ndarray:
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # too large: inf, reported below
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


def seconds_since_first(stamps: Sequence[str]) -> np.ndarray | None:
    """Seconds after the first of ISO 8601 timestamps (pandas), or None if one is no date-time
    or they mix time zones."""
    import pandas as pd  # local: only trace loading needs it

    try:
        parsed = pd.to_datetime(pd.Series(stamps), format="ISO8601", errors="coerce")
        if bool(parsed.isna().any()):
            return None
        seconds = (parsed - parsed.iloc[0]) / pd.Timedelta(seconds=1)
    except OverflowError:  # more than 292 years apart: breaks the span or order rule anyway
        times: Any = parsed.array
        ticks = times.asi8.astype(np.float64)
        return (ticks - ticks[0]) / float(pd.Timedelta(seconds=1) / pd.Timedelta(1, parsed.dt.unit))
    except (ValueError, TypeError):  # time zones mixed (pandas 2 fails on subtracting)
        return None
    return seconds.to_numpy(dtype=np.float64)


def first_bad_stamp(stamps: Sequence[str]) -> tuple[int, bool]:
    """Where :func:`seconds_since_first` fails: (index of the first timestamp that is no
    date-time or is in another time zone than those before it, whether it is the zone)."""
    import pandas as pd

    end = len(stamps)
    try:
        parsed = pd.to_datetime(pd.Series(stamps), format="ISO8601", errors="coerce")
        missing = np.flatnonzero(parsed.isna().to_numpy())
        if missing.size:
            end = int(missing[0])
            if end == 0 or seconds_since_first(stamps[:end]) is not None:
                return end, False
    except ValueError:  # time zones mixed (pandas 3)
        pass
    lo, hi = 0, end - 1  # bisect: the first prefix that fails (longer ones fail too)
    while lo < hi:
        mid = (lo + hi) // 2
        if seconds_since_first(stamps[: mid + 1]) is None:
            hi = mid
        else:
            lo = mid + 1
    return hi, seconds_since_first(stamps[hi : hi + 1]) is not None  # a date-time: the zone


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
