"""A replica's stretch, priced when it starts and logged when it ends.

One engine on its own knows every event that can cut a decode stretch (an arrival, a
cancellation, a timer) before the stretch starts, and logs it at once. A replica of a cluster
does not: a request may be routed to it at any time during the stretch. So
:class:`~batchsim.engine.stretch.StretchRunner` writes a replica's stretch into a
:class:`StretchPlan`; a request routed during the stretch cuts it at the first iteration that
ends at or after the delivery, where stepping one iteration at a time would have delivered it,
and the plan then logs the iterations up to the cut. Pricing is deterministic and every cut
keeps a prefix of the planned runs with the same start and end expressions, so the log is
what a stretch priced with that cut would have written.

This module imports no simpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from batchsim.engine.kv_cache import UsageRamp
from batchsim.engine.runs import run_until
from batchsim.metrics.iterations import IterationLog


class StretchPlan:
    """The iterations of a replica's stretch, priced at its start and logged at its end.

    :class:`~batchsim.engine.stretch.StretchRunner` writes a stretch's runs here instead of
    into the replica's :class:`~batchsim.metrics.iterations.IterationLog` (the same two calls). A
    request routed to the replica during the stretch cuts it (:meth:`cut`); :meth:`commit`
    then logs the iterations up to the cut, exactly as a stretch priced with that cut would
    have (its runs start and end at the same expressions).
    """

    def __init__(self, log: IterationLog):
        self.log = log
        self._items: list[tuple[Any, ...]] = []
        self._end = math.inf
        self._keep: int | None = None

    # ----------------------------------------------------- what StretchRunner calls
    @property
    def num_rows(self) -> int:
        """Iterations logged (the stretch's first iteration index)."""
        return self.log.num_rows

    def add_runs(
        self, runs: list[tuple], kv_cache_usage: Any, num_steps: int | None = None
    ) -> None:
        self._items.append((runs, kv_cache_usage))

    def extend(self, values: tuple, n: int, kv_cache_usage: Any) -> None:
        self._items.append((values, n, kv_cache_usage))

    # ------------------------------------------------------------- the replica's side
    @property
    def pending(self) -> bool:
        """A stretch is planned and not logged yet."""
        return bool(self._items)

    def begin(self, end: float) -> None:
        """The planned stretch ends at ``end`` unless cut."""
        self._end = end
        self._keep = None

    def _find(self, time: float) -> tuple[int, float, float]:
        """The first planned iteration that ends at or after ``time``: (its index in the
        stretch, its end, its KV usage). The last one if none does."""
        items = self._items
        first = 0
        for i, item in enumerate(items):
            if len(item) == 2:
                runs, usage = item
                k = 0
                for run in runs:
                    start, steps, duration = run[0], run[1], run[2]
                    j, end = run_until(start, duration, time, steps)
                    if end >= time:
                        return first + k + j - 1, end, _at_row(usage, k + j - 1)
                    k += steps
                first += k
            else:
                values, n, usage = item
                starts = values[0]
                # the next item (its first run's or row's start) starts when this one's ends
                next_start = float(items[i + 1][0][0][0]) if i + 1 < len(items) else self._end
                ends = np.append(np.asarray(starts[1:n], dtype=float), next_start)
                j = int(np.searchsorted(ends, time, side="left"))
                if j < n:
                    return first + j, float(ends[j]), _at_row(usage, j)
                first += n
        raise AssertionError(f"no planned iteration ends at or after {time!r}")  # the end does

    def usage_at(self, time: float) -> float:
        """KV usage during the iteration under way at ``time`` (or just ended at it)."""
        return self._find(time)[2]

    def cut(self, time: float, *, passed: bool = False) -> float:
        """Stop the stretch at the first iteration that ends at or after ``time`` (after it,
        if ``passed``: the pass at ``time`` is over); return when it ends."""
        index, end, _ = self._find(math.nextafter(time, math.inf) if passed else time)
        if self._keep is None or index + 1 < self._keep:
            self._keep = index + 1
        return end

    def commit(self) -> int | None:
        """Log the stretch (up to its cut); return the iterations kept if it was cut."""
        keep = self._keep
        log = self.log
        left = keep
        for item in self._items:
            if left is not None and left <= 0:
                break
            if len(item) == 2:
                runs, usage = item
                if left is not None:
                    kept, total = [], 0
                    for run in runs:
                        if total + run[1] >= left:
                            kept.append((run[0], left - total, *run[2:]))
                            total = left
                            break
                        kept.append(run)
                        total += run[1]
                    runs, usage = kept, _head(usage, total)
                    left -= total
                log.add_runs(runs, usage)
            else:
                values, n, usage = item
                if left is not None:
                    if left < n:
                        n = left
                        values = tuple(_head(v, n) for v in values)
                        usage = _head(usage, n)
                    left -= n
                log.extend(values, n, usage)
        self._items = []
        self._keep = None
        return keep


def _at_row(value: Any, row: int) -> float:
    """Row ``row`` of a per-iteration column that may be one value for all."""
    if isinstance(value, np.ndarray) and value.ndim:
        return float(value[row])
    if isinstance(value, UsageRamp):
        return value.at(row)
    return float(value)


def _head(value: Any, n: int) -> Any:
    """The first ``n`` rows of a per-iteration column that may be one value for all (or a
    :class:`~batchsim.engine.kv_cache.UsageRamp`, whose rows are its steps)."""
    return value[:n] if isinstance(value, np.ndarray) and value.ndim else value
