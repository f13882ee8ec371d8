"""Runs of equal iterations, as fast-forward (:mod:`batchsim.engine.stretch`) and the
pipeline engine log them: the row a run writes, and the walk of a run to the first
iteration that ends at or after an event."""

from __future__ import annotations

from batchsim.cost.costs import StepCost

NO_DELTAS = (0.0, 0.0, 0.0, 0.0)
"""The per-step growth of a run whose iterations cost the same."""


def run_row(
    start: float,
    steps: int,
    duration: float,
    cost: StepCost,
    batch: tuple,
    deltas: tuple[float, float, float, float] = NO_DELTAS,
) -> tuple:
    """A row of :data:`~batchsim.metrics.iterations.RUN_COLUMNS` + ``BATCH_COLUMNS``: ``steps``
    iterations of ``duration`` from ``start``, the first costing ``cost``, each next one
    adding ``deltas`` (FLOPs, bytes, KV bytes, bound margin)."""
    time, flops, nbytes, weight_bytes, kv_bytes, margin = cost
    return (
        start,
        steps,
        duration,
        time * 1e3,
        flops,
        nbytes,
        weight_bytes,
        kv_bytes,
        margin,
        *deltas,
        *batch,
    )


def run_until(start: float, duration: float, event: float, most: int) -> tuple[int, float]:
    """Walk a run of up to ``most`` back-to-back iterations of ``duration`` from ``start`` to
    the first that ends at or after ``event``: (its step j in 1..most, its end), or (``most``,
    the run's end) if none does. Each end is the previous one plus the duration, as the
    engine's clock advances stepping one iteration at a time (``start + duration x j`` may
    differ from that in the last bits, and two events meant for one instant must be one
    float on either path). A run of equal iterations is at most a KV block of the attention
    kernel long, so this costs an addition per iteration."""
    end, j = start, 0
    while j < most:
        end += duration
        j += 1
        if end >= event:
            break
    return j, end
