"""Elementwise kernels: norms, activation, rotary embedding, residual add, KV-cache write.

Owns :class:`ElementwisePricing`: a fixed time per launch plus the p-norm of two limits, the
time to stream the kernels' bytes (16-bit activations) and the time their SMs need for the
work (FLOPs at the SM-side rate of these kernels: one-CTA-per-token reductions, rotary
lookups and activations run at a fraction of the memory bandwidth on GPUs with much bandwidth
per SM, and at the memory bandwidth on GPUs with little); ``ideal`` is the plain roofline.
How many values each kernel of a layer moves is the layer geometry's business
(:mod:`batchsim.cost.layers`), not this module's.

Must not import anything from batchsim but :mod:`batchsim.cost.costs`.
"""

from __future__ import annotations

from batchsim.cost.costs import ACT_BYTES, KernelCost, smoothmax

__all__ = ["ElementwisePricing"]


class ElementwisePricing:
    """Prices memory-bound elementwise kernels on one GPU.

    Args:
        bandwidth: Achievable B/s of norm / activation / rotary / residual-add kernels
            (their memory side).
        kernel_time: Fixed time per kernel launch, s.
        peak: Achievable FLOP/s (only the compute part of the roofline uses it).
        cache_write_bandwidth: Achievable B/s of the KV-cache write (reshape-and-cache).
        sm_peak: FLOP/s the SMs sustain in these kernels (their SM side), all SMs.
        transition_exponent: p of the p-norm joining the SM and the memory time.
        ideal: Plain roofline: ``max(FLOPs / peak, bytes / bandwidth)``, no fixed time.
    """

    __slots__ = (
        "bandwidth",
        "cache_write_bandwidth",
        "ideal",
        "kernel_time",
        "p",
        "peak",
        "sm_peak",
    )

    def __init__(
        self,
        *,
        bandwidth: float,
        kernel_time: float,
        peak: float,
        cache_write_bandwidth: float,
        sm_peak: float,
        transition_exponent: float,
        ideal: bool = False,
    ) -> None:
        self.bandwidth = bandwidth
        self.kernel_time = kernel_time
        self.peak = peak
        self.cache_write_bandwidth = cache_write_bandwidth
        self.sm_peak = sm_peak
        self.p = transition_exponent
        self.ideal = ideal

    def price(self, elems: float, flops: float, kernels: float) -> KernelCost:
        """``kernels`` launches of one kind moving ``elems`` 16-bit values and doing ``flops``
        in all (the p-norm is per kind: kinds differ in FLOPs per byte)."""
        nbytes = elems * ACT_BYTES
        tm = nbytes / self.bandwidth
        tc = flops / self.peak
        if self.ideal:  # plain roofline
            return KernelCost(flops, nbytes, 0.0, tc if tc > tm else tm, tc, tm)
        # a fixed time per kernel plus the slower of the SM-side and the memory-side time
        time = kernels * self.kernel_time + smoothmax(flops / self.sm_peak, tm, self.p)
        return KernelCost(flops, nbytes, 0.0, time, tc, tm)

    def cache_write(self, elems: float, kv_dtype_bytes: float, kernels: float) -> KernelCost:
        """``kernels`` KV-cache writes of ``elems`` values: read the new 16-bit K and V rows,
        write them into the cache in the KV dtype."""
        nbytes = elems * (ACT_BYTES + kv_dtype_bytes)
        tm = nbytes / self.cache_write_bandwidth
        time = tm if self.ideal else kernels * self.kernel_time + tm
        return KernelCost(0.0, nbytes, 0.0, time, 0.0, tm)
