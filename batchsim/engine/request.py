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
from dataclasses import dataclass

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
    first_token_time: float = NAN
    last_token_time: float = NAN
    finish_time: float = NAN
    reject_reason: str = ""
    user_id: int = -1
    """Closed-loop workloads: the user who sent the request; -1 for open-loop arrivals."""

    @property
    def num_tokens(self) -> int:
        """Length of the known sequence: prompt plus sampled tokens."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens of the known sequence not yet in the KV cache."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def num_remaining_outputs(self) -> int:
        return self.max_tokens - self.num_output_tokens

    @property
    def is_decoding(self) -> bool:
        """True when the next iteration computes exactly the last sampled token."""
        return self.num_output_tokens > 0 and self.num_remaining_tokens == 1

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time
