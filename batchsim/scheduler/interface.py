"""The mechanism every batching policy shares.

A policy decides *which* requests run in the next iteration and *how many tokens* each
computes (:meth:`Scheduler.schedule`). Everything else lives here, once: admission checks
(requests that can never fit are rejected with a reason), KV-block allocation, preemption by
recompute or swap, appending sampled tokens, finishing at the output length, cancellation at
an iteration boundary and each request's timestamps.

The engine drives a scheduler through these calls: :meth:`add_request` for arrivals,
:meth:`cancel`, :meth:`schedule_iteration` (which calls the policy's :meth:`schedule`) ->
cost model -> :meth:`update_from_output`, :meth:`next_timer` when nothing runs, and
:meth:`set_end_of_input` when it learns whether further arrivals are known. A policy that
sets :attr:`Scheduler.decode_stretches` lets the engine advance a decode-only batch over
many iterations at once (:mod:`batchsim.engine.stretch`).

This module imports no simpy and nothing from the engine loop.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from batchsim.cost import BatchShape
from batchsim.engine.cohort import Cohort
from batchsim.engine.kv_cache import KVCacheManager, most_steps_that_fit, num_blocks_for
from batchsim.engine.prefix_cache import PrefixCachingKVCacheManager
from batchsim.engine.request import Request, RequestStatus
from batchsim.errors import ConfigError
from batchsim.scheduler.config import SchedulerConfig
from batchsim.scheduler.output import CohortBatch, SchedulerOutput, StepTimes

_new_shape = tuple.__new__  # builds a BatchShape without its Python-level __new__


@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler:
    """Base class of batching policies.

    Subclasses implement :meth:`schedule` (and optionally :meth:`next_timer`,
    :meth:`policy_reject_reason`, :meth:`on_request_left`, :meth:`policy_max_repeat`).
    Register them in :mod:`batchsim.scheduler.registry`, or name them as
    ``package.module:Class``.

    Args:
        config: The ``scheduler:`` block.
        kv_cache: The engine's block pool.
        window: Sliding-window length of the model (keys per query), or None.
        max_model_len: Longest sequence (prompt + output) the engine accepts, or None.
    """

    name: ClassVar[str] = ""
    abstract_methods: ClassVar[tuple[str, ...]] = ("schedule",)
    """The methods a policy must define (:func:`~batchsim.scheduler.registry.load_policy`
    refuses a class that does not). Not an ``abc.ABC``: the compiled build compiles this class,
    and a compiled class with a Python base would hold its subclasses' ``__dict__`` and weak
    references in a layout of its own."""
    config_keys: ClassVar[frozenset[str]] = frozenset({"policy", "max_num_seqs"})
    """Keys of :class:`SchedulerConfig` the policy reads (others are reported as unused)."""
    reserves_full_sequence: ClassVar[bool] = False
    """True if admission reserves KV for prompt + all output tokens (no preemption needed)."""
    decode_stretches: ClassVar[bool] = False
    """The policy's promise that lets the engine fast-forward: when :meth:`schedule` returns
    a decode-only batch (no preemption, no swap), it would return the same batch again, each
    request one token further along, at every following iteration until a request finishes,
    the KV cache runs short, or an arrival, cancellation or timer happens — and for at most
    :meth:`policy_max_repeat` iterations. The engine then runs those iterations in one step
    with identical results. False (the default, for policies written elsewhere): every
    iteration calls :meth:`schedule`."""

    drains_cohort: ClassVar[bool] = False
    """Declared (not inherited) by a built-in policy whose :meth:`schedule` runs its running
    requests first (:meth:`_schedule_running_batch`, or after its admissions, see
    :attr:`admits_before_running`) and fills the budget from the waiting queue, FCFS, with no
    timer and :meth:`policy_max_repeat` unbounded while the head of the queue would not be
    admitted (:meth:`admits_head`): its next iteration is then :meth:`_cohort_iteration`,
    and the engine runs its decode stretches on through their members' last tokens."""

    lends_running: ClassVar[bool] = False
    """Declared (not inherited) by a built-in policy whose :meth:`schedule` adds to the
    requests :meth:`_schedule_running_batch` returns only requests it put into ``running``
    through this class's methods: an iteration of the cohort alone then holds the running
    list itself as its requests, instead of a copy (work per iteration independent of the
    batch), and the next change to ``running`` copies it first (:meth:`_own_running`), so
    the iteration's requests stay as they were."""

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
        self.transferred: deque[Request] | None = None
        """A decode instance's requests whose KV arrived, waiting for a batch slot (see
        :meth:`add_transferred`); None elsewhere."""
        self.end_of_input = False
        """True while no further arrival is known (see :meth:`set_end_of_input`)."""
        self._swap_in_blocks = 0  # copied during the current schedule_iteration()
        self._swap_out_blocks = 0
        policy = type(self)
        self._lends = vars(policy).get("lends_running", False) is True
        self._lent: list[Request] | None = None
        """The running list an iteration holds as its requests (see :attr:`lends_running`)."""
        self._own_helpers = (
            policy.schedule_running is Scheduler.schedule_running
            and policy.make_output is Scheduler.make_output
        )
        """The helpers are this module's (a subclass that overrides one has it called)."""
        self._prefix: PrefixCachingKVCacheManager | None = (
            kv_cache if isinstance(kv_cache, PrefixCachingKVCacheManager) else None
        )
        """The KV cache when it caches prefixes (blocks are registered as requests compute
        them), else None."""
        self._cohort: Cohort | None = None
        """The running decodes advanced together (built-in policies that grow KV blocks as
        they decode, without a sliding window; see :mod:`batchsim.engine.cohort`)."""
        if (
            window is None
            and kv_cache.window is None
            and not self.reserves_full_sequence
            and self._own_helpers
        ):
            self._cohort = Cohort(kv_cache.block_size)

    @classmethod
    def check_config(cls, config: SchedulerConfig) -> None:
        """Reject settings the policy cannot run with (raise :class:`ConfigError`)."""
        uses_budget = "max_num_batched_tokens" in cls.config_keys
        if uses_budget and config.max_num_batched_tokens < config.max_num_seqs:
            raise ConfigError(
                f"scheduler.max_num_batched_tokens must be >= scheduler.max_num_seqs "
                f"({config.max_num_seqs}), got {config.max_num_batched_tokens}: every running "
                "request needs at least one token of the iteration's budget"
            )

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
        return self.engine_reject_reason(request) or self.policy_reject_reason(request)

    def engine_reject_reason(self, request: Request) -> str:
        """Why ``request`` can never fit this engine (its length, its KV cache), or ''."""
        total = request.num_prompt_tokens + request.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            return f"prompt+output {total} tokens > engine.max_model_len {self.max_model_len}"
        kv = self.kv_cache
        if not kv.can_ever_fit(total):
            need = num_blocks_for(total, kv.block_size)
            room = kv.num_blocks - kv.watermark_blocks
            above = " above the admission watermark" if kv.watermark_blocks else ""
            return f"needs {need} KV blocks > KV cache capacity {room}{above}"
        return ""

    def policy_reject_reason(self, request: Request) -> str:
        """Policy-specific reason to reject ``request`` at arrival ('' = accept)."""
        return ""

    # ------------------------------------------ a decode instance of a disaggregated cluster
    def add_transferred(self, request: Request) -> bool:
        """Take a request whose prompt was computed elsewhere and whose KV cache arrived with
        it (a decode instance of a disaggregated cluster). It holds the KV blocks of its
        prompt, so it needs no admission: it joins the running batch at the next
        :meth:`schedule_iteration` with a free batch slot (``max_num_seqs``), before anything
        waiting is admitted (as vLLM schedules a request once its remote KV is loaded), and
        the policy schedules it from then on like any running decode (its first token's KV,
        computed there, may need a new block). Its fit was checked before its KV moved
        (:meth:`engine_reject_reason`): never rejected."""
        if self.transferred is None:
            self.transferred = deque()
        self.transferred.append(request)
        return True

    def _own_running(self) -> list[Request]:
        """``running``, to change in place: a copy of it first if an iteration holds it as its
        requests (:attr:`lends_running`)."""
        running = self.running
        if running is self._lent:
            running = self.running = running.copy()
            self._lent = None
        return running

    def _admit_transferred(self, transferred: deque[Request]) -> None:
        running = self._own_running()
        while transferred and len(running) < self.max_num_seqs:
            request = transferred.popleft()
            request.status = RequestStatus.RUNNING
            running.append(request)

    def cancel(self, request: Request, now: float) -> None:
        """Drop a request whose client disconnected; called at an iteration boundary."""
        if request.status.is_final:
            return
        if request.status == RequestStatus.RUNNING:
            self._own_running().remove(request)
        elif request.status == RequestStatus.SWAPPED:
            self.swapped.remove(request)
        elif self.transferred and request in self.transferred:
            self.transferred.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_cache.free(request)
        request.status = RequestStatus.CANCELLED
        request.finish_time = now
        self.on_request_left(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.transferred)

    def set_end_of_input(self, ended: bool) -> None:
        """The engine says whether further arrivals are known: True when none is (open loop:
        the workload is exhausted; closed loop: every user waits for a reply), False when one
        becomes known again (closed loop). Request-level batching launches its last, partial
        batch at the end of input."""
        self.end_of_input = ended

    def schedule_iteration(self, now: float) -> Any:
        """The next iteration: the policy's :meth:`schedule`, with the KV blocks it copied
        between GPU and host memory (swaps) attached to the output. Returns what ``schedule()``
        returned, unchecked: the engine checks a policy written elsewhere."""
        self._swap_in_blocks = self._swap_out_blocks = 0
        transferred = self.transferred
        if transferred:
            self._admit_transferred(transferred)
        policy: Any = self  # (its answer is not assumed to be a SchedulerOutput, compiled or not)
        output = policy.schedule(now)
        if transferred and output.is_empty and len(self.running) < self.max_num_seqs:
            # the policy preempted its last running request: a request whose KV is here
            # takes the slot at this boundary (else nothing would wake the engine for it)
            self._admit_transferred(transferred)
            output = policy.schedule(now)
        if self._swap_in_blocks or self._swap_out_blocks:
            output.num_swap_in_blocks = self._swap_in_blocks
            output.num_swap_out_blocks = self._swap_out_blocks
        return output

    def schedule(self, now: float) -> SchedulerOutput:
        """Choose the next iteration's requests and tokens (empty output = nothing runnable).
        Build the output with :meth:`make_output`."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement schedule()")

    def next_timer(self, now: float) -> float | None:
        """A future time at which :meth:`schedule` may decide differently with no arrival
        (e.g. dynamic batching's max delay), or None."""
        return None

    def policy_max_repeat(self, output: SchedulerOutput) -> int:
        """With :attr:`decode_stretches`: how many iterations in a row the policy would run
        the decode-only ``output`` (default: until something else ends the stretch)."""
        return 1 << 62

    def update_from_output(self, output: SchedulerOutput, times: StepTimes) -> list[Request]:
        """Apply ``output``'s iterations (``times.num_steps`` of them, more than one only for
        a decode-only output of a policy with :attr:`decode_stretches`); return the requests
        that finished."""
        batch = self.cohort_batch(output)
        if batch is not None:
            return self._apply_batch(output, batch, times)
        requests = output.requests
        cohort = self._cohort
        if cohort is not None and cohort.n:  # request by request: members go their own way
            for request in requests:
                if request._group is not None:
                    request._group.detach(request)
        # no request of the iteration is in a cohort: their progress is their own fields
        finished: list[Request] = []
        first, end = times.first_iteration, times.end
        num_steps = times.num_steps
        if num_steps == 1:
            start = times.start
            for request, num_new in zip(requests, output.num_scheduled_tokens):
                if request.status != RequestStatus.RUNNING:
                    continue  # preempted later in the same schedule() call
                if request.first_scheduled_time != request.first_scheduled_time:  # NaN
                    request.first_scheduled_time = start
                computed = request._computed + num_new
                request._computed = computed
                if computed < request.num_prompt_tokens + request._outputs:
                    continue  # a non-final prompt chunk samples nothing
                if request._last == first - 1 >= 0:  # its token run goes on
                    request._last = first
                    request._outputs += 1
                else:
                    request.record_tokens(first, 1, end)
                if request._outputs >= request.max_tokens:
                    finished.append(request)
        else:
            if not self.reserves_full_sequence:
                self.kv_cache.grow(requests, num_steps)
            for request in requests:
                request._computed += num_steps
                request.record_tokens(first, num_steps, end)
                if request._outputs >= request.max_tokens:
                    assert request._outputs == request.max_tokens, "stretch overshot"
                    finished.append(request)
        if self._prefix is not None:
            self._register(requests)
        self._finish(finished, end)
        return finished

    def _register(self, requests: list[Request]) -> None:
        """Prefix caching: cache the keyed blocks the running ``requests`` completed."""
        assert self._prefix is not None
        register = self._prefix.register
        for request in requests:
            if request.status == RequestStatus.RUNNING:
                register(request)

    def _finish(self, finished: list[Request], end: float) -> None:
        for request in finished:
            request.status = RequestStatus.FINISHED
            request.finish_time = end
            self.kv_cache.free(request)
            self._own_running().remove(request)
            self.on_request_left(request)

    def on_request_left(self, request: Request) -> None:
        """Hook: ``request`` finished or was cancelled (request-level policies track slots)."""

    # ------------------------------------------------------------- helpers for policies
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

    # ------------------------------------------------- the cohort (built-in policies only)
    # The built-in continuous and chunked-prefill policies schedule their running requests
    # with _schedule_running_batch() and build the iteration with _batch_output(): the same
    # iteration as schedule_running() and make_output() would, with the cohort's members
    # handled as one (constant work per iteration however many they are). Whatever those
    # cannot decide without looking at every request (a preemption, a budget that ends
    # among the members) goes the general way.
    def cohort_batch(self, output: SchedulerOutput) -> CohortBatch | None:
        """How ``output`` was built around the cohort, while that still holds (else None)."""
        batch = output.batch
        if (
            batch is None
            or batch.version != batch.cohort.version
            or not batch.cohort.ahead
            or output.requests is not batch.requests
            or len(batch.requests) != batch.size
        ):
            return None
        return batch

    def prompt_chunk_repeat(self, output: SchedulerOutput) -> int:
        """For a policy whose :meth:`schedule` is defined next to this method: how many
        consecutive iterations would run ``output`` again, each decode one token further and
        its one prompt chunk as long, further along the prompt (1: none; see
        :mod:`batchsim.engine.stretch`). The promise includes that a whole chunk takes all
        the budget the decodes leave: a request arriving during those iterations waits and
        changes none of them (the engine hands it to :meth:`add_request` inside the stretch),
        and the prompt's last chunk, whose leftover budget it could take, is counted only
        while nothing waits."""
        return 1

    def _chunk_stretch_limit(self, output: SchedulerOutput) -> int:
        """How many consecutive iterations would repeat ``output`` when it is the cohort and,
        after it, one request's non-final prompt chunk taking the rest of the token budget.
        No budget is left, so nothing is admitted or resumed: the next iterations are the
        same, each chunk as long, up to the prompt's last chunk (included when nothing waits,
        is swapped out or runs unscheduled, so that its leftover budget has no taker), the first
        member's last token, or KV blocks running short (which would preempt)."""
        batch = self.cohort_batch(output)
        if batch is None or output.has_side_work:
            return 1
        chunk = prompt_chunk_of(output, batch)
        if chunk is None:
            return 1
        request, q = chunk
        remaining = request.num_remaining_tokens
        if remaining <= q:
            return 1  # the prompt's last chunk
        full = -(-remaining // q) - 1  # iterations with a whole chunk, this one included
        alone = not self.waiting and not self.swapped and len(self.running) == batch.members + 1
        steps = full + 1 if alone else full  # the last chunk's leftover budget is not taken
        steps = min(steps, batch.cohort.min_remaining())
        if self._prefix is not None:  # the last iteration may complete a keyed block
            steps = min(steps, self._prefix.steps_to_register(request, q))
        if steps <= 1:
            return 1
        kv = self.kv_cache
        computed, held, bs = request._computed, request._blocks, kv.block_size
        free = kv.num_free_blocks - kv.num_idle_blocks  # a stretch never evicts a cached block
        prompt_blocks = max(0, -(-(computed + remaining) // bs) - held)
        most = batch.members * ((steps - 1) // bs + 1) + prompt_blocks  # >= need(steps)
        if most <= free:
            return steps
        offsets = batch.cohort.offsets()

        def need(k: int) -> int:  # blocks the iterations after the first take
            tokens = k * q if k <= full else remaining
            blocks = -(-(computed + tokens) // bs) - held
            return kv.growth_from_offsets(offsets, k) + (blocks if blocks > 0 else 0)

        return most_steps_that_fit(need, steps, free)

    def _promote(self, cohort: Cohort) -> list[tuple[int, Request]]:
        """Let the running decodes outside the cohort join it; return (position, request)
        of the running requests still outside."""
        loose: list[tuple[int, Request]] = []
        running = self.running
        # Every member runs, so len(running) - cohort.n requests are outside; they are
        # usually the newest, at the end: look there first.
        outside: list[tuple[int, Request]] = []
        for i in range(cohort.n, len(running)):
            request = running[i]
            if request._group is cohort:  # not at the end after all: look at every one
                outside = [(i, r) for i, r in enumerate(running) if r._group is not cohort]
                break
            outside.append((i, request))
        for i, request in outside:
            # (a request with keyed blocks left to compute registers them on its own)
            if cohort.can_join(request) and (self._prefix is None or self._prefix.settled(request)):
                cohort.join(request)
            else:
                loose.append((i, request))
        return loose

    def _schedule_running_batch(
        self, token_budget: int, preempted: list[Request]
    ) -> tuple[list[Request], list[int], int, CohortBatch | None]:
        """:meth:`schedule_running`, and how the iteration is built around the cohort (None:
        built the general way)."""
        cohort = self._cohort
        running = self.running
        n = len(running)
        if cohort is not None and cohort.n == n and 0 < n <= token_budget:
            # every running request is a member (most iterations): one token each
            kv = self.kv_cache
            need = 0 if cohort.ahead else cohort.crossing()
            if need <= kv.num_free_blocks:
                kv.num_free_blocks -= need
                cohort.ahead = 1
                batch = CohortBatch(cohort, cohort.version, n, [], n)
                if self._lends:
                    self._lent = running
                    return running, [1] * n, token_budget - n, batch
                return running.copy(), [1] * n, token_budget - n, batch
        if cohort is not None and n and token_budget > 0:
            loose = self._promote(cohort) if cohort.n != n else []
            scheduled = self._schedule_around(cohort, loose, token_budget) if cohort.n else None
            if scheduled is not None:
                cut, chunks, left = scheduled
                tokens = [1] * cut
                for i, _, q in chunks:
                    tokens[i] = q
                batch = CohortBatch(cohort, cohort.version, cohort.n, chunks, cut)
                return running[:cut], tokens, left, batch
        return (*self.schedule_running(token_budget, preempted), None)

    admits_before_running: bool = False
    """With :attr:`drains_cohort`: the policy's :meth:`schedule` admits waiting requests
    before it schedules the running ones (and then runs no decode with them)."""

    def admits_head(self, running_tokens: int) -> bool:
        """With :attr:`drains_cohort`: whether :meth:`schedule` would admit the head of the
        waiting queue (there is one, a batch slot is free and nothing is swapped out) into an
        iteration whose running requests take ``running_tokens`` of the budget, given the KV
        blocks free when it would try (True: it might)."""
        return True

    def _head_may_join(self) -> bool:
        """A waiting request could join the next iteration as far as the queues go: one
        waits, a batch slot is free and no swapped-out request resumes first (whether it
        fits the budget and the KV cache is :meth:`admits_head`)."""
        return bool(self.waiting) and not self.swapped and len(self.running) < self.max_num_seqs

    def _cohort_iteration(self) -> Cohort | None:
        """The next iteration of a policy that :attr:`drains_cohort`, when that is the whole
        cohort and nothing else: nothing is swapped out or transferred, no waiting request
        would be admitted (:meth:`admits_head`), and every running request is a member (or
        joins, as :meth:`_schedule_running_batch` lets it). Takes the blocks of every
        member's next token, as that would, and returns the cohort; None if the iteration is
        anything else (with the state :meth:`schedule` would have reached at that point:
        requests joined, the members' blocks taken)."""
        cohort = self._cohort
        running = self.running
        n = len(running)
        if (
            cohort is None
            or not n
            or self.swapped
            or self.transferred
            or n > self.config.max_num_batched_tokens
            or (cohort.n != n and self._promote(cohort))
        ):
            return None
        waits = self._head_may_join()
        if waits and self.admits_before_running and self.admits_head(n):
            return None
        need = 0 if cohort.ahead else cohort.crossing()
        kv = self.kv_cache
        if need > kv.num_free_blocks:
            return None  # schedule_running() would preempt
        kv.num_free_blocks -= need
        cohort.ahead = 1
        if waits and not self.admits_before_running and self.admits_head(n):
            return None
        return cohort

    def _schedule_around(
        self, cohort: Cohort, loose: list[tuple[int, Request]], token_budget: int
    ) -> tuple[int, list[tuple[int, Request, int]], int] | None:
        """Schedule the running requests as :meth:`schedule_running` would when that needs
        no preemption and takes every cohort member: return (how many running requests,
        from the front, are scheduled; (position, request, tokens) of those outside the
        cohort; budget left), having taken their KV blocks. None (nothing changed) if it
        would preempt or leave a member out."""
        kv = self.kv_cache
        bs = kv.block_size
        n = len(self.running)
        need = 0 if cohort.ahead else cohort.crossing()
        left = token_budget
        chunks: list[tuple[int, Request, int]] = []
        cut = n
        prev = 0  # first position after the last request outside the cohort
        for i, request in loose:
            members = i - prev  # one token each
            if members >= left:  # the budget ends among them (or right after them)
                if members > left:
                    return None
                cut = i
                left = 0
                break
            left -= members
            computed = request._computed
            q = request.num_prompt_tokens + request._outputs - computed
            if q > left:
                q = left
            extra = -(-(computed + q) // bs) - request._blocks
            if extra > 0:
                need += extra
            chunks.append((i, request, q))
            left -= q
            prev = i + 1
            if left <= 0:
                cut = prev
                break
        else:
            members = n - prev
            if members > left:
                return None
            left -= members
        if cut < n and n - cut > sum(1 for i, _ in loose if i >= cut):
            return None  # a member after the cut would not run
        if need > kv.num_free_blocks:
            return None  # schedule_running() would preempt
        for _, request, q in chunks:
            total = request._computed + q
            if -(-total // bs) > request._blocks:
                allocated = kv.allocate(request, total)
                assert allocated, "the blocks were counted above"
        if not cohort.ahead:
            kv.num_free_blocks -= cohort.crossing()
            cohort.ahead = 1
        return cut, chunks, left

    def _batch_output(
        self,
        requests: list[Request],
        tokens: list[int],
        preempted: list[Request],
        batch: CohortBatch | None,
    ) -> SchedulerOutput:
        """:meth:`make_output` of an iteration built by :meth:`_schedule_running_batch` (and
        requests added after the running ones), or of any requests (``batch`` None)."""
        if batch is None:
            if self.window is not None or not self._own_helpers:
                return self.make_output(requests, tokens, preempted=preempted)
            members = kv_read = 0
            others = list(zip(range(len(requests)), requests, tokens))
        elif not batch.loose and len(requests) == batch.tail:  # the cohort alone
            members = batch.members
            kv_read = batch.cohort.context_tokens()
            shape = _new_shape(
                BatchShape, (members, 0, members, 0, members, kv_read, kv_read + members, 0, 0)
            )
            batch.requests, batch.size = requests, members
            return SchedulerOutput(
                requests, tokens, shape, 0, members, members, members, preempted, batch=batch
            )
        else:
            members = batch.members
            kv_read = batch.cohort.context_tokens()
            others = batch.loose
            if len(requests) > batch.tail:
                others = others + [
                    (i, requests[i], tokens[i]) for i in range(batch.tail, len(requests))
                ]
        decodes = num_decode = sampled = members
        pairs = kv_read + members
        prefill = 0
        for _, request, q in others:
            computed = request.num_computed_tokens
            outputs = request.num_output_tokens
            left = request.num_prompt_tokens + outputs - computed
            if left == 1 and outputs > 0:
                decodes += q
                num_decode += 1
            else:
                prefill += q
            sampled += q == left
            kv_read += computed
            pairs += q * computed + q * (q + 1) // 2
        n = len(requests)
        shape = _new_shape(BatchShape, (n, prefill, decodes, 0, sampled, kv_read, pairs, 0, 0))
        if batch is not None:
            batch.requests, batch.size = requests, n
        return SchedulerOutput(
            requests,
            tokens,
            shape,
            num_prefill_seqs=n - num_decode,
            num_decode_seqs=num_decode,
            num_slots=n,
            num_output_tokens=sampled,
            preempted=preempted,
            batch=batch,
        )

    def _apply_batch(
        self, output: SchedulerOutput, batch: CohortBatch, times: StepTimes
    ) -> list[Request]:
        """:meth:`update_from_output` of an iteration built around the cohort."""
        cohort = batch.cohort
        kv = self.kv_cache
        num_steps, first, end = times.num_steps, times.first_iteration, times.end
        requests = output.requests
        others = batch.loose
        if len(requests) > batch.tail:
            tokens = output.num_scheduled_tokens
            others = others + [
                (i, requests[i], tokens[i]) for i in range(batch.tail, len(requests))
            ]
        if not others:
            return self._advance_cohort(cohort, first, num_steps, end, requests)
        if num_steps > 1:
            kv.num_free_blocks -= kv.growth_from_offsets(cohort.offsets(), num_steps)
        cohort.tick(first, num_steps)
        done: list[tuple[int, Request]] = []
        if others and num_steps == 1:
            for i, request, num_new in others:
                if request.status != RequestStatus.RUNNING:
                    continue
                if request.first_scheduled_time != request.first_scheduled_time:  # NaN
                    request.first_scheduled_time = times.start
                request.num_computed_tokens += num_new
                if request.num_remaining_tokens > 0:
                    continue  # a non-final prompt chunk samples nothing
                request.record_tokens(first, 1, end)
                if request.num_output_tokens >= request.max_tokens:
                    done.append((i, request))
        elif others:  # a stretch: decodes outside the cohort, or a prompt's chunks
            decodes: list[tuple[int, Request, int]] = []
            for item in others:
                i, request, q = item
                remaining = request.num_remaining_tokens
                if remaining == q == 1:
                    decodes.append(item)
                elif remaining > q:  # chunks of q tokens, and maybe the prompt's last one
                    if request.first_scheduled_time != request.first_scheduled_time:
                        request.first_scheduled_time = times.start
                    full = -(-remaining // q) - 1
                    assert num_steps <= full + 1, "a stretch past the prompt's last chunk"
                    computed = num_steps * q if num_steps <= full else remaining
                    allocated = kv.allocate(request, request.num_computed_tokens + computed)
                    assert allocated, "a stretch of prompt chunks without its KV blocks"
                    request.num_computed_tokens += computed
                    if computed == remaining:  # the last chunk samples
                        request.record_tokens(first + num_steps - 1, 1, end)
                        if request.num_output_tokens >= request.max_tokens:
                            done.append((i, request))
            if decodes:
                kv.grow([r for _, r, _ in decodes], num_steps)
            for i, request, _ in decodes:
                request.num_computed_tokens += num_steps
                request.record_tokens(first, num_steps, end)
                if request.num_output_tokens >= request.max_tokens:
                    assert request.num_output_tokens == request.max_tokens, "stretch overshot"
                    done.append((i, request))
        if self._prefix is not None:
            self._register([request for _, request, _ in others])
        done += self._finished_members(cohort, requests)
        if not done:
            return []
        done.sort(key=lambda item: item[0])
        finished = [r for _, r in done]
        self._finish(finished, end)
        return finished

    def _advance_cohort(
        self, cohort: Cohort, first: int, num_steps: int, end: float, requests: list[Request]
    ) -> list[Request]:
        """:meth:`update_from_output` of ``num_steps`` iterations from ``first`` that ran the
        whole cohort and nothing else (``requests``, in the iteration's order): the members'
        blocks grow, the cohort ticks, and those that sampled their last token finish at
        ``end`` (returned in ``requests`` order)."""
        if num_steps > 1:
            kv = self.kv_cache
            kv.num_free_blocks -= kv.growth_from_offsets(cohort.offsets(), num_steps)
        cohort.tick(first, num_steps)
        done = self._finished_members(cohort, requests)
        if not done:
            return []
        if len(done) > 1:
            done.sort(key=lambda item: item[0])
        finished = [r for _, r in done]
        self._finish(finished, end)
        return finished

    @staticmethod
    def _finished_members(cohort: Cohort, requests: list[Request]) -> list[tuple[int, Request]]:
        """(position in ``requests``, request) of the members that sampled their last token,
        taken out of the cohort."""
        members = cohort.pop_finished()
        if not members:
            return []
        if len(members) > 8:
            where = {id(r): i for i, r in enumerate(requests)}
            done = [(where[id(r)], r) for r in members]
        else:
            done = [(requests.index(r), r) for r in members]
        for r in members:
            cohort.detach(r)
        return done


def prompt_chunk_of(output: SchedulerOutput, batch: CohortBatch) -> tuple[Request, int] | None:
    """(request, tokens) of the one request after the cohort's members in ``output``: a
    running request outside the cohort or one added after the running ones (None if the
    iteration is not the cohort and one such request)."""
    members = batch.members
    if len(output.requests) != members + 1:
        return None
    if batch.loose:
        if len(batch.loose) != 1 or batch.tail != members + 1 or batch.loose[0][0] != members:
            return None
        _, request, q = batch.loose[0]
    elif batch.tail == members:
        request, q = output.requests[members], output.num_scheduled_tokens[members]
    else:
        return None
    if request._group is not None:
        return None
    return request, q
