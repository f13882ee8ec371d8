"""Azure trace timestamps read in bulk for the columnar trace readers: ``YYYY-MM-DD
HH:MM:SS[.f]`` parsed digit by digit in numpy to nanoseconds since 1970, and any other writing
left to pandas, as the row-by-row reader does, so the seconds equal that reader's exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from batchsim.workload import files
from batchsim.workload.columnar_checks import _string_buffers

if TYPE_CHECKING:
    import pyarrow as pa

_GATHER = 1 << 16  # timestamps copied at a time when their widths differ
_BLOCK = 1 << 14  # timestamps parsed at a time (the temporaries stay in the cache)
_SEPARATORS = {4: ord("-"), 7: ord("-"), 13: ord(":"), 16: ord(":"), 19: ord(".")}
_MONTH_DAYS = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_EXACT_NS = 2**53  # differences up to this many ns convert to float64 exactly


def _azure_seconds(column: pa.ChunkedArray) -> np.ndarray | None:
    """Seconds since the first timestamp, equal to what pandas' ISO 8601 parsing gives; None
    when pandas finds a timestamp it cannot read."""
    pieces = [_iso_ns(chunk) for chunk in column.chunks]
    if pieces and all(p is not None for p in pieces):
        ns = np.concatenate([p for p in pieces if p is not None])
        if int(ns.max()) - int(ns.min()) < _EXACT_NS:  # Python ints: no overflow
            return (ns - ns[0]).astype(np.float64) / 1e9
    return _pandas_seconds(column)


def _pandas_seconds(column: pa.ChunkedArray) -> np.ndarray | None:
    """The row-by-row reader's conversion (for timestamps written another way)."""
    return files.seconds_since_first(column.to_pylist())


def _iso_ns(array: pa.Array) -> np.ndarray | None:
    """Nanoseconds since 1970 of ``YYYY-MM-DD HH:MM:SS[.f]`` timestamps (1 to 9 fraction
    digits, ``T`` or a space in the middle, years 1900-2199), or None if any is written
    otherwise or is no date."""
    offsets, codes = _string_buffers(array)
    lengths = np.diff(offsets)
    if not len(lengths):
        return np.zeros(0, dtype=np.int64)
    if lengths.min() == lengths.max():
        width = int(lengths[0])
        return _iso_ns_fixed(codes[offsets[0] : offsets[-1]].reshape(len(lengths), width))
    out = np.empty(len(lengths), dtype=np.int64)
    for width in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == width)
        text = np.empty((len(rows), width), dtype=np.uint8)
        for lo in range(0, len(rows), _GATHER):  # gathered in blocks: the index is 8 B a byte
            starts = offsets[rows[lo : lo + _GATHER]].astype(np.int64)
            text[lo : lo + _GATHER] = codes[starts[:, None] + np.arange(width)]
        part = _iso_ns_fixed(text)
        if part is None:
            return None
        out[rows] = part
    return out


def _iso_ns_fixed(text: np.ndarray) -> np.ndarray | None:
    """:func:`_iso_ns` of timestamps of one width, given as a (rows, width) array of bytes
    (worked through in blocks of rows, transposed so that each character is a row)."""
    rows, width = text.shape
    if width != 19 and not 21 <= width <= 29:
        return None
    out = np.empty(rows, dtype=np.int64)
    for lo in range(0, rows, _BLOCK):
        part = _iso_ns_block(np.ascontiguousarray(text[lo : lo + _BLOCK].T))
        if part is None:
            return None
        out[lo : lo + _BLOCK] = part
    return out


def _iso_ns_block(chars: np.ndarray) -> np.ndarray | None:
    """:func:`_iso_ns_fixed` of a (width, rows) array: ``chars[i]`` is character ``i`` of
    every timestamp."""
    width = chars.shape[0]
    for col, char in _SEPARATORS.items():
        if col < width and not np.all(chars[col] == char):
            return None
    if not np.all((chars[10] == ord(" ")) | (chars[10] == ord("T"))):
        return None
    digits = chars[[c for c in range(width) if c not in _SEPARATORS and c != 10]]
    if int(digits.min()) < ord("0") or int(digits.max()) > ord("9"):
        return None
    d = chars.astype(np.int64)
    d -= ord("0")
    year = d[0] * 1000 + d[1] * 100 + d[2] * 10 + d[3]
    month = d[5] * 10 + d[6]
    day = d[8] * 10 + d[9]
    hour = d[11] * 10 + d[12]
    minute = d[14] * 10 + d[15]
    second = d[17] * 10 + d[18]
    if not (
        np.all((year >= 1900) & (year <= 2199))
        and np.all((month >= 1) & (month <= 12))
        and np.all(hour <= 23)
        and np.all(minute <= 59)
        and np.all(second <= 59)
    ):
        return None
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    if not np.all((day >= 1) & (day <= _MONTH_DAYS[month] + ((month == 2) & leap))):
        return None
    # Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    y = year - (month <= 2)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    days = era * 146097 + day_of_era - 719468
    ns = (days * 86400 + hour * 3600 + minute * 60 + second) * 1_000_000_000
    if width > 20:
        fraction = d[20]
        for col in range(21, width):
            fraction = fraction * 10 + d[col]
        ns += fraction * 10 ** (29 - width)
    return ns
