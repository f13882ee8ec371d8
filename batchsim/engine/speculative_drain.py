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

from batchsim.cost.costs import StepCost
from batchsim.cost.model import RooflineCostModel
from batchsim.cost.shapes import cuda_graph_padded
from batchsim.engine.request import Request
from batchsim.engine.stretch import StretchHost, run_row
from batchsim.metrics.iterations import IterationLog
from batchsim.scheduler.output import StepTimes
from batchsim.scheduler.speculation import (
    Speculator,
    apply_verifications,
    verification_output,
)


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

    def _tokens(self, running: list[Request]) -> list[int] | None:
        """Each running request's verification rows for the next iteration, or None when that
        iteration is anything else (a request that is not a decode, rows over the token
        budget, KV blocks that would run short: a pass decides it)."""
        engine = self.engine
        scheduler = engine.scheduler
        kv = scheduler.kv_cache
        bs = kv.block_size
        k = self.speculator.num_speculative_tokens
        tokens: list[int] = []
        total = need = 0
        for request in running:
            computed = request.num_computed_tokens
            outputs = request.num_output_tokens
            if outputs == 0 or request.num_prompt_tokens + outputs - computed != 1:
                return None
            drafts = request.max_tokens - outputs - 1
            q = 1 + (k if k < drafts else drafts)
            total += q
            extra = -(-(computed + q) // bs) - request.num_blocks
            if extra > 0:
                need += extra
            tokens.append(q)
        if total > scheduler.config.max_num_batched_tokens or need > kv.num_free_blocks:
            return None
        return tokens

    def drain(self, now: float, event: float) -> float:
        """Run verification iterations from ``now`` while the next one is known (see the
        module docstring) and starts before ``event``, the engine's next arrival or
        cancellation; the last may end at or after it. Returns the engine's time after the
        last one."""
        engine = self.engine
        scheduler = engine.scheduler
        kv = scheduler.kv_cache
        bs = kv.block_size
        speculator = self.speculator
        cost_model = self.cost_model
        log = self.log
        options = engine.options
        graph_max = options.cuda_graph_max_batch_size
        swap = 0.0 * options.swap_time_per_block  # (no swap: as a pass prices it)
        on_step = engine.on_step
        while now < event:
            if scheduler.waiting or scheduler.swapped or scheduler.transferred:
                break
            running = scheduler.running
            if not running:
                break
            tokens = self._tokens(running)
            if tokens is None:
                break
            if on_step is not None:
                on_step(engine)
            requests = list(running)
            for request, q in zip(requests, tokens):  # schedule(): the blocks of the rows
                computed = request.num_computed_tokens
                if -(-(computed + q) // bs) > request.num_blocks:
                    allocated = kv.allocate(request, computed + q)
                    assert allocated, "the blocks were counted above"
            output = verification_output(scheduler, speculator, requests, tokens, [])
            if graph_max:
                output.shape = cuda_graph_padded(output.shape, graph_max)
            # the engine's pricing of a speculative iteration (proposals, then verification)
            cost = cost_model.step_cost(output.shape)
            propose = output.propose_cost
            if propose is not None:
                cost = StepCost(
                    cost.time + propose.time,
                    cost.flops + propose.flops,
                    cost.bytes + propose.bytes,
                    cost.weight_bytes + propose.weight_bytes,
                    cost.kv_bytes + propose.kv_bytes,
                    cost.margin,
                )
            cpu = engine.cpu_time(output.num_seqs)
            gpu = cost.time + swap
            if options.async_scheduling and engine.back_to_back(now):
                duration = cpu if cpu > gpu else gpu
            else:
                duration = cpu + gpu
            first = log.num_rows
            row = engine.batch_row(output, cpu)
            verify = output.num_verify_tokens
            if verify:  # (num_prefill_tokens, num_decode_tokens) at 5 and 6
                row = (*row[:5], row[5] - verify, row[6] + verify, *row[7:])
            log.append(run_row(now, 1, duration, cost, row), kv.usage)
            end = now + duration
            finished = apply_verifications(
                scheduler, speculator, output, StepTimes(first, now, end)
            )
            engine.last_end = now = end
            self.num_drained += 1
            for request in finished:
                engine.leave(request, end)
            event = min(event, engine.next_arrival_time(), engine.next_cancel_time())
        return now
