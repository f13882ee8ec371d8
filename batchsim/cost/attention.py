"""The attention kernel: what one layer's attention over the KV cache costs on one GPU.

Owns :class:`AttentionGeometry` (per-GPU sizes of a layer's attention: KV elements per token,
FLOPs per (query, key) pair, how query heads share KV heads) and :class:`AttentionPricing`, a
model of FlashAttention-2's split-KV kernel, the decode and chunked-prefill path of the profiled
engine:

* decode rows: each request's KV heads (MLA: 64-head row blocks) are one CTA each, or ``s``
  CTAs when split-KV is on (FlashAttention's own split heuristic, then a combine kernel); CTAs
  run in rounds of 2 per SM, the busiest SM's CTAs streaming whole 128-token KV blocks at
  min(per-SM rate, their share of the memory bandwidth), each round paying a fixed time;
* prefill rows: 64-row blocks of compute (plus the causally masked pairs the kernel pays for)
  against the memory traffic, joined by :func:`~batchsim.cost.costs.smoothmax`;
* one fixed time per call; ``ideal``: the plain roofline of the causal pairs and the bytes.

FLOPs are the *causal* pairs x :attr:`AttentionGeometry.flops_per_pair`, whatever the kernel
wastes. MLA (DeepSeek) uses the absorbed formulation for every row: attention runs over the
latent cache (``kv_lora_rank + qk_rope_head_dim`` per token, replicated on every TP rank) and
each pair costs ``2 (kv_lora + rope) + 2 kv_lora`` FLOPs per head; for long prefills this
over-counts attention FLOPs versus vLLM's naive prefill path (up to ~3.4x for DeepSeek-V3).
Parameters and their derivation: ``docs/calibration.md``.

Must not import anything from batchsim but :mod:`batchsim.cost.costs`,
:mod:`batchsim.cost.shapes` and :mod:`batchsim.catalog.model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchsim.catalog.model import ModelSpec
from batchsim.cost.costs import ACT_BYTES, DecodeSlopes, KernelCost, OpCost, vmax
from batchsim.cost.shapes import BatchShape

__all__ = [
    "AttentionGeometry",
    "AttentionPricing",
    "decode_steps_in_block",
    "split_context",
]

# Kernel geometry of FlashAttention-2's split-KV kernel (not fitted):
BLOCK_M = 64  # query rows per CTA
BLOCK_N = 128  # keys per KV block (head_dim <= 128)
CTAS_PER_SM = 2  # resident CTAs per SM (4 warps, ~80 KB shared memory each)
SPLIT_FILL = 0.8  # no split-KV once the CTAs fill 80 % of the SMs
SPLIT_TOL = 0.85  # smallest split count whose wave efficiency is >= 85 % of the best
MAX_SPLITS = 128
_CACHE_LIMIT = 65536  # entries per memo table


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    """Per-GPU sizes of one layer's attention under tensor parallelism.

    Attributes:
        query_heads: Query heads on one GPU.
        kv_heads: KV heads on one GPU (replicated when fewer than tp; MLA: 1, the latent).
        kv_head_elems: KV-cache elements of one KV head per token (K and V; MLA: the latent,
            ``kv_lora_rank + qk_rope_head_dim``).
        kv_elems: KV-cache elements per token (all KV heads; K and V).
        flops_per_pair: FLOPs of one causal (query, key) pair over all query heads.
        head_flops_per_pair: The same for one query head.
        qo_elems: 16-bit query and output elements per row.
    """

    query_heads: float
    kv_heads: int
    kv_head_elems: int
    kv_elems: float
    flops_per_pair: float
    head_flops_per_pair: float
    qo_elems: float

    @classmethod
    def from_model(cls, model: ModelSpec, tp: int) -> AttentionGeometry:
        """The attention of ``model`` split over ``tp`` GPUs (``tp`` divides the query heads)."""
        heads = model.num_attention_heads / tp
        if model.is_mla:
            lora, rope = model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
            pair = 2.0 * (lora + rope) + 2.0 * lora
            return cls(
                query_heads=heads,
                kv_heads=1,  # one latent "KV head" shared by all query heads
                kv_head_elems=lora + rope,
                kv_elems=float(lora + rope),
                flops_per_pair=heads * pair,
                head_flops_per_pair=pair,
                qo_elems=heads * ((lora + rope) + lora),
            )
        kv_heads = math.ceil(model.num_key_value_heads / tp)  # replicated when kv_heads < tp
        return cls.dense(heads, kv_heads, model.head_dim)

    @classmethod
    def dense(cls, query_heads: float, kv_heads: int, head_dim: int) -> AttentionGeometry:
        """Multi-head / grouped-query attention of ``query_heads`` and ``kv_heads`` heads of
        ``head_dim`` on one GPU."""
        hd = head_dim
        return cls(
            query_heads=query_heads,
            kv_heads=kv_heads,
            kv_head_elems=2 * hd,
            kv_elems=2.0 * kv_heads * hd,
            flops_per_pair=query_heads * 4.0 * hd,
            head_flops_per_pair=4.0 * hd,
            qo_elems=2.0 * query_heads * hd,
        )


def split_context(seqs: Any, decodes: Any, rows: Any, kv_read: Any, pairs: Any) -> tuple:
    """(decode context, prefill context, prefill pairs) from an iteration's aggregates.

    ``decodes`` single-row requests and ``rows`` prefill rows of ``seqs - decodes`` chunks
    read ``kv_read`` cached tokens and compute ``pairs`` causal pairs in all. Decodes compute
    c + 1 pairs each; n prefill chunks of q = rows / n rows each compute q c + q (q + 1) / 2,
    so the pair count fixes how the cached tokens are shared (exact for equal chunks).
    """
    n = seqs - decodes
    if n <= 0 or rows <= 0:
        return kv_read, 0.0 * kv_read, 0.0 * kv_read
    if decodes <= 0:
        return 0.0 * kv_read, kv_read, pairs
    q = rows / n
    own = n * q * (q + 1.0) / 2.0
    # q > 1: solve the pair count for the prefill context; else share it per request
    ctx_p = (pairs - decodes - own - kv_read) / (q - 1.0) if q > 1.0 else kv_read * n / seqs
    if isinstance(ctx_p, np.ndarray):
        ctx_p = np.clip(ctx_p, 0.0, kv_read)
    else:
        ctx_p = min(max(ctx_p, 0.0), kv_read)
    ctx_d = kv_read - ctx_p
    return ctx_d, ctx_p, pairs - ctx_d - decodes


def decode_steps_in_block(kv_read_tokens: int, num_decodes: int) -> int:
    """Consecutive decode steps, from ``kv_read_tokens`` cached tokens over ``num_decodes`` > 0
    rows (each step one token further along), that read the same number of KV blocks.

    The kernel reads ceil((kv + n) / (n x block)) blocks per row (mean context kv / n plus the
    new token); this counts the steps before that number grows.
    """
    span = num_decodes * BLOCK_N
    blocks = -(-(kv_read_tokens + num_decodes) // span)
    return max(1, (span * blocks - kv_read_tokens) // num_decodes)


class AttentionPricing:
    """Prices the attention kernel of one layer on one GPU.

    Args:
        geometry: The layer's attention sizes on this GPU.
        kv_dtype_bytes: Bytes per KV-cache element.
        peak: Achievable FLOP/s of the attention kernel (peak x attention efficiency).
        bandwidth: Achievable device-memory B/s.
        num_sms: SMs (CUs).
        sm_bandwidth: B/s one SM streams the KV cache at.
        kernel_time: Fixed time per attention call, s.
        cta_time: Fixed time per round of decode CTAs on an SM, s.
        combine_time: Time of the split-KV combine kernel, s.
        prefill_time: Extra fixed time of a call with prefill rows, s.
        masked_fraction: Causally masked pairs of a prefill chunk the kernel pays for, relative
            to computing them.
        transition_exponent: p of the prefill rows' compute/memory transition.
        ideal: Plain roofline: ``max(FLOPs / peak, bytes / bandwidth)``.
    """

    __slots__ = (
        "_dec_ctas_seq",
        "_dec_pair_flops",
        "_dec_tok_bytes",
        "_decode_cache",
        "_flops_pair",
        "_kv_elems",
        "_peak_sm",
        "_prefill_cache",
        "_qo_elems",
        "_split_cache",
        "bandwidth",
        "combine_time",
        "cta_time",
        "geometry",
        "ideal",
        "kernel_time",
        "kv_dtype_bytes",
        "masked_fraction",
        "num_sms",
        "p",
        "peak",
        "prefill_time",
        "sm_bandwidth",
    )

    def __init__(
        self,
        geometry: AttentionGeometry,
        *,
        kv_dtype_bytes: float,
        peak: float,
        bandwidth: float,
        num_sms: int,
        sm_bandwidth: float,
        kernel_time: float,
        cta_time: float,
        combine_time: float,
        prefill_time: float,
        masked_fraction: float,
        transition_exponent: float,
        ideal: bool = False,
    ) -> None:
        self.geometry = geometry
        self.kv_dtype_bytes = kv_dtype_bytes
        self.peak = peak
        self.bandwidth = bandwidth
        self.num_sms = num_sms
        self.sm_bandwidth = sm_bandwidth
        self.kernel_time = kernel_time
        self.cta_time = cta_time
        self.combine_time = combine_time
        self.prefill_time = prefill_time
        self.masked_fraction = masked_fraction
        self.p = transition_exponent
        self.ideal = ideal
        # hot-path copies of the geometry
        self._flops_pair = geometry.flops_per_pair
        self._kv_elems = geometry.kv_elems
        self._qo_elems = geometry.qo_elems
        # decode: the query heads of one KV head are packed into the rows of one CTA
        group = max(1.0, geometry.query_heads / geometry.kv_heads)
        self._dec_ctas_seq = geometry.kv_heads * math.ceil(group / BLOCK_M)
        self._dec_tok_bytes = geometry.kv_head_elems * kv_dtype_bytes
        self._dec_pair_flops = min(group, BLOCK_M) * geometry.head_flops_per_pair
        self._peak_sm = peak / num_sms
        self._split_cache: dict[tuple[int, int], int] = {}
        self._decode_cache: dict[tuple, float] = {}
        self._prefill_cache: dict[tuple, float] = {}

    # ----------------------------------------------------------------- one iteration
    def group(
        self, shape: BatchShape, tokens: int, num_layers: int, cache_write: KernelCost
    ) -> tuple[OpCost, Any]:
        """The ``attention`` group of an iteration of ``tokens`` rows over ``num_layers``
        layers, with the KV-cache write of its new rows (``cache_write``, all layers).

        Returns:
            The group, and the KV-cache bytes it reads (cached plus new keys).
        """
        L = num_layers
        keys = shape.kv_read_tokens + tokens
        a_flops = L * self._flops_pair * shape.attn_pairs
        kv_read = L * self._kv_elems * self.kv_dtype_bytes * keys
        a_bytes = kv_read + L * tokens * self._qo_elems * ACT_BYTES
        a_time, a_tc, a_tm = self.layer_time(
            shape.num_seqs + shape.num_padding_seqs,
            shape.num_decode_rows,
            shape.num_prefill_tokens
            + shape.num_padding_tokens
            - shape.num_padding_seqs
            - shape.num_graph_padding_tokens,
            shape.kv_read_tokens,
            shape.attn_pairs,
            a_bytes / L,
        )
        a_time, a_tc, a_tm = L * a_time, L * a_tc, L * a_tm
        attn = OpCost(
            a_flops,
            a_bytes + cache_write.bytes,
            a_time + cache_write.time,
            a_tc,
            a_tm + cache_write.memory_time,
        )
        return attn, kv_read

    def hybrid_group(
        self,
        shape: BatchShape,
        tokens: int,
        full_layers: int,
        window_layers: int,
        cache_write: KernelCost,
    ) -> tuple[OpCost, Any]:
        """:meth:`group` of a hybrid model: ``full_layers`` layers read ``kv_read_tokens``
        (and compute ``attn_pairs``), ``window_layers`` sliding-window layers read
        ``window_kv_read_tokens`` (and compute ``window_attn_pairs``)."""
        no_write = KernelCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # written once, with the window
        full, full_read = self.group(shape, tokens, full_layers, no_write)
        windowed = shape._replace(
            kv_read_tokens=shape.window_kv_read_tokens, attn_pairs=shape.window_attn_pairs
        )
        win, win_read = self.group(windowed, tokens, window_layers, cache_write)
        parts = zip(
            (full.flops, full.bytes, full.time, full.compute_time, full.memory_time),
            (win.flops, win.bytes, win.time, win.compute_time, win.memory_time),
        )
        return OpCost(*(a + b for a, b in parts)), full_read + win_read

    def token_slopes(self, num_layers: int) -> DecodeSlopes:
        """Growth of the attention group's totals per extra cached token a decode row reads:
        one pair and one token's K and V per layer (linear; its time is not)."""
        L = num_layers
        kv = L * self._kv_elems * self.kv_dtype_bytes
        return DecodeSlopes(
            flops=L * self._flops_pair,
            bytes=kv,
            kv_bytes=kv,
            compute_time=L * self._flops_pair / self.peak,
            memory_time=kv / self.bandwidth,
        )

    # ----------------------------------------------------------------- one layer
    def kernel(
        self,
        num_seqs: int,
        num_tokens: int,
        kv_read_tokens: int,
        attn_pairs: int,
        prefill_tokens: int = 0,
        split_tokens: float | None = None,
    ) -> OpCost:
        """One layer's attention kernel alone (no KV-cache write).

        ``prefill_tokens`` rows belong to the ``num_seqs - (num_tokens - prefill_tokens)``
        prefill chunks, the other rows are decodes. ``split_tokens``: key length the split-KV
        heuristic sees (the profiled engine padded its block table to ``max_model_len``).
        """
        keys = kv_read_tokens + num_tokens
        flops = self._flops_pair * attn_pairs
        nbytes = (
            self._kv_elems * self.kv_dtype_bytes * keys + num_tokens * self._qo_elems * ACT_BYTES
        )
        decodes = num_tokens - prefill_tokens
        time, tc, tm = self.layer_time(
            num_seqs, decodes, prefill_tokens, kv_read_tokens, attn_pairs, nbytes, split_tokens
        )
        return OpCost(flops, nbytes, time, tc, tm)

    def layer_time(
        self,
        seqs: Any,
        decodes: Any,
        rows: Any,
        kv_read: Any,
        pairs: Any,
        nbytes: Any,
        split_tokens: float | None = None,
    ) -> tuple[Any, Any, Any]:
        """One layer's attention kernel: (time, compute time, memory time), s.

        ``decodes`` single-row requests and ``rows`` prefill rows of ``seqs - decodes``
        chunks read ``kv_read`` cached tokens in all, compute ``pairs`` causal pairs and move
        ``nbytes``. Decode rows are priced by how the split-KV kernel streams the cache (CTAs
        over SMs), prefill rows by their 64-row-block compute against the memory traffic; one
        fixed time per call. ``split_tokens`` is the key length the split heuristic sees
        (default: the mean decode context; the profiled engine used its padded block table).
        """
        tc = self._flops_pair * pairs / self.peak
        tm = nbytes / self.bandwidth
        prefill_seqs = seqs - decodes
        if self.masked_fraction and prefill_seqs > 0 and rows > 0:
            tc = tc + self._flops_pair * self.masked_pairs(rows, prefill_seqs) / self.peak
        if self.ideal:
            return vmax(tc, tm), tc, tm
        time: Any = self.kernel_time
        # split the cached tokens (and pairs) between the decodes and the prefill chunks
        ctx_d, ctx_p, pairs_p = split_context(seqs, decodes, rows, kv_read, pairs)
        if decodes > 0:
            time = time + self.decode_stream(decodes, ctx_d / decodes + 1.0, split_tokens)
        if prefill_seqs > 0 and rows > 0:
            prefill = self._prefill_rows_time(rows, prefill_seqs, ctx_p, pairs_p)
            time = time + self.prefill_time + prefill
        return time, tc, tm

    def scalar_layer_time(
        self, seqs: int, decodes: int, rows: int, kv_read: int, pairs: int, nbytes: float
    ) -> tuple[float, float, float]:
        """:meth:`layer_time` of python numbers (no ``split_tokens``): the same arithmetic in
        the same order, so equal to the last bit, with the prefill rows' time cached like the
        decode rows' (per rows, chunks, context and pairs)."""
        peak = self.peak
        tc = self._flops_pair * pairs / peak
        tm = nbytes / self.bandwidth
        prefill_seqs = seqs - decodes
        has_prefill = prefill_seqs > 0 and rows > 0
        if has_prefill and self.masked_fraction:  # masked_pairs(), inlined
            masked = self.masked_fraction * max(0.0, (rows * rows / prefill_seqs - rows) / 2.0)
            tc = tc + self._flops_pair * masked / peak
        if self.ideal:
            return (tc if tc >= tm else tm), tc, tm
        time = self.kernel_time
        if not has_prefill:  # split_context: every cached token is a decode's
            if decodes > 0:
                ctx = kv_read / decodes + 1.0
                blocks = max(1, math.ceil(ctx / BLOCK_N - 1e-9))
                stream = self._decode_cache.get((decodes, blocks, None))
                if stream is None:
                    stream = self.decode_stream(decodes, ctx, None)
                time = time + stream
            return time, tc, tm
        # split_context() and the decode rows' cached stream, inlined
        if decodes > 0:
            q = rows / prefill_seqs
            own = prefill_seqs * q * (q + 1.0) / 2.0
            if q > 1.0:
                ctx_p = (pairs - decodes - own - kv_read) / (q - 1.0)
            else:
                ctx_p = kv_read * prefill_seqs / seqs
            ctx_p = min(max(ctx_p, 0.0), kv_read)
            ctx_d = kv_read - ctx_p
            pairs_p = pairs - ctx_d - decodes
            ctx = ctx_d / decodes + 1.0
            blocks = max(1, math.ceil(ctx / BLOCK_N - 1e-9))
            stream = self._decode_cache.get((decodes, blocks, None))
            if stream is None:
                stream = self.decode_stream(decodes, ctx, None)
            time = time + stream
        else:
            ctx_p, pairs_p = float(kv_read), float(pairs)  # (exact: token counts < 2**53)
        key = (rows, prefill_seqs, ctx_p, pairs_p)
        prefill = self._prefill_cache.get(key)
        if prefill is None:
            prefill = self._scalar_prefill_rows_time(rows, prefill_seqs, ctx_p, pairs_p)
            if len(self._prefill_cache) < _CACHE_LIMIT:
                self._prefill_cache[key] = prefill
        return time + self.prefill_time + prefill, tc, tm

    def _scalar_prefill_rows_time(
        self, rows: int, prefill_seqs: int, ctx_p: float, pairs_p: float
    ) -> float:
        """:meth:`_prefill_rows_time` of python numbers, with :func:`smoothmax` inlined (the
        same arithmetic)."""
        q = rows / prefill_seqs
        q_pad = math.ceil(q / BLOCK_M) * BLOCK_M
        scale = q_pad / q
        work = pairs_p * scale + self.masked_fraction * prefill_seqs * q_pad * (q_pad - 1) / 2.0
        p_tc = self._flops_pair * work / self.peak
        p_tm = (
            self._kv_elems * self.kv_dtype_bytes * (ctx_p + rows)
            + rows * self._qo_elems * ACT_BYTES
        ) / self.bandwidth
        hi = p_tc if p_tc >= p_tm else p_tm
        if hi <= 0.0:
            return 0.0
        lo = p_tc if p_tc < p_tm else p_tm
        return hi * (1.0 + (lo / hi) ** self.p) ** (1.0 / self.p)

    def _prefill_rows_time(self, rows: Any, prefill_seqs: Any, ctx_p: Any, pairs_p: Any) -> float:
        """Time of the prefill rows of one call (without the fixed ``prefill_time``), from
        numbers of any type (numpy's too; never arrays)."""
        return self._scalar_prefill_rows_time(
            int(rows), int(prefill_seqs), float(ctx_p), float(pairs_p)
        )

    def masked_pairs(self, rows: float, prefill_seqs: float) -> float:
        """Causally masked pairs the kernel still computes, times ``masked_fraction``.

        A chunk of q rows has q(q-1)/2 masked pairs above the diagonal. The shape only holds
        the total prefill rows P of n prefill sequences, so sum(q^2) is estimated as P^2 / n:
        exact for one chunk or for padded (rectangular) prefills, a lower bound otherwise.
        """
        return self.masked_fraction * max(0.0, (rows * rows / prefill_seqs - rows) / 2.0)

    def num_splits(self, ctas: int, blocks: int) -> int:
        """Split-KV factor of FlashAttention's heuristic (cached per (ctas, blocks)).

        No split once ``ctas`` fill 80 % of the SMs; else the smallest split count whose wave
        efficiency (CTAs / SMs over its ceiling) is within 85 % of the best, counting only
        split counts that change the KV blocks per split.
        """
        key = (ctas, blocks)
        cached = self._split_cache.get(key)
        if cached is not None:
            return cached
        sms = self.num_sms
        best = 1
        if ctas < SPLIT_FILL * sms:
            top = min(MAX_SPLITS, sms, blocks)
            effs = []
            for s in range(1, top + 1):
                if s > 1 and -(-blocks // s) == -(-blocks // (s - 1)):
                    effs.append(0.0)
                    continue
                waves = ctas * s / sms
                effs.append(waves / math.ceil(waves))
            target = SPLIT_TOL * max(effs)
            best = next(s for s, e in enumerate(effs, 1) if e > 0 and e >= target)
        if len(self._split_cache) < _CACHE_LIMIT:
            self._split_cache[key] = best
        return best

    def decode_stream(self, seqs: Any, ctx: Any, split_tokens: float | None) -> Any:
        """Time of the decode rows of one attention call: split-KV CTAs streaming the cache.

        ``seqs`` requests of mean context ``ctx`` (new token included; an array for a decode
        stretch). Each request's KV heads (MLA: 64-head row blocks) are one CTA each, or ``s``
        CTAs when split-KV is on (then a combine kernel follows). CTAs run in rounds of
        ``CTAS_PER_SM`` per SM; within a round the busiest SM's k CTAs stream at min(per-SM
        rate, their share of the memory bandwidth); each round pays ``cta_time``. KV is read
        in whole 128-token blocks.
        """
        if isinstance(ctx, np.ndarray):  # decode stretch: the time depends on whole blocks
            nblocks = np.maximum(1, np.ceil(ctx / BLOCK_N - 1e-9)).astype(np.int64)
            if nblocks.ndim == 1 and nblocks[0] == nblocks[-1] and nblocks.min() == nblocks[0]:
                # a short stretch stays within one 128-token block count: one scalar price
                one = self.decode_stream(seqs, int(nblocks[0]) * BLOCK_N, split_tokens)
                return np.full(ctx.shape, one, dtype=float)
            uniq, inverse = np.unique(nblocks, return_inverse=True)
            times = [self.decode_stream(seqs, b * BLOCK_N, split_tokens) for b in uniq]
            return np.asarray(times, dtype=float)[inverse].reshape(ctx.shape)
        blocks = max(1, math.ceil(ctx / BLOCK_N - 1e-9))
        key = (seqs, blocks, split_tokens)
        cached = self._decode_cache.get(key)
        if cached is not None:
            return cached
        base = int(seqs) * self._dec_ctas_seq
        split_blocks = blocks
        if split_tokens is not None:
            split_blocks = max(blocks, math.ceil(split_tokens / BLOCK_N - 1e-9))
        s = self.num_splits(base, split_blocks)
        per_split = -(-split_blocks // s)
        n = base * -(-blocks // per_split)  # CTAs that have KV blocks to read
        tok = min(blocks, per_split) * BLOCK_N
        cta_bytes = tok * self._dec_tok_bytes
        cta_flops = tok * self._dec_pair_flops
        sms, occ = self.num_sms, CTAS_PER_SM
        full, last = divmod(n, sms * occ)
        time = self.combine_time if s > 1 else 0.0
        if full:
            rate = min(self.sm_bandwidth, self.bandwidth / sms)
            work = max(occ * cta_bytes / rate, occ * cta_flops / self._peak_sm)
            time += full * (self.cta_time + work)
        if last:
            k = -(-last // sms)
            rate = min(self.sm_bandwidth, self.bandwidth * k / last)
            time += self.cta_time + max(k * cta_bytes / rate, k * cta_flops / self._peak_sm)
        if len(self._decode_cache) < _CACHE_LIMIT:
            self._decode_cache[key] = time
        return time
