"""Columnar reading of trace files with pyarrow: the fast path of :mod:`~batchsim.workload.traces`.

Each reader here returns the arrays of a trace, or None when it cannot vouch that they are what
the row-by-row readers of :mod:`~batchsim.workload.traces` would return. Then those readers run
on the same bytes and report the first broken rule as always (file and line), so every check
here may be stricter than the rules but never looser, and no error message is written here but
the row-limit one. Left to the row-by-row readers: bytes that break the encoding rules; in a CSV,
a quote character in the data rows, a row whose field count is not the header's, a line longer
than ``csv.field_size_limit()``, a number written unusually (``12.0``, ``1e3``, ``+5``); in a
JSONL file, escapes (``\\``), a lone ``\\r``, more than one object per line, an object spread
over lines, nesting besides ``hash_ids``, a non-integer or missing value; and every broken rule.
(A lone ``\\r`` ends a CSV line for the csv module and for pyarrow alike, so only line numbers
differ, and those are the row-by-row reader's.) Azure timestamps written other than
``YYYY-MM-DD HH:MM:SS[.fffffffff]`` (``T`` may separate date and time) are parsed by pandas,
as the row-by-row reader does.

Nothing here builds Python objects per row (but for timestamps written otherwise, handed to
pandas). pyarrow is imported when a trace is first read; pandas only for those timestamps.

The checks on bytes and columns are :mod:`~batchsim.workload.columnar_checks`, the parsing of
Azure timestamps :mod:`~batchsim.workload.columnar_times`.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from batchsim.errors import ConfigError
from batchsim.workload import files
from batchsim.workload.columnar_checks import (
    _counts,
    _lines,
    _lines_within_field_limit,
    _lone_carriage_return,
    _nonnegative_floats,
    _numbers,
    _positions,
    _string_buffers,
    _text_rules_hold,
    _times_hold,
    _token_counts,
)
from batchsim.workload.columnar_times import _azure_seconds

if TYPE_CHECKING:
    import pyarrow as pa

_UTF8_BOM = b"\xef\xbb\xbf"


class HashIds(Sequence[list[int]]):
    """Mooncake ``hash_ids`` of every row, stored flat: row ``i`` is
    ``values[offsets[i]:offsets[i + 1]]``. Indexing gives a list of ints, slicing a list of
    them (built only for the rows asked for)."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self._values = values
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> list[int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[list[int]]: ...

    def __getitem__(self, index: int | slice) -> list[int] | list[list[int]]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return list(HashIds(self._values, self._offsets[start : max(start, stop) + 1]))
            return [self[i] for i in range(start, stop, step)]
        i = range(len(self))[index]
        return self._values[self._offsets[i] : self._offsets[i + 1]].tolist()

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)``: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""
        return self._values, self._offsets

    def head(self, rows: int) -> HashIds:
        """The first ``rows`` rows."""
        return HashIds(self._values, self._offsets[: rows + 1])

    def __iter__(self) -> Iterator[list[int]]:
        first = int(self._offsets[0])
        flat = self._values[first : int(self._offsets[-1])].tolist()
        ends = (self._offsets - first).tolist()
        return (flat[a:b] for a, b in itertools.pairwise(ends))


# ------------------------------------------------------------------------------------ CSV


@dataclass(frozen=True)
class CsvHeader:
    """The header of a CSV trace, found in its bytes."""

    names: list[str]
    """Column names, stripped."""
    start: int
    """Offset of the header line."""
    end: int
    """Offset just past the header line: the data rows start here."""


def csv_header(data: bytes) -> CsvHeader | None:
    """The header of a CSV trace (its first non-blank line), or None when the columnar reader
    does not read these bytes."""
    if not _text_rules_hold(data):
        return None
    pos = len(_UTF8_BOM) if data.startswith(_UTF8_BOM) else 0
    while True:
        newline = data.find(b"\n", pos)
        end = len(data) if newline < 0 else newline + 1
        line = data[pos:end]
        if not files.blank(line.removesuffix(b"\n")):
            break
        if newline < 0:
            return None
        pos = end
    if b"\r" in data[:pos] or b"\r" in line.removesuffix(b"\r\n"):
        return None  # csv ends a line at a lone "\r" too: the lines here would not be its
    text = line.decode("utf-8").removesuffix("\n").removesuffix("\r")
    try:  # strict: a quote left open (a header spread over lines) is an error, not a guess
        row = next(csv.reader([text], strict=True))
    except (csv.Error, StopIteration):
        return None
    if len(row) == 1 and not row[0].strip():  # blank to the csv module (e.g. '""'): skipped
        return None
    return CsvHeader([h.strip() for h in row], pos, end)


def read_azure(
    data: bytes, header: CsvHeader, shown: str, limit: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(Seconds since the first row, prompt tokens, output tokens) of an Azure trace."""
    names = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    if not all(name in header.names for name in names):
        return None
    i_ts, i_ctx, i_gen = (header.names.index(name) for name in names)
    table = _read_body(data, header, {i_ts: "text", i_ctx: "count", i_gen: "count"}, shown, limit)
    if table is None:
        return None
    prompt = _token_counts(table.column(f"c{i_ctx}"))
    output = _token_counts(table.column(f"c{i_gen}"))
    if prompt is None or output is None:
        return None
    seconds = _azure_seconds(table.column(f"c{i_ts}"))
    if seconds is None or not _times_hold(seconds):
        return None
    return seconds, prompt, output


def read_burstgpt(
    data: bytes, header: CsvHeader, shown: str, limit: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int] | None:
    """(Seconds since the first kept row, prompt tokens, output tokens, rows with 0 response
    tokens, rows with 0 request tokens but some response) of a BurstGPT trace: the rows up to
    the ``limit``-th with both counts > 0 are read and checked, those with a 0 are left out."""
    names = ("Timestamp", "Request tokens", "Response tokens")
    if not all(name in header.names for name in names):
        return None
    i_ts, i_req, i_resp = (header.names.index(name) for name in names)
    if len({i_ts, i_req, i_resp}) != 3:
        return None
    types = {i_ts: "time", i_req: "count", i_resp: "count"}
    try:
        table = _read_body(data, header, types, shown, None)
    except ConfigError:
        if limit is None:
            raise
        return None  # too many rows in all; the row reader may stop before them
    if table is None:
        return None
    request = _token_counts(table.column(f"c{i_req}"), minimum=0)
    response = _token_counts(table.column(f"c{i_resp}"), minimum=0)
    if request is None or response is None:
        return None
    kept = (request > 0) & (response > 0)
    end = len(kept)
    if limit is not None:
        rows = np.flatnonzero(kept)
        if len(rows) >= limit:
            end = int(rows[limit - 1]) + 1
    stamps = _nonnegative_floats(table.column(f"c{i_ts}").slice(0, end))
    if stamps is None or not _times_hold(stamps):
        return None
    kept, request, response = kept[:end], request[:end], response[:end]
    if not kept.any():
        return None
    times = stamps[kept]
    failed = int(np.count_nonzero(response == 0))
    no_prompt = int(np.count_nonzero((request == 0) & (response > 0)))
    return times - times[0], request[kept], response[kept], failed, no_prompt


def read_generic_csv(
    data: bytes,
    header: CsvHeader,
    shown: str,
    limit: int | None,
    columns: tuple[str | None, str, str],
    time_unit: str,
    prefix: tuple[str, str] | None = None,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """(Arrival times or None, prompt tokens, output tokens, prefix group ids or None, prefix
    tokens or None) of a generic CSV trace; ``columns`` names the arrival time (None: no
    times), prompt and output columns, ``prefix`` the group and prefix-tokens columns (see
    :func:`~batchsim.workload.files.group_ids` for the ids)."""
    arrival_name, prompt_name, output_name = columns
    wanted = [prompt_name, output_name]
    kinds = ["count", "count"]
    if arrival_name is not None:
        wanted.append(arrival_name)
        kinds.append("time")
    if prefix is not None:
        wanted += [prefix[1], prefix[0]]
        kinds += ["count", "text"]
    if not all(name in header.names for name in wanted):
        return None
    index = [header.names.index(name) for name in wanted]
    types = dict(zip(index, kinds))
    if any(types[i] != kind for i, kind in zip(index, kinds)):
        return None  # one column read both as times and as counts, or as text
    table = _read_body(data, header, types, shown, limit)
    if table is None:
        return None
    prompt = _token_counts(table.column(f"c{index[0]}"))
    output = _token_counts(table.column(f"c{index[1]}"))
    if prompt is None or output is None:
        return None
    arrival = None
    if arrival_name is not None:
        arrival = _nonnegative_floats(table.column(f"c{index[2]}"))
        if arrival is None:
            return None
        if time_unit == "ms":
            arrival = arrival / 1000.0
        if not _times_hold(arrival):
            return None
    group = tokens = None
    if prefix is not None:
        tokens = _token_counts(table.column(f"c{index[-2]}"), minimum=0)
        if tokens is None or bool(np.any(tokens > prompt)):
            return None
        group = _group_ids(table.column(f"c{index[-1]}"), tokens > 0)
        if group is None:
            return None
    return arrival, prompt, output, group, tokens


def _group_ids(column: pa.ChunkedArray, used: np.ndarray) -> np.ndarray | None:
    """:func:`~batchsim.workload.files.group_ids` of a string column, or None when a row in
    ``used`` has an empty group."""
    array: Any = column.combine_chunks()
    offsets, _ = _string_buffers(array)
    if bool(np.any(np.diff(offsets)[used] == 0)):
        return None
    codes = _numbers(array.dictionary_encode().indices, np.int32).astype(np.int64)
    ids = np.full(len(codes), -1, dtype=np.int64)
    chosen = codes[used]
    if chosen.size:
        # pyarrow's codes, renumbered in order of first appearance among the rows used
        unique, first = np.unique(chosen, return_index=True)
        rank = np.empty(len(unique), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(unique), dtype=np.int64)
        lookup = np.zeros(int(unique[-1]) + 1, dtype=np.int64)
        lookup[unique] = rank
        ids[used] = lookup[chosen]
    return ids


def _read_body(
    data: bytes,
    header: CsvHeader,
    types: dict[int, str],
    shown: str,
    limit: int | None,
) -> pa.Table | None:
    """The columns ``types`` names (index: ``"text"``, ``"count"`` or ``"time"``) of the first
    ``limit`` data rows, named ``c<index>``. Text columns are strings; counts are int64 unless
    an ``x`` in the data might be hexadecimal (which pyarrow reads as a number and the rules do
    not), then strings; times are float64. pyarrow's numbers are a subset of Python's: it
    trims spaces and tabs as Python's ``int()`` and ``float()`` do, and reads no ``_``, no
    ``+`` before an integer and no unicode digit.

    Raises:
        ConfigError: More than MAX_REQUESTS data rows (read whole), naming the first line over.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if data.find(b'"', header.end) >= 0:
        return None
    width = len(header.names)
    names = [f"c{i}" for i in range(width)]
    if not _lines_within_field_limit(data, header.end):
        return None
    hexadecimal = data.find(b"x", header.end) >= 0 or data.find(b"X", header.end) >= 0
    arrow_types = {
        "text": pa.string(),
        "count": pa.string() if hexadecimal else pa.int64(),
        "time": pa.float64(),
    }
    try:
        table = pacsv.read_csv(
            pa.py_buffer(memoryview(data)[header.end :]),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
            parse_options=pacsv.ParseOptions(
                quote_char=False,
                double_quote=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
            ),
            convert_options=pacsv.ConvertOptions(
                include_columns=[names[i] for i in sorted(types)],
                column_types={names[i]: arrow_types[kind] for i, kind in types.items()},
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowException:
        return None
    if limit is not None:
        table = table.slice(0, limit)
    if table.num_rows == 0:
        return None
    if table.num_rows > files.MAX_REQUESTS:
        line = _line_of_data_row(data, header, files.MAX_REQUESTS)
        if line is None:
            return None
        files._check_row_count(table.num_rows, shown, line)
    return table


def _line_of_data_row(data: bytes, header: CsvHeader, row: int) -> int | None:
    """1-based line of data row ``row`` (0-based; pyarrow skips empty lines), or None when
    lines of white space or a lone ``\\r`` (a line break to csv) make the count uncertain."""
    if _lone_carriage_return(data):
        return None
    _, starts, ends = _lines(data, header.end)
    view = np.frombuffer(data, dtype=np.uint8)
    length = ends - starts
    if len(length):
        length -= (length > 0) & (view[np.maximum(ends - 1, 0)] == 13)  # a CRLF line's "\r"
    filled = np.flatnonzero(length > 0)
    if len(filled) and not np.all(files._nonblank(data, starts[filled], ends[filled])):
        return None
    if row >= len(filled):
        return None
    return data.count(b"\n", 0, header.start) + 2 + int(filled[row])


# ------------------------------------------------------------------------------------ JSONL


def read_mooncake(
    data: bytes, shown: str, limit: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, HashIds] | None:
    """(Seconds since the first row, prompt tokens, output tokens, hash ids) of a Mooncake
    JSONL trace.

    Raises:
        ConfigError: More than MAX_REQUESTS rows (read whole), naming the first line over.
    """
    if not _text_rules_hold(data) or b"\\" in data or _lone_carriage_return(data):
        return None
    import pyarrow as pa
    import pyarrow.json as pajson

    start = len(_UTF8_BOM) if data.startswith(_UTF8_BOM) else 0
    schema = pa.schema(
        [
            ("timestamp", pa.int64()),
            ("input_length", pa.int64()),
            ("output_length", pa.int64()),
            ("hash_ids", pa.list_(pa.int64())),
        ]
    )
    try:
        table = pajson.read_json(
            pa.py_buffer(memoryview(data)[start:]),
            read_options=pajson.ReadOptions(use_threads=False),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema,
                unexpected_field_behavior="ignore",
                newlines_in_values=False,
            ),
        )
    except pa.ArrowException:
        return None
    rows = table.num_rows
    newlines, starts, ends = _lines(data, start)
    nonblank = np.flatnonzero(files._nonblank(data, starts, ends)) if len(ends) else ends
    if not rows or len(nonblank) != rows or not _one_brace_per_row(data, start, newlines, rows):
        return None
    stamps, inputs, outputs, hashes = (table.column(i) for i in range(4))
    if stamps.null_count or inputs.null_count or outputs.null_count:
        return None
    hash_ids = _hash_ids(hashes, data, start, rows)
    if hash_ids is None:
        return None
    if limit is None and rows > files.MAX_REQUESTS:
        files._check_row_count(rows, shown, int(nonblank[files.MAX_REQUESTS]) + 1)
    keep = rows if limit is None else min(rows, limit)
    prompt = _counts(inputs, keep)
    output = _counts(outputs, keep)
    ms = _numbers(stamps, np.int64)[:keep]
    if prompt is None or output is None or ms.min() < 0:
        return None
    ms_f = ms.astype(np.float64)
    seconds = (ms_f - ms_f[0]) / 1000.0
    if not _times_hold(seconds):
        return None
    return seconds, prompt, output, hash_ids.head(keep)


def _one_brace_per_row(data: bytes, start: int, newlines: np.ndarray, rows: int) -> bool:
    """As many ``{`` and ``}`` as rows, no two ``{`` on one line: each row is an object on a
    line of its own, with no object inside (so no deep nesting either)."""
    braces = _positions(data, start, ord("{"))
    if len(braces) != rows or data.count(b"}", start) != rows:
        return False
    return bool(np.all(np.diff(np.searchsorted(newlines, braces)) > 0))


def _hash_ids(column: pa.ChunkedArray, data: bytes, start: int, rows: int) -> HashIds | None:
    """The ``hash_ids`` lists, or None when one is null (which may be an explicit null) or
    holds a null, or when a ``[`` or ``]`` belongs to anything else."""
    brackets = data.count(b"[", start)
    if brackets != data.count(b"]", start):
        return None
    if column.null_count == rows:  # no row has the key: every list is empty
        if brackets or data.find(b'"hash_ids"', start) >= 0:
            return None
        return HashIds(np.zeros(0, dtype=np.int64), np.zeros(rows + 1, dtype=np.int64))
    if column.null_count or brackets != rows:
        return None
    lists: Any = column.combine_chunks()
    offsets = _numbers(lists.offsets, np.int32).astype(np.int64)
    values = lists.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if values.null_count:
        return None
    return HashIds(_numbers(values, np.int64), offsets - offsets[0])
