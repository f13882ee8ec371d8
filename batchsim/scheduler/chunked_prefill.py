"""Chunked prefill (Sarathi-Serve, vLLM v1, SGLang).

Each iteration has a token budget, ``max_num_batched_tokens``; a prompt longer than what is
left of it is split across iterations, and non-final chunks emit no token.

- ``mix_prefill_decode: true`` (default, vLLM v1): running requests go first in admission
  order, a decode taking one token and an unfinished prompt a chunk of what is left; waiting
  requests then fill the rest of the budget.
- ``mix_prefill_decode: false`` (SGLang's default, without ``--enable-mixed-chunk``): prefill
  first. While a prompt is being chunked or a waiting request can be admitted, the iteration
  runs prompt chunks only, up to the budget (the unfinished prompt first, then new requests
  FCFS, the last one cut at the budget), and the running decodes stall for it; otherwise it is
  a decode iteration. A burst of prompts is prefilled before any of them decodes.

No new request is admitted in an iteration that had to preempt. With ``preemption_mode:
swap``, swapped-out requests resume (oldest first) after the running ones, and new requests
are admitted only once none is left swapped out.
"""

from __future__ import annotations

from typing import Any

from batchsim.engine.request import Request
from batchsim.scheduler.fast_forward import fast_forward
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput


@fast_forward(decode_stretches=True, drains_cohort=True, lends_running=True)
class ChunkedPrefillScheduler(Scheduler):
    name = "chunked_prefill"
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
        mix = self.config.mix_prefill_decode
        self._mixes = True if mix is None else mix
        # prefill first: prompts are admitted before the running requests are scheduled
        self.admits_before_running = not self._mixes

    def schedule(self, now: float) -> SchedulerOutput:
        if not self._mixes and not self.swapped:
            prefill = self._prefill_iteration()
            if prefill is not None:
                return prefill
        preempted: list[Request] = []
        requests, tokens, budget, batch = self._schedule_running_batch(
            self.config.max_num_batched_tokens, preempted
        )
        if not preempted and self.swapped:
            budget = self.schedule_swapped(budget, requests, tokens)
        if self._mixes and not preempted and not self.swapped:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                request = self.waiting[0]
                q = self.admit_waiting(request, budget, chunked=True)
                if not q:
                    break
                requests.append(request)
                tokens.append(q)
                budget -= q
        return self._batch_output(requests, tokens, preempted, batch)

    def _prefill_iteration(self) -> SchedulerOutput | None:
        """Prefill first: the next chunk of the prompt cut last time, then new requests'
        prompts, within the budget; None if there is none (a decode iteration follows).

        The prompt cut last time is the last running request: it was the last one admitted,
        and nothing is admitted after it while it lasts (so each virtual engine of a pipeline
        sees its own, with no state kept here)."""
        budget = self.config.max_num_batched_tokens
        requests: list[Request] = []
        tokens: list[int] = []
        preempted: list[Request] = []
        cut = False
        running = self.running
        if running:
            last = running[-1]
            left = last.num_remaining_tokens
            if left > 1:  # more than its next token: a prompt (or a recompute) cut short
                q = min(left, budget)
                if self.allocate_or_preempt(last, last.num_computed_tokens + q, preempted):
                    requests.append(last)
                    tokens.append(q)
                    budget -= q
                    cut = q < left
        while (
            not preempted
            and not cut
            and self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            request = self.waiting[0]
            q = self.admit_waiting(request, budget, chunked=True, reserve_tokens=_whole(request))
            if not q:
                break
            requests.append(request)
            tokens.append(q)
            budget -= q
            cut = q < request.num_remaining_tokens  # cut at the budget; its KV is allocated
        if not requests and not preempted:
            return None
        return self._batch_output(requests, tokens, preempted, None)

    def prompt_chunk_repeat(self, output: SchedulerOutput) -> int:
        # A non-final chunk takes what the decodes leave of the budget: the next iteration
        # admits and resumes nothing, and its chunk is as long while the prompt lasts.
        # (Prefill first builds its iterations without the cohort: never a chunk stretch.)
        return self._chunk_stretch_limit(output) if self._mixes else 1

    def admits_head(self, running_tokens: int) -> bool:
        # the head gets what the running requests leave of the budget (prefill first: all
        # of it), a chunk of its prompt
        budget = self.config.max_num_batched_tokens
        head = self.waiting[0]
        if not self._mixes:
            return bool(
                self.admit_waiting(
                    head, budget, chunked=True, reserve_tokens=_whole(head), check_only=True
                )
            )
        left = budget - running_tokens
        return left > 0 and bool(self.admit_waiting(head, left, chunked=True, check_only=True))

    def policy_max_repeat(self, output: SchedulerOutput) -> int:
        # A waiting request that could be admitted would change the next iteration. It would
        # get what the batch leaves of the budget, as now: if its chunk does not fit the KV
        # cache now, it does not later in the stretch either (free blocks never grow during
        # a stretch, and the batch, hence what it leaves, stays the same).
        if self._head_may_join() and self.admits_head(sum(output.num_scheduled_tokens)):
            return 1
        return 1 << 62


def _whole(request: Request) -> int:
    """Prefill first admits a prompt only with KV blocks for all of it (SGLang's prefill
    adder checks the whole input against the free tokens): its later chunks never wait for
    blocks that decodes, stalled by prefill, would never free."""
    return request.num_prompt_tokens + request.num_output_tokens
