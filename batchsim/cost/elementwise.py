"""Elementwise kernels: norms, activation, rotary embedding, residual add, KV-cache write.

Owns :class:`ElementwisePricing`: memory-bound kernels priced as a fixed time per launch plus
the time to stream their bytes (16-bit activations), from explicit hardware terms; ``ideal``
is the plain roofline. How many values each kernel of a layer moves is the layer geometry's
business (:mod:`batchsim.cost.layers`), not this module's.

Must not import anything from batchsim but :mod:`batchsim.cost.costs`.
"""

from __future__ import annotations

from batchsim.cost.costs import ACT_BYTES, KernelCost

__all__ = ["ElementwisePricing"]


class ElementwisePricing:
    """Prices memory-bound elementwise kernels on one GPU.

    Args:
        bandwidth: Achievable B/s of norm / activation / rotary / residual-add kernels.
        kernel_time: Fixed time per kernel launch, s.
        peak: Achievable FLOP/s (only the compute part of the roofline uses it).
        cache_write_bandwidth: Achievable B/s of the KV-cache write (reshape-and-cache).
        ideal: Plain roofline: ``max(FLOPs / peak, bytes / bandwidth)``, no fixed time.
    """

    __slots__ = ("bandwidth", "cache_write_bandwidth", "ideal", "kernel_time", "peak")

    def __init__(
        self,
        *,
        bandwidth: float,
        kernel_time: float,
        peak: float,
        cache_write_bandwidth: float,
        ideal: bool = False,
    ) -> None:
        self.bandwidth = bandwidth
        self.kernel_time = kernel_time
        self.peak = peak
        self.cache_write_bandwidth = cache_write_bandwidth
        self.ideal = ideal

    def price(self, elems: float, flops: float, kernels: float) -> KernelCost:
        """``kernels`` launches moving ``elems`` 16-bit values and doing ``flops`` in all."""
        nbytes = elems * ACT_BYTES
        tm = nbytes / self.bandwidth
        tc = flops / self.peak
        # ideal: plain roofline; else a fixed time per kernel plus the streaming time
        time = (tc if tc > tm else tm) if self.ideal else kernels * self.kernel_time + tm
        return KernelCost(flops, nbytes, 0.0, time, tc, tm)

    def cache_write(self, elems: float, kv_dtype_bytes: float, kernels: float) -> KernelCost:
        """``kernels`` KV-cache writes of ``elems`` values: read the new 16-bit K and V rows,
        write them into the cache in the KV dtype."""
        nbytes = elems * (ACT_BYTES + kv_dtype_bytes)
        tm = nbytes / self.cache_write_bandwidth
        time = tm if self.ideal else kernels * self.kernel_time + tm
        return KernelCost(0.0, nbytes, 0.0, time, 0.0, tm)
