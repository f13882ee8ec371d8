"""Chunked prefill (Sarathi-Serve, vLLM v1).

Each iteration has a token budget, ``max_num_batched_tokens``. Running requests go first in
admission order: a decode takes one token, an unfinished prompt takes a chunk of what is left.
Waiting requests then fill the rest of the budget, their prompts split across iterations when
they do not fit. Non-final chunks emit no token. No new request is admitted in an iteration
that had to preempt. With ``preemption_mode: swap``, swapped-out requests resume (oldest first)
after the running ones, and new requests are admitted only once none is left swapped out.
"""

from __future__ import annotations

from batchsim.engine.request import Request
from batchsim.scheduler.fast_forward import fast_forward
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput


@fast_forward(decode_stretches=True, drains_cohort=True, lends_running=True)
class ChunkedPrefillScheduler(Scheduler):
    name = "chunked_prefill"
    config_keys = frozenset({"policy", "max_num_seqs", "max_num_batched_tokens", "preemption_mode"})

    def schedule(self, now: float) -> SchedulerOutput:
        preempted: list[Request] = []
        requests, tokens, budget, batch = self._schedule_running_batch(
            self.config.max_num_batched_tokens, preempted
        )
        if not preempted and self.swapped:
            budget = self.schedule_swapped(budget, requests, tokens)
        if not preempted and not self.swapped:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                request = self.waiting[0]
                q = self.admit_waiting(request, budget, chunked=True)
                if not q:
                    break
                requests.append(request)
                tokens.append(q)
                budget -= q
        return self._batch_output(requests, tokens, preempted, batch)

    def prompt_chunk_repeat(self, output: SchedulerOutput) -> int:
        # A non-final chunk takes what the decodes leave of the budget: the next iteration
        # admits and resumes nothing, and its chunk is as long while the prompt lasts.
        return self._chunk_stretch_limit(output)

    def admits_head(self, running_tokens: int) -> bool:
        # the head gets what the running requests leave of the budget, a chunk of its prompt
        left = self.config.max_num_batched_tokens - running_tokens
        return left > 0 and bool(
            self.admit_waiting(self.waiting[0], left, chunked=True, check_only=True)
        )

    def policy_max_repeat(self, output: SchedulerOutput) -> int:
        # A waiting request that could be admitted would change the next iteration. It would
        # get what the batch leaves of the budget, as now: if its chunk does not fit the KV
        # cache now, it does not later in the stretch either (free blocks never grow during
        # a stretch, and the batch, hence what it leaves, stays the same).
        if self._head_may_join() and self.admits_head(sum(output.num_scheduled_tokens)):
            return 1
        return 1 << 62
