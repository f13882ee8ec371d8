"""Communication between GPUs: the ring all-reduce of tensor parallelism, the
point-to-point send of pipeline parallelism, and the KV-cache transfer of disaggregated
serving.

Owns the ring all-reduce formula, ``t = latency + 2 (n-1)/n x bytes / link_bandwidth`` for
``n`` GPUs (:func:`ring_all_reduce_time`), and :class:`AllReducePricing`, which applies it to
the two all-reduces per layer of tensor parallelism; and the point-to-point formula
``t = latency + bytes / link_bandwidth`` (:func:`p2p_time`) of the activations one pipeline
stage sends the next. The functions take numbers or arrays.

A KV transfer (:func:`kv_transfer_link_time`, :func:`layerwise_exposed_time`) moves a prompt's
KV cache from a prefill instance to a decode instance, one link per GPU: the GPUs' shards move
in parallel, so the time is the larger per-GPU shard (of the sending or the receiving side)
over one link's bandwidth, plus the link's latency.

Must not import anything from batchsim but :mod:`batchsim.cost.costs`.
"""

from __future__ import annotations

from typing import Any

from batchsim.cost.costs import ACT_BYTES, ZERO_OP, OpCost

__all__ = [
    "AllReducePricing",
    "kv_transfer_link_time",
    "layerwise_exposed_time",
    "p2p_time",
    "ring_all_reduce_link_bytes",
    "ring_all_reduce_time",
]


def kv_transfer_link_time(
    num_tokens: Any, bytes_per_token_per_gpu: float, link_bandwidth: float
) -> Any:
    """Time the KV of ``num_tokens`` tokens takes on the link, s (latency excluded): each GPU's
    shard of ``bytes_per_token_per_gpu`` per token moves over its own link of
    ``link_bandwidth`` B/s, all shards at once."""
    return num_tokens * bytes_per_token_per_gpu / link_bandwidth


def layerwise_exposed_time(link_time: Any, compute_time: Any, num_layers: int) -> Any:
    """The part of a transfer streamed layer by layer that the prefill does not hide, s.

    The prefill computes its ``num_layers`` layers one after another, each taking
    ``compute_time / num_layers``; layer l's KV goes on the link as soon as it is computed and
    the link has sent layer l-1's, each taking ``link_time / num_layers``. The last layer's KV
    is ready when the prefill ends; the link finishes it ``max(link_time / L, link_time -
    compute_time x (L-1)/L)`` later: the last layer's share when the link keeps up with the
    compute, else what the first L-1 layers' compute could not hide (the latency comes on
    top).
    """
    layers = float(num_layers)
    hidden = compute_time * (layers - 1.0) / layers
    rest = link_time - hidden
    last = link_time / layers
    return rest if rest > last else last


def ring_all_reduce_link_bytes(num_bytes: Any, num_gpus: Any) -> Any:
    """Bytes each GPU sends in a ring all-reduce of ``num_bytes`` over ``num_gpus`` GPUs."""
    return 2.0 * (num_gpus - 1) / num_gpus * num_bytes


def ring_all_reduce_time(
    num_bytes: Any, num_gpus: Any, link_bandwidth: float, latency: float
) -> Any:
    """Time of one ring all-reduce of ``num_bytes`` over ``num_gpus`` >= 2 GPUs, s."""
    return ring_all_reduce_link_bytes(num_bytes, num_gpus) / link_bandwidth + latency


def p2p_time(num_bytes: Any, link_bandwidth: float, latency: float) -> Any:
    """Time to send ``num_bytes`` from one GPU to another over one link, s."""
    return latency + num_bytes / link_bandwidth


class AllReducePricing:
    """Prices the all-reduces of tensor parallelism over ``num_gpus`` GPUs.

    Args:
        num_gpus: Tensor-parallel degree (1: no communication).
        link_bandwidth: Achievable GPU-to-GPU B/s per direction.
        latency: Fixed time per all-reduce, s.
    """

    __slots__ = ("latency", "link_bandwidth", "num_gpus")

    def __init__(self, *, num_gpus: int, link_bandwidth: float, latency: float) -> None:
        self.num_gpus = num_gpus
        self.link_bandwidth = link_bandwidth
        self.latency = latency

    def time(self, num_bytes: float) -> float:
        """One ring all-reduce of ``num_bytes``, s (0 on one GPU)."""
        if self.num_gpus == 1:
            return 0.0
        return ring_all_reduce_time(num_bytes, self.num_gpus, self.link_bandwidth, self.latency)

    def layers(self, rows: float, hidden_size: int, num_layers: int) -> OpCost:
        """The ``all_reduce`` group: two all-reduces per layer (after attention and after the
        MLP) of ``rows x hidden_size`` 16-bit values; ``bytes`` counts the bytes sent."""
        if self.num_gpus == 1 or rows <= 0:
            return ZERO_OP
        message = rows * hidden_size * ACT_BYTES
        link = ring_all_reduce_link_bytes(message, self.num_gpus)
        per = ring_all_reduce_time(message, self.num_gpus, self.link_bandwidth, self.latency)
        return OpCost(0.0, 2.0 * num_layers * link, 2.0 * num_layers * per)
