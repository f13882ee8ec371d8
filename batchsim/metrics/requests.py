"""The per-request table (``requests.csv``): :class:`RequestLog` keeps one row per request
that left the engine and, for each finished request, the iterations that sampled its tokens
(runs of consecutive iterations), handed to the summary as
:class:`~batchsim.metrics.timing.TokenRuns`.

This module imports no simpy and no scheduler policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from batchsim.engine.request import Request, RequestStatus
from batchsim.metrics.columns import ChunkedColumns, Columns
from batchsim.metrics.timing import TokenRuns

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

_PENDING_SEGMENTS = 1 << 16
"""Token-run bounds buffered as Python ints before they move into a numpy chunk."""


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
        (:meth:`~batchsim.metrics.iterations.IterationLog.concatenate`).

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
