"""Fast-forward of a speculative run: its verification iterations, one after another, without
a pass of the engine each.

A speculative run cannot repeat an iteration (each request accepts a random number of drafts
at every verification), so it has no decode stretches. But while every running request is a
decode, nothing waits, is swapped out or is due (an arrival, a cancellation), and the token
budget and the free KV blocks hold every request's verification rows, the next iteration is
known without asking the policy: every running request, in order, verifies 1 + k' rows
(k' = min(k, tokens it still needs - 1)). :meth:`SpeculativeDrain.drain` runs such
iterations back to back and does what a pass would do for each, in the same order and with
the same arithmetic: takes the requests' KV blocks, builds the iteration's output
(:func:`~batchsim.scheduler.speculation.verification_output`), prices it with its proposals,
logs it, draws the acceptances and applies them
(:func:`~batchsim.scheduler.speculation.apply_verifications`), and lets the finished requests
leave. ``engine.fast_forward: false`` runs every iteration as a pass (the results are the same,
tested). Used by one engine on its own, without prefix caching, a sliding window or recorded
slots.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from batchsim.cost import BatchShape
from batchsim.cost.costs import StepCost
from batchsim.cost.model import RooflineCostModel
from batchsim.cost.shapes import cuda_graph_padded
from batchsim.engine.request import Request
from batchsim.engine.stretch import StretchHost
from batchsim.metrics.iterations import IterationLog
from batchsim.scheduler.speculation import Speculator, with_proposals

_new_shape = tuple.__new__  # builds a BatchShape without its Python-level __new__


class SpeculativeDrain:
    """Runs a speculative engine's verification iterations back to back (see the module
    docstring).

    Args:
        engine: The engine it runs for.
        log: The engine's iteration log.
        speculator: The run's proposals and acceptance draws.
    """

    def __init__(self, engine: StretchHost, log: IterationLog, speculator: Speculator):
        self.engine = engine
        self.log = log
        self.speculator = speculator
        self.cost_model: RooflineCostModel = engine.cost_model
        self.num_drained = 0
        """Iterations run by :meth:`drain` (read by tests; no result depends on it)."""

    def drain(self, now: float, event: float) -> float:
        """Run verification iterations from ``now`` while the next one is known (see the
        module docstring) and starts before ``event``, the engine's next arrival or
        cancellation; the last may end at or after it. Returns the engine's time after the
        last one.

        Each iteration is what a pass computes, summed in one loop over the running
        requests (as :func:`~batchsim.scheduler.speculation.verification_output` and
        :func:`~batchsim.scheduler.speculation.apply_verifications` do for any iteration):
        a running request is in no cohort in a speculative run, so its own fields are its
        progress."""
        engine = self.engine
        scheduler = engine.scheduler
        assert scheduler._cohort is None, "a speculative run has no cohort"
        kv = scheduler.kv_cache
        bs = kv.block_size
        speculator = self.speculator
        k = speculator.num_speculative_tokens
        budget = scheduler.config.max_num_batched_tokens
        proposer_time = speculator.proposer_time
        priced_by_draft = speculator.draft_cost_model is not None
        cost_model = self.cost_model
        log = self.log
        options = engine.options
        graph_max = options.cuda_graph_max_batch_size
        overlap = options.async_scheduling
        swap = 0.0 * options.swap_time_per_block  # (no swap: as a pass prices it)
        swap_ms = 0 * options.swap_time_per_block * 1e3
        on_step = engine.on_step
        rows = _Rows(log, swap_ms)
        tokens: list[int] = []
        while now < event:
            if scheduler.waiting or scheduler.swapped or scheduler.transferred:
                break
            running = scheduler.running
            n = len(running)
            if not n:
                break
            # schedule(): every running request a decode verifying 1 + k' rows, in order,
            # and the iteration's shape, in one pass (nothing changes unless all fit)
            tokens.clear()
            total = need = 0
            verify = num_verifying = plain = most = kv_read = pairs = 0
            for request in running:
                computed, outputs = request._computed, request._outputs
                if outputs == 0 or request.num_prompt_tokens + outputs - computed != 1:
                    break
                drafts = request.max_tokens - outputs - 1
                q = 1 + (k if k < drafts else drafts)
                total += q
                extra = -(-(computed + q) // bs) - request._blocks
                if extra > 0:
                    need += extra
                tokens.append(q)
                kv_read += computed
                pairs += q * computed + q * (q + 1) // 2
                if q > 1:  # a verification: a chunk of q rows, each through lm_head
                    verify += q
                    num_verifying += 1
                    if q - 1 > most:
                        most = q - 1
                else:
                    plain += 1
            if len(tokens) < n or total > budget or need > kv.num_free_blocks:
                break  # not that iteration: a pass decides it
            if on_step is not None:
                on_step(engine)
            # the blocks of every request's rows
            draft_rows: list[tuple[int, int]] = []
            if need or priced_by_draft:
                for request, q in zip(running, tokens):
                    computed = request._computed
                    if -(-(computed + q) // bs) > request._blocks:
                        allocated = kv.allocate(request, computed + q)
                        assert allocated, "the blocks were counted above"
                    if priced_by_draft and q > 1:
                        draft_rows.append((computed, q - 1))
            sampled = n + verify - num_verifying if verify else n
            shape = _new_shape(
                BatchShape, (n, verify, plain, 0, sampled, kv_read, pairs, 0, 0, None, None)
            )
            if graph_max:
                shape = cuda_graph_padded(shape, graph_max)
            # the engine's pricing of a speculative iteration (proposals, then verification)
            cost = cost_model.step_cost(shape)
            if priced_by_draft:
                propose = speculator.propose_cost(draft_rows, [])
            else:
                propose = (
                    None if not most else StepCost(most * proposer_time, 0.0, 0.0, 0.0, 0.0, 0.0)
                )
            if propose is not None:
                cost = with_proposals(cost, propose)
            cpu = engine.cpu_time(n)
            gpu = cost.time + swap
            if overlap and engine.back_to_back(now):
                duration = cpu if cpu > gpu else gpu
            else:
                duration = cpu + gpu
            first = rows.add(now, duration, cost, cpu, n, shape, verify, kv.usage)
            end = now + duration
            # update_from_output(): acceptances, the rejected drafts' blocks, finishes
            finished: list[Request] = []
            freed = 0
            for request, q in zip(running, tokens):
                computed = request._computed
                if q > 1:
                    emitted = speculator.accept(request, q - 1) + 1
                    request._computed = computed + emitted
                    request.record_burst(first, emitted, end)
                    keep = -(-(computed + emitted) // bs)
                    rejected = request._blocks - keep  # blocks of rejected drafts only
                    if rejected > 0:
                        request._blocks = keep
                        freed += rejected
                else:
                    request._computed = computed + 1
                    request.record_tokens(first, 1, end)
                if request._outputs >= request.max_tokens:
                    assert request._outputs == request.max_tokens, "accepted too many"
                    finished.append(request)
            if freed:
                kv.num_free_blocks += freed
            engine.last_end = now = end
            self.num_drained += 1
            if finished:
                scheduler._finish(finished, end)
                for request in finished:
                    engine.leave(request, end)
                event = min(event, engine.next_arrival_time(), engine.next_cancel_time())
        rows.flush()
        return now


class _Rows:
    """The drained iterations' rows, kept column by column and logged in blocks
    (:meth:`~batchsim.metrics.iterations.IterationLog.extend`): the row of each is
    ``run_row(start, 1, duration, cost, Engine.batch_row(output, cpu))``, with the
    verification rows counted as decode tokens."""

    def __init__(self, log: IterationLog, swap_ms: float):
        self.log = log
        self.swap_ms = swap_ms
        self.columns: list[list[Any]] = [[] for _ in range(_VARYING)]
        self.usage: list[float] = []

    def add(
        self,
        start: float,
        duration: float,
        cost: StepCost,
        cpu: float,
        n: int,
        shape: BatchShape,
        verify: int,
        usage: float,
    ) -> int:
        """One iteration of ``n`` decodes, ``verify`` of their rows verifications; returns
        its index in the log."""
        c = self.columns
        time, flops, nbytes, weight_bytes, kv_bytes, margin = cost
        c[0].append(start)
        c[1].append(duration)
        c[2].append(time * 1e3)
        c[3].append(flops)
        c[4].append(nbytes)
        c[5].append(weight_bytes)
        c[6].append(kv_bytes)
        c[7].append(margin)
        c[8].append(cpu * 1e3)
        c[9].append(n)
        c[10].append(shape.num_prefill_tokens - verify)
        c[11].append(shape.num_decode_tokens + verify)
        c[12].append(shape.num_padding_tokens)
        self.usage.append(usage)
        index = self.log.num_rows + len(self.usage) - 1
        if len(self.usage) >= _BLOCK_ROWS:
            self.flush()
        return index

    def flush(self) -> None:
        """Log the rows kept so far."""
        n = len(self.usage)
        if not n:
            return
        c = [np.array(column) for column in self.columns]
        seqs = c[9]
        self.log.extend(
            (
                c[0],  # start_time_s
                1,  # num_steps
                c[1],  # duration_s
                c[2],  # gpu_time_ms
                c[3],  # flops
                c[4],  # bytes
                c[5],  # weight_bytes
                c[6],  # kv_bytes
                c[7],  # bound_margin_s
                0.0,
                0.0,
                0.0,
                0.0,  # the *_step columns
                c[8],  # cpu_time_ms
                seqs,  # num_seqs
                seqs,  # num_slots
                0,  # num_prefill_seqs
                seqs,  # num_decode_seqs
                c[10],  # num_prefill_tokens
                c[11],  # num_decode_tokens
                c[12],  # num_padding_tokens
                seqs,  # num_output_tokens
                0,  # num_preempted
                0,  # num_swap_in_blocks
                0,  # num_swap_out_blocks
                self.swap_ms,  # swap_time_ms
                0,  # num_swapped_out
                0,  # num_cached_blocks
                0,  # num_evicted_blocks
            ),
            n,
            np.array(self.usage),
        )
        for column in self.columns:
            column.clear()
        self.usage.clear()


_VARYING = 13
"""Columns of a drained iteration's row that vary from one to the next."""
_BLOCK_ROWS = 4096
"""Rows kept before they are logged."""
