"""Dynamic (request-level) batching with a time window.

Like static batching, but a batch launches when ``max_num_seqs`` requests are queued **or**
the oldest queued request has waited ``max_wait_ms``, whichever comes first. It decides by the
queue and its timer only (unlike static batching, it does not look at whether more requests
will come). The timer is exact: the engine wakes at ``arrival_time + max_wait_ms`` of the
oldest queued request, and a request arriving at exactly that instant joins the batch
(arrivals at a time are visible to a ``schedule()`` at the same time). Then the batch runs to
completion as in static batching.
"""

from __future__ import annotations

from batchsim.scheduler.static import StaticScheduler


class DynamicScheduler(StaticScheduler):
    name = "dynamic"
    config_keys = frozenset({"policy", "max_num_seqs", "padding", "max_wait_ms"})

    def deadline(self) -> float:
        """When the oldest queued request's wait expires (s)."""
        return self.waiting[0].arrival_time + self.config.max_wait_ms / 1000.0

    def should_launch(self, now: float) -> bool:
        return len(self.waiting) >= self.max_num_seqs or now >= self.deadline()

    def next_timer(self, now: float) -> float | None:
        if self.batch_width or not self.waiting:
            return None
        deadline = self.deadline()
        return deadline if deadline > now else None
