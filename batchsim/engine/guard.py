"""The progress guard's check of one iteration: what ``schedule()`` of a policy written
outside batchsim must return.

The engine calls :func:`check_output` on every output of such a policy (the built-in policies
are trusted: their invariants are tested). A rule broken is a
:class:`~batchsim.errors.PolicyError` naming the policy and the rule; the other rules of the
guard (an exception raised, a timer in the past, no progress) are the engine loop's own
(:mod:`batchsim.engine.engine`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from batchsim.cost import BatchShape
from batchsim.engine.kv_cache import KVCacheManager
from batchsim.engine.request import Request, RequestStatus
from batchsim.errors import PolicyError
from batchsim.scheduler.output import SchedulerOutput

_OUTPUT_COUNTS = (
    "num_prefill_seqs",
    "num_decode_seqs",
    "num_slots",
    "num_output_tokens",
    "num_swap_in_blocks",
    "num_swap_out_blocks",
    "padding_context",
)
"""The integer fields of a :class:`SchedulerOutput` besides its token counts."""


def _python_int(value: Any) -> Any:
    """``value`` as a python int if it is an integer of another type (numpy's, say)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def check_output(output: Any, kv: KVCacheManager, broke: Callable[[str], PolicyError]) -> None:
    """The rules an iteration of a policy written elsewhere must follow; ``broke(rule)`` makes
    the error naming the policy. Integer counts of other types (numpy's, say) become python
    ints in place: the engine and the cost model compute with those (and, compiled, require
    them)."""
    if not isinstance(output, SchedulerOutput):
        raise broke(
            f"schedule() returned {type(output).__name__}, not a SchedulerOutput "
            "(build it with make_output())"
        )
    # (read as Any: the values are a policy's, checked here, not assumed to be ints)
    requests: Any = output.requests
    tokens: Any = output.num_scheduled_tokens
    if len(requests) != len(tokens):
        raise broke(f"schedule() returned {len(requests)} requests but {len(tokens)} token counts")
    seen: set[int] = set()
    python_ints = True
    for request, q in zip(requests, tokens):
        if not isinstance(request, Request):
            raise broke(f"schedule() returned {request!r} as a request")
        rid = request.request_id
        if request.status != RequestStatus.RUNNING:
            raise broke(
                f"schedule() scheduled request {rid}, which is "
                f"{request.status.name.lower()}, not running (admit() it first)"
            )
        if id(request) in seen:
            raise broke(f"schedule() scheduled request {rid} twice")
        seen.add(id(request))
        count = 0 if isinstance(q, bool) or not isinstance(q, numbers.Integral) else int(q)
        python_ints = python_ints and type(q) is int
        if count < 1:
            raise broke(
                f"schedule() scheduled {q!r} tokens for request {rid}; each scheduled "
                "request computes an integer number of tokens >= 1"
            )
        left = request.num_remaining_tokens
        if count > left:
            raise broke(
                f"schedule() scheduled {count} tokens for request {rid}, which has only "
                f"{left} to compute"
            )
        total = request.num_computed_tokens + count
        if kv.blocks_held(request.num_computed_tokens, total) > request.num_blocks:
            raise broke(
                f"schedule() scheduled {total} tokens of request {rid} without the KV "
                f"blocks to hold them (it holds {request.num_blocks}; allocate() first)"
            )
    # Integers of other types (numpy's, say) become python ints, which the engine and the
    # cost model compute with (and, compiled, require).
    if not python_ints:
        output.num_scheduled_tokens = [int(q) for q in tokens]
    shape: Any = output.shape
    if any(type(v) is not int and isinstance(v, numbers.Integral) for v in shape):
        output.shape = BatchShape(*(_python_int(v) for v in shape))
    for name in _OUTPUT_COUNTS:
        value = getattr(output, name)
        if type(value) is not int:
            setattr(output, name, _python_int(value))
