"""Static (request-level) batching.

The engine waits until ``max_num_seqs`` requests are queued (the last, partial batch launches
once no further arrival is expected), then runs that batch to completion: one prefill
iteration for all its prompts, then decode iterations in lockstep. Membership never changes
inside a batch: a finished request keeps an empty slot until the whole batch ends (reported as
slot waste), so short requests wait for the longest one. Admission reserves KV for the prompt
and every output token, so nothing is ever preempted.

``padding: true`` (default, naive batched ``generate``): prompts are padded to the longest one,
and finished rows keep being computed as padding until the batch ends. ``padding: false`` packs
prompt tokens back to back and skips finished rows (their slots still stay empty).
"""

from __future__ import annotations

from batchsim.engine.request import Request
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput


class StaticScheduler(Scheduler):
    name = "static"
    config_keys = frozenset({"policy", "max_num_seqs", "padding"})
    reserves_full_sequence = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_width = 0
        """Slots of the batch in flight (0 = no batch)."""
        self.num_batches = 0

    def should_launch(self, now: float) -> bool:
        """Whether the queue justifies a new batch now."""
        return len(self.waiting) >= self.max_num_seqs or not self.arrivals_pending

    def schedule(self, now: float) -> SchedulerOutput:
        pad = self.config.padding
        if self.batch_width == 0:
            if not self.waiting or not self.should_launch(now):
                return self.make_output([], [], now)
            batch: list[Request] = []
            kv = self.kv_cache
            while self.waiting and len(batch) < self.max_num_seqs:
                request = self.waiting[0]
                if not kv.allocate(request, request.num_prompt_tokens + request.max_tokens):
                    break  # the batch is as large as the KV cache allows
                self.admit(request)
                batch.append(request)
            assert batch, "an empty KV cache must hold any accepted request"
            self.batch_width = len(batch)
            self.num_batches += 1
            tokens = [r.num_remaining_tokens for r in batch]
            return self.make_output(batch, tokens, now, pad_prompts=pad)
        running = self.running
        return self.make_output(
            list(running),
            [1] * len(running),
            now,
            num_slots=self.batch_width,
            compute_empty_slots=pad,
        )

    def on_request_left(self, request: Request) -> None:
        if self.batch_width and not self.running:
            self.batch_width = 0  # the whole batch has ended; the next one may form
