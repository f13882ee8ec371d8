"""A request's life in the simulated engine: its lengths, progress and timestamps.

A request carries no phase flag. As in vLLM v1, progress is ``num_computed_tokens``: the
tokens whose KV is in the cache. The known sequence is the prompt plus the tokens sampled so
far (``num_tokens``); an iteration computes some of the missing ones, and when it reaches the
end of the known sequence the request samples one new token. Prefill, chunked prefill, decode
and recompute after preemption are all the same rule.

A running decode of a built-in policy may belong to a :class:`Group` of decodes that advance
together, one token per iteration (the :class:`~batchsim.engine.cohort.Cohort`). Its progress
(computed and output tokens, KV blocks, token runs) is then kept by the group and read through
the same attributes; assigning any of them takes the request out of the group first.

This module imports nothing from the rest of batchsim.
"""

from __future__ import annotations

import enum
import math
from typing import Any

NAN = math.nan
HANDED_OFF = -2
"""``last_token_iteration`` of a request whose first token came from a prefill instance of a
disaggregated cluster and that has sampled none on its decode instance yet: its token runs
there start afresh (iterations of another engine), its ``first_token_time`` stays."""


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


_FIELDS = (
    "request_id",
    "arrival_time",
    "num_prompt_tokens",
    "max_tokens",
    "cancel_time",
    "status",
    "num_computed_tokens",
    "num_output_tokens",
    "num_blocks",
    "num_cpu_blocks",
    "num_preemptions",
    "num_swaps",
    "num_cached_tokens",
    "first_scheduled_time",
    "first_token_time",
    "finish_time",
    "reject_reason",
    "user_id",
    "last_token_iteration",
    "token_segments",
    "prefix_segments",
)


class Group:
    """What a request reads of the group of decodes it advances with: the part of
    :class:`~batchsim.engine.cohort.Cohort` that :class:`Request`'s attributes need.

    Attributes:
        steps: Iterations the group has run; a member's progress is its own plus ``steps``.
        ahead: 1 when the blocks of every member's next token are taken, else 0.
        block_size: Tokens per KV block.
        last_iteration: The iteration of the group's latest step (-1: none).
    """

    __slots__ = ("ahead", "block_size", "groups", "last_iteration", "slide", "steps", "window")

    def __init__(self, block_size: int, window: int = 0, groups: int = 1, slide: int = 0):
        self.block_size = block_size
        self.steps = 0
        self.ahead = 0
        self.last_iteration = -1
        self.window = window
        """With a sliding window (0: none), its length in keys: every member has computed at
        least that many tokens."""
        self.groups = groups
        """Layer groups each block of the pool belongs to one of (1 without a window)."""
        self.slide = slide
        """Of those, the groups that keep only the window (0 without one)."""

    def blocks_at(self, tokens: int) -> int:
        """Blocks a member holds with ``tokens`` tokens computed or reserved (its computed
        tokens plus ``ahead``): one per ``block_size`` tokens, or with a window of W keys that
        in each of the ``groups`` layer groups, less in each sliding one the
        ``(tokens - W) // block_size`` blocks wholly before the window
        (:meth:`~batchsim.engine.kv_cache.KVCacheManager.blocks_held`, for tokens >= W)."""
        bs = self.block_size
        if not self.window:
            return -(-tokens // bs)
        return self.groups * -(-tokens // bs) - self.slide * ((tokens - self.window) // bs)

    def detach(self, r: Request) -> None:
        """Take member ``r`` out: its progress, blocks and token runs become its own again."""
        raise NotImplementedError

    def segments_of(self, r: Request) -> list[int]:
        """``r.token_segments`` of a member, as if it had recorded its steps itself."""
        raise NotImplementedError


class Request:
    """One inference request.

    Attributes are simulated times in seconds (NaN until the event happens) and token counts.

    Attributes:
        request_id: Index of the request in the workload.
        arrival_time: When the request reached the engine (s).
        num_prompt_tokens: Prompt length.
        max_tokens: Output tokens to generate (the request ignores EOS, as benchmark clients
            do).
        cancel_time: When the client disconnects (s); ``inf`` if it never does.
        status: Where the request is.
        num_computed_tokens: Tokens whose KV is in the cache.
        num_output_tokens: Tokens sampled so far.
        num_blocks: KV-cache blocks held on the GPU.
        num_cpu_blocks: KV-cache blocks swapped out to host memory.
        num_preemptions: Times the request was preempted.
        num_swaps: Preemptions that swapped the KV cache out (the rest recomputed it).
        num_cached_tokens: Tokens of its prompt found in the prefix cache when it was first
            admitted (vLLM's name; 0 without ``engine.enable_prefix_caching``).
        first_scheduled_time: Start of the first iteration that computed tokens for the
            request (s).
        first_token_time: End of the iteration that sampled its first token (s).
        finish_time: When it finished or was cancelled (s).
        reject_reason: Why it was rejected ('' if it was not).
        user_id: Closed-loop workloads: the user who sent the request; -1 for open-loop
            arrivals.
        prefix_segments: The shared content its sequence starts with,
            ``((content_id, num_tokens), ...)`` (:mod:`batchsim.workload.prefix`), or None.
        last_token_iteration: Index of the iteration that sampled the request's latest token
            (-1: none yet; :data:`HANDED_OFF`: its first token came from a prefill instance).
        token_segments: When the tokens came: runs of consecutive iterations that each sampled
            one token of the request, as ``[first0, last0, first1, last1, ...]`` iteration
            indices; the open last run ends at :attr:`last_token_iteration`. Inter-token gaps
            are differences of those iterations' end times (see :mod:`batchsim.metrics.timing`).
    """

    __slots__ = (
        "_blocks",
        "_computed",
        "_group",
        "_joined",
        "_last",
        "_outputs",
        "_prefix",
        "_segments",
        "_ticket",
        "arrival_time",
        "cancel_time",
        "finish_time",
        "first_scheduled_time",
        "first_token_time",
        "max_tokens",
        "num_cached_tokens",
        "num_cpu_blocks",
        "num_preemptions",
        "num_prompt_tokens",
        "num_swaps",
        "prefix_segments",
        "reject_reason",
        "request_id",
        "status",
        "user_id",
    )

    def __init__(
        self,
        request_id: int,
        arrival_time: float,
        num_prompt_tokens: int,
        max_tokens: int,
        cancel_time: float = math.inf,
        status: RequestStatus = RequestStatus.WAITING,
        num_computed_tokens: int = 0,
        num_output_tokens: int = 0,
        num_blocks: int = 0,
        num_cpu_blocks: int = 0,
        num_preemptions: int = 0,
        num_swaps: int = 0,
        first_scheduled_time: float = NAN,
        first_token_time: float = NAN,
        finish_time: float = NAN,
        reject_reason: str = "",
        user_id: int = -1,
        last_token_iteration: int = -1,
        token_segments: list[int] | None = None,
        prefix_segments: tuple[tuple[int, int], ...] | None = None,
        num_cached_tokens: int = 0,
    ):
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.cancel_time = cancel_time
        self.status = status
        self._computed = num_computed_tokens
        self._outputs = num_output_tokens
        self._blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.num_preemptions = num_preemptions
        self.num_swaps = num_swaps
        self.num_cached_tokens = num_cached_tokens
        self.first_scheduled_time = first_scheduled_time
        self.first_token_time = first_token_time
        self.finish_time = finish_time
        self.reject_reason = reject_reason
        self.user_id = user_id
        self._last = last_token_iteration
        self._segments = [] if token_segments is None else token_segments
        self.prefix_segments = prefix_segments
        self._group: Group | None = None
        self._joined = 0  # group step at which the request joined
        self._ticket = 0  # which membership (a request may join, leave and join again)
        self._prefix: Any = None  # its block keys and cache references (prefix caching only)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"Request({fields})"

    # ----------------------------------------------------------- progress (cohort-aware)
    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache."""
        group = self._group
        return self._computed if group is None else self._computed + group.steps

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if self._group is not None:
            self._group.detach(self)
        self._computed = value

    @property
    def num_output_tokens(self) -> int:
        """Tokens sampled so far."""
        group = self._group
        return self._outputs if group is None else self._outputs + group.steps

    @num_output_tokens.setter
    def num_output_tokens(self, value: int) -> None:
        if self._group is not None:
            self._group.detach(self)
        self._outputs = value

    @property
    def num_blocks(self) -> int:
        """KV-cache blocks held on the GPU."""
        group = self._group
        if group is None:
            return self._blocks
        return group.blocks_at(self._computed + group.steps + group.ahead)

    @num_blocks.setter
    def num_blocks(self, value: int) -> None:
        if self._group is not None:
            self._group.detach(self)
        self._blocks = value

    @property
    def last_token_iteration(self) -> int:
        """Index of the iteration that sampled the request's latest token (-1: none yet)."""
        group = self._group
        if group is None or group.steps == self._joined:
            return self._last
        return group.last_iteration

    @last_token_iteration.setter
    def last_token_iteration(self, value: int) -> None:
        if self._group is not None:
            self._group.detach(self)
        self._last = value

    @property
    def token_segments(self) -> list[int]:
        """Runs of consecutive iterations that sampled a token each (see the class)."""
        group = self._group
        if group is None:
            return self._segments
        return group.segments_of(self)

    @token_segments.setter
    def token_segments(self, value: list[int]) -> None:
        if self._group is not None:
            self._group.detach(self)
        self._segments = value

    def record_tokens(self, first_iteration: int, num_tokens: int, end_time: float) -> None:
        """One token sampled at each of ``num_tokens`` consecutive iterations from
        ``first_iteration``; the last of them ended at ``end_time``."""
        if self._group is not None:
            self._group.detach(self)
        last = self._last
        if last < 0:  # the first token (or, at HANDED_OFF, the first on a decode instance)
            if last != HANDED_OFF:
                assert num_tokens == 1, "a first token comes from one iteration"
                self.first_token_time = end_time
            self._segments.append(first_iteration)
        elif last != first_iteration - 1:  # a gap in iterations: a new run
            self._segments += (last, first_iteration)
        self._last = first_iteration + num_tokens - 1
        self._outputs += num_tokens

    def record_burst(self, iteration: int, num_tokens: int, end_time: float) -> None:
        """``num_tokens`` sampled together at ``iteration`` (speculative decoding's accepted
        tokens): one output chunk. Token runs hold the iterations that sampled, so the
        burst is one inter-token gap while it counts ``num_tokens`` output tokens."""
        self.record_tokens(iteration, 1, end_time)
        self._outputs += num_tokens - 1

    def closed_segments(self) -> list[int]:
        """:attr:`token_segments` with the open last run closed."""
        last = self.last_token_iteration
        if last < 0:
            return []
        return [*self.token_segments, last]

    @property
    def num_tokens(self) -> int:
        """Length of the known sequence: prompt plus sampled tokens."""
        group = self._group
        if group is None:
            return self.num_prompt_tokens + self._outputs
        return self.num_prompt_tokens + self._outputs + group.steps

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens of the known sequence not yet in the KV cache."""
        # a cohort moves computed and output tokens together: their difference is stored
        return self.num_prompt_tokens + self._outputs - self._computed
