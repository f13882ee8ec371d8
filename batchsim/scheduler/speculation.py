"""Speculative decoding's work at every iteration: proposals and their price, verification
rows, acceptance draws (:class:`Speculator`), and the iterations of a speculative policy
(:func:`schedule_verifications`, :func:`verification_output`, :func:`apply_verifications`).

What speculative decoding is and how a run uses it is :mod:`batchsim.scheduler.speculative`'s;
this module is the mechanism it calls, compiled with the engine loop (a speculative run is
stepped: acceptance is random at every iteration, so no two iterations repeat). Each request
draws from its own stream, a block of uniform numbers at a time
(:class:`AcceptanceStream`): the same numbers, in the same order, as one draw per
verification.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from mypy_extensions import mypyc_attr

from batchsim.cost import BatchShape
from batchsim.cost.costs import StepCost
from batchsim.engine.request import Request, RequestStatus
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.scheduler.toolkit import SchedulerToolkit

if TYPE_CHECKING:
    from batchsim.cost import RooflineCostModel
    from batchsim.scheduler.config import SpeculativeConfig

SPECULATIVE_STREAM = 1000
"""First spawn key of the acceptance streams (see :mod:`batchsim.scheduler.speculative`)."""
DRAWS_PER_BLOCK = 64
"""Uniform numbers a request's stream draws at a time."""
_new_shape = tuple.__new__  # builds a BatchShape without its Python-level __new__


class AcceptanceStream:
    """One request's acceptance randomness: its rate and its uniform numbers, drawn from its
    own generator :data:`DRAWS_PER_BLOCK` at a time (``Generator.random(n)`` gives the numbers
    ``n`` calls of ``Generator.random()`` would)."""

    def __init__(self, rng: Any, alpha: float):
        self.rng = rng
        self.alpha = alpha
        self._log_alpha = math.log(alpha) if 0.0 < alpha < 1.0 else 0.0
        self._block: list[float] = []
        self._next = 0

    def next_uniform(self) -> float:
        """The stream's next uniform number in [0, 1)."""
        i = self._next
        if i == len(self._block):
            self._block = self.rng.random(DRAWS_PER_BLOCK).tolist()
            i = 0
        self._next = i + 1
        return self._block[i]

    def leading_successes(self, num_drafts: int) -> int:
        """How many of ``num_drafts`` drafts are accepted: the leading successes of
        Bernoulli(alpha) trials, from the next uniform u (as 1 - u in (0, 1]): at least s
        with probability P(1 - u <= alpha^s) = alpha^s."""
        u = 1.0 - self.next_uniform()
        alpha = self.alpha
        if alpha >= 1.0:
            return num_drafts
        if alpha <= 0.0:
            return 0
        leading = math.log(u) / self._log_alpha
        return num_drafts if leading >= num_drafts else int(leading)


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
        self._streams: dict[int, AcceptanceStream] = {}
        self.num_verifications = 0
        """Verification steps of a request with at least one draft."""
        self.num_draft_tokens = 0
        """Drafts proposed."""
        self.num_accepted_tokens = 0
        """Drafts accepted."""

    # ----------------------------------------------------------------- acceptance
    def _stream(self, request: Request) -> AcceptanceStream:
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
        found = AcceptanceStream(rng, alpha)
        self._streams[request.request_id] = found
        return found

    def acceptance_rate(self, request: Request) -> float:
        """Alpha of ``request``."""
        return self._stream(request).alpha

    def accept(self, request: Request, num_drafts: int) -> int:
        """How many of ``num_drafts`` drafts of ``request`` are accepted
        (:meth:`AcceptanceStream.leading_successes` of its stream), counted."""
        accepted = self._stream(request).leading_successes(num_drafts)
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


@mypyc_attr(allow_interpreted_subclasses=True)
class SpeculativeOutput(SchedulerOutput):
    """A :class:`SchedulerOutput` with the proposals of the iteration."""

    __slots__ = ("num_verify_tokens", "propose_cost")

    num_verify_tokens: int
    """Verification rows (k' + 1 per verifying request, counted with the prefill tokens of
    the shape, as the cost model prices them)."""
    propose_cost: StepCost | None
    """GPU cost of the drafts, before the target's pass."""


def with_proposals(cost: StepCost, propose: StepCost) -> StepCost:
    """An iteration's cost with its proposals' (run on the GPU before the target's
    verification pass; the bound margin is the target's)."""
    return StepCost(
        cost.time + propose.time,
        cost.flops + propose.flops,
        cost.bytes + propose.bytes,
        cost.weight_bytes + propose.weight_bytes,
        cost.kv_bytes + propose.kv_bytes,
        cost.margin,
    )


def schedule_verifications(
    scheduler: SchedulerToolkit, k: int, token_budget: int, preempted: list[Request]
) -> tuple[list[Request], list[int], int]:
    """``schedule_running`` of a speculative policy: every running request in order, a decode
    taking 1 + k' verification rows (k' = min(k, tokens it still needs - 1)), an unfinished
    prompt a chunk of what is left of the budget; KV blocks taken, preempting when they run
    short. Returns (requests, tokens, budget left)."""
    requests: list[Request] = []
    tokens: list[int] = []
    i = 0
    running = scheduler.running
    block = scheduler.kv_cache.block_size
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
        if -(-(computed + q) // block) > request.num_blocks and not scheduler.allocate_or_preempt(
            request, computed + q, preempted
        ):
            break
        requests.append(request)
        tokens.append(q)
        token_budget -= q
        i += 1
    return requests, tokens, token_budget


def verification_output(
    scheduler: SchedulerToolkit,
    speculator: Speculator,
    requests: list[Request],
    num_tokens: list[int],
    preempted: list[Request],
) -> SpeculativeOutput:
    """``make_output`` of a speculative policy: a verifying decode's 1 + k' rows are a chunk
    (its attention pairs and KV reads those of k' + 1 rows) whose every row goes through
    lm_head; the proposals' cost rides along."""
    contexts: list[int] = []
    decode: list[bool] = []
    sampled: list[bool] = []
    drafts: list[tuple[int, int]] = []
    prefills: list[tuple[int, int, bool]] = []
    num_outputs = num_decode = verify = 0
    prefill_rows = decode_rows = kv_read = pairs = num_sampled = 0
    counts: Any = num_tokens  # (a policy's; the engine checks them)
    for request, q in zip(requests, counts):
        c, outputs = request.num_computed_tokens, request.num_output_tokens
        left = request.num_prompt_tokens + outputs - c
        contexts.append(c)
        is_decode = left == 1 and outputs > 0
        num_decode += is_decode
        kv_read += c
        pairs += q * c + q * (q + 1) // 2
        if is_decode and q > 1:  # verification: a chunk of q rows, each through lm_head
            decode.append(False)
            sampled.append(True)
            drafts.append((c, q - 1))
            verify += q
            num_outputs += 1
            prefill_rows += q
            num_sampled += 1
            continue
        samples = q == left
        decode.append(is_decode)
        sampled.append(samples)
        num_outputs += samples
        num_sampled += samples
        if is_decode:
            decode_rows += q
        else:
            prefill_rows += q
            prefills.append((q, c, samples))
    n = len(requests)
    if scheduler.window is None and n and (num_decode < n or verify):
        # the aggregates BatchShape.from_requests computes, without a window
        shape = _new_shape(
            BatchShape,
            (n, prefill_rows, decode_rows, 0, num_sampled, kv_read, pairs, 0, 0, None, None),
        )
    else:
        shape = BatchShape.from_requests(
            num_tokens, contexts, decode=decode, sampled=sampled, window=scheduler.window
        )
    if verify:  # every verification row samples (the shape counted one per request)
        shape = shape._replace(num_sampled_tokens=shape.num_sampled_tokens + verify - len(drafts))
    output = SpeculativeOutput(
        requests=requests,
        num_scheduled_tokens=num_tokens,
        shape=shape,
        num_prefill_seqs=n - num_decode,
        num_decode_seqs=num_decode,
        num_slots=n,
        num_output_tokens=num_outputs,
        preempted=preempted,
        context_tokens=contexts,
    )
    output.num_verify_tokens = verify
    output.propose_cost = speculator.propose_cost(drafts, prefills)
    return output


def apply_verifications(
    scheduler: SchedulerToolkit,
    speculator: Speculator,
    output: SchedulerOutput,
    times: StepTimes,
) -> list[Request]:
    """``update_from_output`` of a speculative policy: a verifying decode accepts its leading
    drafts and one bonus token (1 to k' + 1 tokens, one output chunk) and frees the KV of the
    rejected ones; the rest as usual. Returns the requests that finished."""
    assert times.num_steps == 1, "a speculative run steps one iteration at a time"
    finished: list[Request] = []
    first, end, start = times.first_iteration, times.end, times.start
    kv = scheduler.kv_cache
    bs = kv.block_size
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
    if scheduler._prefix is not None:
        scheduler._register(output.requests)
    scheduler._finish(finished, end)
    return finished
