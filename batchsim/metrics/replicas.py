"""The per-replica table of a cluster run (``replicas.csv``): how the router spread the load.

One row per replica, over the summary's window (the counted requests, from the first counted
arrival to the last counted finish, as :func:`~batchsim.metrics.summary.summarize`), so
that its columns add up to the cluster's summary: ``completed`` sums to the summary's
``completed``, ``output_throughput`` to its ``output_throughput``, and the mean of
``busy_fraction`` is its ``busy_fraction``.

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import IterationLog
from batchsim.metrics.summary import percentile, summary_window

REPLICA_COLUMNS = [
    "replica",
    "hardware",
    "tensor_parallel_size",
    "num_gpu_blocks",
    "num_requests",
    "completed",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_queue_delay_ms",
    "num_iterations",
    "mean_batch_size",
    "busy_fraction",
    "mean_kv_cache_usage",
    "max_kv_cache_usage",
    "num_preemptions",
    "prefix_cache_hit_rate",
]
"""Columns of ``replicas.csv``, in order."""


@dataclass(frozen=True)
class ReplicaRecord:
    """What the table needs of one replica besides the cluster's requests."""

    hardware: str
    """The name of its GPU profile."""
    tensor_parallel_size: int
    num_gpu_blocks: int
    iterations: IterationLog
    """Its own iterations."""
    pool: str | None = None
    """``prefill`` or ``decode`` in a disaggregated cluster; None otherwise."""


def replica_table(
    replicas: Sequence[ReplicaRecord],
    requests: Columns,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
) -> Columns:
    """``replicas.csv`` as columns.

    Args:
        replicas: The replicas, in index order.
        requests: The cluster's ``requests`` columns, with their ``replica`` column.
        warmup_s: As ``metrics.warmup_s``.
        cooldown_s: As ``metrics.cooldown_s``.

    Columns (over the summary's window): ``num_requests`` (counted requests routed to the
    replica), ``completed``, ``output_throughput`` (its finished requests' output tokens
    over the cluster's ``duration``), ``mean_ttft_ms``, ``p99_ttft_ms``,
    ``mean_queue_delay_ms`` (of the requests routed to it), ``num_iterations`` and
    ``mean_batch_size`` (iterations that
    start in the window), ``busy_fraction`` (the window's time its iterations cover),
    ``mean_kv_cache_usage`` (over that busy time), ``max_kv_cache_usage``,
    ``num_preemptions``, and ``prefix_cache_hit_rate`` (cached / prompt tokens of its
    finished requests; NaN when requests carry no ``num_cached_tokens``).

    In a disaggregated cluster (records with a ``pool``), a ``pool`` column follows
    ``replica``; a request is routed to a prefill instance (its ``prefill_replica``) and then
    to a decode instance (its ``decode_replica``): ``num_requests``, the TTFT and the queueing
    delay count the requests routed to the replica, ``completed`` and ``output_throughput``
    those that finished there (``replica``), so that they still add up to the summary's.
    """
    counted, t0, t1 = summary_window(requests, warmup_s, cooldown_s)
    duration = t1 - t0
    replica = requests["replica"]
    finished = counted & (requests["status"] == "finished")
    cached = requests.get("num_cached_tokens")
    pooled = any(record.pool is not None for record in replicas)
    columns = replica_column_names(pooled)
    rows: dict[str, list] = {key: [] for key in columns}
    for index, record in enumerate(replicas):
        served = replica if record.pool is None else requests[f"{record.pool}_replica"]
        mine = counted & (served == index)
        done = finished & (replica == index)
        ttft = requests["ttft_ms"][finished & (served == index)]
        queue = requests["queue_delay_ms"][mine]
        queue = queue[~np.isnan(queue)]
        it = record.iterations.totals(t0, t1, kv_usage=True)
        num_iter = it["num_counted"]
        prompt = int(requests["prompt_tokens"][done].sum())
        values = {
            "replica": index,
            "pool": record.pool,
            "hardware": record.hardware,
            "tensor_parallel_size": record.tensor_parallel_size,
            "num_gpu_blocks": record.num_gpu_blocks,
            "num_requests": int(mine.sum()),
            "completed": int(done.sum()),
            "output_throughput": float(requests["output_tokens"][done].sum()) / duration
            if duration > 0
            else math.nan,
            "mean_ttft_ms": float(ttft.mean()) if ttft.size else math.nan,
            "p99_ttft_ms": percentile(ttft, 99) if ttft.size else math.nan,
            "mean_queue_delay_ms": float(queue.mean()) if queue.size else math.nan,
            "num_iterations": int(num_iter),
            "mean_batch_size": it["num_seqs"] / num_iter if num_iter else math.nan,
            "busy_fraction": min(1.0, it["busy_s"] / duration) if duration > 0 else 0.0,
            "mean_kv_cache_usage": it["kv_usage_s"] / it["busy_s"] if it["busy_s"] else 0.0,
            "max_kv_cache_usage": it["max_kv_cache_usage"],
            "num_preemptions": int(it["num_preempted"]),
            "prefix_cache_hit_rate": float(cached[done].sum()) / prompt
            if cached is not None and prompt
            else math.nan,
        }
        for key in columns:
            rows[key].append(values[key])
    out: Columns = {}
    for key, column in rows.items():
        if key in ("hardware", "pool"):
            out[key] = np.array(column, dtype=object)
        else:
            out[key] = np.array(column, dtype=np.int64 if key in _COUNTS else float)
    return out


def replica_column_names(pooled: bool) -> list[str]:
    """The columns of ``replicas.csv``: :data:`REPLICA_COLUMNS`, with ``pool`` after
    ``replica`` in a disaggregated run."""
    if not pooled:
        return list(REPLICA_COLUMNS)
    return [REPLICA_COLUMNS[0], "pool", *REPLICA_COLUMNS[1:]]


def pool_busy_fractions(table: Columns) -> dict[str, float]:
    """``prefill_busy_fraction`` and ``decode_busy_fraction``: the mean ``busy_fraction`` of
    each pool's replicas (``replicas.csv`` of a disaggregated run)."""
    out = {}
    for pool in ("prefill", "decode"):
        mine = table["pool"] == pool
        out[f"{pool}_busy_fraction"] = float(table["busy_fraction"][mine].mean())
    return out


def transfer_summary(
    requests: Columns, warmup_s: float = 0.0, cooldown_s: float = 0.0
) -> dict[str, float]:
    """The KV transfers of a disaggregated run, over the counted requests whose KV moved:
    ``num_kv_transfers``, ``mean_kv_transfer_ms`` and ``p99_kv_transfer_ms`` (from the start
    on the link to the landing), ``mean_kv_wait_ms`` and ``p99_kv_wait_ms`` (from the end of
    the prefill to that start: waiting for the decode instance's KV space and for the link),
    ``mean_kv_transfer_bytes``."""
    counted, _, _ = summary_window(requests, warmup_s, cooldown_s)
    moved = counted & (requests["kv_transfer_bytes"] > 0)
    transfer = requests["kv_transfer_ms"][moved]
    wait = requests["kv_wait_ms"][moved]
    some = bool(moved.any())
    return {
        "num_kv_transfers": int(moved.sum()),
        "mean_kv_transfer_ms": float(transfer.mean()) if some else math.nan,
        "p99_kv_transfer_ms": percentile(transfer, 99) if some else math.nan,
        "mean_kv_wait_ms": float(wait.mean()) if some else math.nan,
        "p99_kv_wait_ms": percentile(wait, 99) if some else math.nan,
        "mean_kv_transfer_bytes": float(requests["kv_transfer_bytes"][moved].mean())
        if some
        else math.nan,
    }


_COUNTS = frozenset(
    {
        "replica",
        "tensor_parallel_size",
        "num_gpu_blocks",
        "num_requests",
        "completed",
        "num_iterations",
        "num_preemptions",
    }
)
