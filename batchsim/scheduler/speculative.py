"""Speculative decoding (``engine.speculative``): draft, verify, accept.

Each iteration, every decoding request of a speculative run (Leviathan et al. 2023; vLLM's
``speculative_config``):

1. **proposes** k' = min(k, tokens it still needs - 1) tokens: k' decode steps of a draft model
   on the same GPUs (``method: draft``), batched over the decoding requests, or k' steps of a
   draft-free proposer costing ``proposer_ms_per_token`` each (``ngram``, ``eagle``);
2. is **verified** by the target model in the iteration's forward pass as k' + 1 query rows
   over its cached context (its last sampled token and the drafts): a prefill-like chunk, so
   attention pairs and KV reads are those of k' + 1 rows, and every row goes through lm_head;
3. **accepts** the leading drafts that pass (each with probability alpha, given those before
   it did), then one bonus token from the target: 1 to k' + 1 tokens arrive together (one
   output chunk). The KV of the rejected drafts is freed: a request holds the blocks of its
   accepted context only.

The token budget (``max_num_batched_tokens``) counts the k' + 1 verification rows; a budget
that runs short proposes fewer drafts. A request whose iteration computes a prompt chunk (or a
recompute) proposes nothing. With ``method: draft`` the draft model also computes every
prompt chunk the target computes (it needs the prompt's KV), in its first step.

Randomness: request ``i`` draws from its own stream,
``numpy.random.SeedSequence(seed, spawn_key=(SPECULATIVE_STREAM, i))``: first its acceptance
rate if that is a distribution, then one uniform number per verification. The same request
thus sees the same acceptances whatever the batch it runs in, and the workload's streams
(children 0.. of ``SeedSequence(seed)``) are untouched.

Memory: the draft model's weights take memory next to the target's, and every KV block holds
the draft's KV of its tokens too (blocks are sized by the sum of the two models' KV bytes per
token). The proposer of ``ngram`` and ``eagle`` takes no memory (an EAGLE head's weights and
KV are left out).

Decode stretches are off for a speculative run: acceptance is random at every iteration, so
no two iterations repeat. The policies are the built-in continuous and chunked_prefill ones,
extended by :func:`speculative_policy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from batchsim.engine.request import Request
from batchsim.scheduler.fast_forward import fast_forward
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.scheduler.speculation import (
    Speculator,
    apply_verifications,
    schedule_verifications,
    verification_output,
)

if TYPE_CHECKING:
    pass


SPECULATIVE_POLICIES = ("continuous", "chunked_prefill")
"""Policies that run speculative decoding."""


@fast_forward()  # stepped: acceptance is random at every iteration
class SpeculativeScheduler(Scheduler):
    """What a built-in policy does differently in a speculative run (mixed in before it by
    :func:`speculative_policy`): decodes schedule k' + 1 verification tokens, the output
    carries the proposals' cost, and applying it accepts a random number of tokens."""

    speculative_base: ClassVar[type[Scheduler]]
    """The built-in policy extended."""
    speculator: Speculator

    def schedule_running(
        self, token_budget: int, preempted: list[Request]
    ) -> tuple[list[Request], list[int], int]:
        k = self.speculator.num_speculative_tokens
        return schedule_verifications(self, k, token_budget, preempted)

    def make_output(
        self,
        requests: list[Request],
        num_tokens: list[int],
        *,
        preempted: list[Request] | None = None,
        pad_prompts: bool = False,
        num_slots: int | None = None,
        compute_empty_slots: bool = False,
        padded_context: int | None = None,
    ) -> SchedulerOutput:
        assert not (pad_prompts or compute_empty_slots or padded_context), "packed batches only"
        assert num_slots is None or num_slots == len(requests), "no empty slots"
        return verification_output(self, self.speculator, requests, num_tokens, preempted or [])

    def update_from_output(self, output: SchedulerOutput, times: StepTimes) -> list[Request]:
        return apply_verifications(self, self.speculator, output, times)

    def on_request_left(self, request: Request) -> None:
        self.speculator.forget(request)
        super().on_request_left(request)


def speculative_policy(policy: type[Scheduler]) -> type[Scheduler]:
    """``policy`` (a built-in continuous or chunked_prefill policy) running speculative
    decoding (one class per policy)."""
    made = _SPECULATIVE.get(policy)
    if made is None:
        made = _SPECULATIVE[policy] = type(
            f"Speculative{policy.__name__}",
            (SpeculativeScheduler, policy),
            {"speculative_base": policy, "__module__": __name__},
        )
    return made


_SPECULATIVE: dict[type[Scheduler], type[Scheduler]] = {}
