"""Records of a run and the numbers computed from them.

Owns the per-iteration log (columnar, chunked numpy buffers; a decode stretch of K
iterations is stored as a few runs of equal time, not K rows), the per-request table, and the
summary with vLLM ``benchmark_serving`` names (``mean_ttft_ms``, ``p99_itl_ms``, ...) plus
batchsim's own. Percentiles use numpy's default (linear) definition, as vLLM does.
Inter-token latencies are stored as weighted runs (see :class:`ItlLog`); the weighted
percentile below equals ``np.percentile`` of the expanded sample exactly.

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from batchsim.cost import DecodeSlopes
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
}
"""Columns of one run of identical iterations, as of its first iteration.

``bound_margin_s`` is compute time minus memory time (> 0: compute-bound). Iteration k of a
run starts ``k x duration_s`` after the run and, being a decode step that reads
``k x num_decode_seqs`` more cached tokens, adds that many times the cost model's
:class:`~batchsim.cost.DecodeSlopes` to ``flops``, ``bytes``, ``kv_bytes`` and the margin.
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
]
"""Columns of ``iterations.csv``, in order (``bound`` is compute|memory)."""

_CHUNK = 1 << 14
_PENDING = 4096
"""Rows and blocks buffered before they are moved into the numpy chunks."""
_BLOCK = object()
"""Marks an ``extend()`` block among buffered rows."""


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
        self._chunks: list[list[np.ndarray]] = []
        self._fill = _CHUNK
        self._stored = 0
        self._pending: list[tuple] = []  # rows, and (values, n) blocks from extend()
        self._pending_rows = 0

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

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        total, self._pending_rows = self._pending_rows, 0
        dtypes = list(self.dtypes.values())
        pieces: list[list[np.ndarray]] = [[] for _ in dtypes]
        rows: list[tuple] = []

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
        self._stored += n

    def column(self, key: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``lo:hi`` of one column (all rows by default), as one array."""
        self._flush()
        index = self._index[key]
        hi = self.num_rows if hi is None else min(hi, self.num_rows)
        if hi <= lo:
            return np.empty(0, dtype=self.dtypes[key])
        first, last = lo // _CHUNK, (hi - 1) // _CHUNK
        if first == last:
            return self._chunks[first][index][lo - first * _CHUNK : hi - first * _CHUNK]
        parts = [self._chunks[first][index][lo - first * _CHUNK :]]
        parts += [c[index] for c in self._chunks[first + 1 : last]]
        parts.append(self._chunks[last][index][: hi - last * _CHUNK])
        return np.concatenate(parts)


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


_WINDOW_ROWS = 1 << 20
"""Most iterations expanded at once when the log is read in windows."""


class IterationLog:
    """Append-only columnar log of iterations, stored as runs.

    A run is one iteration, or consecutive decode iterations of one batch that take the same
    time (a decode stretch is one or a few runs): one row of :data:`RUN_COLUMNS` and
    :data:`BATCH_COLUMNS`, whatever its length. Only the KV-cache usage is kept per
    iteration. Reading expands the runs, in windows of at most about a million iterations so
    that even runs of tens of millions of iterations are summarized and written in bounded
    memory.

    Args:
        slopes: Per-token growth of a decode iteration's totals (the cost model's
            :attr:`~batchsim.cost.RooflineCostModel.decode_token_slopes`); needed only if
            runs longer than one iteration are added.
    """

    def __init__(self, slopes: DecodeSlopes | None = None) -> None:
        self.slopes = slopes
        self._runs = ChunkedColumns({**RUN_COLUMNS, **BATCH_COLUMNS})
        self._usage = ChunkedColumns({"kv_cache_usage": "f4"})

    @property
    def num_rows(self) -> int:
        """Iterations logged."""
        return self._usage.num_rows

    def append(self, run: tuple, kv_cache_usage: float) -> None:
        """One iteration: ``run`` in :data:`RUN_COLUMNS` + :data:`BATCH_COLUMNS` order with
        ``num_steps`` 1."""
        self._runs.append(run)
        self._usage.append((kv_cache_usage,))

    def add_runs(self, runs: list[tuple], kv_cache_usage: np.ndarray | float) -> None:
        """Runs of one decode stretch, in order, and the usage of each of their iterations."""
        assert self.slopes is not None or all(r[1] == 1 for r in runs)
        for run in runs:
            self._runs.append(run)
        num_steps = sum(r[1] for r in runs)
        self._usage.extend((kv_cache_usage,), num_steps)

    def extend(self, values: tuple, n: int, kv_cache_usage: np.ndarray | float) -> None:
        """``n`` single iterations; each value (column order as in :meth:`append`) is an
        array of length n or a scalar shared by all of them."""
        self._runs.extend(values, n)
        self._usage.extend((kv_cache_usage,), n)

    def windows(self, max_rows: int = _WINDOW_ROWS) -> Iterator[Columns]:
        """The iterations, in order, as column tables of at most about ``max_rows`` rows
        (``iterations.csv`` columns with ``bound`` as :class:`Labels`, plus
        ``compute_bound``)."""
        runs = self._runs
        num_runs = runs.num_rows
        if not num_runs:  # one empty table, so that readers still see the columns
            yield self._expand(0, 0, np.empty(0, dtype=np.int64), 0, 0)
            return
        lo = row = 0
        while lo < num_runs:
            steps = runs.column("num_steps", lo, min(num_runs, lo + max_rows)).astype(np.int64)
            ends = np.cumsum(steps)
            hi = lo + max(1, int(np.searchsorted(ends, max_rows, side="right")))
            total = int(ends[hi - lo - 1])
            yield self._expand(lo, hi, steps[: hi - lo], row, total)
            row += total
            lo = hi

    def _expand(self, lo: int, hi: int, steps: np.ndarray, row: int, total: int) -> Columns:
        runs = self._runs
        run_of = np.repeat(np.arange(hi - lo), steps)
        k = np.arange(total, dtype=np.int64)
        k -= np.repeat(np.cumsum(steps) - steps, steps)
        step = k.astype(float)

        def expand(key: str) -> np.ndarray:
            return runs.column(key, lo, hi)[run_of]

        data: Columns = {"iteration": np.arange(row, row + total)}
        duration = expand("duration_s")
        data["start_time_s"] = expand("start_time_s") + duration * step
        data["duration_ms"] = duration * 1e3
        data["cpu_time_ms"] = expand("cpu_time_ms")
        data["gpu_time_ms"] = expand("gpu_time_ms")
        for key in BATCH_COLUMNS:
            if key != "cpu_time_ms":
                data[key] = expand(key)
        grow = data["num_decode_seqs"] * step  # extra cached tokens read at step k
        slopes = self.slopes
        flops, nbytes, kv_bytes = expand("flops"), expand("bytes"), expand("kv_bytes")
        margin = expand("bound_margin_s")
        if slopes is not None:
            flops += grow * slopes.flops
            nbytes += grow * slopes.bytes
            kv_bytes += grow * slopes.kv_bytes
            margin += grow * (slopes.compute_time - slopes.memory_time)
        data["flops"] = flops
        data["bytes"] = nbytes
        with np.errstate(divide="ignore", invalid="ignore"):
            data["arithmetic_intensity"] = flops / nbytes
        data["weight_bytes"] = expand("weight_bytes")
        data["kv_bytes"] = kv_bytes
        data["compute_bound"] = margin > 0
        data["bound"] = Labels(data["compute_bound"].astype(np.int8), ("memory", "compute"))
        data["kv_cache_usage"] = self._usage.column("kv_cache_usage", row, row + total)
        return data

    def to_columns(self) -> Columns:
        """The whole log as ``iterations.csv`` columns (``bound`` as strings), plus
        ``compute_bound`` (bool)."""
        parts = list(self.windows())
        data: Columns = {}
        for key in parts[0]:
            if key == "bound":
                continue
            data[key] = np.concatenate([p[key] for p in parts])
        data["bound"] = np.where(data["compute_bound"], "compute", "memory").astype(object)
        return data

    def totals(self, lo: float = -math.inf, hi: float = math.inf) -> dict[str, float]:
        """Sums over the iterations starting inside [lo, hi], for the summary:
        ``num_iterations`` (all), ``num_counted`` (inside) and, over those inside, the sums
        of :data:`_SUMMED` and ``num_compute_bound``."""
        out = dict.fromkeys(("num_iterations", "num_counted", *_SUMMED, "num_compute_bound"), 0.0)
        trimmed = lo > -math.inf or hi < math.inf
        for window in self.windows():
            start = window["start_time_s"]
            out["num_iterations"] += len(start)
            inside: Any = (start >= lo) & (start <= hi) if trimmed else slice(None)
            out["num_counted"] += len(start[inside])
            for key in _SUMMED:
                out[key] += float(window[key][inside].sum(dtype=float))
            out["num_compute_bound"] += float(np.count_nonzero(window["compute_bound"][inside]))
        return out


_SUMMED = (
    "num_seqs",
    "num_slots",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_padding_tokens",
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
]


class ItlLog:
    """Inter-token gaps as runs: gaps of equal length ``gap`` ending at ``time + j x gap`` for
    ``j`` in ``first..last``, each shared by ``count`` tokens.

    Tokens that share a gap are stored once with a count, and a decode stretch of K
    iterations over B requests adds one run of count B per distinct iteration time instead
    of (K-1) x B rows, so memory grows with runs, not with tokens. The end times are those
    the engine computed (the same expression), so a gap ending exactly at a request's
    finish time compares equal to it.
    """

    def __init__(self) -> None:
        self._rows = ChunkedColumns(
            {"time": "f8", "gap": "f8", "count": "i4", "first": "i4", "last": "i4"}
        )

    def add(self, time: float, gap: float, count: int = 1) -> None:
        """``count`` tokens whose gap ``gap`` ended at ``time``."""
        self._rows.append((time, gap, count, 0, 0))

    def add_run(self, start: float, gap: float, count: int, first: int, last: int) -> None:
        """``count`` tokens per gap ending at ``start + j x gap``, j = ``first..last``."""
        self._rows.append((start, gap, count, first, last))

    def extend(self, times: np.ndarray, gaps: np.ndarray, count: int) -> None:
        """Add ``len(gaps)`` single gaps sharing one ``count``."""
        self._rows.extend((times, gaps, count, 0, 0), len(gaps))

    def samples(self, lo: float = -math.inf, hi: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
        """(gaps, weights) of the gaps ending inside [lo, hi]."""
        rows = self._rows
        gap = rows.column("gap")
        first = rows.column("first").astype(np.int64)
        last = rows.column("last").astype(np.int64)
        if lo > -math.inf or hi < math.inf:
            start = rows.column("time")
            first = np.maximum(first, _first_index_at_least(start, gap, lo, first, last))
            last = np.minimum(last, _last_index_at_most(start, gap, hi, first, last))
        weight = rows.column("count").astype(np.int64) * np.maximum(0, last - first + 1)
        keep = weight > 0
        return gap[keep], weight[keep]


def _first_index_at_least(
    start: np.ndarray, gap: np.ndarray, bound: float, first: np.ndarray, last: np.ndarray
) -> np.ndarray:
    """Per row, the least j in first..last (or last + 1) with ``start + j x gap >= bound``,
    evaluated with the engine's own expression (a division only gives a first guess)."""
    if bound == -math.inf:
        return first
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        guess = np.ceil((bound - start) / gap)
    # a zero gap: every end is ``start``
    guess = np.where(gap > 0, guess, np.where(start >= bound, first, last + 1))
    j = np.clip(guess, first, last + 1).astype(np.int64)
    while True:  # step from the guess (usually off by at most one) to the exact index
        down = (j > first) & (start + gap * (j - 1) >= bound)
        up = (j <= last) & (start + gap * j < bound)
        if not (down.any() or up.any()):
            return j
        j = j - down + up


def _last_index_at_most(
    start: np.ndarray, gap: np.ndarray, bound: float, first: np.ndarray, last: np.ndarray
) -> np.ndarray:
    """Per row, the greatest j in first..last (or first - 1) with ``start + j x gap <=
    bound``."""
    if bound == math.inf:
        return last
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        guess = np.floor((bound - start) / gap)
    guess = np.where(gap > 0, guess, np.where(start <= bound, last, first - 1))
    j = np.clip(guess, first - 1, last).astype(np.int64)
    while True:
        up = (j < last) & (start + gap * (j + 1) <= bound)
        down = (j >= first) & (start + gap * j > bound)
        if not (down.any() or up.any()):
            return j
        j = j - down + up


Columns = dict[str, Any]
"""A table as column name -> numpy array (or list of strings), all of one length."""


class RequestLog:
    """Final records of the requests that left the engine (finished, rejected or cancelled).

    A request is recorded as one row when it leaves, so a run of millions of requests keeps
    only those in flight as Python objects.
    """

    _STATUS_NAMES = np.array([s.name.lower() for s in RequestStatus], dtype=object)

    def __init__(self) -> None:
        self._rows = ChunkedColumns(
            {
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
            }
        )
        self._reasons: dict[int, str] = {}

    @property
    def num_rows(self) -> int:
        return self._rows.num_rows

    def add(self, r: Request) -> None:
        """Record ``r``, which has reached a final status."""
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
            )
        )
        if r.reject_reason:
            self._reasons[r.request_id] = r.reject_reason

    def to_columns(self) -> Columns:
        """One row per request in ``request_id`` order (times in s, latencies in ms, NaN
        where not applicable): ``requests.csv``."""
        rows = self._rows
        order = np.argsort(rows.column("request_id"), kind="stable")

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
        return {
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
        }
