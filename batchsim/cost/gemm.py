"""GEMM kernels: what one (grouped) matrix multiply of a layer costs on one GPU.

Owns :class:`Gemm` (the shape of one weight GEMM: ``rows x k @ k x n``, possibly ``groups`` of
them) and :class:`GemmPricing`, which prices it from explicit hardware terms: FLOPs, bytes
(weights in the weight dtype, activations 16-bit) and time

    ``min_kernel_time + smoothmax_p(t_compute, t_memory)``

where ``t_compute`` counts tile and wave quantization on ``num_sms`` SMs (the library is assumed
to pick the fastest of four tile shapes — ``tile_m x tile_n`` and halves of either, the tile
height shrunk to the next power of two >= the rows — and of split-K factors 1-4) and
``t_memory = bytes / bandwidth``. A measured correction (``correction``: the profile's GEMM
table, :mod:`batchsim.catalog.gemm_table`) multiplies the time of a single (ungrouped) GEMM by
``exp(correction(rows, n, k))``; FLOPs, bytes and the bound stay the model's. ``ideal=True`` is
the plain roofline ``max(FLOPs / peak, bytes / bandwidth)``, without correction. Parameters
and their derivation: ``docs/calibration.md``.

Must not import anything from batchsim but :mod:`batchsim.cost.costs`: it knows nothing of
models, layers, iterations or hardware profiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from batchsim.cost.costs import ACT_BYTES, CostSum, KernelCost, smoothmax

__all__ = ["MIN_TILE_M", "MIN_TILE_N", "Gemm", "GemmPricing"]

SPLIT_K = (1, 2, 3, 4)
"""Split-K factors a GEMM library tries on skinny problems."""
MIN_K_SLICE = 128
"""A split-K slice is at least this deep."""
MIN_TILE_M = 16
"""Smallest tensor-core tile height (mma m16)."""
MIN_TILE_N = 8
"""Smallest tensor-core tile width."""
_CACHE_LIMIT = 65536  # entries of the compute-time memo


@dataclass(frozen=True, slots=True)
class Gemm:
    """One (grouped) weight GEMM of a layer: ``groups`` x [rows, k] @ [k, n].

    Attributes:
        k: Input features.
        n: Output features.
        groups: Independent GEMMs of this shape (heads, experts), each with its own weights.
    """

    k: int
    n: int
    groups: float = 1.0


def _pow2ceil(x: float) -> float:
    """Smallest power of two >= x (x >= 1)."""
    return float(1 << max(0, math.ceil(math.log2(x)))) if x > 1 else 1.0


class GemmPricing:
    """Prices GEMM kernels on one GPU.

    Args:
        peak: Achievable FLOP/s (dense peak of the compute dtype x compute efficiency).
        bandwidth: Achievable device-memory B/s.
        num_sms: SMs (CUs) the output tiles run on in waves.
        min_kernel_time: Fixed time per kernel (launch, pipeline fill and drain), s.
        transition_exponent: p of :func:`~batchsim.cost.costs.smoothmax`.
        tile_m: Output tile rows (tokens) of the large kernels, >= :data:`MIN_TILE_M`.
        tile_n: Output tile columns (features), >= :data:`MIN_TILE_N`.
        weight_bytes: Bytes per weight element (the weight dtype).
        ideal: Plain roofline: no quantization, no fixed time, no smooth transition.
        correction: ``(rows, n, k) -> ln(measured / modelled time)`` of one ungrouped GEMM, or
            None (ignored when ``ideal``).
    """

    __slots__ = (
        "_cache",
        "_correction",
        "_factors",
        "_peak_sm",
        "_row_tiling",
        "bandwidth",
        "ideal",
        "min_kernel_time",
        "num_sms",
        "p",
        "peak",
        "tiles",
        "weight_bytes",
    )

    def __init__(
        self,
        *,
        peak: float,
        bandwidth: float,
        num_sms: int,
        min_kernel_time: float,
        transition_exponent: float,
        tile_m: float,
        tile_n: float,
        weight_bytes: float,
        ideal: bool = False,
        correction: Callable[[float, float, float], float] | None = None,
    ) -> None:
        self.peak = peak
        self.bandwidth = bandwidth
        self.num_sms = num_sms
        self.min_kernel_time = min_kernel_time
        self.p = transition_exponent
        self.weight_bytes = weight_bytes
        self.ideal = ideal
        half_m, half_n = max(MIN_TILE_M, tile_m / 2), max(float(MIN_TILE_N), tile_n / 2)
        # the tile shapes (rows, columns) the library chooses from, largest first
        self.tiles = tuple(
            dict.fromkeys(((tile_m, tile_n), (half_m, tile_n), (tile_m, half_n), (half_m, half_n)))
        )
        self._peak_sm = peak / num_sms
        self._cache: dict[tuple, float] = {}
        self._correction = None if ideal else correction
        self._factors: dict[tuple[float, int, int], float] = {}
        self._row_tiling: dict[float, tuple[float, tuple[int, ...]]] = {}

    def compute_time(self, rows: float, k: int, n: int, groups: float) -> float:
        """Tile- and wave-quantized compute time of ``groups`` GEMMs of rows x k x n, s.

        The rows count only through the tile height and the tiles they fill, so the time is
        cached per those (prefills of nearby lengths share it)."""
        tiling = self._row_tiling.get(rows)
        if tiling is None:  # (the GEMMs of an iteration share its rows: once per row count)
            cap = min(max(_pow2ceil(rows), MIN_TILE_M), self.tiles[0][0])
            heights = tuple(
                [math.ceil(rows / (tm0 if tm0 < cap else cap)) for tm0, _ in self.tiles]
            )
            tiling = (cap, heights)
            if len(self._row_tiling) < _CACHE_LIMIT:
                self._row_tiling[rows] = tiling
        cap, heights = tiling
        key = (k, n, groups, cap, heights)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        peak_sm = self._peak_sm
        best = math.inf
        for (tm0, tn), height in zip(self.tiles, heights):
            tm = tm0 if tm0 < cap else cap
            tiles = groups * height * math.ceil(n / tn)
            for split in SPLIT_K:
                if split > 1 and k / split < MIN_K_SLICE:
                    break
                waves = math.ceil(tiles * split / self.num_sms - 1e-9)
                t = waves * 2.0 * tm * tn * (k / split) / peak_sm
                if t < best:
                    best = t
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[key] = best
        return best

    def price(
        self, gemm: Gemm, rows: float, *, weight_groups: float = -1.0, kernels: float = 1.0
    ) -> KernelCost:
        """One kernel of ``gemm`` over ``rows`` rows per group (> 0).

        ``weight_groups`` overrides how many of the ``groups`` weight matrices are read (MoE:
        the expected number of touched experts); ``rows`` is then rows per touched group.
        ``kernels``: launches that pay the fixed time (e.g. a GEMM plus a small helper kernel).
        """
        wg = gemm.groups if weight_groups < 0 else weight_groups
        flops = 2.0 * rows * gemm.k * gemm.n * wg
        weight = gemm.k * gemm.n * wg * self.weight_bytes
        nbytes = weight + rows * wg * (gemm.k + gemm.n) * ACT_BYTES
        tm = nbytes / self.bandwidth
        if self.ideal:
            tc = flops / self.peak
            time = tc if tc > tm else tm
        else:
            tc = self.compute_time(rows, gemm.k, gemm.n, wg)
            time = kernels * self.min_kernel_time + smoothmax(tc, tm, self.p)
            if self._correction is not None and wg == 1.0:
                time *= self.factor(rows, gemm.n, gemm.k)
        return KernelCost(flops, nbytes, weight, time, tc, tm)

    def factor(self, rows: float, n: int, k: int) -> float:
        """The measured correction of one rows x k x n GEMM's time (1.0 without one)."""
        correction = self._correction
        if correction is None:
            return 1.0
        key = (rows, n, k)
        f = self._factors.get(key)
        if f is None:
            f = math.exp(correction(rows, n, k))
            if len(self._factors) < _CACHE_LIMIT:
                self._factors[key] = f
        return f

    def add(
        self,
        acc: CostSum,
        gemms: Iterable[Gemm],
        rows: float,
        times: float,
        *,
        weight_groups: float = -1.0,
        kernels: float = 1.0,
    ) -> None:
        """Add ``times`` (layers) x one kernel of each of ``gemms`` over ``rows`` rows to
        ``acc``; nothing when ``rows`` or ``times`` is not positive."""
        if rows <= 0 or times <= 0:
            return
        price = self.price
        for gemm in gemms:
            acc.add(price(gemm, rows, weight_groups=weight_groups, kernels=kernels), times)
