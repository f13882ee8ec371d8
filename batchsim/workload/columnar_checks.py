"""What the columnar trace readers (:mod:`~batchsim.workload.columnar`) check in the bytes of a
trace and in the columns pyarrow reads from them: the text rules (no NUL byte, UTF-8), line
breaks and line lengths, numbers read straight from pyarrow's buffers, token counts, and times
that never decrease.

None of them writes an error message: a check that fails answers False or None, and the reader
leaves the bytes to the row-by-row reader.
"""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING

import numpy as np

from batchsim.validation import MAX_SECONDS, MAX_TOKENS

if TYPE_CHECKING:
    import pyarrow as pa

_SCAN = 1 << 22  # bytes compared at a time when looking for a byte (bounds the temporaries)
_FLOAT_CHARS = np.zeros(256, dtype=bool)
_FLOAT_CHARS[list(b"0123456789.eE+-")] = True


# ------------------------------------------------------------------------------------ bytes


def _text_rules_hold(data: bytes) -> bool:
    """No NUL byte and valid UTF-8 (which also rules out UTF-16/UTF-32 byte-order marks)."""
    if b"\x00" in data:
        return False
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _lone_carriage_return(data: bytes) -> bool:
    """A ``\\r`` not followed by ``\\n`` (csv and pyarrow end a line there, Python's json
    does not)."""
    returns = _positions(data, 0, 13)
    if not len(returns):
        return False
    if int(returns[-1]) == len(data) - 1:
        return True
    return not bool(np.all(np.frombuffer(data, dtype=np.uint8)[returns + 1] == 10))


def _positions(data: bytes, start: int, byte: int) -> np.ndarray:
    """Offsets of ``byte`` in ``data[start:]`` (int64, ascending)."""
    codes = np.frombuffer(data, dtype=np.uint8)
    found = [
        np.flatnonzero(codes[lo : lo + _SCAN] == byte) + lo for lo in range(start, len(data), _SCAN)
    ]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _lines(data: bytes, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Newline offsets in ``data[start:]``, and the start and end offsets of its lines (the last
    one included when it has no newline)."""
    newlines = _positions(data, start, 10)
    ends = newlines
    if not data.endswith(b"\n") and len(data) > start:
        ends = np.concatenate((newlines, [len(data)]))
    starts = np.concatenate(([start], ends[:-1] + 1)) if len(ends) else ends
    return newlines, starts, ends


def _lines_within_field_limit(data: bytes, start: int) -> bool:
    """Every line of ``data[start:]`` is at most ``csv.field_size_limit()`` bytes long, so no
    field is longer than the csv module allows."""
    limit = csv.field_size_limit()
    # A line longer than the limit holds a whole aligned block of half its size: when each
    # block has a newline, no line is too long (a few hundred finds for 100 MB).
    block = max(limit // 2, 1)
    blocks = range(start, len(data) - block + 1, block)
    if all(data.find(b"\n", lo, lo + block) >= 0 for lo in blocks):
        return True
    _, starts, ends = _lines(data, start)
    return not len(ends) or int((ends - starts).max()) <= limit


# ------------------------------------------------------------------------------------ columns


def _numbers(column: pa.ChunkedArray | pa.Array, dtype: type[np.generic]) -> np.ndarray:
    """The values of a null-free int64 or float64 column, read from its buffers (pyarrow's
    ``to_numpy`` would import pandas)."""
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    size = np.dtype(dtype).itemsize
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * size)
        for c in chunks
        if len(c)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(Offsets, bytes) of a pyarrow string array: value ``i`` is
    ``bytes[offsets[i]:offsets[i + 1]]``."""
    buffers = array.buffers()
    offsets = np.frombuffer(
        buffers[1], dtype=np.int32, count=len(array) + 1, offset=array.offset * 4
    )
    values = buffers[2]
    codes = np.frombuffer(values, dtype=np.uint8) if values is not None else np.zeros(0, np.uint8)
    return offsets, codes


def _token_counts(column: pa.ChunkedArray, minimum: int = 1) -> np.ndarray | None:
    """Integers in [minimum, MAX_TOKENS], or None. An int64 column was parsed by pyarrow (see
    :func:`~batchsim.workload.columnar._read_body` for what it accepts); a string column must
    hold plain digits."""
    import pyarrow as pa

    if column.type == pa.string():
        for chunk in column.chunks:
            offsets, codes = _string_buffers(chunk)
            if not len(chunk):
                continue
            if int(np.diff(offsets).min()) < 1:
                return None
            text = codes[offsets[0] : offsets[-1]]
            if int(text.min()) < ord("0") or int(text.max()) > ord("9"):
                return None
        import pyarrow.compute as pc

        try:
            column = pc.cast(column, pa.int64())
        except pa.ArrowException:
            return None
    counts = _numbers(column, np.int64)
    if not counts.size or counts.min() < minimum or counts.max() > MAX_TOKENS:
        return None
    return counts


def _nonnegative_floats(column: pa.ChunkedArray) -> np.ndarray | None:
    """Finite numbers >= 0 (parsed by pyarrow as float64), or None."""
    values = _numbers(column, np.float64)
    if not (values.size and np.isfinite(values).all() and values.min() >= 0):
        return None
    return values


def _times_hold(seconds: np.ndarray) -> bool:
    """Non-decreasing and within MAX_SECONDS (NaN fails both)."""
    return bool(np.all(np.diff(seconds) >= 0)) and bool(np.all(seconds <= MAX_SECONDS))


def _counts(column: pa.ChunkedArray, keep: int) -> np.ndarray | None:
    """The first ``keep`` values if all are token counts, else None."""
    counts = _numbers(column, np.int64)[:keep]
    if counts.min() < 1 or counts.max() > MAX_TOKENS:
        return None
    return counts
