"""Writing tables and the summary to files: CSV and Parquet with pyarrow, JSON without NaN.

This module imports nothing from batchsim but :mod:`batchsim.metrics.columns`.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.metrics.columns import Columns, Labels

_ARROW_TYPES = {"f8": "float64", "f4": "float32", "i8": "int64", "i4": "int32"}


def _arrow_column(values: Any, empty_as_null: bool = False):
    """A pyarrow array over a numpy column, built from its buffers.

    (Building from buffers keeps pyarrow from importing pandas, which costs a CLI run a
    noticeable fraction of a second.) Text is written as strings; with ``empty_as_null`` an
    empty text is a null (Parquet's "no value"; CSV writes both as an empty field). A
    :class:`Labels` column stays a dictionary array for the CSV writer, which prints it as its
    strings (casting it would import ``pyarrow.compute``, ~30 ms of start-up); Parquet gets
    it decoded.
    """
    import pyarrow as pa

    if isinstance(values, Labels):
        codes = np.ascontiguousarray(values.codes, dtype=np.int32)
        labels = pa.DictionaryArray.from_arrays(
            _arrow_column(codes), _arrow_column(np.asarray(values.labels, dtype=object))
        )
        # Parquet: a plain string column, as the other text columns (readers see strings)
        return labels.dictionary_decode() if empty_as_null else labels
    array = np.asarray(values)
    kind = array.dtype.str[1:]
    if kind in _ARROW_TYPES:
        array = np.ascontiguousarray(array)
        arrow_type = getattr(pa, _ARROW_TYPES[kind])()
        return pa.Array.from_buffers(arrow_type, len(array), [None, pa.py_buffer(array)])
    encoded = [str(v).encode("utf-8") for v in array]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    data = b"".join(encoded)
    validity = None
    if empty_as_null:
        present = offsets[1:] != offsets[:-1]
        if not present.all():
            validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


_BATCH_ROWS = 1 << 18
"""Rows converted and written at once (Parquet: one row group)."""

_CSV_ROWS = 1 << 15
"""Rows of CSV formatted at once by one thread (~7 MB of text for an iteration table)."""


def _csv_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _csv_text(batch: Any, header: bool) -> Any:
    """A record batch as CSV text (a pyarrow buffer), with the header line or without."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    sink = pa.BufferOutputStream()
    options = pa_csv.WriteOptions(quoting_style="needed", include_header=header)
    pa_csv.write_csv(batch, sink, options)
    return sink.getvalue()


def write_csv(tables: Iterable[Columns], names: list[str], path: Path) -> None:
    """Write ``names`` of consecutive column ``tables`` as one CSV, with pyarrow (~10x
    faster than pandas).

    Rows go out in record batches of views on the numpy columns, so a run of millions of
    iterations is written without a second copy of its table in memory. Formatting numbers
    as text is most of the cost and pyarrow does it without the GIL: batches of
    :data:`_CSV_ROWS` rows are formatted by up to four threads (one per core) and written in
    order, a few at a time, so the file is the same as one writer's.
    """
    batches = _record_batches(tables, names, path, _CSV_ROWS, empty_as_null=False)
    batches = itertools.chain([next(batches)], batches)  # no table: no file
    threads = _csv_threads()
    with open(path, "wb") as out:
        if threads == 1:
            for i, batch in enumerate(batches):
                out.write(_csv_text(batch, i == 0))
            return
        with ThreadPoolExecutor(threads, thread_name_prefix="batchsim-csv") as pool:
            pending: deque[Any] = deque()
            try:
                for i, batch in enumerate(batches):
                    pending.append(pool.submit(_csv_text, batch, i == 0))
                    if len(pending) > threads:
                        out.write(pending.popleft().result())
                while pending:
                    out.write(pending.popleft().result())
            finally:
                for future in pending:
                    future.cancel()


class TableStream:
    """One table written while its rows are still being produced (the iterations of a
    ``batchsim run``): :meth:`add` turns a column table into record batches (views of the
    numpy columns, cheap) and a background thread formats and writes them in order, the way
    :func:`write_csv` or :func:`write_parquet` would write the same tables at once, while the
    caller goes on. :meth:`close` waits for the last writes and closes the file.

    At most a few tables wait to be written; :meth:`add` waits for the oldest beyond that.
    An ``OSError`` of the background writes is raised by the next :meth:`add` or by
    :meth:`close`; :meth:`abort` drops what waits and closes the file.

    Args:
        path: The file to create.
        names: The columns to write, in order.
        fmt: ``csv`` or ``parquet``.
    """

    _MAX_WAITING = 3

    def __init__(self, path: Path, names: list[str], fmt: str):
        if fmt not in ("csv", "parquet"):
            raise ValueError(f"unknown table format {fmt!r}")
        self.path = path
        self.names = names
        self.fmt = fmt
        self.rows = _CSV_ROWS * 2 if fmt == "csv" else _BATCH_ROWS
        """Rows worth handing to :meth:`add` at once."""
        self._count = 0
        self._out = open(path, "wb") if fmt == "csv" else None  # noqa: SIM115 (closed by close())
        self._parquet: Any = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batchsim-stream")
        self._waiting: deque[Any] = deque()

    def add(self, columns: Columns) -> None:
        """Write ``columns`` (a table of :attr:`names`) after the tables added before; an empty
        one only if it is the first (it carries the header or schema)."""
        waiting = self._waiting
        while waiting and waiting[0].done():
            waiting.popleft().result()  # raises what the write raised
        size = _CSV_ROWS if self.fmt == "csv" else _BATCH_ROWS
        empty_as_null = self.fmt == "parquet"
        for batch in _record_batches([columns], self.names, self.path, size, empty_as_null):
            if self._count and not batch.num_rows:
                continue
            while len(waiting) >= self._MAX_WAITING:
                waiting.popleft().result()
            waiting.append(self._pool.submit(self._write, batch, not self._count))
            self._count += 1

    def _write(self, batch: Any, first: bool) -> None:  # in the background thread
        if self._out is not None:
            self._out.write(_csv_text(batch, first))
            return
        if self._parquet is None:
            import pyarrow.parquet as pq

            self._parquet = pq.ParquetWriter(str(self.path), batch.schema, compression="zstd")
        self._parquet.write_batch(batch)

    def close(self) -> None:
        """Wait for the writes and close the file (raises what a write raised)."""
        try:
            while self._waiting:
                self._waiting.popleft().result()
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the tables not yet written, wait for the one being written, close the file."""
        for future in self._waiting:
            future.cancel()
        self._waiting.clear()
        self._pool.shutdown(wait=True)
        try:
            if self._parquet is not None:
                self._parquet.close()
        finally:
            self._parquet = None
            if self._out is not None:
                self._out.close()
                self._out = None


def write_parquet(tables: Iterable[Columns], names: list[str], path: Path) -> None:
    """Write ``names`` of consecutive column ``tables`` as one Parquet file, with pyarrow.

    The columns keep their numpy types (``int32`` counts, ``float32`` KV usage, ``int64`` and
    ``float64`` elsewhere) and text is a string column, an empty text a null. Like
    :func:`write_csv` it streams: one row group per batch of rows.
    """
    import pyarrow.parquet as pq

    writer = None
    try:
        for batch in _record_batches(tables, names, path, _BATCH_ROWS, empty_as_null=True):
            if writer is None:
                writer = pq.ParquetWriter(str(path), batch.schema, compression="zstd")
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()


def _record_batches(
    tables: Iterable[Columns], names: list[str], path: Path, size: int, empty_as_null: bool
) -> Iterator[Any]:
    """Record batches of at most ``size`` rows over ``names`` of the tables, in order: the
    first one even if empty (it carries the header or schema), no other empty one.

    Raises:
        ValueError: There is no table at all.
    """
    import pyarrow as pa

    count = 0
    for columns in tables:
        num_rows = len(columns[names[0]])
        for lo in range(0, max(num_rows, 1), size):
            hi = min(lo + size, num_rows)
            if count and hi <= lo:
                continue  # an empty table after the first: nothing to add
            arrays = [_arrow_column(_rows_of(columns[n], lo, hi), empty_as_null) for n in names]
            count += 1
            yield pa.RecordBatch.from_arrays(arrays, names=names)
    if not count:
        raise ValueError(f"{path.name}: no table to write")


def _rows_of(values: Any, lo: int, hi: int) -> Any:
    return values[lo:hi] if isinstance(values, Labels) else np.asarray(values)[lo:hi]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(value, np.integer):
        return int(value)
    return value
