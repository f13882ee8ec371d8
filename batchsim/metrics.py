"""Records of a run and the numbers computed from them.

Owns the per-iteration log (columnar, chunked numpy buffers: a decode stretch of K iterations
is appended as arrays, not K Python rows), the per-request table, and the summary with vLLM
``benchmark_serving`` names (``mean_ttft_ms``, ``p99_itl_ms``, ...) plus batchsim's own.
Percentiles use numpy's default (linear) definition, as vLLM does. Inter-token latencies are
stored as weighted samples (see :class:`ItlLog`); the weighted
percentile below equals ``np.percentile`` of the expanded sample exactly.

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from batchsim.request import Request, RequestStatus

STEP_COLUMNS: dict[str, str] = {
    "start_time_s": "f8",
    "duration_ms": "f8",
    "gpu_time_ms": "f8",
    "flops": "f8",
    "bytes": "f8",
    "weight_bytes": "f8",
    "kv_bytes": "f8",
    "compute_bound": "?",
    "kv_cache_usage": "f4",
}
"""Columns that change from one iteration to the next inside a decode stretch."""

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
}
"""Columns that describe the batch, constant across a decode stretch."""

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
]
"""Columns of ``iterations.csv``, in order (``bound`` is compute|memory)."""

_CHUNK = 1 << 14


class ChunkedColumns:
    """Append-only columns in preallocated numpy chunks (no per-row Python objects).

    Args:
        dtypes: Column name -> numpy dtype, in row order.
    """

    def __init__(self, dtypes: dict[str, str]):
        self.dtypes = dtypes
        self._chunks: list[list[np.ndarray]] = []
        self._fill = _CHUNK
        self.num_rows = 0

    def _room(self) -> list[np.ndarray]:
        if self._fill == _CHUNK:
            self._chunks.append([np.empty(_CHUNK, dtype=t) for t in self.dtypes.values()])
            self._fill = 0
        return self._chunks[-1]

    def append(self, row: tuple) -> None:
        """One row, values in column order."""
        chunk = self._room()
        i = self._fill
        for column, value in zip(chunk, row):
            column[i] = value
        self._fill += 1
        self.num_rows += 1

    def extend(self, values: tuple, n: int) -> None:
        """``n`` rows; each value is an array of length n or a scalar shared by all rows."""
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
        self.num_rows += n

    def column(self, key: str) -> np.ndarray:
        index = list(self.dtypes).index(key)
        if not self._chunks:
            return np.empty(0, dtype=self.dtypes[key])
        parts = [c[index] for c in self._chunks[:-1]]
        parts.append(self._chunks[-1][index][: self._fill])
        return np.concatenate(parts)


class IterationLog:
    """Append-only columnar log of iterations.

    Per-iteration values go into numpy chunks; the batch description is stored once per run
    of identical iterations (a decode stretch) with its length, and expanded when read.
    """

    def __init__(self) -> None:
        self._steps = ChunkedColumns(STEP_COLUMNS)
        self._batches = ChunkedColumns({**BATCH_COLUMNS, "length": "i8"})

    @property
    def num_rows(self) -> int:
        return self._steps.num_rows

    def append(self, step: tuple, batch: tuple) -> None:
        """One iteration: ``step`` in :data:`STEP_COLUMNS` order, ``batch`` in
        :data:`BATCH_COLUMNS` order."""
        self._steps.append(step)
        self._batches.append((*batch, 1))

    def extend(self, step: tuple, batch: tuple, n: int) -> None:
        """``n`` iterations of one batch; each ``step`` value is an array of length n or a
        scalar shared by all of them."""
        self._steps.extend(step, n)
        self._batches.append((*batch, n))

    def column(self, key: str) -> np.ndarray:
        if key in BATCH_COLUMNS:
            return np.repeat(self._batches.column(key), self._batches.column("length"))
        return self._steps.column(key)

    def to_columns(self) -> Columns:
        """The log as ``iterations.csv`` columns, plus ``compute_bound`` (bool)."""
        data: Columns = {"iteration": np.arange(self.num_rows)}
        for key in (*STEP_COLUMNS, *BATCH_COLUMNS):
            data[key] = self.column(key)
        with np.errstate(divide="ignore", invalid="ignore"):
            data["arithmetic_intensity"] = data["flops"] / data["bytes"]
        data["bound"] = np.where(data["compute_bound"], "compute", "memory")
        return data


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
    "status",
    "reject_reason",
]


class ItlLog:
    """Inter-token gaps as (time of the later token, gap, how many tokens share it).

    Tokens that share a gap are stored once with a count: a decode stretch of K iterations
    over B requests adds K-1 rows of count B instead of (K-1) x B rows, so memory grows with
    iterations, not with tokens.
    """

    def __init__(self) -> None:
        self._rows = ChunkedColumns({"time": "f8", "gap": "f8", "count": "i4"})

    def add(self, time: float, gap: float, count: int = 1) -> None:
        self._rows.append((time, gap, count))

    def extend(self, times: np.ndarray, gaps: np.ndarray, count: int) -> None:
        """Add ``len(gaps)`` rows sharing one ``count``."""
        self._rows.extend((times, gaps, count), len(gaps))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All rows as (times, gaps, counts) arrays."""
        rows = self._rows
        return rows.column("time"), rows.column("gap"), rows.column("count").astype(np.int64)


Columns = dict[str, Any]
"""A table as column name -> numpy array (or list of strings), all of one length."""


def requests_columns(requests: Sequence[Request]) -> Columns:
    """One flat row per request (times in s, latencies in ms, NaN where not applicable)."""
    n = len(requests)
    arrival = np.fromiter((r.arrival_time for r in requests), float, n)
    scheduled = np.fromiter((r.first_scheduled_time for r in requests), float, n)
    first = np.fromiter((r.first_token_time for r in requests), float, n)
    finish = np.fromiter((r.finish_time for r in requests), float, n)
    outputs = np.fromiter((r.num_output_tokens for r in requests), np.int64, n)
    names = {s: s.name.lower() for s in RequestStatus}
    status = np.array([names[r.status] for r in requests], dtype=object)
    done = status == "finished"
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(done & (outputs > 1), (finish - first) / (outputs - 1), np.nan)
    e2el = np.where(done, finish - arrival, np.nan)
    return {
        "request_id": np.fromiter((r.request_id for r in requests), np.int64, n),
        "arrival_time_s": arrival,
        "first_scheduled_time_s": scheduled,
        "first_token_time_s": first,
        "finish_time_s": finish,
        "prompt_tokens": np.fromiter((r.num_prompt_tokens for r in requests), np.int64, n),
        "output_tokens": outputs,
        "max_tokens": np.fromiter((r.max_tokens for r in requests), np.int64, n),
        "ttft_ms": (first - arrival) * 1e3,
        "tpot_ms": tpot * 1e3,
        "e2el_ms": e2el * 1e3,
        "queue_delay_ms": (scheduled - arrival) * 1e3,
        "num_preemptions": np.fromiter((r.num_preemptions for r in requests), np.int64, n),
        "status": status,
        "reject_reason": np.array([r.reject_reason for r in requests], dtype=object),
    }


def _rows(table: Columns, mask: np.ndarray) -> Columns:
    return {k: v[mask] for k, v in table.items()}


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, percents: Iterable[float]
) -> list[float]:
    """``np.percentile(np.repeat(values, weights), p)`` without expanding the sample."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    cum = np.cumsum(weights[order])
    n = int(cum[-1])
    out = []
    for p in percents:
        pos = p / 100.0 * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        v_lo = v[np.searchsorted(cum, lo + 1)]
        v_hi = v[np.searchsorted(cum, hi + 1)]
        out.append(float(v_lo + (pos - lo) * (v_hi - v_lo)))
    return out


def _stats(name: str, values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """mean/median/std/p90/p99 of ``values`` (ms) under vLLM's names."""
    keys = [f"{s}_{name}_ms" for s in ("mean", "median", "std", "p90", "p99")]
    if values.size == 0:
        return dict.fromkeys(keys, math.nan)
    if weights is None:
        weights = np.ones(values.size, dtype=np.int64)
    total = weights.sum()
    mean = float((values * weights).sum() / total)
    std = float(math.sqrt(max(0.0, (weights * (values - mean) ** 2).sum() / total)))
    p50, p90, p99 = weighted_percentiles(values, weights, (50, 90, 99))
    return dict(zip(keys, (mean, p50, std, p90, p99)))


def summarize(
    requests: Columns,
    iterations: Columns,
    itl_time: np.ndarray,
    itl_value: np.ndarray,
    itl_count: np.ndarray,
    *,
    num_preemptions: int,
    max_kv_cache_usage: float,
    slo: dict[str, float] | None = None,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
) -> dict[str, Any]:
    """The summary dict of a run (``summary.json`` without ``wall_time_s`` and ``config``).

    With ``warmup_s``/``cooldown_s``, request metrics count only requests that arrived inside
    [first arrival + warmup, last arrival - cooldown]; inter-token gaps and iteration
    statistics count only those that ended/started inside that window.
    """
    arrivals = requests["arrival_time_s"]
    lo = (arrivals.min() if arrivals.size else 0.0) + warmup_s
    hi = (arrivals.max() if arrivals.size else 0.0) - cooldown_s
    trimmed = warmup_s > 0 or cooldown_s > 0
    req = _rows(requests, (arrivals >= lo) & (arrivals <= hi)) if trimmed else requests
    done = _rows(req, req["status"] == "finished")
    completed = len(done["status"])
    if completed:
        duration = float(done["finish_time_s"].max() - req["arrival_time_s"].min())
    else:
        duration = 0.0
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["output_tokens"].sum())

    def rate(x: float) -> float:
        return x / duration if duration > 0 else math.nan

    out: dict[str, Any] = {
        "completed": completed,
        "num_requests": len(req["status"]),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": rate(completed),
        "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out),
    }
    if slo:
        ok = np.ones(completed, dtype=bool)
        for key, column in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("e2el_ms", "e2el_ms")):
            if slo.get(key) is not None:
                v = done[column]
                ok &= ~(v > slo[key])  # NaN TPOT (single-token output) meets any TPOT SLO
        out["request_goodput"] = rate(float(ok.sum()))
    else:
        out["request_goodput"] = math.nan
    out.update(_stats("ttft", done["ttft_ms"]))
    tpot = done["tpot_ms"]
    out.update(_stats("tpot", tpot[~np.isnan(tpot)]))
    if trimmed:
        # Gaps are not attributed to requests: keep those that ended inside the window
        # spanned by the counted requests (first counted arrival .. last counted finish).
        end = float(done["finish_time_s"].max()) if completed else hi
        keep = (itl_time >= lo) & (itl_time <= end)
        itl_value, itl_count = itl_value[keep], itl_count[keep]
    out.update(_stats("itl", itl_value * 1e3, itl_count))
    out.update(_stats("e2el", done["e2el_ms"]))

    it = iterations
    if trimmed:
        start = it["start_time_s"]
        it = _rows(it, (start >= lo) & (start <= hi))
    num_iter = len(it["start_time_s"])
    computed_tokens = (
        it["num_prefill_tokens"].sum()
        + it["num_decode_tokens"].sum()
        + it["num_padding_tokens"].sum()
    )
    slots = it["num_slots"].sum()
    queue = req["queue_delay_ms"]
    queue = queue[~np.isnan(queue)]
    out.update(
        {
            "num_iterations": len(iterations["start_time_s"]),
            "mean_batch_size": float(it["num_seqs"].mean()) if num_iter else math.nan,
            "num_preemptions": int(num_preemptions),
            "num_rejected": int((req["status"] == "rejected").sum()),
            "num_cancelled": int((req["status"] == "cancelled").sum()),
            "mean_queue_delay_ms": float(queue.mean()) if queue.size else math.nan,
            "p99_queue_delay_ms": float(np.percentile(queue, 99)) if queue.size else math.nan,
            "padding_fraction": float(it["num_padding_tokens"].sum() / computed_tokens)
            if computed_tokens
            else 0.0,
            "empty_slot_fraction": float(1 - it["num_seqs"].sum() / slots) if slots else 0.0,
            "compute_bound_fraction": float(it["compute_bound"].mean()) if num_iter else 0.0,
            "max_kv_cache_usage": float(max_kv_cache_usage),
            "cpu_overhead_fraction": float(it["cpu_time_ms"].sum() / it["duration_ms"].sum())
            if num_iter
            else 0.0,
            "busy_fraction": float(it["duration_ms"].sum() / 1e3 / duration) if duration else 0.0,
        }
    )
    return out
