"""An engine's settings, in SI units: what the experiment's ``engine:`` block (and the
hardware profile's CPU terms) make of its loop."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings in SI units."""

    cpu_overhead_base: float = 0.0
    """CPU time per iteration (s)."""
    cpu_overhead_per_seq: float = 0.0
    """Extra CPU time per request in the iteration (s)."""
    async_scheduling: bool = False
    cuda_graph_max_batch_size: int = 0
    """Pad decode-only batches up to the next CUDA-graph size up to this (0: no padding)."""
    swap_time_per_block: float = 0.0
    """Time to copy one KV block between GPU and host memory (s)."""
    fast_forward: bool = True
    record_slots: bool = False
    """Keep a :class:`~batchsim.metrics.slots.SlotLog` of the batch slots."""
