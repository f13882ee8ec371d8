"""A request's life in the simulated engine: its lengths, progress and timestamps.

A request carries no phase flag. As in vLLM v1, progress is ``num_computed_tokens``: the
tokens whose KV is in the cache. The known sequence is the prompt plus the tokens sampled so
far (``num_tokens``); an iteration computes some of the missing ones, and when it reaches the
end of the known sequence the request samples one new token. Prefill, chunked prefill, decode
and recompute after preemption are all the same rule.

This module imports nothing from the rest of batchsim.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

NAN = math.nan


class RequestStatus(enum.IntEnum):
    """Where a request is. The last three are final: a request reaches exactly one of them."""

    WAITING = 0
    """Arrived, not in the running set (never scheduled, or preempted by recompute)."""
    RUNNING = 1
    """Holds KV blocks and is scheduled at iterations."""
    SWAPPED = 2
    """Preempted by swapping: its KV blocks wait in host memory to be copied back."""
    FINISHED = 3
    """Produced all its output tokens."""
    REJECTED = 4
    """Could never be served (e.g. longer than the KV cache); see ``reject_reason``."""
    CANCELLED = 5
    """The client disconnected; the request left at the next iteration boundary."""

    @property
    def is_final(self) -> bool:
        return self >= RequestStatus.FINISHED


@dataclass(slots=True, eq=False)
class Request:
    """One inference request.

    Attributes are simulated times in seconds (NaN until the event happens) and token counts.
    """

    request_id: int
    arrival_time: float
    """When the request reached the engine (s)."""
    num_prompt_tokens: int
    max_tokens: int
    """Output tokens to generate (the request ignores EOS, as benchmark clients do)."""
    cancel_time: float = math.inf
    """When the client disconnects (s); ``inf`` if it never does."""
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    """Tokens whose KV is in the cache."""
    num_output_tokens: int = 0
    """Tokens sampled so far."""
    num_blocks: int = 0
    """KV-cache blocks held on the GPU."""
    num_cpu_blocks: int = 0
    """KV-cache blocks swapped out to host memory."""
    num_preemptions: int = 0
    num_swaps: int = 0
    """Preemptions that swapped the KV cache out (the rest recomputed it)."""
    first_scheduled_time: float = NAN
    """Start of the first iteration that computed tokens for the request (s)."""
    first_token_time: float = NAN
    finish_time: float = NAN
    reject_reason: str = ""
    user_id: int = -1
    """Closed-loop workloads: the user who sent the request; -1 for open-loop arrivals."""
    last_token_iteration: int = -1
    """Index of the iteration that sampled the request's latest token (-1: none yet)."""
    token_segments: list[int] = field(default_factory=list)
    """When the tokens came: runs of consecutive iterations that each sampled one token of
    the request, as ``[first0, last0, first1, last1, ...]`` iteration indices; the open last
    run ends at :attr:`last_token_iteration`. Inter-token gaps are differences of those
    iterations' end times (see :mod:`batchsim.metrics.logs`)."""

    def record_tokens(self, first_iteration: int, num_tokens: int, end_time: float) -> None:
        """One token sampled at each of ``num_tokens`` consecutive iterations from
        ``first_iteration``; the last of them ended at ``end_time``."""
        last = self.last_token_iteration
        if last < 0:  # the first token
            assert num_tokens == 1, "a first token comes from one iteration"
            self.first_token_time = end_time
            self.token_segments.append(first_iteration)
        elif last != first_iteration - 1:  # a gap in iterations: a new run
            self.token_segments += (last, first_iteration)
        self.last_token_iteration = first_iteration + num_tokens - 1
        self.num_output_tokens += num_tokens

    def closed_segments(self) -> list[int]:
        """:attr:`token_segments` with the open last run closed."""
        if self.last_token_iteration < 0:
            return []
        return [*self.token_segments, self.last_token_iteration]

    @property
    def num_tokens(self) -> int:
        """Length of the known sequence: prompt plus sampled tokens."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens of the known sequence not yet in the KV cache."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens
