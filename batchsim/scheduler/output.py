"""What one iteration runs: the scheduler's decision, handed to the cost model and the engine.

This module imports only :mod:`batchsim.engine.request` and :mod:`batchsim.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchsim.cost import BatchShape
from batchsim.engine.request import Request, RequestStatus


@dataclass(slots=True)
class SchedulerOutput:
    """The composition of one iteration (vLLM: ``SchedulerOutput``).

    ``requests[i]`` computes ``num_scheduled_tokens[i]`` new tokens on top of the
    ``num_computed_tokens`` it already holds.
    """

    requests: list[Request]
    num_scheduled_tokens: list[int]
    shape: BatchShape
    num_prefill_seqs: int = 0
    """Requests computing prompt (or recomputed) tokens this iteration."""
    num_decode_seqs: int = 0
    """Requests computing their last sampled token (one token each)."""
    num_slots: int = 0
    """Width of the batch: requests plus empty slots (request-level policies keep the slots of
    finished requests until the whole batch ends)."""
    num_output_tokens: int = 0
    """Tokens sampled for real requests (a non-final prompt chunk samples none)."""
    preempted: list[Request] = field(default_factory=list)
    """Requests evicted from the KV cache while building this iteration."""
    num_swap_in_blocks: int = 0
    """KV blocks copied back from host memory before this iteration (resumed requests)."""
    num_swap_out_blocks: int = 0
    """KV blocks copied out to host memory before this iteration (requests preempted by
    swapping)."""
    context_tokens: list[int] = field(default_factory=list)
    """Cached tokens each request's attention sees (its ``num_computed_tokens``, or the
    padded length of a rectangular batch)."""
    padding_context: int = 0
    """Cached tokens each padding sequence's attention sees."""

    @property
    def num_swapped_out(self) -> int:
        """Preempted requests whose KV went to host memory (the others recompute)."""
        return sum(1 for r in self.preempted if r.status == RequestStatus.SWAPPED)

    @property
    def has_side_work(self) -> bool:
        """Preemptions or swaps belong to this iteration only, not to repeats of it."""
        return bool(self.preempted or self.num_swap_in_blocks or self.num_swap_out_blocks)

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefill_seqs == 0 and self.num_decode_seqs > 0

    @property
    def num_empty_slots(self) -> int:
        return self.num_slots - len(self.requests)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Where and when the iterations of one scheduled batch ran: usually one iteration; a
    decode stretch runs ``num_steps`` identical ones back to back."""

    first_iteration: int
    """Index of the first iteration (its row in ``iterations.csv``)."""
    start: float
    """When the first iteration started (s)."""
    end: float
    """When the last iteration ended (s)."""
    num_steps: int = 1
