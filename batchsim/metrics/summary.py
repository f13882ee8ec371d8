"""The summary of a run: vLLM ``benchmark_serving`` names plus batchsim's own.

Percentiles use numpy's default (linear) definition, as vLLM does. Inter-token latencies are
weighted samples; :func:`weighted_percentiles` equals ``np.percentile`` of the expanded sample
exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import IterationLog
from batchsim.metrics.requests import RequestLog
from batchsim.metrics.timing import RunTable, TokenRuns


def _rows(table: Columns, mask: np.ndarray, keys: Iterable[str]) -> Columns:
    """The rows of ``mask`` of some columns (views of all rows when ``mask`` is all true)."""
    if mask.all():
        return {k: table[k] for k in keys}
    return {k: table[k][mask] for k in keys}


_DONE_COLUMNS = (
    "arrival_time_s",
    "finish_time_s",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "status",
    "num_cached_tokens",
)
"""The columns of the finished requests the summary reads."""


def _where(mask: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """The rows selected by ``inner``, a mask over the rows ``mask`` selects."""
    if mask.all():
        return inner
    out = np.zeros(len(mask), dtype=bool)
    out[mask] = inner
    return out


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, percents: Iterable[float]
) -> list[float]:
    """``np.percentile(np.repeat(values, weights), p)`` without expanding the sample: the
    same virtual index and the same interpolation (numpy's ``_lerp``), so equal to the last
    bit (for finite values)."""
    order = np.argsort(values, kind="stable")
    cum = weights[order]
    if cum.dtype in (np.int64, np.float64):  # the type cumsum would choose: add in place
        np.cumsum(cum, out=cum)
    else:
        cum = np.cumsum(cum)
    v = values[order]
    del order
    n = int(cum[-1])
    out = []
    for p in percents:
        pos = (n - 1) * (p / 100.0)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        a = float(v[np.searchsorted(cum, lo + 1)])
        b = float(v[np.searchsorted(cum, hi + 1)])
        out.append(_lerp(a, b, pos - lo))
    return out


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between neighbours ``a <= b`` at ``t`` in [0, 1): from the
    nearer one, as ``np.percentile`` computes it."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def percentile(values: np.ndarray, p: float) -> float:
    """``np.percentile(values, p)`` of finite values (numpy's would import ``numpy.ma``
    into every run, ~10 ms)."""
    n = len(values)
    pos = (n - 1) * (p / 100.0)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    part = np.partition(values, (lo, hi)) if hi != lo else np.partition(values, lo)
    return _lerp(float(part[lo]), float(part[hi]), pos - lo)


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
    request_log: RequestLog,
    iterations: IterationLog,
    *,
    requests: Columns | None = None,
    slo: dict[str, float] | None = None,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    request_rate: float = math.nan,
    hand_over: bool = False,
    num_replicas: int = 1,
) -> dict[str, Any]:
    """The summary dict of a run (``summary.json`` without ``wall_time_s`` and ``config``).

    One window for everything. The *counted* requests are those that arrived in [first
    arrival + ``warmup_s``, last arrival - ``cooldown_s``] (all requests by default); request
    metrics (latencies, throughput, goodput, the ITL of their tokens) count the finished ones
    among them. ``duration`` spans from the first counted arrival to the last counted finish,
    and every iteration statistic (batch size, waste and bound fractions, busy and CPU
    fractions, preemptions, swaps, peak KV usage) counts the iterations that start inside that
    span (``busy_fraction``: the time the span is covered by iterations). ``num_iterations``
    is every iteration of the run (the rows of ``iterations.csv``).

    Args:
        request_log: The requests that left, with their token times.
        iterations: The iteration log.
        requests: ``request_log.to_columns()`` if already built.
        slo: ``ttft_ms``/``tpot_ms``/``e2el_ms`` limits for ``request_goodput``.
        warmup_s: Leave out requests arriving this long after the first arrival.
        cooldown_s: Leave out requests arriving this long before the last arrival.
        request_rate: The workload's configured arrival rate (req/s), reported as is.
        hand_over: Take the request log's token runs instead of copying them (less memory;
            the log cannot give them again, see :meth:`RequestLog.token_runs`).
        num_replicas: Engines whose iterations the log holds (a cluster's replicas):
            ``busy_fraction`` is their mean.
    """
    if requests is None:
        requests = request_log.to_columns()
    counted, t0, t1 = summary_window(requests, warmup_s, cooldown_s)
    req = _rows(requests, counted, ("arrival_time_s", "status", "queue_delay_ms"))
    finished = req["status"] == "finished"
    done = _rows(requests, _where(counted, finished), _DONE_COLUMNS)
    completed = len(done["status"])
    duration = t1 - t0
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["output_tokens"].sum())

    def rate(x: float) -> float:
        return x / duration if duration > 0 else math.nan

    out: dict[str, Any] = {
        "completed": completed,
        "failed": len(finished) - completed,
        "num_requests": len(finished),
        "num_prompts": len(finished),
        "request_rate": request_rate,
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
        # DistServe's attainment: of the counted requests, the fraction that finished within
        # every target (a rejected or cancelled request meets none)
        out["slo_attainment"] = float(ok.sum()) / len(finished) if len(finished) else math.nan
    else:
        out["request_goodput"] = math.nan
        out["slo_attainment"] = math.nan
    out.update(_stats("ttft", done["ttft_ms"]))
    tpot = done["tpot_ms"]
    out.update(_stats("tpot", tpot[~np.isnan(tpot)]))
    runs = iterations.run_table()
    tokens = request_log.token_runs(
        counted & (requests["status"] == "finished"), hand_over=hand_over
    )
    itl_value, itl_count = tokens.inter_token_gaps(runs)
    peaks = _peaks(done, tokens, runs)
    del tokens, runs  # before the ITL statistics, the largest arrays of the summary
    itl_value *= 1e3  # ms
    out.update(_stats("itl", itl_value, itl_count))
    del itl_value, itl_count
    out.update(_stats("e2el", done["e2el_ms"]))
    out.update(peaks)

    it = iterations.totals(t0, t1)
    num_iter = it["num_counted"]
    computed_tokens = it["num_prefill_tokens"] + it["num_decode_tokens"] + it["num_padding_tokens"]
    slots = it["num_slots"]
    queue = req["queue_delay_ms"]
    queue = queue[~np.isnan(queue)]
    out.update(
        {
            "num_iterations": iterations.num_rows,
            "mean_batch_size": it["num_seqs"] / num_iter if num_iter else math.nan,
            "num_preemptions": int(it["num_preempted"]),
            "num_swaps": int(it["num_swapped_out"]),
            "num_rejected": int((req["status"] == "rejected").sum()),
            "num_cancelled": int((req["status"] == "cancelled").sum()),
            "mean_queue_delay_ms": float(queue.mean()) if queue.size else math.nan,
            "p99_queue_delay_ms": percentile(queue, 99) if queue.size else math.nan,
            "queue_delay_growth": queue_delay_growth(req["arrival_time_s"], req["queue_delay_ms"]),
            "padding_fraction": it["num_padding_tokens"] / computed_tokens
            if computed_tokens
            else 0.0,
            "empty_slot_fraction": 1 - it["num_seqs"] / slots if slots else 0.0,
            "compute_bound_fraction": it["num_compute_bound"] / num_iter if num_iter else 0.0,
            "max_kv_cache_usage": it["max_kv_cache_usage"],
            # of the prompt tokens of the finished counted requests, those found cached at
            # their first admission (0 without prefix caching)
            "prefix_cache_hit_rate": int(done["num_cached_tokens"].sum()) / total_in
            if total_in
            else math.nan,
            "cpu_overhead_fraction": it["cpu_time_ms"] / it["duration_ms"] if num_iter else 0.0,
            # covered time cannot exceed the span; a sum of many iterations can by rounding
            "busy_fraction": min(1.0, it["busy_s"] / (duration * num_replicas))
            if duration > 0
            else 0.0,
        }
    )
    return out


def summary_window(
    requests: Columns, warmup_s: float = 0.0, cooldown_s: float = 0.0
) -> tuple[np.ndarray, float, float]:
    """The summary's window: (the counted requests, as a mask over ``requests``' rows; the
    first counted arrival; the last counted finish, or the first arrival if none finished).
    See :func:`summarize`."""
    arrivals = requests["arrival_time_s"]
    counted = np.ones(len(arrivals), dtype=bool)
    if (warmup_s > 0 or cooldown_s > 0) and arrivals.size:
        lo, hi = arrivals.min() + warmup_s, arrivals.max() - cooldown_s
        counted = (arrivals >= lo) & (arrivals <= hi)
    arrived = arrivals if counted.all() else arrivals[counted]
    t0 = float(arrived.min()) if len(arrived) else 0.0
    finished = counted & (requests["status"] == "finished")
    t1 = float(requests["finish_time_s"][finished].max()) if finished.any() else t0
    return counted, t0, t1


def queue_delay_growth(arrival_s: np.ndarray, queue_delay_ms: np.ndarray) -> float:
    """How fast the queue grows: the least-squares slope of queueing delay against arrival time
    (seconds of delay per second of arrivals) over the requests that were scheduled.

    About 0 for a stable system; when arrivals outpace service by a factor rho > 1 (a FIFO
    queue), each second of arrivals adds about rho - 1 seconds of delay. NaN with fewer than
    two scheduled requests or when they all arrived at the same instant.
    """
    scheduled = ~np.isnan(queue_delay_ms)
    x = arrival_s[scheduled]
    if x.size < 2:
        return math.nan
    x = x - x.mean()
    spread = float(np.dot(x, x))
    if spread <= 0.0:
        return math.nan
    return float(np.dot(x, queue_delay_ms[scheduled] / 1e3) / spread)


def _peaks(done: Columns, tokens: TokenRuns, runs: RunTable) -> dict[str, float]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``: in one-second
    buckets from the first finished request's arrival, the most tokens sampled (first tokens
    included) and the most finished requests in flight (a request counts in every bucket from
    its arrival's to its finish's).

    Only the buckets where something happens are kept (a sorted array of bucket numbers and
    their sums), so the memory follows the number of requests and iterations, never the
    simulated time span: 20 requests a year apart cost 20 buckets, not 3e7.
    """
    if not len(done["status"]):
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    origin = float(done["arrival_time_s"].min())
    finish = np.floor(done["finish_time_s"] - origin).astype(np.int64)
    last = int(finish.max()) + 1  # the last bucket counted
    keys: list[np.ndarray] = []
    sums: list[np.ndarray] = []
    for iterations, ends in runs.end_time_chunks():
        count = tokens.tokens_between(int(iterations[0]), int(iterations[-1]) + 1)
        sampled = np.flatnonzero(count)
        if sampled.size:
            buckets = np.floor(ends[sampled] - origin).astype(np.int64)
            inside = (buckets >= 0) & (buckets <= last)
            chunk_keys, where = np.unique(buckets[inside], return_inverse=True)
            keys.append(chunk_keys)
            sums.append(np.bincount(where, count[sampled][inside], minlength=chunk_keys.size))
    max_tokens = 0.0  # a bucket without tokens holds 0
    if keys:
        _, where = np.unique(np.concatenate(keys), return_inverse=True)
        # token counts are integers: their float sums are exact in any order
        per_bucket = np.bincount(where, np.concatenate(sums))
        if per_bucket.size:
            max_tokens = max(max_tokens, float(per_bucket.max()))
    begin = np.floor(done["arrival_time_s"] - origin).astype(np.int64)
    # the in-flight count changes only at a bucket where a request begins or one has ended:
    # its running sum over those buckets, in order, takes every value the dense count takes
    events, where = np.unique(np.concatenate((begin, finish + 1)), return_inverse=True)
    began = np.bincount(where[: begin.size], minlength=events.size)
    ended = np.bincount(where[begin.size :], minlength=events.size)
    return {
        "max_output_tokens_per_s": max_tokens,
        "max_concurrent_requests": int(np.cumsum(began - ended).max()),
    }
