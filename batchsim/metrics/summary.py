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

from batchsim.metrics.logs import Columns, IterationLog, ItlLog


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
    iterations: IterationLog,
    itl: ItlLog,
    *,
    num_preemptions: int,
    max_kv_cache_usage: float,
    num_swaps: int = 0,
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
        itl_value, itl_count = itl.samples(lo, end)
    else:
        itl_value, itl_count = itl.samples()
    out.update(_stats("itl", itl_value * 1e3, itl_count))
    out.update(_stats("e2el", done["e2el_ms"]))

    it = iterations.totals(lo, hi) if trimmed else iterations.totals()
    num_iter = it["num_counted"]
    computed_tokens = it["num_prefill_tokens"] + it["num_decode_tokens"] + it["num_padding_tokens"]
    slots = it["num_slots"]
    queue = req["queue_delay_ms"]
    queue = queue[~np.isnan(queue)]
    out.update(
        {
            "num_iterations": int(it["num_iterations"]),
            "mean_batch_size": it["num_seqs"] / num_iter if num_iter else math.nan,
            "num_preemptions": int(num_preemptions),
            "num_swaps": int(num_swaps),
            "num_rejected": int((req["status"] == "rejected").sum()),
            "num_cancelled": int((req["status"] == "cancelled").sum()),
            "mean_queue_delay_ms": float(queue.mean()) if queue.size else math.nan,
            "p99_queue_delay_ms": float(np.percentile(queue, 99)) if queue.size else math.nan,
            "padding_fraction": it["num_padding_tokens"] / computed_tokens
            if computed_tokens
            else 0.0,
            "empty_slot_fraction": 1 - it["num_seqs"] / slots if slots else 0.0,
            "compute_bound_fraction": it["num_compute_bound"] / num_iter if num_iter else 0.0,
            "max_kv_cache_usage": float(max_kv_cache_usage),
            "cpu_overhead_fraction": it["cpu_time_ms"] / it["duration_ms"] if num_iter else 0.0,
            "busy_fraction": it["duration_ms"] / 1e3 / duration if duration else 0.0,
        }
    )
    return out
