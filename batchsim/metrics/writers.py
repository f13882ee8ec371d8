"""Writing tables and the summary to files: CSV with pyarrow, JSON without NaN.

This module imports nothing from batchsim but :mod:`batchsim.metrics.logs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.metrics.logs import Columns, Labels

_ARROW_TYPES = {"f8": "float64", "f4": "float32", "i8": "int64", "i4": "int32"}


def _arrow_column(values: Any):
    """A pyarrow array over a numpy column, built from its buffers.

    (Building from buffers keeps pyarrow from importing pandas, which costs a CLI run a
    noticeable fraction of a second.) A :class:`Labels` column stays a dictionary array, which
    the CSV writer prints as its strings: casting it here would import ``pyarrow.compute``
    (another ~30 ms of start-up).
    """
    import pyarrow as pa

    if isinstance(values, Labels):
        codes = np.ascontiguousarray(values.codes, dtype=np.int32)
        return pa.DictionaryArray.from_arrays(
            _arrow_column(codes), _arrow_column(np.asarray(values.labels, dtype=object))
        )
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
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


_CSV_BATCH_ROWS = 1 << 20


def write_csv(tables: Iterable[Columns], names: list[str], path: Path) -> None:
    """Write ``names`` of consecutive column ``tables`` as one CSV, with pyarrow (~10x
    faster than pandas).

    Rows go out in record batches of views on the numpy columns, so a run of millions of
    iterations is written without a second copy of its table in memory.
    """
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    options = pa_csv.WriteOptions(quoting_style="needed")
    writer = None
    try:
        for columns in tables:
            num_rows = len(columns[names[0]])
            for lo in range(0, max(num_rows, 1), _CSV_BATCH_ROWS):
                hi = min(lo + _CSV_BATCH_ROWS, num_rows)
                arrays = [_arrow_column(_rows_of(columns[n], lo, hi)) for n in names]
                batch = pa.RecordBatch.from_arrays(arrays, names=names)
                if writer is None:
                    writer = pa_csv.CSVWriter(str(path), batch.schema, write_options=options)
                if hi > lo or num_rows == 0:
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
