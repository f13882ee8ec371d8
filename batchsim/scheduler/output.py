"""What one iteration runs: the scheduler's decision, handed to the cost model and the engine.

This module imports only :mod:`batchsim.engine.request` and :mod:`batchsim.cost`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from batchsim.cost import BatchShape
from batchsim.engine.request import Request


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


EMPTY_SHAPE = BatchShape(num_seqs=0)


@dataclass(slots=True)
class StepTimes:
    """When the iterations of one scheduled batch end.

    Usually one iteration; a decode stretch runs several identical ones. The ends after the
    first are held as runs of equal spacing, so a stretch of hundreds of iterations costs
    the scheduler O(runs), not O(iterations).
    """

    first_end: float
    last_end: float
    num_steps: int = 1
    later: list[tuple[float, float, int, int]] = field(default_factory=list)
    """Ends after the first, as runs ``(start, spacing, j0, j1)``: the ends
    ``start + j x spacing`` for j = j0..j1."""
    later_arrays: tuple[np.ndarray, np.ndarray] | None = None
    """Or as arrays (ends, gaps to the previous end)."""

    @classmethod
    def from_ends(cls, ends: Sequence[float] | np.ndarray) -> StepTimes:
        """From the end time of every iteration."""
        n = len(ends)
        if n == 1:
            end = float(ends[0])
            return cls(end, end)
        array = np.asarray(ends, dtype=float)
        return cls(float(array[0]), float(array[-1]), n, later_arrays=(array[1:], np.diff(array)))
