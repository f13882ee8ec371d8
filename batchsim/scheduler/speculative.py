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

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from batchsim.cost import BatchShape
from batchsim.cost.costs import StepCost
from batchsim.engine.request import Request, RequestStatus
from batchsim.scheduler.fast_forward import fast_forward
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes

if TYPE_CHECKING:
    from batchsim.cost import RooflineCostModel
    from batchsim.scheduler.config import SpeculativeConfig

SPECULATIVE_STREAM = 1000
"""First spawn key of the acceptance streams (see the module)."""

SPECULATIVE_POLICIES = ("continuous", "chunked_prefill")
"""Policies that run speculative decoding."""


class Speculator:
    """One engine's speculative decoding: the proposer's price, the acceptance draws and the
    counters of the summary.

    Args:
        config: The ``engine.speculative`` block.
        seed: The run's seed.
        draft_cost_model: The draft model on the engine's GPUs (``method: draft``), else None.
    """

    def __init__(
        self,
        config: SpeculativeConfig,
        seed: int,
        draft_cost_model: RooflineCostModel | None = None,
    ):
        self.config = config
        self.num_speculative_tokens = config.num_speculative_tokens
        self.seed = seed
        self.draft_cost_model = draft_cost_model
        self.draft_window = (
            None if draft_cost_model is None else draft_cost_model.model.sliding_window
        )
        self.proposer_time = config.proposer_ms_per_token / 1e3
        """Seconds per proposal step of the batch (ngram, eagle)."""
        rate = config.acceptance_rate
        self._fixed_rate = rate if isinstance(rate, float) else None
        self._streams: dict[int, tuple[np.random.Generator, float]] = {}
        self.num_verifications = 0
        """Verification steps of a request with at least one draft."""
        self.num_draft_tokens = 0
        """Drafts proposed."""
        self.num_accepted_tokens = 0
        """Drafts accepted."""

    # ----------------------------------------------------------------- acceptance
    def _stream(self, request: Request) -> tuple[np.random.Generator, float]:
        found = self._streams.get(request.request_id)
        if found is not None:
            return found
        seq = np.random.SeedSequence(self.seed, spawn_key=(SPECULATIVE_STREAM, request.request_id))
        rng = np.random.default_rng(seq)
        alpha = self._fixed_rate
        if alpha is None:
            dist = self.config.acceptance_rate
            assert not isinstance(dist, float)
            if dist.dist == "beta":
                assert dist.a is not None and dist.b is not None
                alpha = float(rng.beta(dist.a, dist.b))
            else:
                assert dist.low is not None and dist.high is not None
                alpha = float(rng.uniform(dist.low, dist.high))
        found = (rng, alpha)
        self._streams[request.request_id] = found
        return found

    def acceptance_rate(self, request: Request) -> float:
        """Alpha of ``request``."""
        return self._stream(request)[1]

    def accept(self, request: Request, num_drafts: int) -> int:
        """How many of ``num_drafts`` drafts of ``request`` are accepted: the leading
        successes of Bernoulli(alpha) trials, from one uniform draw u in (0, 1]: at least s
        with probability P(u <= alpha^s) = alpha^s."""
        rng, alpha = self._stream(request)
        u = 1.0 - rng.random()
        if alpha >= 1.0:
            accepted = num_drafts
        elif alpha <= 0.0:
            accepted = 0
        else:
            leading = math.log(u) / math.log(alpha)
            accepted = num_drafts if leading >= num_drafts else int(leading)
        self.num_verifications += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += accepted
        return accepted

    def forget(self, request: Request) -> None:
        """``request`` left the engine."""
        self._streams.pop(request.request_id, None)

    # ----------------------------------------------------------------- proposing
    def propose_cost(
        self, drafts: list[tuple[int, int]], prefills: list[tuple[int, int, bool]]
    ) -> StepCost | None:
        """GPU cost of the proposals of one iteration: ``drafts`` holds (cached context,
        drafts) of each verifying request, ``prefills`` (tokens, cached context, samples) of
        each prompt chunk the iteration computes. None if nothing is proposed."""
        steps = max((d for _, d in drafts), default=0)
        draft = self.draft_cost_model
        if draft is None:
            if not steps:
                return None
            t = steps * self.proposer_time
            return StepCost(t, 0.0, 0.0, 0.0, 0.0, 0.0)
        if not steps and not prefills:
            return None
        window = self.draft_window
        totals = [0.0] * 5
        for j in range(max(steps, 1)):
            new: list[int] = []
            context: list[int] = []
            decode: list[bool] = []
            sampled: list[bool] = []
            if j == 0:  # the draft computes the prompt chunks too, with its first step
                for q, c, samples in prefills:
                    new.append(q)
                    context.append(c)
                    decode.append(False)
                    sampled.append(samples)
            for c, d in drafts:
                if d > j:
                    new.append(1)
                    context.append(c + j)
                    decode.append(True)
                    sampled.append(True)
            shape = BatchShape.from_requests(
                new, context, decode=decode, sampled=sampled, window=window
            )
            cost = draft.step_cost(shape)
            for i in range(5):
                totals[i] += cost[i]
        time, flops, nbytes, weight_bytes, kv_bytes = totals
        return StepCost(time, flops, nbytes, weight_bytes, kv_bytes, 0.0)

    # ----------------------------------------------------------------- summary
    def summary(self) -> dict[str, float]:
        return summary_of([self])


def summary_of(speculators: list[Speculator]) -> dict[str, float]:
    """``mean_acceptance_length`` (tokens a verifying request emits per verification, the
    bonus token included) and ``draft_acceptance_rate`` (accepted / proposed drafts) over
    the whole run (every replica)."""
    steps = sum(s.num_verifications for s in speculators)
    proposed = sum(s.num_draft_tokens for s in speculators)
    accepted = sum(s.num_accepted_tokens for s in speculators)
    return {
        "mean_acceptance_length": (accepted + steps) / steps if steps else math.nan,
        "draft_acceptance_rate": accepted / proposed if proposed else math.nan,
    }


class SpeculativeOutput(SchedulerOutput):
    """A :class:`SchedulerOutput` with the proposals of the iteration."""

    __slots__ = ("num_verify_tokens", "propose_cost")

    num_verify_tokens: int
    """Verification rows (k' + 1 per verifying request, counted with the prefill tokens of
    the shape, as the cost model prices them)."""
    propose_cost: StepCost | None
    """GPU cost of the drafts, before the target's pass."""


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
        requests: list[Request] = []
        tokens: list[int] = []
        i = 0
        running = self.running
        block = self.kv_cache.block_size
        k = self.speculator.num_speculative_tokens
        while i < len(running) and token_budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            outputs = request.num_output_tokens
            q = request.num_prompt_tokens + outputs - computed
            if q == 1 and outputs > 0:  # a decode: verify k' drafts
                drafts = request.max_tokens - outputs - 1
                q = 1 + (k if k < drafts else drafts)
            if q > token_budget:
                q = token_budget
            if -(-(computed + q) // block) > request.num_blocks and not self.allocate_or_preempt(
                request, computed + q, preempted
            ):
                break
            requests.append(request)
            tokens.append(q)
            token_budget -= q
            i += 1
        return requests, tokens, token_budget

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
        contexts: list[int] = []
        decode: list[bool] = []
        sampled: list[bool] = []
        drafts: list[tuple[int, int]] = []
        prefills: list[tuple[int, int, bool]] = []
        num_outputs = num_decode = verify = 0
        for request, q in zip(requests, num_tokens):
            c, outputs = request.num_computed_tokens, request.num_output_tokens
            left = request.num_prompt_tokens + outputs - c
            contexts.append(c)
            is_decode = left == 1 and outputs > 0
            num_decode += is_decode
            if is_decode and q > 1:  # verification: a chunk of q rows, each through lm_head
                decode.append(False)
                sampled.append(True)
                drafts.append((c, q - 1))
                verify += q
                num_outputs += 1
                continue
            samples = q == left
            decode.append(is_decode)
            sampled.append(samples)
            num_outputs += samples
            if not is_decode:
                prefills.append((q, c, samples))
        shape = BatchShape.from_requests(
            num_tokens, contexts, decode=decode, sampled=sampled, window=self.window
        )
        if verify:  # every verification row samples (the shape counted one per request)
            shape = shape._replace(
                num_sampled_tokens=shape.num_sampled_tokens + verify - len(drafts)
            )
        output = SpeculativeOutput(
            requests=requests,
            num_scheduled_tokens=num_tokens,
            shape=shape,
            num_prefill_seqs=len(requests) - num_decode,
            num_decode_seqs=num_decode,
            num_slots=len(requests) if num_slots is None else num_slots,
            num_output_tokens=num_outputs,
            preempted=preempted or [],
            context_tokens=contexts,
        )
        output.num_verify_tokens = verify
        output.propose_cost = self.speculator.propose_cost(drafts, prefills)
        return output

    def update_from_output(self, output: SchedulerOutput, times: StepTimes) -> list[Request]:
        assert times.num_steps == 1, "a speculative run steps one iteration at a time"
        finished: list[Request] = []
        first, end, start = times.first_iteration, times.end, times.start
        kv = self.kv_cache
        bs = kv.block_size
        speculator = self.speculator
        for request, q in zip(output.requests, output.num_scheduled_tokens):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted later in the same schedule() call
            if request.first_scheduled_time != request.first_scheduled_time:  # NaN
                request.first_scheduled_time = start
            computed = request.num_computed_tokens
            outputs = request.num_output_tokens
            if q > 1 and outputs > 0 and request.num_prompt_tokens + outputs - computed == 1:
                emitted = speculator.accept(request, q - 1) + 1
                request.num_computed_tokens = computed + emitted
                request.record_burst(first, emitted, end)
                keep = -(-(computed + emitted) // bs)
                rejected = request.num_blocks - keep  # blocks of rejected drafts only
                if rejected > 0:
                    request.num_blocks = keep
                    kv.num_free_blocks += rejected
            else:
                computed += q
                request.num_computed_tokens = computed
                if computed < request.num_prompt_tokens + outputs:
                    continue  # a non-final prompt chunk samples nothing
                request.record_tokens(first, 1, end)
            if request.num_output_tokens >= request.max_tokens:
                assert request.num_output_tokens == request.max_tokens, "accepted too many"
                finished.append(request)
        if self._prefix is not None:
            self._register(output.requests)
        self._finish(finished, end)
        return finished

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
