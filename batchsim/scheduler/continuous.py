"""Continuous (iteration-level) batching, as in Orca and vLLM.

Membership is decided again at every iteration under ``max_num_seqs`` and
``max_num_batched_tokens``: a finished request leaves at once and a waiting one joins at the
next iteration. A prompt is always prefilled whole, in one iteration.

- ``mix_prefill_decode: false`` (default, vLLM v0): prefill first. An iteration that admits
  new requests runs only their prefills; the running decodes stall for that iteration.
- ``mix_prefill_decode: true`` (Orca selective batching): the running decodes and the new
  prefills share one iteration, whose length the prefill dominates.

KV blocks grow as tokens are produced; when they run out, the most recently admitted request is
preempted (recompute, or swap with ``preemption_mode: swap``). As in vLLM v0, swapped-out
requests resume (oldest first) in an iteration without preemption, and no new prompt is
admitted while any is left swapped out.
"""

from __future__ import annotations

from typing import Any

from batchsim.engine.request import Request
from batchsim.scheduler.fast_forward import fast_forward
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput


@fast_forward(decode_stretches=True, drains_cohort=True, lends_running=True)
class ContinuousScheduler(Scheduler):
    name = "continuous"
    config_keys = frozenset(
        {
            "policy",
            "max_num_seqs",
            "max_num_batched_tokens",
            "mix_prefill_decode",
            "preemption_mode",
        }
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mixes = bool(self.config.mix_prefill_decode)  # None: the default, no mixing
        # without mixing, prompts are admitted before the running requests are scheduled
        self.admits_before_running = not self._mixes

    def policy_reject_reason(self, request: Request) -> str:
        budget = self.config.max_num_batched_tokens
        if request.num_prompt_tokens > budget:
            return (
                f"prompt of {request.num_prompt_tokens} tokens > "
                f"scheduler.max_num_batched_tokens {budget} (only chunked_prefill splits prompts)"
            )
        return ""

    def _admit_prefills(
        self, token_budget: int, num_running: int, requests: list[Request], tokens: list[int]
    ) -> None:
        """Admit waiting requests, whole prompts, FCFS, while the budget, the batch cap and
        the KV cache allow. A preempted request whose recompute (prompt + generated tokens)
        is longer than the whole budget could never fit: it runs as the first prefill of an
        iteration, over budget, rather than never."""
        first = True
        max_budget = self.config.max_num_batched_tokens
        while self.waiting and num_running < self.max_num_seqs:
            request = self.waiting[0]
            q = self.admit_waiting(
                request, token_budget, over_budget_above=max_budget if first else None
            )
            if not q:
                break
            requests.append(request)
            tokens.append(q)
            token_budget -= q
            num_running += 1
            first = False

    def schedule(self, now: float) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        preempted: list[Request] = []
        if not self._mixes:
            if not self.swapped:
                prefills: list[Request] = []
                prefill_tokens: list[int] = []
                self._admit_prefills(budget, len(self.running), prefills, prefill_tokens)
                if prefills:
                    return self._batch_output(prefills, prefill_tokens, preempted, None)
            requests, tokens, left, batch = self._schedule_running_batch(budget, preempted)
            if not preempted and self.swapped:
                self.schedule_swapped(left, requests, tokens)
            return self._batch_output(requests, tokens, preempted, batch)
        requests, tokens, left, batch = self._schedule_running_batch(budget, preempted)
        if not preempted and self.swapped:
            left = self.schedule_swapped(left, requests, tokens)
        if not preempted and not self.swapped and left > 0:
            self._admit_prefills(left, len(self.running), requests, tokens)
        return self._batch_output(requests, tokens, preempted, batch)

    def policy_max_repeat(self, output: SchedulerOutput) -> int:
        if self._prefix is not None and len(output.requests) < len(self.running):
            # prefills first: a recompute whose last token alone was left (its other tokens
            # found in the prefix cache) looks like a decode, but the running decodes it
            # stalled run with it at the next iteration
            return 1
        # A waiting request that could be admitted would change the next iteration. It is
        # asked with the budget schedule() would give it (mixed: what the batch leaves), and
        # free blocks never grow during a stretch: if it does not fit now, it does not later.
        if self._head_may_join() and self.admits_head(sum(output.num_scheduled_tokens)):
            return 1
        return 1 << 62

    def admits_head(self, running_tokens: int) -> bool:
        # whole prompts, FCFS, the first one over budget if it could never fit otherwise;
        # without mixing, before the running requests (the whole budget)
        budget = self.config.max_num_batched_tokens
        left = budget - running_tokens if self._mixes else budget
        return left > 0 and bool(
            self.admit_waiting(self.waiting[0], left, over_budget_above=budget, check_only=True)
        )
