"""The running decodes advanced together, and what fast-forward asks of a policy:
:class:`CohortScheduling`.

The built-in continuous and chunked-prefill policies schedule their running requests with
:meth:`~CohortScheduling._schedule_running_batch` and build the iteration with
:meth:`~CohortScheduling._batch_output`: the same iteration as
:meth:`~batchsim.scheduler.toolkit.SchedulerToolkit.schedule_running` and
:meth:`~batchsim.scheduler.toolkit.SchedulerToolkit.make_output` would, with the cohort's
members (:class:`~batchsim.engine.cohort.Cohort`) handled as one: constant work per
iteration however many they are. :meth:`~CohortScheduling.update_from_output` applies an
iteration (or a stretch of them) either way.

Fast-forward's questions to a policy that declares its promises
(:mod:`batchsim.scheduler.fast_forward`) are here too: ``policy_max_repeat``,
``prompt_chunk_repeat``, ``admits_head`` and the next iteration of the cohort alone. This
module imports no simpy and nothing from the engine loop.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from batchsim.engine.cohort import Cohort
from batchsim.engine.kv_cache import KVCacheManager, most_steps_that_fit
from batchsim.engine.request import Request, RequestStatus
from batchsim.scheduler.config import SchedulerConfig
from batchsim.scheduler.fast_forward import declaration
from batchsim.scheduler.output import CohortBatch, SchedulerOutput, StepTimes
from batchsim.scheduler.toolkit import SchedulerToolkit
from batchsim.scheduler.windowed import batch_output, cohort_shape


@mypyc_attr(allow_interpreted_subclasses=True)
class CohortScheduling(SchedulerToolkit):
    """:class:`~batchsim.scheduler.toolkit.SchedulerToolkit` with the cohort of decodes and
    the application of iterations (see the module docstring)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        *,
        window: int | None = None,
        max_model_len: int | None = None,
    ):
        super().__init__(config, kv_cache, window=window, max_model_len=max_model_len)
        policy = type(self)
        self._lends = declaration(policy).lends_running
        """An iteration of the cohort alone holds the running list itself (``lends_running``)."""
        self._own_helpers = (
            policy.schedule_running is SchedulerToolkit.schedule_running
            and policy.make_output is SchedulerToolkit.make_output
        )
        """The helpers are the toolkit's (a subclass that overrides one has it called)."""
        if not self.reserves_full_sequence and self._own_helpers:
            if kv_cache.window is None:
                self._cohort = Cohort(kv_cache.block_size)
            else:  # every layer's window (window) or a hybrid model's sliding groups'
                assert window is None or window == kv_cache.window
                slide = kv_cache.window_groups
                groups = kv_cache.full_groups + slide
                self._cohort = Cohort(kv_cache.block_size, kv_cache.window, groups, slide)

    def update_from_output(self, output: SchedulerOutput, times: StepTimes) -> list[Request]:
        """Apply ``output``'s iterations (``times.num_steps`` of them, more than one only for
        a decode-only output of a policy that declares ``decode_stretches``); return the requests
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

    def policy_max_repeat(self, output: SchedulerOutput) -> int:
        """With ``decode_stretches`` (:mod:`batchsim.scheduler.fast_forward`): how many
        iterations in a row the policy would run the decode-only ``output`` (default: until
        something else ends the stretch)."""
        return 1 << 62

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
        if batch is None or output.has_side_work or batch.cohort.window:
            return 1  # (a window's chunks are stepped)
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
            need = 0 if cohort.ahead else cohort.growing()
            if need <= kv.num_free_blocks:
                if not cohort.ahead:
                    kv.num_free_blocks -= cohort.crossing() - cohort.freed()
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
    """With ``drains_cohort``: the policy's :meth:`schedule` admits waiting requests
    before it schedules the running ones (and then runs no decode with them)."""

    def admits_head(self, running_tokens: int) -> bool:
        """With ``drains_cohort``: whether :meth:`schedule` would admit the head of the
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
        """The next iteration of a policy that declares ``drains_cohort``, when that is the whole
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
        need = 0 if cohort.ahead else cohort.growing()
        kv = self.kv_cache
        if need > kv.num_free_blocks:
            return None  # schedule_running() would preempt
        if not cohort.ahead:
            kv.num_free_blocks -= cohort.crossing() - cohort.freed()
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
        window = cohort.window
        n = len(self.running)
        grow = 0 if cohort.ahead else cohort.growing()
        need = grow
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
            if window:
                extra = kv.blocks_held(computed, computed + q) - request._blocks
            else:
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
        kv.num_free_blocks -= grow  # (the members first: what else they free counts after)
        for _, request, q in chunks:
            total = request._computed + q
            if window or -(-total // bs) > request._blocks:  # (a window may free blocks)
                allocated = kv.allocate(request, total)
                assert allocated, "the blocks were counted above"
        if not cohort.ahead:
            kv.num_free_blocks += grow - cohort.crossing() + cohort.freed()
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
            if self.window is not None or self.kv_cache.window is not None or not self._own_helpers:
                return self.make_output(requests, tokens, preempted=preempted)
            members = kv_read = 0
            others = list(zip(range(len(requests)), requests, tokens))
        elif not batch.loose and len(requests) == batch.tail:  # the cohort alone
            members = batch.members
            cohort = batch.cohort
            kv_read = cohort.context_tokens()
            batch.requests, batch.size = requests, members
            shape = cohort_shape(members, kv_read, self.window, self.kv_cache.hybrid_window)
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
        # (with a window, any requests without a cohort went to make_output above)
        hybrid = self.kv_cache.hybrid_window
        return batch_output(
            requests, tokens, preempted, batch, others, members, kv_read, self.window, hybrid
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
            kv.num_free_blocks -= kv.growth_from_offsets(
                cohort.offsets(), num_steps, cohort.window_offsets()
            )
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
            kv.num_free_blocks -= kv.growth_from_offsets(
                cohort.offsets(), num_steps, cohort.window_offsets()
            )
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
