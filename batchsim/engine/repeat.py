"""Fast-forward's first question: how many iterations in a row would this batch repeat?

When a policy returns a decode-only batch and nothing else can change before the next
request finishes, the KV cache runs short or an external event (arrival, cancellation,
timer) happens, the following iterations are the same batch with every context one token
longer; :mod:`batchsim.engine.stretch` then runs them as one step. This module says how far
that goes:

- :func:`repeat_limit` — how many iterations the batch would repeat (1: step it). Only
  policies that declare ``decode_stretches`` (:mod:`batchsim.scheduler.fast_forward`) are
  fast-forwarded (:func:`stretches_allowed`); any other policy is asked at every iteration.
- :func:`cohort_repeat` — the same for the built-in policies' cohort alone, from its counts by
  block offset, whatever the batch size.
- :func:`prompt_chunk_repeat` — chunked prefill's iterations of the cohort and one prompt's
  chunk (:meth:`~batchsim.scheduler.Scheduler.prompt_chunk_repeat`).

External events are the engine's to cut. This module imports no simpy and nothing of the
engine loop.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from batchsim.engine.cohort import Cohort
from batchsim.engine.kv_cache import KVCacheManager
from batchsim.errors import PolicyError
from batchsim.scheduler.fast_forward import declaration
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput
from batchsim.scheduler.registry import policy_name

_WINDOWED_MAX_STEPS = 1024
"""Longest stretch of a sliding-window model (its KV usage is computed per request and step)."""


def stretches_allowed(policy: type[Scheduler]) -> bool:
    """Whether ``policy`` promises ``decode_stretches``
    (:func:`~batchsim.scheduler.fast_forward.declaration`: a subclass of a built-in policy
    that overrides ``schedule()`` is stepped unless it declares the promise again)."""
    return declaration(policy).decode_stretches


def repeat_limit(scheduler: Scheduler, output: SchedulerOutput) -> int:
    """How many consecutive iterations would run exactly this decode-only batch.

    Bounded by the first request to finish (its last token ends the stretch), by the KV
    blocks the growing contexts need, by a swapped-out request that could resume, and by the
    policy (:meth:`~Scheduler.policy_max_repeat`). 1 for anything but pure decode and for an
    iteration that preempted or swapped. External events are the engine's to cut.

    With prefix caching, a stretch neither evicts a cached block (its growth takes only
    empty blocks, and an iteration whose ``schedule()`` evicted runs alone) nor registers
    one before its last iteration: the cached blocks stay the same throughout.
    """
    kv = scheduler.kv_cache
    if kv.num_evicted_blocks:
        return 1  # its schedule() evicted cached blocks: that belongs to this iteration only
    if output.num_prefill_seqs:
        if output.num_prefill_seqs == 1 and not output.has_side_work:
            return prompt_chunk_repeat(scheduler, output)
        return 1
    if not output.num_decode_seqs or output.has_side_work:
        return 1  # preemptions and swaps belong to one iteration
    if scheduler.swapped and len(scheduler.running) < scheduler.max_num_seqs:
        head = scheduler.swapped[0]
        if kv.can_swap_in(head, head.num_computed_tokens + 1):
            return 1  # the next schedule() may resume it; free blocks only shrink later
    requests = output.requests
    batch = scheduler.cohort_batch(output)
    if batch is not None and batch.pure:  # the cohort alone: no look at each request
        most = policy_max_repeat(scheduler, output)
        steps = cohort_repeat(kv, batch.cohort, most)
        if batch.cohort.window and steps > 1 and (scheduler.waiting or scheduler.swapped):
            steps = min(steps, _steps_before_freeing(kv, batch.cohort, steps))
        return steps
    if (
        batch is not None
        and batch.cohort.window
        and any(r._computed >= batch.cohort.window for _, r, _ in batch.loose)
    ):
        # A decode past the window that is not a member holds blocks its first step frees
        # (a prompt's, before the window slid); it joins at the next schedule(), and the
        # stretch of the cohort alone is priced in runs: one step first.
        return 1
    if batch is None and (scheduler._cohort is None or not scheduler._cohort.n):
        steps = min(r.max_tokens - r._outputs for r in requests)  # none is in a cohort
    else:
        steps = min(r.max_tokens - r.num_output_tokens for r in requests)
    steps = min(steps, policy_max_repeat(scheduler, output))
    prefix = scheduler._prefix
    if prefix is not None and steps > 1:  # the last iteration may complete a keyed block
        steps = min(steps, min(prefix.steps_to_register(r, 1) for r in requests))
    if steps <= 1 or scheduler.reserves_full_sequence:
        return max(1, steps)
    steps = kv.max_growth_steps(requests, steps)
    if kv.window is not None and steps > 1 and (scheduler.waiting or scheduler.swapped):
        # A window frees blocks as contexts slide; a policy may then admit a waiting (or
        # resume a swapped) request, so the stretch ends before free blocks exceed today's.
        # (With none, freed blocks change nothing until an arrival, which ends a stretch.)
        steps = min(steps, _WINDOWED_MAX_STEPS)
        usage = np.atleast_1d(kv.usage_during_growth(requests, steps))
        freed = np.flatnonzero(usage < usage[0])
        if freed.size:
            steps = int(freed[0])
    return max(1, steps)


def policy_max_repeat(scheduler: Scheduler, output: SchedulerOutput) -> int:
    """:meth:`~Scheduler.policy_max_repeat` as a python int (a policy may count in numpy
    integers); a policy that returns anything but an integer broke a rule."""
    policy: Any = scheduler  # (its answer is not assumed to be an int, compiled or not)
    most = policy.policy_max_repeat(output)
    if type(most) is int and most >= 1:
        return most
    # (int(): a numpy integer's comparison gives a numpy bool, which compiled code refuses)
    if isinstance(most, bool) or not isinstance(most, numbers.Integral) or int(most) < 1:
        raise PolicyError(
            f"scheduler.policy {policy_name(type(scheduler))}: policy_max_repeat() "
            f"returned {most!r}; it must return an integer >= 1 (1: no repeat)"
        )
    return int(most)


def cohort_repeat(kv: KVCacheManager, cohort: Cohort, most: int) -> int:
    """How many consecutive iterations of the whole cohort, and nothing else, would run (at
    most ``most``): up to the first member's last token, while the KV blocks last."""
    steps = min(cohort.min_remaining(), most)
    if steps <= 1:
        return max(1, steps)
    empty = kv.num_free_blocks - kv.num_idle_blocks  # a stretch never evicts
    if cohort.groups * cohort.n * ((steps - 1) // kv.block_size + 1) <= empty:
        return steps  # room for a new block per member (and group) at every block boundary
    return max(1, kv.max_growth_from_offsets(cohort.offsets(), steps, cohort.window_offsets()))


def _steps_before_freeing(kv: KVCacheManager, cohort: Cohort, most: int) -> int:
    """With a window and a request waiting (or swapped out): the steps of a stretch of the
    cohort alone before the pool holds fewer blocks than at its first (the policy might then
    admit or resume it), as :func:`repeat_limit` cuts a stretch of any requests. The blocks
    held beyond the first step's repeat with the block size, growing by the full-attention
    groups' share, so the first period says it."""
    at_least, freed = cohort.offsets(), cohort.window_offsets()
    assert freed is not None
    for k in range(2, min(most, kv.block_size + 1) + 1):
        if kv.growth_from_offsets(at_least, k, freed) < 0:
            return k - 1
    return most


def prompt_chunks_allowed(policy: type[Scheduler]) -> bool:
    """Whether ``policy`` fast-forwards prompt chunks: its ``schedule`` is defined by the
    class that defines :meth:`~Scheduler.prompt_chunk_repeat` (a subclass that overrides
    ``schedule()`` does not inherit it)."""
    allowed = _CHUNKS_ALLOWED.get(policy)
    if allowed is None:
        allowed = False
        for klass in policy.__mro__:
            if "schedule" in klass.__dict__:
                allowed = "prompt_chunk_repeat" in klass.__dict__
                break
        _CHUNKS_ALLOWED[policy] = allowed
    return allowed


_CHUNKS_ALLOWED: dict[type, bool] = {}


def prompt_chunk_repeat(scheduler: Scheduler, output: SchedulerOutput) -> int:
    """How many consecutive iterations would run exactly this iteration of decodes and one
    non-final prompt chunk, each decode one token further and the chunk as long, further
    along its prompt (:meth:`~Scheduler.prompt_chunk_repeat`; 1 for a policy that does not
    promise it with its ``schedule()``)."""
    if not prompt_chunks_allowed(type(scheduler)):
        return 1
    return max(1, scheduler.prompt_chunk_repeat(output))
