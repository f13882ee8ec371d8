"""Static (request-level) batching.

The engine waits until ``max_num_seqs`` requests are queued, then runs that batch to
completion: one prefill iteration for all its prompts, then decode iterations in lockstep.
Membership never changes inside a batch: a finished request keeps an empty slot until the
whole batch ends (reported as slot waste), so short requests wait for the longest one.
Admission reserves KV for the prompt and every output token, so nothing is ever preempted.
At the end of input (no further arrival known) a last, partial batch launches: without it
static batching could never finish a workload whose size is not a multiple of the batch.

``padding: true`` (default, naive batched ``generate``): prompts are padded to the longest
one, and the KV cache is a rectangle: every row (finished ones included, as padding rows)
attends over the longest prompt plus the steps so far, and each slot reserves KV for the
longest prompt plus the longest output of the batch. ``padding: false`` packs prompt tokens
back to back, skips finished rows (their slots still stay empty) and reserves each request's
own length.
"""

from __future__ import annotations

from batchsim.engine.request import Request
from batchsim.scheduler.fast_forward import fast_forward
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput


@fast_forward(decode_stretches=True)
class StaticScheduler(Scheduler):
    name = "static"
    config_keys = frozenset({"policy", "max_num_seqs", "padding"})
    reserves_full_sequence = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_width = 0
        """Slots of the batch in flight (0 = no batch)."""
        self.batch_prompt_len = 0
        """Longest prompt of the batch in flight (the padded prompt length)."""

    def should_launch(self, now: float) -> bool:
        """Whether the queue justifies a new batch now."""
        return len(self.waiting) >= self.max_num_seqs or self.end_of_input

    def _form_batch(self) -> list[Request]:
        """The longest prefix of the waiting queue (at most ``max_num_seqs``) whose KV
        reservation fits, reserved and admitted."""
        kv = self.kv_cache
        pad = self.config.padding
        candidates: list[Request] = []
        longest_prompt = longest_output = packed_need = 0
        room = kv.num_free_blocks - kv.watermark_blocks
        for request in self.waiting:
            if len(candidates) == self.max_num_seqs:
                break
            prompt = max(longest_prompt, request.num_prompt_tokens)
            output = max(longest_output, request.max_tokens)
            own = kv.blocks_held(0, request.num_prompt_tokens + request.max_tokens)
            if pad:  # every slot reserves a row of the padded rectangle
                need = (len(candidates) + 1) * kv.blocks_held(0, prompt + output)
            else:
                need = packed_need + own
            if need > room:
                break
            candidates.append(request)
            longest_prompt, longest_output, packed_need = prompt, output, packed_need + own
        # With prefix caching the check above counts whole reservations, cached blocks
        # included (what each request reuses only lowers what it takes), so the batch is the
        # one formed without caching; then each member reuses its cached leading blocks.
        for request in candidates:
            tokens = (
                longest_prompt + longest_output
                if pad
                else request.num_prompt_tokens + request.max_tokens
            )
            reserved = self.admit_waiting(request, 1 << 62, reserve_tokens=tokens)
            assert reserved, "the reservation was checked above"
        return candidates

    def schedule(self, now: float) -> SchedulerOutput:
        pad = self.config.padding
        if self.batch_width == 0:
            if not self.waiting or not self.should_launch(now):
                return self.make_output([], [])
            batch = self._form_batch()
            if not batch:
                # blocks held outside any batch (a prefill instance's prompts whose KV has
                # not moved yet) come back at a known time: wait for them
                assert self.kv_cache.num_used_blocks, "an empty KV cache must hold any request"
                return self.make_output([], [])
            self.batch_width = len(batch)
            self.batch_prompt_len = max(r.num_prompt_tokens for r in batch)
            tokens = [r.num_remaining_tokens for r in batch]
            return self.make_output(batch, tokens, pad_prompts=pad)
        running = self.running
        padded_context = None
        if pad:  # lockstep: every row is as far past the longest prompt as any live one
            head = running[0]
            padded_context = (
                self.batch_prompt_len + head.num_computed_tokens - head.num_prompt_tokens
            )
        return self.make_output(
            list(running),
            [1] * len(running),
            num_slots=self.batch_width,
            compute_empty_slots=pad,
            padded_context=padded_context,
        )

    def on_request_left(self, request: Request) -> None:
        if self.batch_width and not self.running:
            self.batch_width = 0  # the whole batch has ended; the next one may form
