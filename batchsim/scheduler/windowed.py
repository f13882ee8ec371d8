"""The iteration of a cohort of decodes with the requests scheduled around it, its
:class:`~batchsim.cost.BatchShape` counted as :meth:`~batchsim.cost.BatchShape.from_requests`
counts it, in work independent of the cohort's size
(:class:`~batchsim.scheduler.cohorts.CohortScheduling` builds it); with a sliding window (on
every layer, or in a hybrid model's sliding-window layers) each member has computed its
window, so its reads are the whole of it."""

from __future__ import annotations

from batchsim.cost import BatchShape
from batchsim.cost.shapes import cached_keys, window_pairs
from batchsim.engine.request import Request
from batchsim.scheduler.output import CohortBatch, SchedulerOutput

_new_shape = tuple.__new__  # builds a BatchShape without its Python-level __new__


def cohort_reads(
    members: int, kv_read: int, window: int | None, hybrid: int | None
) -> tuple[int, int, int, int]:
    """(cached keys read, pairs; the same in a ``hybrid`` model's sliding layers) of a
    cohort's ``members`` decodes, which read ``kv_read`` cached tokens in all: with a window
    (``window``: every layer's), each member reads the W - 1 cached keys of its window and
    computes W pairs."""
    if window is not None:
        read = members * (window - 1)
        return read, read + members, 0, 0
    if hybrid is None:
        return kv_read, kv_read + members, 0, 0
    read = members * (hybrid - 1)
    return kv_read, kv_read + members, read, read + members


def cohort_shape(members: int, kv_read: int, window: int | None, hybrid: int | None) -> BatchShape:
    """The shape of the cohort alone (reads as :func:`cohort_reads` counts them)."""
    read, pairs, window_read, window_pairs_sum = cohort_reads(members, kv_read, window, hybrid)
    if hybrid is None:
        fields: tuple = (members, 0, members, 0, members, read, pairs, 0, 0, None, None)
    else:
        fields = (members, 0, members, 0, members, read, pairs, 0, 0, window_read, window_pairs_sum)
    return _new_shape(BatchShape, fields)


def batch_output(
    requests: list[Request],
    tokens: list[int],
    preempted: list[Request],
    batch: CohortBatch | None,
    others: list[tuple[int, Request, int]],
    members: int,
    kv_read: int,
    window: int | None,
    hybrid: int | None,
) -> SchedulerOutput:
    """The iteration of ``batch``'s cohort (``members`` decodes reading ``kv_read`` cached
    tokens, counted by :func:`cohort_reads`) and ``others`` (position, request, tokens),
    ``requests`` in all, counted as :meth:`~batchsim.cost.BatchShape.from_requests` counts
    them (``window``: every layer's; ``hybrid``: a hybrid model's sliding layers')."""
    decodes = num_decode = sampled = members
    prefill = 0
    kv_read, pairs, window_read, window_pairs_sum = cohort_reads(members, kv_read, window, hybrid)
    for _, request, q in others:
        computed = request.num_computed_tokens
        outputs = request.num_output_tokens
        left = request.num_prompt_tokens + outputs - computed
        if left == 1 and outputs > 0:
            decodes += q
            num_decode += 1
        else:
            prefill += q
        sampled += q == left
        cached = cached_keys(computed, window)
        kv_read += cached
        pairs += window_pairs(q, cached, window)
        if hybrid is not None:
            cached = cached_keys(computed, hybrid)
            window_read += cached
            window_pairs_sum += window_pairs(q, cached, hybrid)
    n = len(requests)
    if hybrid is None:
        fields: tuple = (n, prefill, decodes, 0, sampled, kv_read, pairs, 0, 0, None, None)
    else:
        fields = (
            n,
            prefill,
            decodes,
            0,
            sampled,
            kv_read,
            pairs,
            0,
            0,
            window_read,
            window_pairs_sum,
        )
    shape = _new_shape(BatchShape, fields)
    if batch is not None:
        batch.requests, batch.size = requests, n
    return SchedulerOutput(
        requests,
        tokens,
        shape,
        num_prefill_seqs=n - num_decode,
        num_decode_seqs=num_decode,
        num_slots=n,
        num_output_tokens=sampled,
        preempted=preempted,
        batch=batch,
    )
