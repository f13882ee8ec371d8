"""Writing tables and the summary to files: CSV and Parquet with pyarrow, JSON without NaN.

This module imports nothing from batchsim but :mod:`batchsim.metrics.logs`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.metrics.logs import Columns, Labels

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
"""Rows converted and written at once."""


def write_csv(tables: Iterable[Columns], names: list[str], path: Path) -> None:
    """Write ``names`` of consecutive column ``tables`` as one CSV, with pyarrow (~10x
    faster than pandas).

    Rows go out in record batches of views on the numpy columns, so a run of millions of
    iterations is written without a second copy of its table in memory.
    """
    import pyarrow.csv as pa_csv

    options = pa_csv.WriteOptions(quoting_style="needed")
    _write_batches(
        tables,
        names,
        path,
        lambda schema: pa_csv.CSVWriter(str(path), schema, write_options=options),
        empty_as_null=False,
    )


def write_parquet(tables: Iterable[Columns], names: list[str], path: Path) -> None:
    """Write ``names`` of consecutive column ``tables`` as one Parquet file, with pyarrow.

    The columns keep their numpy types (``int32`` counts, ``float32`` KV usage, ``int64`` and
    ``float64`` elsewhere) and text is a string column, an empty text a null. Like
    :func:`write_csv` it streams: one row group per batch of rows.
    """
    import pyarrow.parquet as pq

    _write_batches(
        tables,
        names,
        path,
        lambda schema: pq.ParquetWriter(str(path), schema, compression="zstd"),
        empty_as_null=True,
    )


def _write_batches(
    tables: Iterable[Columns],
    names: list[str],
    path: Path,
    open_writer: Callable[[Any], Any],
    empty_as_null: bool,
) -> None:
    import pyarrow as pa

    writer = None
    try:
        for columns in tables:
            num_rows = len(columns[names[0]])
            for lo in range(0, max(num_rows, 1), _BATCH_ROWS):
                hi = min(lo + _BATCH_ROWS, num_rows)
                if writer is not None and hi <= lo:
                    continue  # an empty table after the first: nothing to add
                arrays = [_arrow_column(_rows_of(columns[n], lo, hi), empty_as_null) for n in names]
                batch = pa.RecordBatch.from_arrays(arrays, names=names)
                if writer is None:
                    writer = open_writer(batch.schema)
                writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
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
