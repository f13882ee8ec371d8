"""The records of a run: the per-iteration log and the per-request table with each request's
token times.

- :class:`IterationLog`: columnar, chunked numpy buffers. A run of K iterations that differ
  only linearly (a decode stretch) is one row, not K.
- :class:`RequestLog`: one row per request that left, and for each finished request the
  iterations that sampled its tokens (runs of consecutive iterations), from which the
  inter-token gaps of the counted requests are computed exactly (:func:`inter_token_gaps`).

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from batchsim.engine.kv_cache import UsageRamp, expand_usage_ramps
from batchsim.engine.request import Request, RequestStatus

RUN_COLUMNS: dict[str, str] = {
    "start_time_s": "f8",
    "num_steps": "i4",
    "duration_s": "f8",
    "gpu_time_ms": "f8",
    "flops": "f8",
    "bytes": "f8",
    "weight_bytes": "f8",
    "kv_bytes": "f8",
    "bound_margin_s": "f8",
    "flops_step": "f8",
    "bytes_step": "f8",
    "kv_bytes_step": "f8",
    "bound_margin_step_s": "f8",
}
"""Columns of one run of iterations of equal duration, as of its first iteration.

``bound_margin_s`` is compute time minus memory time (> 0: compute-bound). Iteration k of a
run starts ``k x duration_s`` after the run and adds k times the ``*_step`` columns to
``flops``, ``bytes``, ``kv_bytes`` and the margin (a decode stretch reads more cached tokens
at every step).
"""

BATCH_COLUMNS: dict[str, str] = {
    "cpu_time_ms": "f8",
    "num_seqs": "i4",
    "num_slots": "i4",
    "num_prefill_seqs": "i4",
    "num_decode_seqs": "i4",
    "num_prefill_tokens": "i4",
    "num_decode_tokens": "i4",
    "num_padding_tokens": "i4",
    "num_output_tokens": "i4",
    "num_preempted": "i4",
    "num_swap_in_blocks": "i4",
    "num_swap_out_blocks": "i4",
    "swap_time_ms": "f8",
    "num_swapped_out": "i4",
    "num_cached_blocks": "i4",
    "num_evicted_blocks": "i4",
}
"""Columns that describe the batch, the same for every iteration of a run."""

ITERATION_COLUMNS = [
    "iteration",
    "start_time_s",
    "duration_ms",
    "cpu_time_ms",
    "gpu_time_ms",
    "num_seqs",
    "num_slots",
    "num_prefill_seqs",
    "num_decode_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_padding_tokens",
    "num_output_tokens",
    "flops",
    "bytes",
    "arithmetic_intensity",
    "weight_bytes",
    "kv_bytes",
    "bound",
    "kv_cache_usage",
    "num_preempted",
    "num_swap_in_blocks",
    "num_swap_out_blocks",
    "swap_time_ms",
    "num_swapped_out",
    "num_cached_blocks",
    "num_evicted_blocks",
]
"""Columns of ``iterations.csv``, in order (``bound`` is compute|memory)."""

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


_WINDOW_ROWS = 1 << 18
"""Most iterations expanded at once when the log is read in windows."""
_GAP_CHUNK = 1 << 18
"""Gaps between token runs counted at once (see :meth:`TokenRuns.inter_token_gaps`)."""
_PENDING_SEGMENTS = 1 << 16
"""Token-run bounds buffered as Python ints before they move into a numpy chunk."""


class IterationLog:
    """Append-only columnar log of iterations, stored as runs.

    A run is one iteration, or consecutive iterations of one batch that take the same time
    and whose FLOPs, bytes and bound margin grow by a fixed step (a decode stretch is one or
    a few runs): one row of :data:`RUN_COLUMNS` and :data:`BATCH_COLUMNS`, whatever its
    length. Only the KV-cache usage is kept per iteration. Reading expands the runs, in
    windows of at most about a million iterations, so that even runs of tens of millions of
    iterations are summarized and written in bounded memory.
    """

    def __init__(self, *, with_replica: bool = False) -> None:
        extra = {"replica": "i4"} if with_replica else {}
        self._runs = ChunkedColumns({**RUN_COLUMNS, **BATCH_COLUMNS, **extra})
        self._usage = ChunkedColumns({"kv_cache_usage": "f4"})
        self._sink: Callable[[Columns], None] | None = None
        self._stream_rows = 0
        self._streamed = (0, 0)  # (runs, iterations) handed to the sink
        self._stream_at = 0  # iterations logged when the sink gets the next ones

    @classmethod
    def concatenate(cls, logs: Sequence[IterationLog]) -> IterationLog:
        """The iterations of several engines (the replicas of a cluster) as one log: each
        log's in turn, numbered on from the previous one's, with a ``replica`` column (the
        log's position in ``logs``). A replica's iteration k is iteration ``k + offset`` of
        the result, its offset being the iterations of the logs before it."""
        out = cls(with_replica=True)
        for index, log in enumerate(logs):
            runs = log._runs
            if runs.num_rows:
                columns = tuple(runs.column(key) for key in runs.dtypes)
                out._runs.extend((*columns, index), runs.num_rows)
            if log.num_rows:
                out._usage.extend((log._usage.column("kv_cache_usage"),), log.num_rows)
        return out

    @property
    def has_replica(self) -> bool:
        """The log holds a cluster's iterations (a ``replica`` column)."""
        return "replica" in self._runs.dtypes

    @property
    def num_rows(self) -> int:
        """Iterations logged."""
        return self._usage.num_rows

    def append(self, run: tuple, kv_cache_usage: float) -> None:
        """One iteration: ``run`` in :data:`RUN_COLUMNS` + :data:`BATCH_COLUMNS` order with
        ``num_steps`` 1."""
        self._runs.append(run)
        self._usage.append((kv_cache_usage,))
        if self._sink is not None and self.num_rows >= self._stream_at:
            self._stream()

    def add_runs(
        self,
        runs: list[tuple],
        kv_cache_usage: np.ndarray | float | UsageRamp,
        num_steps: int | None = None,
    ) -> None:
        """Consecutive runs, in order, and the usage of each of their iterations
        (``num_steps``: their iterations, if the caller knows)."""
        for run in runs:
            self._runs.append(run)
        if num_steps is None:
            num_steps = sum(r[1] for r in runs)
        if isinstance(kv_cache_usage, UsageRamp):
            self._usage.extend_ramp(kv_cache_usage, num_steps)
        else:
            self._usage.extend((kv_cache_usage,), num_steps)
        if self._sink is not None and self.num_rows >= self._stream_at:
            self._stream()

    def last_gpu_time(self) -> float:
        """GPU time of the last iteration logged, s (there is one)."""
        return float(self._runs.last("gpu_time_ms")) / 1e3

    def batch_column(self, key: str) -> np.ndarray:
        """One value of a :data:`BATCH_COLUMNS` column per run (the same for each iteration
        of the run): enough for its minimum and maximum without expanding the runs."""
        assert key in BATCH_COLUMNS, f"{key} is not a batch column"
        return self._runs.column(key)

    def extend(self, values: tuple, n: int, kv_cache_usage: np.ndarray | float) -> None:
        """``n`` single iterations; each value (column order as in :meth:`append`) is an
        array of length n or a scalar shared by all of them."""
        self._runs.extend(values, n)
        self._usage.extend((kv_cache_usage,), n)
        if self._sink is not None and self.num_rows >= self._stream_at:
            self._stream()

    def stream_to(self, sink: Callable[[Columns], None], rows: int) -> None:
        """Hand the iterations to ``sink`` while they are logged, about ``rows`` at a time, as
        the tables :meth:`windows` yields (the same rows and values, cut elsewhere);
        :meth:`end_stream` hands on the rest. The log keeps every iteration as before."""
        assert self._sink is None, "the log is streamed already"
        self._sink = sink
        self._stream_rows = rows
        self._stream_at = self.num_rows + rows

    def _stream(self) -> None:
        sink = self._sink
        assert sink is not None
        for window in self._windows(self._stream_rows, start=self._streamed):
            sink(window.table())
        self._streamed = (self._runs.num_rows, self.num_rows)
        self._stream_at = self.num_rows + self._stream_rows

    def end_stream(self) -> None:
        """Hand the iterations not yet streamed to the sink (one empty table if the log has
        none at all) and stop streaming."""
        sink = self._sink
        if sink is None:
            return
        if self.num_rows:
            if self.num_rows > self._streamed[1]:
                self._stream()
        else:
            sink(_Window.empty(self).table())
        self._sink = None

    def windows(
        self, max_rows: int = _WINDOW_ROWS, rows: np.ndarray | None = None
    ) -> Iterator[Columns]:
        """The iterations, in order, as column tables of at most about ``max_rows`` rows
        (``iterations.csv`` columns with ``bound`` as :class:`Labels`, plus
        ``compute_bound`` and ``end_time_s``).

        Args:
            max_rows: Iterations expanded at once.
            rows: Only these iterations (increasing indices, e.g. :func:`sample_rows`); their
                ``iteration`` column keeps their numbers in the whole run.
        """
        found = False
        for window in self._windows(max_rows, rows):
            found = True
            yield window.table()
        if not found:  # one empty table, so that readers still see the columns
            yield _Window.empty(self).table()

    def _windows(
        self,
        max_rows: int = _WINDOW_ROWS,
        rows: np.ndarray | None = None,
        start: tuple[int, int] = (0, 0),
    ) -> Iterator[_Window]:
        """Windows of whole runs (``start``: from this run, the first of this iteration)."""
        runs = self._runs
        num_runs = runs.num_rows
        if rows is not None:
            yield from self._sampled_windows(max_rows, rows)
            return
        lo, row = start
        while lo < num_runs:
            steps = runs.column("num_steps", lo, min(num_runs, lo + max_rows)).astype(np.int64)
            ends = np.cumsum(steps)
            hi = lo + max(1, int(np.searchsorted(ends, max_rows, side="right")))
            total = int(ends[hi - lo - 1])
            steps = steps[: hi - lo]
            run_of = np.repeat(np.arange(hi - lo), steps)
            k = np.arange(total, dtype=np.int64)
            k -= np.repeat(np.cumsum(steps) - steps, steps)
            usage = self._usage.column("kv_cache_usage", row, row + total)
            yield _Window(
                self, lo, hi, run_of, k, np.arange(row, row + total), usage, whole_runs=True
            )
            row += total
            lo = hi

    def _sampled_windows(self, max_rows: int, rows: np.ndarray) -> Iterator[_Window]:
        runs = self._runs
        steps = runs.column("num_steps").astype(np.int64)
        firsts = np.cumsum(steps) - steps
        del steps
        rows = np.asarray(rows, dtype=np.int64)
        for at in range(0, self.num_rows, max_rows):
            i0, i1 = np.searchsorted(rows, (at, at + max_rows))
            if i0 == i1:
                continue
            picked = rows[i0:i1]
            run = np.searchsorted(firsts, picked, side="right") - 1
            lo, hi = int(run[0]), int(run[-1]) + 1
            k = picked - firsts[run]
            first, last = int(picked[0]), int(picked[-1])
            usage = self._usage.column("kv_cache_usage", first, last + 1)[picked - first]
            yield _Window(self, lo, hi, run - lo, k, picked, usage)

    def to_columns(self) -> Columns:
        """The whole log as ``iterations.csv`` columns (``bound`` as strings), plus
        ``compute_bound`` (bool) and ``end_time_s``."""
        parts = list(self.windows())
        data: Columns = {}
        for key in parts[0]:
            if key == "bound":
                continue
            data[key] = np.concatenate([p[key] for p in parts])
        data["bound"] = np.where(data["compute_bound"], "compute", "memory").astype(object)
        return data

    def run_table(self) -> RunTable:
        """Where each run starts (iteration index and time) and its length and duration."""
        runs = self._runs
        steps = runs.column("num_steps")  # int32: a run's length (first is int64)
        first = np.cumsum(steps, dtype=np.int64) - steps
        return RunTable(first, steps, runs.column("start_time_s"), runs.column("duration_s"))

    def totals(
        self, lo: float = -math.inf, hi: float = math.inf, *, kv_usage: bool = False
    ) -> dict[str, float]:
        """Sums over the iterations that start in [lo, hi), for the summary.

        Keys: ``num_counted`` (iterations inside), the sums of :data:`_SUMMED` and
        ``num_compute_bound`` over them, ``max_kv_cache_usage`` (0 if none), ``busy_s``:
        the time inside [lo, hi] covered by any iteration (an iteration that straddles a
        bound counts its part inside), and with ``kv_usage`` ``kv_usage_s``: KV usage times
        that time, summed (0 without).
        """
        keys = (
            "num_counted",
            *_SUMMED,
            "num_compute_bound",
            "max_kv_cache_usage",
            "busy_s",
            "kv_usage_s",
        )
        out = dict.fromkeys(keys, 0.0)
        for window in self._windows():
            start, end = window.get("start_time_s"), window.get("end_time_s")
            # bounds are event times (an arrival, a finish) that an iteration may start at:
            # within TIME_EPS of one, a start is taken to be at it, whatever the float rounding
            # of the path that computed it (runs expanded or stepped one by one)
            inside = (start >= lo - TIME_EPS) & (start < hi - TIME_EPS)
            out["num_counted"] += float(np.count_nonzero(inside))
            for key in _SUMMED:  # one expanded column at a time
                out[key] += float(window.get(key)[inside].sum(dtype=float))
            out["num_compute_bound"] += float(np.count_nonzero(window.get("compute_bound")[inside]))
            usage = window.usage[inside]
            if usage.size:
                out["max_kv_cache_usage"] = max(out["max_kv_cache_usage"], float(usage.max()))
            covered = np.minimum(end, hi) - np.maximum(start, lo)
            out["busy_s"] += float(covered[covered > 0].sum())
            if kv_usage:
                np.maximum(covered, 0.0, out=covered)
                out["kv_usage_s"] += float(np.dot(covered, window.usage))
        return out


TIME_EPS = 1e-9
"""Seconds within which an iteration's start is taken to be at a window bound (far below any
iteration's duration, far above the rounding of simulated times)."""


class _Window:
    """Some iterations of an :class:`IterationLog`: iteration ``iterations[i]`` is step
    ``k[i]`` of run ``lo + run_of[i]``. Columns are expanded on demand (:meth:`get`), with the
    same expressions whatever the window, so every window reads the same values."""

    def __init__(
        self,
        log: IterationLog,
        lo: int,
        hi: int,
        run_of: np.ndarray,
        k: np.ndarray,
        iterations: np.ndarray,
        usage: np.ndarray,
        whole_runs: bool = False,
    ):
        self.runs = log._runs
        self.whole_runs = whole_runs
        """Every iteration of runs ``lo:hi``, in order (else some of them: a sample)."""
        self.lo, self.hi = lo, hi
        self.run_of = run_of
        self.k = k
        self.step = k.astype(float)
        self.iterations = iterations
        self.usage = usage
        self._duration: np.ndarray | None = None
        self._start: np.ndarray | None = None

    @classmethod
    def empty(cls, log: IterationLog) -> _Window:
        none = np.empty(0, dtype=np.int64)
        return cls(log, 0, 0, none, none, none, np.empty(0, dtype=np.float32))

    def expand(self, key: str) -> np.ndarray:
        return self.runs.column(key, self.lo, self.hi)[self.run_of]

    def linear(self, key: str, step_key: str) -> np.ndarray:
        return self.expand(key) + self.expand(step_key) * self.step

    def duration(self) -> np.ndarray:
        if self._duration is None:
            self._duration = self.expand("duration_s")
        return self._duration

    def start(self) -> np.ndarray:
        if self._start is None:
            if self.whole_runs:
                lo, hi, runs = self.lo, self.hi, self.runs
                self._start = run_starts(
                    runs.column("start_time_s", lo, hi),
                    runs.column("duration_s", lo, hi),
                    runs.column("num_steps", lo, hi),
                )
            else:
                self._start = advanced(self.expand("start_time_s"), self.duration(), self.k)
        return self._start

    def get(self, key: str) -> np.ndarray:
        """One column (``iterations.csv``'s, ``compute_bound`` or ``end_time_s``)."""
        if key == "iteration":
            return self.iterations
        if key == "start_time_s":
            return self.start()
        if key == "end_time_s":
            return self.start() + self.duration()
        if key == "duration_ms":
            return self.duration() * 1e3
        if key in ("flops", "bytes", "kv_bytes"):
            return self.linear(key, f"{key}_step")
        if key == "arithmetic_intensity":
            with np.errstate(divide="ignore", invalid="ignore"):
                return self.get("flops") / self.get("bytes")
        if key == "compute_bound":
            return self.linear("bound_margin_s", "bound_margin_step_s") > 0
        if key == "kv_cache_usage":
            return self.usage
        return self.expand(key)  # gpu_time_ms, weight_bytes and the batch columns

    def table(self) -> Columns:
        data: Columns = {"iteration": self.iterations}
        data["start_time_s"] = self.start()
        data["end_time_s"] = self.get("end_time_s")
        data["duration_ms"] = self.get("duration_ms")
        data["cpu_time_ms"] = self.get("cpu_time_ms")
        data["gpu_time_ms"] = self.get("gpu_time_ms")
        for key in BATCH_COLUMNS:
            if key != "cpu_time_ms":
                data[key] = self.get(key)
        flops, nbytes = self.get("flops"), self.get("bytes")
        data["flops"] = flops
        data["bytes"] = nbytes
        with np.errstate(divide="ignore", invalid="ignore"):
            data["arithmetic_intensity"] = flops / nbytes
        data["weight_bytes"] = self.get("weight_bytes")
        data["kv_bytes"] = self.get("kv_bytes")
        data["compute_bound"] = self.get("compute_bound")
        data["bound"] = Labels(data["compute_bound"].astype(np.int8), ("memory", "compute"))
        data["kv_cache_usage"] = self.usage
        if "replica" in self.runs.dtypes:
            data["replica"] = self.expand("replica")
        return data


def sample_rows(num_rows: int, n: int) -> np.ndarray:
    """``n`` of ``num_rows`` row indices evenly spaced, the first and the last included (all
    rows if ``n >= num_rows``): row ``k * (num_rows - 1) // (n - 1)`` for k = 0 .. n-1."""
    if n >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    if n <= 1:
        return np.zeros(min(n, num_rows), dtype=np.int64)
    assert (num_rows - 1) * (n - 1) < 2**63, "a sample too large for 64-bit indices"
    return np.arange(n, dtype=np.int64) * (num_rows - 1) // (n - 1)


_SUMMED = (
    "num_seqs",
    "num_slots",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_padding_tokens",
    "num_preempted",
    "num_swapped_out",
    "cpu_time_ms",
    "duration_ms",
)


REQUEST_COLUMNS = [
    "request_id",
    "arrival_time_s",
    "first_scheduled_time_s",
    "first_token_time_s",
    "finish_time_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "queue_delay_ms",
    "num_preemptions",
    "num_swaps",
    "status",
    "reject_reason",
    "num_cached_tokens",
]


Columns = dict[str, Any]
"""A table as column name -> numpy array (or list of strings), all of one length."""


class RequestLog:
    """Final records of the requests that left the engine (finished, rejected or cancelled).

    A request is recorded as one row when it leaves, so a run of millions of requests keeps
    only those in flight as Python objects. A finished request also leaves the iterations
    that sampled its tokens, as runs of consecutive iteration indices (its
    ``token_segments``); inter-token gaps are computed from them and the iterations' end
    times (:meth:`inter_token_gaps`), for the requests the summary counts.
    """

    _STATUS_NAMES = np.array([s.name.lower() for s in RequestStatus], dtype=object)

    def __init__(self, *, with_replica: bool = False) -> None:
        extra = {"replica": "i4"} if with_replica else {}
        self._rows = ChunkedColumns(
            {
                **extra,
                "request_id": "i8",
                "arrival_time_s": "f8",
                "first_scheduled_time_s": "f8",
                "first_token_time_s": "f8",
                "finish_time_s": "f8",
                "prompt_tokens": "i8",
                "output_tokens": "i8",
                "max_tokens": "i8",
                "num_preemptions": "i4",
                "num_swaps": "i4",
                "status": "i1",
                "num_segments": "i4",
                "num_cached_tokens": "i8",
            }
        )
        # token runs' first and last iterations: arrays grown by doubling (one block of
        # memory each, sorted in place by a summary they are handed to; None after that)
        self._firsts: np.ndarray | None = np.empty(0, dtype=np.int32)
        self._lasts: np.ndarray | None = np.empty(0, dtype=np.int32)
        self._num_segments = 0
        self._pending_segments: list[int] = []  # flat (first, last) pairs
        self._reasons: dict[int, str] = {}

    @property
    def num_rows(self) -> int:
        return self._rows.num_rows

    @classmethod
    def concatenate(
        cls,
        logs: Sequence[RequestLog],
        iteration_offsets: Sequence[int],
        *,
        replicas: Sequence[int] | None = None,
        first_runs: np.ndarray | None = None,
    ) -> RequestLog:
        """The requests of several engines (the replicas of a cluster) as one log, with a
        ``replica`` column (the log's position in ``logs``, or ``replicas[i]``); each log's
        token runs move by its offset in the concatenated iteration log
        (:meth:`IterationLog.concatenate`).

        ``first_runs[request_id]``, when given, is the iteration of the concatenated log that
        sampled a request's first token on another engine (a prefill instance of a
        disaggregated cluster; -1: none): a finished request's token runs then start with it,
        a run of one, so that its first inter-token gap spans the two engines.
        """
        out = cls(with_replica=True)
        firsts, lasts = [], []
        for index, (log, offset) in enumerate(zip(logs, iteration_offsets, strict=True)):
            replica = index if replicas is None else replicas[index]
            rows = log._rows
            log._flush_segments()
            assert log._firsts is not None and log._lasts is not None, "token runs handed over"
            n = log._num_segments
            first = log._firsts[:n].astype(np.int64) + offset
            last = log._lasts[:n].astype(np.int64) + offset
            if rows.num_rows:
                columns = [rows.column(key) for key in rows.dtypes]
                if first_runs is not None:
                    at = list(rows.dtypes).index("num_segments")
                    first, last, columns[at] = _with_first_runs(
                        first_runs,
                        rows.column("request_id"),
                        rows.column("status"),
                        columns[at],
                        first,
                        last,
                    )
                out._rows.extend((replica, *columns), rows.num_rows)
            firsts.append(first)
            lasts.append(last)
            out._reasons.update(log._reasons)
        first = np.concatenate(firsts) if firsts else np.empty(0, np.int64)
        last = np.concatenate(lasts) if lasts else np.empty(0, np.int64)
        top = int(last.max()) if len(last) else 0
        assert top < 2**32, "runs of more than 2^32 iterations are not supported"
        dtype = np.int32 if top < 2**31 else np.int64
        out._firsts, out._lasts = first.astype(dtype), last.astype(dtype)
        out._num_segments = len(first)
        return out

    def add(self, r: Request) -> None:
        """Record ``r``, which has reached a final status."""
        segments = r.closed_segments() if r.status == RequestStatus.FINISHED else []
        num_segments = len(segments) // 2
        self._rows.append(
            (
                r.request_id,
                r.arrival_time,
                r.first_scheduled_time,
                r.first_token_time,
                r.finish_time,
                r.num_prompt_tokens,
                r.num_output_tokens,
                r.max_tokens,
                r.num_preemptions,
                r.num_swaps,
                int(r.status),
                num_segments,
                r.num_cached_tokens,
            )
        )
        if num_segments:
            pending = self._pending_segments
            pending += segments
            if len(pending) >= _PENDING_SEGMENTS:
                self._flush_segments()
        if r.reject_reason:
            self._reasons[r.request_id] = r.reject_reason

    def _flush_segments(self) -> None:
        pending = self._pending_segments
        if pending:
            # iteration indices: 32 bits unless a run passes 2^31 iterations (token-run gaps
            # pack two of them in 64 bits)
            top = max(pending)
            assert top < 2**32, "runs of more than 2^32 iterations are not supported"
            firsts, lasts = self._firsts, self._lasts
            assert firsts is not None and lasts is not None, "token runs handed over"
            dtype = np.int32 if top < 2**31 and firsts.dtype == np.int32 else np.int64
            pairs = np.array(pending, dtype=dtype)
            n, count = self._num_segments, len(pairs) // 2
            if n + count > len(firsts) or dtype != firsts.dtype:
                size = max(n + count, 2 * len(firsts), _PENDING_SEGMENTS)
                self._firsts, self._lasts = (
                    _grown(firsts, n, size, dtype),
                    _grown(lasts, n, size, dtype),
                )
            assert self._firsts is not None and self._lasts is not None
            self._firsts[n : n + count] = pairs[0::2]
            self._lasts[n : n + count] = pairs[1::2]
            self._num_segments = n + count
            self._pending_segments = []

    def _order(self) -> np.ndarray:
        return np.argsort(self._rows.column("request_id"), kind="stable")

    def to_columns(self) -> Columns:
        """One row per request in ``request_id`` order (times in s, latencies in ms, NaN
        where not applicable): ``requests.csv``."""
        rows = self._rows
        order = self._order()

        def col(key: str) -> np.ndarray:
            return rows.column(key)[order]

        ids = col("request_id")
        arrival, scheduled = col("arrival_time_s"), col("first_scheduled_time_s")
        first, finish = col("first_token_time_s"), col("finish_time_s")
        outputs = col("output_tokens")
        status = self._STATUS_NAMES[col("status")]
        done = status == "finished"
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(done & (outputs > 1), (finish - first) / (outputs - 1), np.nan)
        e2el = np.where(done, finish - arrival, np.nan)
        reasons = np.full(len(ids), "", dtype=object)
        if self._reasons:
            reasons[:] = [self._reasons.get(int(i), "") for i in ids]
        out: Columns = {
            "request_id": ids,
            "arrival_time_s": arrival,
            "first_scheduled_time_s": scheduled,
            "first_token_time_s": first,
            "finish_time_s": finish,
            "prompt_tokens": col("prompt_tokens"),
            "output_tokens": outputs,
            "max_tokens": col("max_tokens"),
            "ttft_ms": (first - arrival) * 1e3,
            "tpot_ms": tpot * 1e3,
            "e2el_ms": e2el * 1e3,
            "queue_delay_ms": (scheduled - arrival) * 1e3,
            "num_preemptions": col("num_preemptions").astype(np.int64),
            "num_swaps": col("num_swaps").astype(np.int64),
            "status": status,
            "reject_reason": reasons,
            "num_cached_tokens": col("num_cached_tokens"),
        }
        if "replica" in rows.dtypes:
            out["replica"] = col("replica").astype(np.int64)
        return out

    def token_runs(self, counted: np.ndarray, *, hand_over: bool = False) -> TokenRuns:
        """The token runs of the requests selected by ``counted`` (a boolean mask over
        :meth:`to_columns`'s rows).

        With ``hand_over`` the log gives its token runs away instead of copying them (they
        are sorted in place; the log cannot give them again): a run of a million requests
        then holds them once, not twice.
        """
        if self._firsts is None or self._lasts is None:
            raise RuntimeError("the token runs were handed over already")
        self._flush_segments()
        num_segments = self._rows.column("num_segments").astype(np.int64)
        selected = np.zeros(len(num_segments), dtype=bool)
        selected[self._order()[counted]] = True
        keep = None
        if not selected.all():
            keep = np.repeat(selected, num_segments)
            num_segments = num_segments[selected]
        n = self._num_segments
        first, last = self._firsts[:n], self._lasts[:n]
        if hand_over:  # the log's own arrays, sorted in place later (or their kept rows)
            self._firsts = self._lasts = None
            if keep is not None:
                first, last = first[keep], last[keep]
        elif keep is None:
            first, last = first.copy(), last.copy()
        else:
            first, last = first[keep], last[keep]
        del keep
        # runs per selected request, in storage order: the first of each is its request's
        is_first = np.zeros(len(first), dtype=bool)
        is_first[(np.cumsum(num_segments) - num_segments)[num_segments > 0]] = True
        return TokenRuns(first, last, is_first, sort_in_place=True)


def _with_first_runs(
    first_runs: np.ndarray,
    ids: np.ndarray,
    status: np.ndarray,
    num_segments: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A log's token runs with each finished request's run on another engine put first (see
    :meth:`RequestLog.concatenate`): (firsts, lasts, runs per request)."""
    elsewhere = first_runs[ids]
    moved = (elsewhere >= 0) & (status == int(RequestStatus.FINISHED))
    if not moved.any():
        return first, last, num_segments
    counts = num_segments.astype(np.int64)
    starts = np.cumsum(counts) - counts  # each request's first run among the log's
    runs = elsewhere[moved].astype(np.int64)
    first = np.insert(first, starts[moved], runs)
    last = np.insert(last, starts[moved], runs)
    return first, last, (counts + moved).astype(num_segments.dtype)


def _grown(values: np.ndarray, n: int, size: int, dtype: type) -> np.ndarray:
    """A new array of ``size`` slots holding the first ``n`` of ``values``."""
    out: np.ndarray = np.empty(size, dtype=dtype)
    out[:n] = values[:n]
    return out


def advanced(start: np.ndarray, duration: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``start[i]`` with ``duration[i]`` added ``k[i]`` times, one addition after another:
    when iteration k of a run of back-to-back iterations of ``duration`` from ``start``
    starts, as the engine's clock reaches it stepping one iteration at a time (see
    :func:`~batchsim.engine.stretch.run_until`; ``start + duration x k`` may differ from it in
    the last bits). Costs the sum of ``k`` additions, in numpy, one pass per step."""
    out = np.array(start, dtype=np.float64)
    top = int(k.max()) if len(k) else 0
    if top <= 0:
        return out
    order = np.argsort(k, kind="stable")
    # elements of k >= j are order[first[j]:], for j = 1..top
    first = np.searchsorted(k[order], np.arange(1, top + 1), side="left")
    for at in first:
        idx = order[at:]
        out[idx] += duration[idx]
    return out


def run_starts(start: np.ndarray, duration: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The start of every iteration of some runs, run after run: :func:`advanced` of each
    run's start by 0, 1, ... ``steps - 1`` of its duration, each iteration's start computed
    from the previous one's (one addition per iteration)."""
    steps = np.asarray(steps, dtype=np.int64)
    out = np.repeat(np.asarray(start, dtype=np.float64), steps)
    top = int(steps.max()) if len(steps) else 0
    if top <= 1:
        return out
    first = np.cumsum(steps) - steps  # where each run's iterations begin in ``out``
    order = np.argsort(-steps, kind="stable")  # the longest runs first
    # runs with more than j iterations: order[:longer[j - 1]], for j = 1..top-1
    longer = np.searchsorted(-steps[order], -np.arange(1, top), side="left")
    for j, count in enumerate(longer, start=1):
        active = order[:count]
        at = first[active] + j
        out[at] = out[at - 1] + duration[active]
    return out


class RunTable:
    """The runs of an :class:`IterationLog` as arrays: iteration k of run r starts at
    ``start[r]`` with ``duration[r]`` added k times (:func:`advanced`) and ends
    ``duration[r]`` later (the expressions of the expanded table, so times computed here
    equal its ``end_time_s`` exactly)."""

    def __init__(
        self, first: np.ndarray, steps: np.ndarray, start: np.ndarray, duration: np.ndarray
    ):
        self.first = first
        self.steps = steps
        self.start = start
        self.duration = duration

    def end_times(self, iterations: np.ndarray) -> np.ndarray:
        """When the given iterations (indices) ended."""
        run = np.searchsorted(self.first, iterations, side="right") - 1
        duration = self.duration[run]
        return advanced(self.start[run], duration, iterations - self.first[run]) + duration

    def end_time_chunks(
        self, max_rows: int = _WINDOW_ROWS
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(iteration indices, end times) of every iteration, in chunks of about
        ``max_rows``."""
        ends = np.cumsum(self.steps)
        lo = 0
        while lo < len(self.steps):
            hi = lo + max(1, int(np.searchsorted(ends[lo:], ends[lo] - self.steps[lo] + max_rows)))
            steps = self.steps[lo:hi]
            run = np.repeat(np.arange(lo, hi), steps)
            iterations = np.arange(self.first[lo], self.first[lo] + int(steps.sum()))
            starts = run_starts(self.start[lo:hi], self.duration[lo:hi], steps)
            yield iterations, starts + self.duration[run]
            lo = hi


class TokenRuns:
    """Token runs of some requests: a request's tokens came at the ends of the iterations
    ``first[k]..last[k]`` of each of its runs (consecutive iterations); ``is_first[k]`` marks
    a request's first run (its runs are stored together, in order).

    The gaps between a request's runs are counted at once; then only the sorted first and
    last iterations are kept (sorted copies, or with ``sort_in_place`` the arrays given,
    sorted).
    """

    def __init__(
        self,
        first: np.ndarray,
        last: np.ndarray,
        is_first: np.ndarray,
        *,
        sort_in_place: bool = False,
    ):
        self._gaps = _gap_pairs(first, last, is_first)
        if sort_in_place:
            first.sort()
            last.sort()
            self._firsts, self._lasts = first, last
        else:
            self._firsts, self._lasts = np.sort(first), np.sort(last)

    def tokens_between(self, lo: int, hi: int) -> np.ndarray:
        """How many tokens the runs sampled at each iteration of ``lo .. hi - 1``."""
        firsts, lasts = self._firsts, self._lasts
        bounds = np.array((lo, hi), dtype=firsts.dtype)  # same dtype: no converted copy
        f0, f1 = np.searchsorted(firsts, bounds, side="left")
        l0, l1 = np.searchsorted(lasts, bounds, side="left")
        began = f0 + np.cumsum(np.bincount(firsts[f0:f1] - lo, minlength=hi - lo))  # first <= i
        ended = np.cumsum(np.bincount(lasts[l0:l1] - lo, minlength=hi - lo))  # last <= i
        ended = l0 + np.concatenate(([0], ended[:-1]))  # last < i
        return began - ended

    def inter_token_gaps(self, runs: RunTable) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap, as (gap values, weights) in seconds.

        Each token after a request's first contributes the time since its previous token. A
        run that is not its request's first starts with ``end[first] - end[previous
        last]``; inside a run the gap at iteration i is ``end[i] - end[i - 1]``, which inside
        a run of the iteration log (back-to-back iterations of one duration) is that
        duration. So gaps are pooled per log run with a count, and the sample grows with
        runs and token runs, not with iterations.
        """
        # A gap between token runs depends only on the two iterations it spans, which many
        # requests share (those a prefill iteration stalled): count each pair once.
        pairs, counts = self._gaps
        boundary = runs.end_times(pairs >> 32) - runs.end_times(pairs & 0xFFFFFFFF)
        del pairs
        firsts, lasts = self._firsts, self._lasts
        first_sums, last_sums = _PrefixSums(firsts), _PrefixSums(lasts)

        def covered(x: np.ndarray) -> np.ndarray:
            """Pairs (token run, iteration i) with first < i <= min(x, last): the gaps
            inside token runs that end at iteration x or earlier (``x`` non-decreasing)."""
            q = x.astype(firsts.dtype)  # a query of another dtype would copy the arrays
            nf = np.searchsorted(firsts, q, side="left")  # token runs with first < x
            nl = np.searchsorted(lasts, q, side="left")  # ... and those with last < x
            return (nf * x - first_sums(nf)) - (nl * x - last_sums(nl))

        head_values, head_weights, body_values, body_weights = [], [], [], []
        for lo in range(0, len(runs.first), _GAP_CHUNK):  # log runs a chunk at a time
            a, n = runs.first[lo : lo + _GAP_CHUNK], runs.steps[lo : lo + _GAP_CHUNK]
            before = covered(a - 1)
            at_first = covered(a)
            inside = covered(a + n - 1) - at_first  # gaps at a log run's later iterations
            at_first -= before  # ... and at its first iteration
            del before
            head = np.flatnonzero(at_first)
            head_values.append(runs.end_times(a[head]) - runs.end_times(a[head] - 1))
            head_weights.append(at_first[head])
            body = np.flatnonzero(inside)
            body_values.append(runs.duration[lo + body])
            body_weights.append(inside[body])
        values = np.concatenate((boundary, *head_values, *body_values))
        del boundary, head_values, body_values
        weights = np.concatenate((counts, *head_weights, *body_weights))
        return values, weights


def _gap_pairs(
    first: np.ndarray, last: np.ndarray, is_first: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (iteration, previous token's iteration) pairs of the gaps between a
    request's token runs, packed as ``iteration << 32 | previous``, and their counts
    (counted in chunks, so that memory stays bounded)."""
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    for lo in range(1, len(is_first), _GAP_CHUNK):
        rows = np.flatnonzero(~is_first[lo : lo + _GAP_CHUNK]) + lo
        pairs = first[rows].astype(np.int64) << 32
        pairs |= last[rows - 1]
        unique, count = np.unique(pairs, return_counts=True)
        keys.append(unique)
        counts.append(count)
    if len(keys) <= 1:
        return (keys[0], counts[0]) if keys else (np.empty(0, np.int64),) * 2
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return unique, np.bincount(inverse, np.concatenate(counts)).astype(np.int64)


class _PrefixSums:
    """``values[:p].sum()`` in int64 for positions p, without a cumulative array as long as
    ``values``: the sums of whole blocks are kept, the rest is summed in the blocks asked
    about."""

    def __init__(self, values: np.ndarray):
        self.values = values
        blocks = [
            int(values[lo : lo + _GAP_CHUNK].sum(dtype=np.int64))
            for lo in range(0, len(values), _GAP_CHUNK)
        ]
        self.before = np.concatenate(([0], np.cumsum(blocks, dtype=np.int64)))
        """Sum of the blocks before block b."""

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The sums for non-decreasing ``positions`` (each in 0 .. len(values))."""
        out = np.empty(len(positions), dtype=np.int64)
        start = 0  # first position not yet answered
        while start < len(positions):
            block = int(positions[start]) // _GAP_CHUNK
            lo = block * _GAP_CHUNK
            stop = int(np.searchsorted(positions, lo + _GAP_CHUNK, side="left"))
            partial = np.concatenate(
                ([0], np.cumsum(self.values[lo : lo + _GAP_CHUNK], dtype=np.int64))
            )
            out[start:stop] = self.before[block] + partial[positions[start:stop] - lo]
            start = stop
        return out
