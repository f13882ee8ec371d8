"""Trace replay: the ``workload.trace`` block and the readers of public trace files.

Owns :class:`TraceConfig` (with :class:`CsvColumns`), the ``TRACE_FORMATS`` descriptions and
:func:`load_trace`, which reads (and caches) an Azure LLM inference 2023/2024 CSV, a Mooncake
JSONL, a BurstGPT CSV or a generic CSV into arrival times (seconds since the first row) and
token counts. BurstGPT rows with 0 response tokens (failed requests) or 0 request tokens are
skipped and counted (:attr:`_Trace.skipped`, :func:`skipped_note`), not errors.
Malformed rows, timestamps going backwards and empty files raise a
:class:`~batchsim.errors.ConfigError` naming the file and line.

Two readers share the work. The columnar one (:mod:`~batchsim.workload.columnar`, pyarrow and
numpy) reads the usual files; when it cannot vouch for a file (an unusual way of writing it,
or a broken rule), the row-by-row one here reads the same bytes and names the first bad line.
With ``limit`` only the first ``limit`` data rows are read: the file is read up to the line
that ends them, and rows after it are neither read nor checked.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from batchsim.errors import ConfigError
from batchsim.validation import ConfigModel, FieldError, StrictFloat, format_value
from batchsim.workload import columnar
from batchsim.workload.files import (
    _as_positive_int,
    _check_row_count,
    _check_sorted,
    _check_span,
    _column_index,
    _mtime,
    _nonnegative_floats,
    _positive_ints,
    _read_rows,
    _take,
    check_prefix_fits,
    csv_rows,
    decode_data,
    first_bad_stamp,
    group_ids,
    read_data_bytes,
    resolve_data_path,
    seconds_since_first,
)


class CsvColumns(ConfigModel):
    """Column names of a generic CSV trace."""

    arrival_time: str | None = Field(
        default="arrival_time", description="arrival time column (null: no timestamps in the file)"
    )
    prompt_tokens: str = Field(default="prompt_tokens", description="prompt length column")
    output_tokens: str = Field(default="output_tokens", description="output length column")
    prefix_group: str | None = Field(
        default=None,
        description="shared-prefix group column (with prefix_tokens): rows with the same "
        "group start with the same prefix_tokens tokens (default: none)",
    )
    prefix_tokens: str | None = Field(
        default=None,
        description="column of each row's shared-prefix length, tokens (0: shares nothing; "
        "at most the row's prompt tokens)",
    )

    @model_validator(mode="after")
    def _check_prefix_pair(self) -> CsvColumns:
        if (self.prefix_group is None) != (self.prefix_tokens is None):
            given, missing = ("prefix_group", "prefix_tokens")
            if self.prefix_group is None:
                given, missing = missing, given
            raise FieldError(missing, f"is required with {given} (give both or neither)")
        return self


TRACE_FORMATS: dict[str, str] = {
    "azure": "Azure LLM inference trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens; "
    "arrival = seconds since the first row",
    "mooncake": "Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids "
    "(512-token prefix blocks, kept for prefix caching)",
    "burstgpt": "BurstGPT CSV (github.com/HPMLL/BurstGPT): Timestamp (s), Model, Request "
    "tokens, Response tokens, Total tokens, Log Type; rows with 0 response tokens (failed "
    "requests) or 0 request tokens are skipped and counted; arrival = seconds since the first "
    "row kept",
    "csv": "generic CSV with a header; columns (default arrival_time, prompt_tokens, "
    "output_tokens; optional prefix_group and prefix_tokens) and time_unit (s or ms) "
    "configurable; arrival times used as given",
}


class TraceConfig(ConfigModel):
    """Replay a trace file: its arrival times and token counts replace the synthetic ones.

    ``time_scale`` multiplies every arrival time (so every inter-arrival gap): 0.5 replays the
    trace twice as fast (double the request rate), 2.0 half as fast. A relative ``path`` is
    looked up next to the experiment file, then in the built-in ``workloads/`` catalog.
    ``format`` may be omitted: ``.jsonl`` files are read as mooncake, CSVs whose header is the
    Azure one as azure, CSVs with BurstGPT's Timestamp, Request tokens and Response tokens
    columns as burstgpt, other CSVs as csv.
    """

    path: str = Field(min_length=1, description="trace file")
    format: Literal["azure", "mooncake", "burstgpt", "csv"] | None = Field(
        default=None, description="azure | mooncake | burstgpt | csv (default: from the file)"
    )
    time_scale: StrictFloat = Field(
        default=1.0, gt=0, le=1e6, description="multiplies arrival times: 0.5 = twice as fast (> 0)"
    )
    columns: CsvColumns | None = Field(default=None, description="csv only: column names")
    time_unit: Literal["s", "ms"] | None = Field(
        default=None, description="csv only: s (default) or ms"
    )

    @model_validator(mode="after")
    def _check_csv_only(self) -> TraceConfig:
        if self.format in ("azure", "mooncake", "burstgpt"):
            for key in ("columns", "time_unit"):
                if getattr(self, key) is not None:
                    raise FieldError(key, f"applies to format csv only, not {self.format}")
        return self


@dataclass(frozen=True)
class _Trace:
    arrival_time: np.ndarray | None  # seconds, unscaled, non-decreasing; None = no timestamps
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: Sequence[list[int]] | None  # a slice gives a list of lists
    format: str
    prefix_group: np.ndarray | None = None  # csv: group content id per row (-1: none)
    prefix_tokens: np.ndarray | None = None  # csv: shared-prefix tokens per row (0: none)
    skipped: tuple[tuple[str, int], ...] = ()  # (why, rows) left out of the rows read

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def load_trace(
    trace: TraceConfig, base_dir: Path | None = None, limit: int | None = None
) -> _Trace:
    """Read a trace file (cached per file, format, columns and limit; do not modify the arrays).

    Args:
        trace: The ``workload.trace`` block.
        base_dir: Directory of the experiment file (see :func:`resolve_data_path`).
        limit: Read only the first ``limit`` data rows (the file up to the line that ends
            them); rows after it are not read, so not checked either. None: the whole file.

    Raises:
        ConfigError: Missing file, malformed row (names file and line), timestamps going
            backwards, or an empty trace.
    """
    resolved = resolve_data_path(trace.path, base_dir, "workload.trace.path")
    cols = trace.columns or CsvColumns()
    explicit_csv = trace.columns is not None or trace.time_unit is not None
    return _load_trace_cached(
        str(resolved),
        _mtime(resolved),
        trace.format,
        explicit_csv,
        cols,
        trace.time_unit or "s",
        trace.path,
        limit,
    )


BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
"""The BurstGPT columns read (``Model``, ``Total tokens``, ``Log Type`` and, in later files,
``Session ID`` and ``Elapsed time`` are not used)."""
SKIPPED_FAILED = "with 0 response tokens (failed requests)"
SKIPPED_NO_PROMPT = "with 0 request tokens"


def _format_of_header(header: list[str], explicit_csv: bool) -> str:
    if explicit_csv:
        return "csv"
    names = {h.strip() for h in header}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= names:
        return "azure"
    return "burstgpt" if set(BURSTGPT_COLUMNS) <= names else "csv"


def skipped_note(trace: _Trace, shown: str) -> str | None:
    """One line saying which rows of the file were left out, or None (none were)."""
    parts = [f"{n:,} row{'s' if n != 1 else ''} {why}" for why, n in trace.skipped if n]
    if not parts:
        return None
    return f"workload.trace: {shown}: skipped {' and '.join(parts)}; they are not replayed"


def _infer_format(path: str, text: str, explicit_csv: bool, shown: str) -> str:
    if Path(path).suffix in (".jsonl", ".json"):
        return "mooncake"
    if explicit_csv:
        return "csv"
    return _format_of_header(next(csv_rows(text, shown), ([], 0))[0], explicit_csv)


@functools.lru_cache(maxsize=8)
def _load_trace_cached(
    path: str,
    mtime: int,
    fmt: str | None,
    explicit_csv: bool,
    cols: CsvColumns,
    time_unit: str,
    shown: str,
    limit: int | None = None,
) -> _Trace:
    jsonl = fmt == "mooncake" or (fmt is None and Path(path).suffix in (".jsonl", ".json"))
    lines = None if limit is None else limit + (0 if jsonl else 1)  # a CSV has a header line
    data, whole = read_data_bytes(path, shown, lines)
    if not whole and not jsonl and b'"' in data:  # a quoted field may hold a line break
        data, whole = read_data_bytes(path, shown)
    out = _parse(data, path, fmt, explicit_csv, cols, time_unit, shown, limit)
    if not whole and limit is not None and len(out) < limit:  # not expected: lines are rows
        out = _parse(
            read_data_bytes(path, shown)[0], path, fmt, explicit_csv, cols, time_unit, shown, limit
        )
    for arr in (
        out.arrival_time,
        out.prompt_tokens,
        out.output_tokens,
        out.prefix_group,
        out.prefix_tokens,
    ):
        if arr is not None:
            arr.setflags(write=False)
    return out


def _parse(
    data: bytes,
    path: str,
    fmt: str | None,
    explicit_csv: bool,
    cols: CsvColumns,
    time_unit: str,
    shown: str,
    limit: int | None,
) -> _Trace:
    """The trace in ``data``: read by the columnar reader if it can, else row by row."""
    if fmt == "mooncake" or (fmt is None and Path(path).suffix in (".jsonl", ".json")):
        moon = columnar.read_mooncake(data, shown, limit)
        if moon is not None:
            return _Trace(moon[0], moon[1], moon[2], moon[3], "mooncake")
        return _parse_rows(data, path, "mooncake", explicit_csv, cols, time_unit, shown, limit)
    header = columnar.csv_header(data)
    if header is not None:
        kind = fmt or _format_of_header(header.names, explicit_csv)
        if kind == "azure":
            azure = columnar.read_azure(data, header, shown, limit)
            if azure is not None:
                return _Trace(azure[0], azure[1], azure[2], None, "azure")
        elif kind == "burstgpt":
            burst = columnar.read_burstgpt(data, header, shown, limit)
            if burst is not None:
                times, requested, responded, failed, no_prompt = burst
                skipped = ((SKIPPED_FAILED, failed), (SKIPPED_NO_PROMPT, no_prompt))
                return _Trace(times, requested, responded, None, "burstgpt", skipped=skipped)
        else:
            names = (cols.arrival_time, cols.prompt_tokens, cols.output_tokens)
            prefix = None
            if cols.prefix_group is not None and cols.prefix_tokens is not None:
                prefix = (cols.prefix_group, cols.prefix_tokens)
            generic = columnar.read_generic_csv(
                data, header, shown, limit, names, time_unit, prefix
            )
            if generic is not None:
                arrival, prompt, output, group, tokens = generic
                return _Trace(arrival, prompt, output, None, "csv", group, tokens)
    return _parse_rows(data, path, fmt, explicit_csv, cols, time_unit, shown, limit)


def _parse_rows(
    data: bytes,
    path: str,
    fmt: str | None,
    explicit_csv: bool,
    cols: CsvColumns,
    time_unit: str,
    shown: str,
    limit: int | None,
) -> _Trace:
    """The trace in ``data``, read row by row (names the first bad line)."""
    text = decode_data(data, shown)
    fmt = fmt or _infer_format(path, text, explicit_csv, shown)
    if fmt == "mooncake":
        return _read_mooncake(text, shown, limit)
    if fmt == "azure":
        return _read_azure(text, shown, limit)
    if fmt == "burstgpt":
        return _read_burstgpt(text, shown, limit)
    return _read_csv_trace(text, shown, cols, time_unit, limit)


def _read_azure(text: str, shown: str, limit: int | None = None) -> _Trace:
    header, rows, lines = _read_rows(text, shown, limit)
    width = len(header)
    i_ts, i_ctx, i_gen = (
        _column_index(header, name, shown)
        for name in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    )
    stamps = _take(rows, lines, i_ts, width, shown)
    prompt = _positive_ints(_take(rows, lines, i_ctx, width, shown), lines, "ContextTokens", shown)
    output = _positive_ints(
        _take(rows, lines, i_gen, width, shown), lines, "GeneratedTokens", shown
    )
    seconds = seconds_since_first(stamps)
    if seconds is None:
        i, zone = first_bad_stamp(stamps)
        raise ConfigError(
            "TIMESTAMP: expected a date-time like 2023-11-16 18:15:46.6805900"
            f"{' in the time zone of the rows before' if zone else ''}, "
            f"got {format_value(stamps[i])}",
            shown,
            lines[i],
        )
    _check_sorted(seconds, lines, "TIMESTAMP", shown)
    _check_span(seconds, lines, "TIMESTAMP", shown)
    return _Trace(seconds, prompt, output, None, "azure")


def _read_burstgpt(text: str, shown: str, limit: int | None = None) -> _Trace:
    """BurstGPT rows up to the ``limit``-th with request and response tokens > 0 (all rows
    without a limit); rows with a 0 are counted and left out."""
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    found = 0
    index: tuple[int, int, int] | None = None
    for row, line in csv_rows(text, shown):
        if header is None:
            header = [h.strip() for h in row]
            i_ts, i_req, i_resp = (_column_index(header, n, shown) for n in BURSTGPT_COLUMNS)
            index = (i_ts, i_req, i_resp)
            continue
        assert index is not None
        rows.append(row)
        lines.append(line)
        _check_row_count(len(rows), shown, line)
        if len(row) <= max(index):
            break  # too few fields: reported by _take below
        counts = [_as_positive_int(row[i], minimum=0) for i in index[1:]]
        if None in counts:
            break  # reported by _positive_ints below
        if counts[0] and counts[1]:
            found += 1
            if found == limit:
                break
    if header is None or not rows:
        raise ConfigError("empty trace: no data rows", shown)
    assert index is not None
    width = len(header)
    i_ts, i_req, i_resp = index
    request = _positive_ints(
        _take(rows, lines, i_req, width, shown), lines, "Request tokens", shown, minimum=0
    )
    response = _positive_ints(
        _take(rows, lines, i_resp, width, shown), lines, "Response tokens", shown, minimum=0
    )
    stamps = _nonnegative_floats(_take(rows, lines, i_ts, width, shown), lines, "Timestamp", shown)
    _check_sorted(stamps, lines, "Timestamp", shown)
    _check_span(stamps, lines, "Timestamp", shown)
    kept = (request > 0) & (response > 0)
    if not kept.any():
        raise ConfigError(
            f"no request to replay: every one of the {len(rows):,} rows has 0 request or 0 "
            "response tokens",
            shown,
        )
    times = stamps[kept]
    failed = int(np.count_nonzero(response == 0))
    no_prompt = int(np.count_nonzero((request == 0) & (response > 0)))
    skipped = ((SKIPPED_FAILED, failed), (SKIPPED_NO_PROMPT, no_prompt))
    return _Trace(
        times - times[0], request[kept], response[kept], None, "burstgpt", skipped=skipped
    )


def _read_csv_trace(
    text: str, shown: str, cols: CsvColumns, time_unit: str, limit: int | None = None
) -> _Trace:
    header, rows, lines = _read_rows(text, shown, limit)
    width = len(header)
    i_p = _column_index(header, cols.prompt_tokens, shown)
    i_o = _column_index(header, cols.output_tokens, shown)
    prompt = _positive_ints(_take(rows, lines, i_p, width, shown), lines, cols.prompt_tokens, shown)
    output = _positive_ints(_take(rows, lines, i_o, width, shown), lines, cols.output_tokens, shown)
    arrival = None
    if cols.arrival_time is not None:
        i_t = _column_index(header, cols.arrival_time, shown)
        raw = _take(rows, lines, i_t, width, shown)
        arrival = _nonnegative_floats(raw, lines, cols.arrival_time, shown)
        if time_unit == "ms":
            arrival = arrival / 1000.0
        _check_sorted(arrival, lines, cols.arrival_time, shown)
        _check_span(arrival, lines, cols.arrival_time, shown)
    group = tokens = None
    if cols.prefix_group is not None and cols.prefix_tokens is not None:
        i_g = _column_index(header, cols.prefix_group, shown)
        i_k = _column_index(header, cols.prefix_tokens, shown)
        raw_tokens = _take(rows, lines, i_k, width, shown)
        tokens = _positive_ints(raw_tokens, lines, cols.prefix_tokens, shown, minimum=0)
        check_prefix_fits(tokens, prompt, lines, cols.prefix_tokens, shown)
        raw_groups = _take(rows, lines, i_g, width, shown)
        group = group_ids(raw_groups, tokens, lines, cols.prefix_group, cols.prefix_tokens, shown)
    return _Trace(arrival, prompt, output, None, "csv", group, tokens)


def _read_mooncake(text: str, shown: str, limit: int | None = None) -> _Trace:
    stamps: list[Any] = []
    inputs: list[Any] = []
    outputs: list[Any] = []
    hashes: list[list[int]] = []
    lines: list[int] = []
    for line_no, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc.msg}", shown, line_no) from None
        except RecursionError:
            raise ConfigError("invalid JSON: nested too deeply", shown, line_no) from None
        if not isinstance(row, dict):
            raise ConfigError("expected a JSON object per line", shown, line_no)
        for key in ("timestamp", "input_length", "output_length"):
            if key not in row:
                raise ConfigError(f"{key}: missing", shown, line_no)
        ids = row.get("hash_ids", [])
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise ConfigError(
                f"hash_ids: expected a list of integers, got {format_value(ids)}", shown, line_no
            )
        stamps.append(row["timestamp"])
        inputs.append(row["input_length"])
        outputs.append(row["output_length"])
        hashes.append(ids)
        lines.append(line_no)
        _check_row_count(len(lines), shown, line_no)
        if len(lines) == limit:
            break
    if not lines:
        raise ConfigError("empty trace: no data rows", shown)
    prompt = _positive_ints(inputs, lines, "input_length", shown)
    output = _positive_ints(outputs, lines, "output_length", shown)
    for value, line in zip(stamps, lines, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(
                f"timestamp: expected a number of ms, got {format_value(value)}", shown, line
            )
    ms = _nonnegative_floats(stamps, lines, "timestamp", shown)
    seconds = (ms - ms[0]) / 1000.0
    _check_sorted(seconds, lines, "timestamp", shown)
    _check_span(seconds, lines, "timestamp", shown)
    return _Trace(seconds, prompt, output, hashes, "mooncake")
