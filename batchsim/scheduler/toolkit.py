"""The helpers a policy calls to build its iteration: :class:`SchedulerToolkit`.

Admission (:meth:`~SchedulerToolkit.admit_waiting`, :meth:`~SchedulerToolkit.admit`), KV-block
allocation with preemption (:meth:`~SchedulerToolkit.allocate_or_preempt`,
:meth:`~SchedulerToolkit.preempt`: by recompute, or by swap to host memory), resuming swapped
requests (:meth:`~SchedulerToolkit.schedule_swapped`), scheduling the running requests
(:meth:`~SchedulerToolkit.schedule_running`) and the iteration's output with its shape
(:meth:`~SchedulerToolkit.make_output`). They are documented for policy authors in
:mod:`batchsim.scheduler.interface`. This module imports no simpy.
"""

from __future__ import annotations

from typing import Any

from mypy_extensions import mypyc_attr

from batchsim.cost import BatchShape
from batchsim.engine.request import Request, RequestStatus
from batchsim.scheduler.core import SchedulerCore
from batchsim.scheduler.output import SchedulerOutput


@mypyc_attr(allow_interpreted_subclasses=True)
class SchedulerToolkit(SchedulerCore):
    """:class:`~batchsim.scheduler.core.SchedulerCore` with the helpers policies call (see
    the module docstring)."""

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
        """Build the :class:`SchedulerOutput` of ``requests`` computing ``num_tokens`` each,
        and its :class:`BatchShape`. Changes nothing.

        Args:
            preempted: Requests evicted while building the iteration.
            pad_prompts: Pad every prefill row to the longest one (rectangular prefill).
            num_slots: Batch width including empty slots (default: ``len(requests)``).
            compute_empty_slots: Empty slots still run, as one-row padding sequences (naive
                static batching).
            padded_context: Every row (and empty slot) attends over this many cached tokens:
                the rectangular KV cache of naive batched generation. Default: each request's
                own ``num_computed_tokens``.
        """
        computed: list[int] = []
        decode: list[bool] = []
        sampled: list[bool] = []
        num_outputs = num_decode = 0
        plain = self._cohort is None or not self._cohort.n  # no request is in a cohort
        counts: Any = num_tokens  # (a policy's; the engine checks them, compiled or not)
        for request, q in zip(requests, counts):
            if plain:
                c, outputs = request._computed, request._outputs
            else:
                c, outputs = request.num_computed_tokens, request.num_output_tokens
            left = request.num_prompt_tokens + outputs - c
            computed.append(c)
            is_decode = left == 1 and outputs > 0
            decode.append(is_decode)
            num_decode += is_decode
            samples = bool(q == left)
            sampled.append(samples)
            num_outputs += samples
        contexts = computed if padded_context is None else [padded_context] * len(requests)
        slots = len(requests) if num_slots is None else num_slots
        empty = slots - len(requests) if compute_empty_slots else 0
        shape = BatchShape.from_requests(
            num_tokens,
            contexts,
            decode=decode,
            sampled=sampled,
            pad_to=max(num_tokens) if (pad_prompts and num_tokens) else None,
            num_padding_seqs=empty,
            padding_context=padded_context or 0,
            window=self.window,
            hybrid_window=self.kv_cache.hybrid_window,
        )
        return SchedulerOutput(
            requests=requests,
            num_scheduled_tokens=num_tokens,
            shape=shape,
            num_prefill_seqs=len(requests) - num_decode,
            num_decode_seqs=num_decode,
            num_slots=slots,
            num_output_tokens=num_outputs,
            preempted=preempted or [],
            context_tokens=contexts,
            padding_context=padded_context or 0,
        )

    def admit(self, request: Request) -> None:
        """Move the head of the waiting queue into the running set."""
        popped = self.waiting.popleft()
        assert popped is request, "admit() takes the head of the waiting queue"
        request.status = RequestStatus.RUNNING
        self._own_running().append(request)

    def admit_waiting(
        self,
        request: Request,
        token_budget: int,
        *,
        chunked: bool = False,
        over_budget_above: int | None = None,
        reserve_tokens: int | None = None,
        check_only: bool = False,
    ) -> int:
        """Admit ``request``, the head of the waiting queue, if the token budget and the KV
        cache (above its watermark) allow; return the tokens it computes in this iteration
        (0: not admitted, nothing changed). Every built-in policy admits through here.

        With prefix caching, the leading blocks of its sequence found cached count as
        computed (at least one token is always left to compute), the tokens scheduled are
        what is left after them, and admission takes a reference to each (an idle cached
        block is taken from the free blocks) and new blocks only for the rest. Its first
        admission records ``num_cached_tokens``.

        Args:
            token_budget: Tokens the iteration has left.
            chunked: Take what the budget allows of the prompt (else all of it or nothing).
            over_budget_above: Whole prompts only: one longer than this (the whole budget)
                may exceed ``token_budget`` (a recompute that could never fit otherwise).
            reserve_tokens: KV to allocate, in tokens (default: up to the scheduled ones).
            check_only: Only say whether it would be admitted (the tokens), changing nothing.
        """
        computed = request._computed  # a waiting request is in no cohort: its own fields
        left = request.num_prompt_tokens + request._outputs - computed
        hits = 0
        prefix = self._prefix
        if prefix is not None and not computed:
            hits = prefix.num_cached_prefix_blocks(request)
            left -= hits * prefix.block_size
        if chunked:
            q = left if left < token_budget else token_budget
        elif left > token_budget and (over_budget_above is None or left <= over_budget_above):
            return 0
        else:
            q = left
        if q <= 0:
            return 0
        if hits:
            return self._admit_cached(request, hits, q, reserve_tokens, check_only)
        kv = self.kv_cache
        tokens = computed + q if reserve_tokens is None else reserve_tokens
        if check_only:
            return q if kv.can_allocate(request, tokens, admission=True) else 0
        if not kv.allocate(request, tokens, admission=True):
            return 0
        self.admit(request)
        return q

    def _admit_cached(
        self,
        request: Request,
        hits: int,
        q: int,
        reserve_tokens: int | None,
        check_only: bool,
    ) -> int:
        """:meth:`admit_waiting` of a request whose first ``hits`` blocks are cached."""
        prefix = self._prefix
        assert prefix is not None
        cached = hits * prefix.block_size
        tokens = cached + q if reserve_tokens is None else reserve_tokens
        if check_only:
            need = prefix.admission_blocks(request, tokens, hits)
            return q if need <= prefix.num_free_blocks - prefix.watermark_blocks else 0
        if not prefix.allocate_admission(request, tokens, hits):
            return 0
        if not request.num_preemptions:  # its first admission
            request.num_cached_tokens = cached
        self.admit(request)
        return q

    def preempt(self, request: Request) -> None:
        """Evict a running request. By recompute: free its KV and send it to the front of the
        waiting queue. By swap (``preemption_mode: swap``, when the host swap space has
        room): copy its blocks to host memory and queue it to resume with its progress."""
        self._own_running().remove(request)
        request.num_preemptions += 1
        kv = self.kv_cache
        if self.config.preemption_mode == "swap" and kv.can_swap_out(request):
            self._swap_out_blocks += kv.swap_out(request)
            request.num_swaps += 1
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
        the KV cache (above its watermark) allow: copy their blocks back and schedule their
        next tokens (one for a decode; a chunk of what is left of a prompt). Returns the
        budget left."""
        kv = self.kv_cache
        while self.swapped and len(self.running) < self.max_num_seqs and token_budget > 0:
            request = self.swapped[0]
            q = min(request.num_remaining_tokens, token_budget)
            if not kv.can_swap_in(request, request.num_computed_tokens + q):
                break
            self.swapped.popleft()
            self._swap_in_blocks += kv.swap_in(request, request.num_computed_tokens + q)
            request.status = RequestStatus.RUNNING
            self._own_running().append(request)
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
        running = self._own_running()  # (a preemption below changes it in place)
        block = self.kv_cache.block_size
        windowed = self.kv_cache.window is not None  # blocks may be freed: always allocate
        while i < len(running) and token_budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            q = request.num_prompt_tokens + request.num_output_tokens - computed
            if q > token_budget:
                q = token_budget
            # Most decode steps need no new block: check inline before the general path.
            if (
                windowed or -(-(computed + q) // block) > request.num_blocks
            ) and not self.allocate_or_preempt(request, computed + q, preempted):
                break
            requests.append(request)
            tokens.append(q)
            token_budget -= q
            i += 1
        return requests, tokens, token_budget
