"""The per-iteration log (``iterations.csv``): :class:`IterationLog` keeps the iterations as
runs in chunked numpy columns (a run of K iterations that differ only linearly, a decode
stretch, is one row, not K) and expands them when read, in windows of bounded size, for the
table, the summary's totals and evenly spaced samples (:func:`sample_rows`).

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from batchsim.engine.kv_cache import UsageRamp
from batchsim.metrics.columns import ChunkedColumns, Columns, Labels
from batchsim.metrics.timing import _WINDOW_ROWS, RunTable, advanced, run_starts

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
