"""The mechanism every batching policy shares.

A policy decides *which* requests run in the next iteration and *how many tokens* each
computes (:meth:`Scheduler.schedule`). Everything else lives here, once: admission checks
(requests that can never fit are rejected with a reason), KV-block allocation, preemption by
recompute, appending sampled tokens, finishing at the output length, cancellation at an
iteration boundary, timestamps and inter-token-latency records.

The engine drives a scheduler with four calls per iteration: :meth:`add_request` for arrivals,
:meth:`schedule` -> cost model -> :meth:`update_from_output`, and :meth:`max_repeat_steps` to
learn how many identical decode iterations may follow (a decode-only stretch with no
arrival, completion or KV event in between is advanced in one go).

This module imports no simpy and nothing from the engine.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from batchsim.cost import BatchShape
from batchsim.engine.kv_cache import KVCacheManager, num_blocks_for
from batchsim.engine.request import Request, RequestStatus
from batchsim.metrics.logs import ItlLog
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.validation import (
    MAX_BATCH_TOKENS,
    MAX_MS,
    MAX_REQUESTS,
    FieldError,
    StrictBool,
    StrictFloat,
    StrictInt,
)
from batchsim.yamlio import data_problem


class SchedulerConfig(BaseModel):
    """The ``scheduler:`` block of an experiment. Policies read the keys they need."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    policy: str = "continuous"
    """static | dynamic | continuous | chunked_prefill, or ``package.module:Class``."""
    max_num_seqs: StrictInt = Field(256, ge=1, le=MAX_REQUESTS)
    """Batch cap B: most requests in one iteration (and, for request-level policies, in a batch)."""
    max_num_batched_tokens: StrictInt = Field(8192, ge=1, le=MAX_BATCH_TOKENS)
    """Most new tokens in one iteration (B x S); the chunked-prefill token budget."""
    max_wait_ms: StrictFloat = Field(50.0, ge=0, le=MAX_MS)
    """dynamic: launch a batch when the oldest queued request has waited this long (ms)."""
    padding: StrictBool = True
    """static/dynamic: pad prompts to the longest one and keep computing finished rows
    (naive batched generate); false packs tokens and skips finished rows."""
    mix_prefill_decode: StrictBool = False
    """continuous: false = an iteration with prefills runs no decodes (vLLM v0);
    true = prefills and decodes share the iteration (Orca selective batching)."""
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    """What happens to a request evicted from a full KV cache: ``recompute`` drops its KV and
    recomputes it when the request is scheduled again (vLLM's default); ``swap`` copies its
    blocks to host memory (``engine.swap_space_gib``) and back before it resumes, paying the
    host link's transfer time; when the swap space is full it recomputes instead."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Free-form settings for out-of-tree policies (``package.module:Class``): plain data
    (strings, finite numbers, booleans, null, lists, mappings), bounded like a YAML file."""

    @field_validator("options")
    @classmethod
    def _plain_bounded_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = data_problem(value)
        if problem is not None:
            raise FieldError(*problem)
        return value


class Scheduler(abc.ABC):
    """Base class of batching policies.

    Subclasses implement :meth:`schedule` (and optionally :meth:`next_timer`,
    :meth:`policy_reject_reason`, :meth:`policy_max_repeat`). Register them in
    :mod:`batchsim.scheduler.registry`, or name them as ``package.module:Class``.

    Args:
        config: The ``scheduler:`` block.
        kv_cache: The engine's block pool.
        window: Sliding-window length of the model (tokens), or None.
        max_model_len: Longest sequence (prompt + output) the engine accepts, or None.
    """

    name: ClassVar[str] = ""
    config_keys: ClassVar[frozenset[str]] = frozenset({"policy", "max_num_seqs"})
    """Keys of :class:`SchedulerConfig` the policy reads (others are reported as unused)."""
    reserves_full_sequence: ClassVar[bool] = False
    """True if admission reserves KV for prompt + all output tokens (no preemption needed)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        *,
        window: int | None = None,
        max_model_len: int | None = None,
    ):
        self.config = config
        self.kv_cache = kv_cache
        self.window = window
        self.max_model_len = max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        """Requests preempted by swapping, in the order they resume."""
        self.num_preemptions = 0
        self.num_swaps = 0
        self._swap_in_blocks = 0  # copied since the last make_output()
        self._swap_out_blocks = 0
        self.itl = ItlLog()
        self.arrivals_pending = True
        """Set by the engine: False once no further arrival is known (lets request-level
        policies launch a last, partial batch)."""

    # ---------------------------------------------------------------- engine-facing calls
    def add_request(self, request: Request) -> bool:
        """Queue an arrival, or reject it (status REJECTED, reason set) if it can never run."""
        reason = self.reject_reason(request)
        if reason:
            request.status = RequestStatus.REJECTED
            request.reject_reason = reason
            return False
        self.waiting.append(request)
        return True

    def reject_reason(self, request: Request) -> str:
        """Why ``request`` can never be served, or '' if it can."""
        total = request.num_prompt_tokens + request.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            return f"prompt+output {total} tokens > engine.max_model_len {self.max_model_len}"
        if not self.kv_cache.can_ever_fit(total):
            need = num_blocks_for(total, self.kv_cache.block_size)
            return f"needs {need} KV blocks > KV cache capacity {self.kv_cache.num_blocks}"
        return self.policy_reject_reason(request)

    def policy_reject_reason(self, request: Request) -> str:
        """Policy-specific reason to reject ``request`` at arrival ('' = accept)."""
        return ""

    def cancel(self, request: Request, now: float) -> None:
        """Drop a request whose client disconnected; called at an iteration boundary."""
        if request.status.is_final:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.SWAPPED:
            self.swapped.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_cache.free(request)
        request.status = RequestStatus.CANCELLED
        request.finish_time = now
        self.on_request_left(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @abc.abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """Choose the next iteration's requests and tokens (empty output = nothing runnable)."""

    def next_timer(self, now: float) -> float | None:
        """A future time at which :meth:`schedule` may decide differently with no arrival
        (e.g. dynamic batching's max delay), or None."""
        return None

    def policy_max_repeat(self, output: SchedulerOutput) -> int:
        """Policy limit on repeating a decode-only ``output`` (default: unlimited)."""
        return 1 << 62

    def max_repeat_steps(self, output: SchedulerOutput) -> int:
        """How many consecutive iterations would run exactly this decode-only batch.

        Bounded by the first request to finish (its last token ends the stretch), by the KV
        blocks the growing contexts need, and by the policy. 1 for anything but pure decode,
        and for an iteration that preempted or swapped.
        """
        if not output.is_decode_only or output.num_prefill_seqs or output.has_side_work:
            return 1  # preemptions and swaps belong to one iteration
        if self.swapped and len(self.running) < self.max_num_seqs:
            head = self.swapped[0]
            if self.kv_cache.can_swap_in(head, head.num_computed_tokens + 1):
                return 1  # the next schedule() may resume it; free blocks only shrink later
        steps = min(r.max_tokens - r.num_output_tokens for r in output.requests)
        steps = min(steps, self.policy_max_repeat(output))
        if steps > 1 and not self.reserves_full_sequence:
            steps = self._kv_limited_steps(output.requests, steps)
        return max(1, steps)

    def update_from_output(
        self, output: SchedulerOutput, times: StepTimes | Sequence[float]
    ) -> list[Request]:
        """Apply ``output``'s iterations, ending at ``times``; return finished requests.

        More than one iteration is allowed only for a decode-only output and no more than
        :meth:`max_repeat_steps` allowed. ``times`` may be the end of every iteration.
        """
        if not isinstance(times, StepTimes):
            times = StepTimes.from_ends(times)
        num_steps = times.num_steps
        end = times.last_end
        first_end = times.first_end
        finished: list[Request] = []
        # Requests that emitted their previous token together share one gap: group them.
        gaps: dict[float, int] = {}
        if num_steps == 1:
            for request, num_new in zip(output.requests, output.num_scheduled_tokens):
                if request.status != RequestStatus.RUNNING:
                    continue  # preempted later in the same schedule() call
                request.num_computed_tokens += num_new
                if (
                    request.num_computed_tokens
                    < request.num_prompt_tokens + request.num_output_tokens
                ):
                    continue  # a non-final prompt chunk samples nothing
                request.num_output_tokens += 1
                if request.num_output_tokens == 1:
                    request.first_token_time = end
                else:
                    last = request.last_token_time
                    gaps[last] = gaps.get(last, 0) + 1
                request.last_token_time = end
                if request.num_output_tokens >= request.max_tokens:
                    finished.append(request)
        else:
            block = self.kv_cache.block_size
            new_blocks = 0
            for request in output.requests:
                last = request.last_token_time
                gaps[last] = gaps.get(last, 0) + 1
                grown = request.num_computed_tokens + num_steps
                blocks = -(-grown // block)
                if blocks > request.num_blocks:
                    new_blocks += blocks - request.num_blocks
                    request.num_blocks = blocks
                request.num_computed_tokens = grown
                request.num_output_tokens += num_steps
                request.last_token_time = end
                if request.num_output_tokens >= request.max_tokens:
                    assert request.num_output_tokens == request.max_tokens, "stretch overshot"
                    finished.append(request)
            self.kv_cache.take(new_blocks)
        itl = self.itl
        for last, count in gaps.items():
            itl.add(first_end, first_end - last, count)
        if num_steps > 1:
            n = len(output.requests)
            for start, gap, first, last in times.later:
                itl.add_run(start, gap, n, first, last)
            if times.later_arrays is not None:
                itl.extend(*times.later_arrays, n)
        for request in finished:
            request.status = RequestStatus.FINISHED
            request.finish_time = end
            self.kv_cache.free(request)
            self.running.remove(request)
            self.on_request_left(request)
        return finished

    def on_request_left(self, request: Request) -> None:
        """Hook: ``request`` finished or was cancelled (request-level policies track slots)."""

    # ------------------------------------------------------------- helpers for policies
    def make_output(
        self,
        requests: list[Request],
        num_tokens: list[int],
        now: float,
        *,
        preempted: list[Request] | None = None,
        pad_prompts: bool = False,
        num_slots: int | None = None,
        compute_empty_slots: bool = False,
    ) -> SchedulerOutput:
        """Build a :class:`SchedulerOutput` and its :class:`BatchShape` (one pass, O(batch)).

        Args:
            pad_prompts: Pad every prefill row to the longest one (rectangular prefill).
            num_slots: Batch width including empty slots (default: ``len(requests)``).
            compute_empty_slots: Empty slots still run as padding rows (naive static batching).
        """
        window = self.window
        prefill_tokens = decode_tokens = sampled = kv_read = pairs = 0
        num_prefill = num_decode = 0
        longest = max(num_tokens) if (pad_prompts and num_tokens) else 0
        padding = 0
        for request, q in zip(requests, num_tokens):
            if request.first_scheduled_time != request.first_scheduled_time:  # NaN: first time
                request.first_scheduled_time = now
            computed = c = request.num_computed_tokens
            known = request.num_prompt_tokens + request.num_output_tokens
            if window is not None and c > window:
                c = window
            if request.num_output_tokens and computed + 1 == known:
                num_decode += 1
                decode_tokens += q
                rows = q
            else:
                num_prefill += 1
                prefill_tokens += q
                rows = longest if longest > q else q
                padding += rows - q
            kv_read += c
            pairs += rows * c + rows * (rows + 1) // 2
            if computed + q == known:
                sampled += 1
        num_outputs = sampled
        slots = len(requests) if num_slots is None else num_slots
        if compute_empty_slots:
            empty = slots - len(requests)
            padding += empty
            sampled += empty
        shape = BatchShape(
            num_seqs=len(requests),
            num_prefill_tokens=prefill_tokens,
            num_decode_tokens=decode_tokens,
            num_padding_tokens=padding,
            num_sampled_tokens=sampled,
            kv_read_tokens=kv_read,
            attn_pairs=pairs,
        )
        swap_in, swap_out = self._swap_in_blocks, self._swap_out_blocks
        self._swap_in_blocks = self._swap_out_blocks = 0
        return SchedulerOutput(
            requests=requests,
            num_scheduled_tokens=num_tokens,
            shape=shape,
            num_prefill_seqs=num_prefill,
            num_decode_seqs=num_decode,
            num_slots=slots,
            num_output_tokens=num_outputs,
            preempted=preempted or [],
            num_swap_in_blocks=swap_in,
            num_swap_out_blocks=swap_out,
        )

    def admit(self, request: Request) -> None:
        """Move the head of the waiting queue into the running set."""
        popped = self.waiting.popleft()
        assert popped is request, "admit() takes the head of the waiting queue"
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def preempt(self, request: Request) -> None:
        """Evict a running request. By recompute: free its KV and send it to the front of the
        waiting queue. By swap (``preemption_mode: swap``, when the host swap space has
        room): copy its blocks to host memory and queue it to resume with its progress."""
        self.running.remove(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        kv = self.kv_cache
        if self.config.preemption_mode == "swap" and kv.can_swap_out(request):
            self._swap_out_blocks += kv.swap_out(request)
            request.num_swaps += 1
            self.num_swaps += 1
            request.status = RequestStatus.SWAPPED
            self.swapped.append(request)
            return
        kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def schedule_swapped(
        self, token_budget: int, requests: list[Request], tokens: list[int]
    ) -> int:
        """Resume swapped requests, oldest first, while the batch cap, the token budget and
        the KV cache allow: copy their blocks back and schedule their next tokens (one for
        a decode; a chunk of what is left of a prompt). Returns the budget left."""
        kv = self.kv_cache
        while self.swapped and len(self.running) < self.max_num_seqs and token_budget > 0:
            request = self.swapped[0]
            q = min(request.num_remaining_tokens, token_budget)
            if not kv.can_swap_in(request, request.num_computed_tokens + q):
                break
            self.swapped.popleft()
            self._swap_in_blocks += kv.swap_in(request, request.num_computed_tokens + q)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            requests.append(request)
            tokens.append(q)
            token_budget -= q
        return token_budget

    def allocate_or_preempt(
        self, request: Request, num_tokens: int, preempted: list[Request]
    ) -> bool:
        """Grow ``request`` to ``num_tokens`` KV tokens, preempting the lowest-priority
        running requests (the most recently admitted) until it fits.

        Returns False if ``request`` itself had to be preempted. Callers walk
        ``self.running`` front to back, so a victim is never one already scheduled.
        """
        while not self.kv_cache.allocate(request, num_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def schedule_running(
        self, token_budget: int, preempted: list[Request]
    ) -> tuple[list[Request], list[int], int]:
        """Schedule every running request in order: decodes take one token, unfinished
        prompts a chunk of what is left of the budget. Returns (requests, tokens, budget left).
        """
        requests: list[Request] = []
        tokens: list[int] = []
        i = 0
        running = self.running
        block = self.kv_cache.block_size
        while i < len(running) and token_budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            q = request.num_prompt_tokens + request.num_output_tokens - computed
            if q > token_budget:
                q = token_budget
            # Most decode steps need no new block: check inline before the general path.
            if -(-(computed + q) // block) > request.num_blocks and not self.allocate_or_preempt(
                request, computed + q, preempted
            ):
                break
            requests.append(request)
            tokens.append(q)
            token_budget -= q
            i += 1
        return requests, tokens, token_budget

    def _kv_limited_steps(self, requests: Sequence[Request], steps: int) -> int:
        """Largest k <= steps such that every request can grow by k tokens without preemption
        (the first step's blocks are already allocated)."""
        kv = self.kv_cache
        block = kv.block_size
        free = kv.num_free_blocks

        def need(k: int) -> int:
            total = 0
            for r in requests:
                extra = -(-(r.num_computed_tokens + k) // block) - r.num_blocks
                if extra > 0:
                    total += extra
            return total

        if need(steps) <= free:
            return steps
        lo, hi = 1, steps  # need(lo) <= free (step 1 is allocated), need(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo
