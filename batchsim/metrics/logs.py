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
from collections.abc import Iterator
from typing import Any

import numpy as np

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


_WINDOW_ROWS = 1 << 18
"""Most iterations expanded at once when the log is read in windows."""
_GAP_CHUNK = 1 << 21
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

    def __init__(self) -> None:
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
        """Consecutive runs, in order, and the usage of each of their iterations."""
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
        ``compute_bound`` and ``end_time_s``)."""
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

        def linear(key: str, step_key: str) -> np.ndarray:
            return expand(key) + expand(step_key) * step

        data: Columns = {"iteration": np.arange(row, row + total)}
        duration = expand("duration_s")
        start = expand("start_time_s") + duration * step
        data["start_time_s"] = start
        data["end_time_s"] = start + duration
        data["duration_ms"] = duration * 1e3
        data["cpu_time_ms"] = expand("cpu_time_ms")
        data["gpu_time_ms"] = expand("gpu_time_ms")
        for key in BATCH_COLUMNS:
            if key != "cpu_time_ms":
                data[key] = expand(key)
        flops = linear("flops", "flops_step")
        nbytes = linear("bytes", "bytes_step")
        data["flops"] = flops
        data["bytes"] = nbytes
        with np.errstate(divide="ignore", invalid="ignore"):
            data["arithmetic_intensity"] = flops / nbytes
        data["weight_bytes"] = expand("weight_bytes")
        data["kv_bytes"] = linear("kv_bytes", "kv_bytes_step")
        data["compute_bound"] = linear("bound_margin_s", "bound_margin_step_s") > 0
        data["bound"] = Labels(data["compute_bound"].astype(np.int8), ("memory", "compute"))
        data["kv_cache_usage"] = self._usage.column("kv_cache_usage", row, row + total)
        return data

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
        steps = runs.column("num_steps").astype(np.int64)
        first = np.cumsum(steps) - steps
        return RunTable(first, steps, runs.column("start_time_s"), runs.column("duration_s"))

    def totals(self, lo: float = -math.inf, hi: float = math.inf) -> dict[str, float]:
        """Sums over the iterations that start in [lo, hi), for the summary.

        Keys: ``num_counted`` (iterations inside), the sums of :data:`_SUMMED` and
        ``num_compute_bound`` over them, ``max_kv_cache_usage`` (0 if none), and
        ``busy_s``: the time inside [lo, hi] covered by any iteration (an iteration that
        straddles a bound counts its part inside).
        """
        keys = ("num_counted", *_SUMMED, "num_compute_bound", "max_kv_cache_usage", "busy_s")
        out = dict.fromkeys(keys, 0.0)
        for window in self.windows():
            start, end = window["start_time_s"], window["end_time_s"]
            inside = (start >= lo) & (start < hi)
            out["num_counted"] += float(np.count_nonzero(inside))
            for key in _SUMMED:
                out[key] += float(window[key][inside].sum(dtype=float))
            out["num_compute_bound"] += float(np.count_nonzero(window["compute_bound"][inside]))
            usage = window["kv_cache_usage"][inside]
            if usage.size:
                out["max_kv_cache_usage"] = max(out["max_kv_cache_usage"], float(usage.max()))
            covered = np.minimum(end, hi) - np.maximum(start, lo)
            out["busy_s"] += float(covered[covered > 0].sum())
        return out


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
                "num_segments": "i4",
            }
        )
        self._segments: list[np.ndarray] = []  # flat (first, last) pairs, in chunks
        self._pending_segments: list[int] = []
        self._reasons: dict[int, str] = {}

    @property
    def num_rows(self) -> int:
        return self._rows.num_rows

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
            dtype = np.int32 if top < 2**31 else np.int64
            self._segments.append(np.array(pending, dtype=dtype))
            self._pending_segments = []

    def _all_segments(self) -> np.ndarray:
        self._flush_segments()
        if not self._segments:
            return np.empty((0, 2), dtype=np.int64)
        if len(self._segments) > 1:
            self._segments = [np.concatenate(self._segments)]
        return self._segments[0].reshape(-1, 2)

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

    def token_runs(self, counted: np.ndarray) -> TokenRuns:
        """The token runs of the requests selected by ``counted`` (a boolean mask over
        :meth:`to_columns`'s rows)."""
        rows = self._rows
        num_segments = rows.column("num_segments").astype(np.int64)
        pairs = self._all_segments()
        selected = np.zeros(len(num_segments), dtype=bool)
        selected[self._order()[counted]] = True
        if not selected.all():
            pairs = pairs[np.repeat(selected, num_segments)]
            num_segments = num_segments[selected]
        # runs per selected request, in storage order: the first of each is its request's
        is_first = np.zeros(len(pairs), dtype=bool)
        is_first[(np.cumsum(num_segments) - num_segments)[num_segments > 0]] = True
        return TokenRuns(pairs[:, 0], pairs[:, 1], is_first)


class RunTable:
    """The runs of an :class:`IterationLog` as arrays: iteration k of run r starts at
    ``start[r] + duration[r] x k`` and ends ``duration[r]`` later (the expressions of the
    expanded table, so times computed here equal its ``end_time_s`` exactly)."""

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
        k = (iterations - self.first[run]).astype(float)
        duration = self.duration[run]
        return (self.start[run] + duration * k) + duration

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
            k = (iterations - self.first[run]).astype(float)
            duration = self.duration[run]
            yield iterations, (self.start[run] + duration * k) + duration
            lo = hi


class TokenRuns:
    """Token runs of some requests: a request's tokens came at the ends of the iterations
    ``first[k]..last[k]`` of each of its runs (consecutive iterations); ``is_first[k]`` marks
    a request's first run (its runs are stored together, in order)."""

    def __init__(self, first: np.ndarray, last: np.ndarray, is_first: np.ndarray):
        self.first = first
        self.last = last
        self.is_first = is_first
        self._firsts = np.sort(first)
        self._lasts = np.sort(last)

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

    def _gap_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct (iteration, previous token's iteration) pairs of the gaps between a
        request's token runs, packed as ``iteration << 32 | previous``, and their counts
        (counted in chunks, so that memory stays bounded)."""
        keys: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        for lo in range(1, len(self.is_first), _GAP_CHUNK):
            rows = np.flatnonzero(~self.is_first[lo : lo + _GAP_CHUNK]) + lo
            pairs = self.first[rows].astype(np.int64) << 32
            pairs |= self.last[rows - 1]
            unique, count = np.unique(pairs, return_counts=True)
            keys.append(unique)
            counts.append(count)
        if len(keys) <= 1:
            return (keys[0], counts[0]) if keys else (np.empty(0, np.int64),) * 2
        unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        return unique, np.bincount(inverse, np.concatenate(counts)).astype(np.int64)

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
        pairs, counts = self._gap_pairs()
        boundary = runs.end_times(pairs >> 32) - runs.end_times(pairs & 0xFFFFFFFF)
        del pairs
        firsts, lasts = self._firsts, self._lasts

        def covered(x: np.ndarray) -> np.ndarray:
            """Pairs (token run, iteration i) with first < i <= min(x, last): the gaps
            inside token runs that end at iteration x or earlier (``x`` non-decreasing)."""
            q = x.astype(firsts.dtype)  # a query of another dtype would copy the arrays
            nf = np.searchsorted(firsts, q, side="left")  # token runs with first < x
            nl = np.searchsorted(lasts, q, side="left")  # ... and those with last < x
            return (nf * x - _prefix_sums(firsts, nf)) - (nl * x - _prefix_sums(lasts, nl))

        a, n = runs.first, runs.steps
        before = covered(a - 1)
        at_first = covered(a)
        inside = covered(a + n - 1) - at_first  # gaps at a log run's later iterations
        at_first -= before  # ... and at its first iteration
        del before
        head = np.flatnonzero(at_first)
        head_gaps = runs.end_times(a[head]) - runs.end_times(a[head] - 1)
        body = np.flatnonzero(inside)
        values = np.concatenate((boundary, head_gaps, runs.duration[body]))
        weights = np.concatenate((counts, at_first[head], inside[body]))
        return values, weights


def _prefix_sums(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``values[:p].sum()`` for each of the non-decreasing ``positions``, in int64, a block
    at a time (no cumulative array as long as ``values``)."""
    out = np.empty(len(positions), dtype=np.int64)
    total = 0
    start = 0  # first position not yet answered
    for lo in range(0, len(values) + 1, _GAP_CHUNK):
        hi = min(lo + _GAP_CHUNK, len(values))
        stop = int(np.searchsorted(positions, hi, side="right"))  # positions <= hi
        if stop > start:
            partial = np.concatenate(([0], np.cumsum(values[lo:hi], dtype=np.int64)))
            out[start:stop] = total + partial[positions[start:stop] - lo]
            start = stop
        total += int(values[lo:hi].sum(dtype=np.int64))
    return out
