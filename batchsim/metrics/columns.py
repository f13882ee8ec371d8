"""The chunked columnar storage the run's records are built on: :class:`ChunkedColumns`,
append-only numpy columns in chunks, each full chunk's column packed in as few bytes as is
simple (one value, narrower integers, or codes into its distinct values) and read back bit
for bit; :class:`Labels`, a text column as codes; and :data:`Columns`, a table as columns.

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from batchsim.engine.kv_cache import UsageRamp, expand_usage_ramps

Columns = dict[str, Any]
"""A table as column name -> numpy array (or list of strings), all of one length."""

_CHUNK = 1 << 14
_PENDING = 4096
"""Rows and blocks buffered before they are moved into the numpy chunks."""
_BLOCK = object()
"""Marks an ``extend()`` block among buffered rows."""
_RAMP = object()
"""Marks an ``extend_ramp()`` block among buffered rows."""


class ChunkedColumns:
    """Append-only columns in preallocated numpy chunks (no per-row Python objects kept).

    Single rows are buffered as tuples and moved into the chunks column by column in bulk
    (a tuple append is ~40x cheaper than writing each field into numpy).

    Args:
        dtypes: Column name -> numpy dtype, in row order.
    """

    def __init__(self, dtypes: dict[str, str]):
        self.dtypes = dtypes
        self._index = {key: i for i, key in enumerate(dtypes)}
        self._chunks: list[list[Any]] = []  # full chunks packed (see _pack), the last open
        self._fill = _CHUNK
        self._stored = 0
        self._pending: list[tuple] = []  # rows, and (values, n) blocks from extend()
        self._pending_rows = 0
        self._ramps = 0  # usage ramps among the pending items

    @property
    def num_rows(self) -> int:
        return self._stored + self._pending_rows

    def _room(self) -> list[np.ndarray]:
        if self._fill == _CHUNK:
            self._chunks.append([np.empty(_CHUNK, dtype=t) for t in self.dtypes.values()])
            self._fill = 0
        return self._chunks[-1]

    def append(self, row: tuple) -> None:
        """One row, values in column order."""
        self._pending.append(row)
        self._pending_rows += 1
        if len(self._pending) >= _PENDING:
            self._flush()

    def extend(self, values: tuple, n: int) -> None:
        """``n`` rows; each value is an array of length n or a scalar shared by all rows."""
        self._pending.append((_BLOCK, values, n))
        self._pending_rows += n
        if len(self._pending) >= _PENDING or self._pending_rows >= _CHUNK:
            self._flush()

    def extend_ramp(self, ramp: UsageRamp, n: int) -> None:
        """``n`` rows of a one-column table: the steps of a KV-usage ramp, expanded in bulk with
        the ramps next to it when the rows are stored."""
        assert len(self.dtypes) == 1, "a usage ramp in a table of several columns"
        self._pending.append((_RAMP, ramp, n))
        self._pending_rows += n
        self._ramps += 1
        if len(self._pending) >= _PENDING or self._pending_rows >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        total, self._pending_rows = self._pending_rows, 0
        dtypes = list(self.dtypes.values())
        pieces: list[list[np.ndarray]] = [[] for _ in dtypes]
        rows: list[tuple] = []

        if self._ramps:
            self._ramps = 0
            self._store((_one_column(pending, total),), total)
            return

        def close_rows() -> None:
            if rows:
                for piece, values, dtype in zip(pieces, zip(*rows), dtypes):
                    piece.append(np.array(values, dtype=dtype))
                rows.clear()

        for item in pending:
            if item and item[0] is _BLOCK:
                close_rows()
                _, values, n = item
                for piece, value, dtype in zip(pieces, values, dtypes):
                    if isinstance(value, np.ndarray) and value.ndim:
                        piece.append(value[:n])
                    else:
                        piece.append(np.full(n, value, dtype=dtype))
            else:
                rows.append(item)
        close_rows()
        columns = tuple(p[0] if len(p) == 1 else np.concatenate(p) for p in pieces)
        self._store(columns, total)

    def _store(self, values: tuple, n: int) -> None:
        done = 0
        while done < n:
            chunk = self._room()
            take = min(n - done, _CHUNK - self._fill)
            lo, hi = self._fill, self._fill + take
            for column, value in zip(chunk, values):
                if isinstance(value, np.ndarray):
                    column[lo:hi] = value[done : done + take]
                else:
                    column[lo:hi] = value
            self._fill += take
            done += take
            if self._fill == _CHUNK:
                self._chunks[-1] = [_pack(column) for column in chunk]
        self._stored += n

    def last(self, key: str) -> Any:
        """The last row's value of one column (there is one)."""
        pending = self._pending
        index = self._index[key]
        if pending:
            item = pending[-1]
            if item and item[0] is _RAMP:
                return item[1].at(item[2] - 1)
            if item and item[0] is _BLOCK:
                value, n = item[1][index], item[2]
                return value[n - 1] if isinstance(value, np.ndarray) and value.ndim else value
            return item[index]
        return self.column(key, self.num_rows - 1)[0]

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored rows (buffered rows not counted)."""
        return sum(_nbytes(part) for chunk in self._chunks for part in chunk)

    def column(self, key: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``lo:hi`` of one column (all rows by default), as one array of the column's
        dtype (do not modify it: it may be a view of the stored rows)."""
        self._flush()
        index = self._index[key]
        dtype = np.dtype(self.dtypes[key])
        hi = self.num_rows if hi is None else min(hi, self.num_rows)
        if hi <= lo:
            return np.empty(0, dtype=dtype)
        first, last = lo // _CHUNK, (hi - 1) // _CHUNK
        if first == last:
            part = self._chunks[first][index]
            return _unpack(part, lo - first * _CHUNK, hi - first * _CHUNK, dtype)
        out = np.empty(hi - lo, dtype=dtype)
        at = 0
        for c in range(first, last + 1):
            a = lo - c * _CHUNK if c == first else 0
            b = hi - c * _CHUNK if c == last else _CHUNK
            out[at : at + b - a] = _unpack(self._chunks[c][index], a, b, dtype)
            at += b - a
        return out


def _one_column(pending: list[tuple], total: int) -> np.ndarray:
    """The ``total`` rows of a one-column table's buffered rows, blocks and usage ramps, in
    order, as one float64 array (the ramps expanded together, see
    :func:`~batchsim.engine.kv_cache.expand_usage_ramps`)."""
    out = np.empty(total, dtype=np.float64)
    row_at: list[int] = []
    row_values: list[float] = []
    ramps: list[UsageRamp] = []
    ramp_steps: list[int] = []
    ramp_at: list[int] = []
    at = 0
    for item in pending:
        head = item[0]
        if head is _RAMP:
            ramps.append(item[1])
            ramp_steps.append(item[2])
            ramp_at.append(at)
            at += item[2]
        elif head is _BLOCK:
            (value,), n = item[1], item[2]
            out[at : at + n] = value[:n] if isinstance(value, np.ndarray) and value.ndim else value
            at += n
        else:
            row_at.append(at)
            row_values.append(head)
            at += 1
    if row_at:
        out[row_at] = row_values
    if ramps:
        steps = np.asarray(ramp_steps, dtype=np.int64)
        where = np.repeat(np.asarray(ramp_at, dtype=np.int64) - (np.cumsum(steps) - steps), steps)
        where += np.arange(int(steps.sum()), dtype=np.int64)
        out[where] = expand_usage_ramps(ramps, ramp_steps)
    return out


class _Constant:
    """A full chunk's column whose rows all hold one value."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        self.value = value  # a 0-d array of the column's dtype


class _Dictionary:
    """A full chunk's column as small integer codes into its distinct values."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: np.ndarray):
        self.codes = codes
        self.values = values


_SAMPLE_ROWS = 512
"""Rows of a chunk looked at before a dictionary is tried (nearly all distinct there: the
column stays as it is)."""


def _pack(column: np.ndarray) -> Any:
    """A full chunk's column in as few bytes as is simple, read back bit for bit by
    :func:`_unpack`: one value, integers of a narrower type, or codes into at most 65,536
    distinct values (compared as bit patterns, so -0.0 and NaN payloads survive)."""
    bits = column.view(f"u{column.dtype.itemsize}")
    if (bits == bits[0]).all():
        return _Constant(column[:1].reshape(()).copy())
    narrow = column
    if column.dtype.kind == "i":
        low, high = int(column.min()), int(column.max())
        for dtype in (np.int8, np.int16, np.int32):
            info = np.iinfo(dtype)
            if info.min <= low and high <= info.max:
                if np.dtype(dtype).itemsize < column.dtype.itemsize:
                    narrow = column.astype(dtype)
                break
    if narrow.dtype.itemsize == 1 or _distinct(bits[:_SAMPLE_ROWS]) > _SAMPLE_ROWS * 7 // 8:
        return narrow  # (nearly) all distinct
    values, codes = np.unique(bits, return_inverse=True)
    code_type = np.uint8 if len(values) <= 256 else np.uint16
    if (
        len(values) > 65536
        or len(values) * column.dtype.itemsize + len(column) * np.dtype(code_type).itemsize
        >= narrow.nbytes
    ):
        return narrow
    return _Dictionary(codes.astype(code_type), values.view(column.dtype))


def _distinct(values: np.ndarray) -> int:
    """How many distinct values (``len(np.unique(values))``, which would import numpy.ma
    into every run, ~7 ms)."""
    if not len(values):
        return 0
    ordered = np.sort(values)
    return 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1]))


def _unpack(part: Any, lo: int, hi: int, dtype: np.dtype) -> np.ndarray:
    if isinstance(part, np.ndarray):
        return part[lo:hi] if part.dtype == dtype else part[lo:hi].astype(dtype)
    if isinstance(part, _Constant):
        return np.full(hi - lo, part.value, dtype=dtype)
    return part.values[part.codes[lo:hi]]


def _nbytes(part: Any) -> int:
    if isinstance(part, np.ndarray):
        return int(part.nbytes)
    if isinstance(part, _Constant):
        return int(part.value.nbytes)
    return int(part.codes.nbytes + part.values.nbytes)


class Labels:
    """A text column stored as small integer codes into ``labels`` (written without a
    Python string per row)."""

    def __init__(self, codes: np.ndarray, labels: tuple[str, ...]):
        self.codes = codes
        self.labels = labels

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index: slice) -> Labels:
        return Labels(self.codes[index], self.labels)

    def strings(self) -> np.ndarray:
        return np.asarray(self.labels, dtype=object)[self.codes]
