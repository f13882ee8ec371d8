"""What one iteration runs: the scheduler's decision, handed to the cost model and the engine.

This module imports only :mod:`batchsim.engine.request`, :mod:`batchsim.engine.cohort` and
:mod:`batchsim.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from mypy_extensions import mypyc_attr

from batchsim.cost import BatchShape
from batchsim.engine.cohort import Cohort
from batchsim.engine.request import Request, RequestStatus


@dataclass(slots=True)
class CohortBatch:
    """How a built-in policy scheduled an iteration around its :class:`Cohort`: every member
    one token (a decode), the other running requests it scheduled at their positions in
    ``requests``, and the requests it added after the running ones (resumed or admitted)
    from ``tail`` on. Valid while the cohort's ``version`` is unchanged."""

    cohort: Cohort
    version: int
    members: int
    """Cohort members in the iteration (all of them)."""
    loose: list[tuple[int, Request, int]]
    """(position, request, tokens) of the running requests outside the cohort."""
    tail: int
    """Position of the first request added after the running ones."""
    requests: list[Request] | None = None
    """The iteration's requests as built (an output whose list was replaced or resized is
    applied request by request)."""
    size: int = 0

    @property
    def pure(self) -> bool:
        """The iteration is the cohort and nothing else: no running request outside it, and
        none added after the running ones (its size says so even for one that is a decode)."""
        return not self.loose and self.tail == self.members == self.size


@mypyc_attr(allow_interpreted_subclasses=True)
class SchedulerOutput:
    """The composition of one iteration (vLLM: ``SchedulerOutput``).

    ``requests[i]`` computes ``num_scheduled_tokens[i]`` new tokens on top of the
    ``num_computed_tokens`` it already holds.

    Attributes:
        requests: The requests of the iteration.
        num_scheduled_tokens: Tokens each computes.
        shape: The aggregates the cost model prices.
        num_prefill_seqs: Requests computing prompt (or recomputed) tokens this iteration.
        num_decode_seqs: Requests computing their last sampled token (one token each).
        num_slots: Width of the batch: requests plus empty slots (request-level policies keep
            the slots of finished requests until the whole batch ends).
        num_output_tokens: Tokens sampled for real requests (a non-final prompt chunk samples
            none).
        preempted: Requests evicted from the KV cache while building this iteration.
        num_swap_in_blocks: KV blocks copied back from host memory before this iteration
            (resumed requests).
        num_swap_out_blocks: KV blocks copied out to host memory before this iteration
            (requests preempted by swapping).
        padding_context: Cached tokens each padding sequence's attention sees.
        batch: How a built-in policy built the iteration around its cohort (None otherwise).
    """

    __slots__ = (
        "_context_tokens",
        "batch",
        "num_decode_seqs",
        "num_output_tokens",
        "num_prefill_seqs",
        "num_scheduled_tokens",
        "num_slots",
        "num_swap_in_blocks",
        "num_swap_out_blocks",
        "padding_context",
        "preempted",
        "requests",
        "shape",
    )

    def __init__(
        self,
        requests: list[Request],
        num_scheduled_tokens: list[int],
        shape: BatchShape,
        num_prefill_seqs: int = 0,
        num_decode_seqs: int = 0,
        num_slots: int = 0,
        num_output_tokens: int = 0,
        preempted: list[Request] | None = None,
        num_swap_in_blocks: int = 0,
        num_swap_out_blocks: int = 0,
        context_tokens: list[int] | None = None,
        padding_context: int = 0,
        batch: CohortBatch | None = None,
    ):
        self.requests = requests
        self.num_scheduled_tokens = num_scheduled_tokens
        self.shape = shape
        self.num_prefill_seqs = num_prefill_seqs
        self.num_decode_seqs = num_decode_seqs
        self.num_slots = num_slots
        self.num_output_tokens = num_output_tokens
        self.preempted = [] if preempted is None else preempted
        self.num_swap_in_blocks = num_swap_in_blocks
        self.num_swap_out_blocks = num_swap_out_blocks
        self._context_tokens = context_tokens
        self.padding_context = padding_context
        self.batch = batch

    def __repr__(self) -> str:
        return (
            f"SchedulerOutput(requests={[r.request_id for r in self.requests]}, "
            f"num_scheduled_tokens={self.num_scheduled_tokens}, shape={self.shape}, "
            f"num_slots={self.num_slots}, preempted={[r.request_id for r in self.preempted]})"
        )

    @property
    def context_tokens(self) -> list[int]:
        """Cached tokens each request's attention sees (its ``num_computed_tokens``, or the
        padded length of a rectangular batch). Built-in policies leave it to be read from the
        requests when first asked, which must be before the iteration is applied."""
        if self._context_tokens is None:
            self._context_tokens = [r.num_computed_tokens for r in self.requests]
        return self._context_tokens

    @context_tokens.setter
    def context_tokens(self, value: list[int]) -> None:
        self._context_tokens = value

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


class StepTimes(NamedTuple):
    """Where and when the iterations of one scheduled batch ran: usually one iteration; a
    decode stretch runs ``num_steps`` identical ones back to back."""

    first_iteration: int
    """Index of the first iteration (its row in ``iterations.csv``)."""
    start: float
    """When the first iteration started (s)."""
    end: float
    """When the last iteration ended (s)."""
    num_steps: int = 1
