"""The roofline cost model: what one iteration (one forward pass) costs on one GPU.

Owns :class:`RooflineCostModel`, a pure function ``BatchShape -> IterationCost``. It reads the
hardware terms once (:mod:`.terms`), builds the model's kernels on one GPU (:mod:`.layers`) and
the kernel models (:mod:`.gemm`, :mod:`.elementwise`, :mod:`.attention`, :mod:`.moe`,
:mod:`.comm`), sums the kernels over the layers into the operator groups of
:data:`~batchsim.cost.costs.OP_NAMES`, and caches what depends only on the row counts (the
simulator prices every iteration through :meth:`RooflineCostModel.estimate`).

``ideal=True`` is the pure datasheet roofline ``max(FLOPs / peak, bytes / bandwidth)`` per
kernel with no quantization, floors or overheads. Every parameter and its derivation is in
``docs/calibration.md``.

Must not import simpy, nor anything about requests, schedulers or the engine: only
:mod:`batchsim.cost`, :mod:`batchsim.errors`, :mod:`batchsim.dtypes`, :mod:`batchsim.catalog`,
numpy and stdlib.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.model import ModelSpec
from batchsim.cost.attention import BLOCK_N, decode_steps_in_block
from batchsim.cost.comm import AllReducePricing
from batchsim.cost.costs import (
    ACT_BYTES,
    EMPTY_COST,
    EMPTY_STEP,
    ZERO_OP,
    CostSum,
    DecodeSlopes,
    IterationCost,
    KernelCost,
    OpCost,
    StepCost,
)
from batchsim.cost.elementwise import ElementwisePricing
from batchsim.cost.layers import ElementwiseKernel, LayerKernels, activation_flops
from batchsim.cost.shapes import BatchShape
from batchsim.cost.terms import WEIGHT_DTYPES, HardwareTerms, gemm_correction
from batchsim.dtypes import DTYPE_BYTES, resolve_kv_dtype
from batchsim.errors import ConfigError

__all__ = ["WEIGHT_DTYPES", "RooflineCostModel"]

_CACHE_LIMIT = 65536  # entries per memo table
_new_step = tuple.__new__  # builds a StepCost without its Python-level __new__


def as_int(value: Any) -> int:
    """A shape's field as an int: the value itself if it is one (compiled: unboxed, no call
    of ``int``), else ``int(value)`` (numpy integers, say)."""
    return value if isinstance(value, int) else int(value)


_NO_KERNEL = KernelCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class _TokenGroups(NamedTuple):
    """The groups of an iteration that depend only on its row count (see ``_token_groups``)."""

    qkv: OpCost
    o: OpCost
    mlp: OpCost
    elementwise: OpCost
    all_reduce: OpCost
    cache_write: KernelCost  # KV-cache write of the new rows, all layers
    weight_bytes: float  # of qkv, o and mlp
    kv_written: float  # KV-cache bytes written


@dataclass(frozen=True, slots=True)
class _Rest:
    """The groups of an iteration other than attention, summed (see ``_rest``)."""

    ops: dict[str, OpCost]
    time: float
    flops: float
    bytes: float
    compute_time: float
    memory_time: float
    weight_bytes: float
    kv_written: float
    cache_write: KernelCost


class RooflineCostModel:
    """Prices iterations of ``model`` on ``hardware`` with tensor parallelism ``tp``.

    Args:
        model: Architecture.
        hardware: One GPU.
        tp: Tensor-parallel degree (weights and FLOPs split by ``tp``; 2 all-reduces/layer).
        dtype: Weight dtype: bf16, fp16, fp8, int8 (W8A16) or int4 (W4A16).
        kv_dtype: KV-cache dtype, or ``auto`` (weight dtype; fp16 for int8/int4 weights).
        ideal: Pure datasheet roofline: efficiencies 1, no quantization, floors or overheads.
        first_stage: The model holds the embedding (false for a later pipeline stage).
        last_stage: The model holds the final norm and lm_head (false for an earlier
            pipeline stage). A pipeline stage is priced by a model whose ``num_hidden_layers``
            are the stage's (:mod:`batchsim.cost.pipeline`).

    Attributes:
        layers: The model's kernels on one GPU (GEMM shapes, attention and elementwise sizes).
        gemm: Prices the GEMMs.
        elementwise: Prices the elementwise kernels and the KV-cache write.
        attention: Prices the attention kernel.
        all_reduce: Prices the tensor-parallel all-reduces.

    Raises:
        ConfigError: Unknown dtype, dtype the GPU cannot run, or bad tp.
    """

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareProfile,
        *,
        tp: int = 1,
        dtype: str = "bf16",
        kv_dtype: str = "auto",
        ideal: bool = False,
        first_stage: bool = True,
        last_stage: bool = True,
    ) -> None:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"parallel.tensor_parallel_size must be an integer >= 1, got {tp!r}")
        if model.num_attention_heads % tp:
            raise ConfigError(
                f"parallel.tensor_parallel_size must divide num_attention_heads="
                f"{model.num_attention_heads} of {model.name}, got {tp}"
            )
        if dtype not in WEIGHT_DTYPES:
            raise ConfigError(
                f"engine.dtype: unknown dtype {dtype!r}; allowed: {', '.join(WEIGHT_DTYPES)}"
            )
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.dtype = dtype
        self.kv_dtype = resolve_kv_dtype(kv_dtype, dtype)
        self.ideal = ideal
        self.first_stage = first_stage
        self.last_stage = last_stage
        terms = HardwareTerms.from_profile(hardware, dtype, ideal=ideal)
        self.compute_dtype = terms.compute_dtype
        self._peak, self._bw = terms.peak, terms.bandwidth
        self._wb = DTYPE_BYTES[dtype]
        self._kvb = DTYPE_BYTES[self.kv_dtype]

        # ---- the model's kernels on one GPU, and how each kind is priced
        self.layers = LayerKernels.from_model(model, tp)
        if not (first_stage and last_stage):
            # the ends are the embedding gather (first stage) and the final norm (last stage),
            # half of the values and one launch each
            ends = self.layers.ends
            part = int(first_stage) + int(last_stage)
            self.layers = dataclasses.replace(
                self.layers,
                ends=ElementwiseKernel(ends.elems * part / 2, 0.0, part * ends.launches // 2),
            )
        self.gemm = terms.gemm_pricing(
            self._wb,
            ideal=ideal,
            correction=gemm_correction(hardware, dtype, self.compute_dtype),
        )
        self.expert_gemm = terms.expert_gemm_pricing(self._wb, ideal=ideal)
        self.elementwise = ElementwisePricing(
            bandwidth=terms.elementwise_bandwidth,
            kernel_time=terms.elementwise_kernel_time,
            peak=terms.peak,
            cache_write_bandwidth=terms.bandwidth,
            ideal=ideal,
        )
        self.attention = terms.attention_pricing(self.layers.attention, self._kvb, ideal=ideal)
        self.all_reduce = AllReducePricing(
            num_gpus=tp, link_bandwidth=terms.link_bandwidth, latency=terms.link_latency
        )
        self._overhead = OpCost(0.0, 0.0, terms.launch_overhead)
        self._num_layers = self.layers.num_layers
        self._lm_weight = self.layers.lm_head.k * self.layers.lm_head.n * self._wb
        if not last_stage:
            self._lm_weight = 0.0
        self._cache_t: dict[int, _TokenGroups] = {}
        self._cache_s: dict[int, OpCost] = {}
        self._rest_cache: dict[tuple[int, int], _Rest] = {}
        self._totals_cache: dict[tuple[int, int], tuple[float, ...]] = {}
        # products of AttentionPricing.group, in its order
        self._kv_layer_bytes = self._num_layers * self.attention._kv_elems * self._kvb
        self._flops_layer = self._num_layers * self.attention._flops_pair
        # a hybrid model's sliding-window layers, priced on a shape's window_* fields
        self._window_layers = model.num_sliding_layers if model.is_hybrid_attention else 0
        self.hybrid_window = model.hybrid_sliding_window if self._window_layers else None
        """The window of the sliding-window layers of a hybrid model (None otherwise): shapes
        that count those layers' reads apart (``BatchShape.window_kv_read_tokens``) are priced
        per layer kind; shapes that do not, as full attention on every layer."""

    # ----------------------------------------------------------------- groups of an iteration
    def _token_groups(self, tokens: int) -> _TokenGroups:
        """Everything that depends only on the number of rows T (cached per T)."""
        cached = self._cache_t.get(tokens)
        if cached is not None:
            return cached
        lk, gemm, t, L = self.layers, self.gemm, float(tokens), self._num_layers
        qkv, o, mlp, ew = CostSum(), CostSum(), CostSum(), CostSum()
        gemm.add(qkv, lk.qkv, t, L)
        gemm.add(o, lk.o, t, L)
        act_elems = 0.0
        act_kernels = 0.0
        if lk.num_dense_layers:
            gemm.add(mlp, lk.dense_mlp, t, lk.num_dense_layers)
            act_elems += lk.num_dense_layers * t * lk.activation_width * lk.gate_factor
            act_kernels += lk.num_dense_layers
        if lk.moe is not None and lk.num_moe_layers and t > 0:
            lk.moe.add_gemms(mlp, gemm, t, lk.num_moe_layers, self.expert_gemm)
            act_elems += lk.num_moe_layers * lk.moe.activation_elems(t) * lk.gate_factor
            act_kernels += lk.num_moe_layers * lk.moe.activation_kernels
        cache_write = _NO_KERNEL
        if t > 0:
            # per layer: norms (in+out), residual add (2 in, 1 out), rotary (q,k in+out)
            nrm, add, rope, lat = lk.norms, lk.residual_add, lk.rope, lk.latent_norms
            elems_row = nrm.elems + add.elems + rope.elems + lat.elems
            flops_row = nrm.flops + add.flops + rope.flops + lat.flops
            kernels = (nrm.launches + add.launches + rope.launches + lat.launches) * L
            elems = L * t * elems_row + act_elems + t * lk.ends.elems
            flops = L * t * flops_row + activation_flops(act_elems)
            ew.add(self.elementwise.price(elems, flops, kernels + act_kernels + lk.ends.launches))
            # KV-cache write of the new rows (reshape_and_cache): read K,V rows, write the cache
            kv_elems = L * t * lk.attention.kv_elems
            cache_write = self.elementwise.cache_write(kv_elems, self._kvb, L)
        groups = _TokenGroups(
            qkv=qkv.op(),
            o=o.op(),
            mlp=mlp.op(),
            elementwise=ew.op(),
            all_reduce=self.all_reduce.layers(t, lk.hidden_size, L),
            cache_write=cache_write,
            weight_bytes=qkv.weight_bytes + o.weight_bytes + mlp.weight_bytes,
            kv_written=L * t * lk.attention.kv_elems * self._kvb,
        )
        if len(self._cache_t) < _CACHE_LIMIT:
            self._cache_t[tokens] = groups
        return groups

    def _lm_head_op(self, rows: int) -> OpCost:
        cached = self._cache_s.get(rows)
        if cached is None:
            acc = CostSum()
            if self.last_stage:  # an earlier pipeline stage samples nothing
                self.gemm.add(acc, (self.layers.lm_head,), float(rows), 1.0)
            cached = acc.op()
            self._cache_s[rows] = cached
        return cached

    def _rest(self, tokens: int, sampled: int) -> _Rest:
        """Every group but attention, and their sums (cached per tokens and sampled rows)."""
        key = (tokens, sampled)
        cached = self._rest_cache.get(key)
        if cached is not None:
            return cached
        groups = self._token_groups(tokens)
        qkv, o, mlp, ew = groups.qkv, groups.o, groups.mlp, groups.elementwise
        ar = groups.all_reduce
        lm = self._lm_head_op(sampled) if sampled > 0 else ZERO_OP
        overhead = self._overhead
        kernels = (qkv, o, mlp, ew, lm)  # the groups whose times decide the bound
        rest = _Rest(
            ops={  # in OP_NAMES order; "attention" is filled in by _combine
                "qkv_proj": qkv,
                "attention": ZERO_OP,
                "o_proj": o,
                "mlp": mlp,
                "elementwise": ew,
                "lm_head": lm,
                "all_reduce": ar,
                "overhead": overhead,
            },
            time=sum(op.time for op in kernels) + ar.time + overhead.time,
            flops=sum(op.flops for op in kernels),
            bytes=sum(op.bytes for op in kernels),
            compute_time=sum(op.compute_time for op in kernels),
            memory_time=sum(op.memory_time for op in kernels),
            weight_bytes=groups.weight_bytes + (self._lm_weight if sampled > 0 else 0.0),
            kv_written=groups.kv_written,
            cache_write=groups.cache_write,
        )
        if len(self._rest_cache) < _CACHE_LIMIT:
            self._rest_cache[key] = rest
        return rest

    def _rest_totals(self, tokens: int, sampled: int) -> tuple[float, ...]:
        """The sums of :meth:`_rest` alone (cached per tokens and sampled rows, built from the
        groups cached per tokens and the lm_head cached per sampled rows): time, FLOPs,
        bytes, compute time, memory time, weight bytes, KV bytes written, the KV-cache
        write's time, bytes and memory time, and the attention kernel's query and output
        bytes."""
        key = (tokens, sampled)
        cached = self._totals_cache.get(key)
        if cached is not None:
            return cached
        groups = self._token_groups(tokens)
        qkv, o, mlp, ew = groups.qkv, groups.o, groups.mlp, groups.elementwise
        lm = self._lm_head_op(sampled) if sampled > 0 else ZERO_OP
        cw = groups.cache_write
        # the same sums as _rest, in the same order
        totals = (
            0
            + qkv.time
            + o.time
            + mlp.time
            + ew.time
            + lm.time
            + groups.all_reduce.time
            + self._overhead.time,
            0 + qkv.flops + o.flops + mlp.flops + ew.flops + lm.flops,
            0 + qkv.bytes + o.bytes + mlp.bytes + ew.bytes + lm.bytes,
            0
            + qkv.compute_time
            + o.compute_time
            + mlp.compute_time
            + ew.compute_time
            + lm.compute_time,
            0 + qkv.memory_time + o.memory_time + mlp.memory_time + ew.memory_time + lm.memory_time,
            groups.weight_bytes + (self._lm_weight if sampled > 0 else 0.0),
            groups.kv_written,
            cw.time,
            cw.bytes,
            cw.memory_time,
            # the query and output rows the attention kernel moves (AttentionPricing.group)
            self._num_layers * tokens * self.attention._qo_elems * ACT_BYTES,
        )
        if len(self._totals_cache) < _CACHE_LIMIT:
            self._totals_cache[key] = totals
        return totals

    @staticmethod
    def _combine(rest: _Rest, attn: OpCost, kv_read: Any) -> IterationCost:
        """An iteration's cost from its attention group and the rest."""
        ops = dict(rest.ops)
        ops["attention"] = attn
        nbytes = rest.bytes + attn.bytes
        kv_bytes = kv_read + rest.kv_written
        return IterationCost(
            ops,
            rest.time + attn.time,
            rest.flops + attn.flops,
            nbytes,
            rest.weight_bytes,
            kv_bytes,
            nbytes - rest.weight_bytes - kv_bytes,
            rest.compute_time + attn.compute_time,
            rest.memory_time + attn.memory_time,
        )

    # ----------------------------------------------------------------- public API
    def estimate(self, shape: BatchShape) -> IterationCost:
        """Cost of one iteration of ``shape`` (python floats, or arrays for array fields)."""
        tokens = shape.num_prefill_tokens + shape.num_decode_tokens + shape.num_padding_tokens
        sampled = shape.num_sampled_tokens
        if isinstance(tokens, np.ndarray) or isinstance(sampled, np.ndarray):
            return self._estimate_varying(shape)
        tokens = int(tokens)
        if tokens <= 0:
            return EMPTY_COST
        rest = self._rest(tokens, int(sampled))
        attn, kv_read = self._attention_group(shape, tokens, rest.cache_write)
        return self._combine(rest, attn, kv_read)

    def _attention_group(
        self, shape: BatchShape, tokens: int, cache_write: KernelCost
    ) -> tuple[OpCost, Any]:
        """The attention group over every layer (a hybrid model's two kinds when the shape
        counts its sliding-window reads apart)."""
        if not self._window_layers or shape.window_kv_read_tokens is None:
            return self.attention.group(shape, tokens, self._num_layers, cache_write)
        return self.attention.hybrid_group(
            shape, tokens, self._num_layers - self._window_layers, self._window_layers, cache_write
        )

    def step_cost(self, shape: BatchShape) -> StepCost:
        """The totals of :meth:`estimate` that the engine logs, for a shape of python ints.

        The same arithmetic in the same order (equal to the last bit), without building the
        operator groups; the attention kernel's nonlinear time is cached per decode rows and
        KV blocks and per prefill rows, chunks and context, so a mixed or chunked iteration
        costs about what a decode-only one does. (The fields are read as ints, so that the
        compiled engine computes unboxed; integers of other types are converted.)
        """
        if self._window_layers and shape.window_kv_read_tokens is not None:
            c = self.estimate(shape)  # two kinds of attention layer: the general path
            fields = (c.time, c.flops, c.bytes, c.weight_bytes, c.kv_bytes)
            return _new_step(StepCost, (*fields, c.compute_time - c.memory_time))
        prefill = as_int(shape.num_prefill_tokens)
        padding = as_int(shape.num_padding_tokens)
        tokens = prefill + as_int(shape.num_decode_tokens) + padding
        if tokens <= 0:
            return EMPTY_STEP
        (
            r_time,
            r_flops,
            r_bytes,
            r_tc,
            r_tm,
            r_weight,
            r_written,
            cw_time,
            cw_bytes,
            cw_tm,
            qo,
        ) = self._rest_totals(tokens, as_int(shape.num_sampled_tokens))
        att = self.attention
        L = self._num_layers
        pad_seqs = as_int(shape.num_padding_seqs)
        kv_tokens = as_int(shape.kv_read_tokens)
        pairs = as_int(shape.attn_pairs)
        kv_read = self._kv_layer_bytes * (kv_tokens + tokens)
        a_bytes = kv_read + qo
        decodes = as_int(shape.num_decode_tokens) + pad_seqs
        rows = prefill + padding - pad_seqs - as_int(shape.num_graph_padding_tokens)
        if rows or self.ideal:
            a_time, a_tc, a_tm = att.scalar_layer_time(
                as_int(shape.num_seqs) + pad_seqs, decodes, rows, kv_tokens, pairs, a_bytes / L
            )
        else:  # decode rows only: AttentionPricing.scalar_layer_time, inlined
            a_tc = att._flops_pair * pairs / att.peak
            a_tm = a_bytes / L / att.bandwidth
            a_time = att.kernel_time
            if decodes > 0:
                ctx = kv_tokens / decodes + 1.0
                blocks = max(1, math.ceil(ctx / BLOCK_N - 1e-9))
                stream = att._decode_cache.get((decodes, blocks, None))
                if stream is None:
                    stream = att.decode_stream(decodes, ctx, None)
                a_time = a_time + stream
        return _new_step(
            StepCost,
            (
                r_time + (L * a_time + cw_time),
                r_flops + self._flops_layer * pairs,
                r_bytes + (a_bytes + cw_bytes),
                r_weight,
                kv_read + r_written,
                (r_tc + L * a_tc) - (r_tm + (L * a_tm + cw_tm)),
            ),
        )

    def decode_run_step(self, shape: BatchShape) -> tuple[StepCost, int]:
        """:meth:`decode_run` with the totals of :meth:`step_cost`."""
        cost = self.step_cost(shape)
        n = shape.num_decode_tokens + shape.num_padding_seqs
        if self.ideal or n <= 0:
            return cost, 1
        return cost, decode_steps_in_block(shape.kv_read_tokens, n)

    def estimate_decode_stretch(
        self,
        shape: BatchShape,
        kv_read_tokens: np.ndarray,
        window_kv_read_tokens: np.ndarray | None = None,
    ) -> IterationCost:
        """Cost of consecutive decode iterations of one batch whose cached context grows.

        ``shape`` is the first iteration; iteration k reads ``kv_read_tokens[k]`` cached tokens
        (and computes that many plus one pair per decode), a hybrid model's sliding-window
        layers ``window_kv_read_tokens[k]``. Only the attention group depends on
        the context, so the other groups are priced once and the attention group as arrays.
        Equals :meth:`estimate` on the corresponding shapes up to float rounding.

        Returns:
            An IterationCost whose totals are arrays over the iterations; ``ops`` holds the
            first iteration's groups except ``attention``, which holds arrays.
        """
        stretch = shape.with_decode_context(kv_read_tokens, window_kv_read_tokens)
        tokens = int(shape.num_prefill_tokens + shape.num_decode_tokens + shape.num_padding_tokens)
        if shape.num_prefill_tokens or tokens <= 0:
            return self.estimate(stretch)
        rest = self._rest(tokens, int(shape.num_sampled_tokens))
        attn, kv_read = self._attention_group(stretch, tokens, rest.cache_write)
        return self._combine(rest, attn, kv_read)

    @functools.cached_property
    def full_layer_token_slopes(self) -> DecodeSlopes:
        """:attr:`decode_token_slopes` of a hybrid model's full-attention layers alone (once
        every context fills the window, the sliding layers read no more per step)."""
        return self.attention.token_slopes(self._num_layers - self._window_layers)

    @functools.cached_property
    def decode_token_slopes(self) -> DecodeSlopes:
        """How an iteration's totals grow per extra cached token a decode row reads.

        In a decode iteration only the attention group depends on the context, and its
        FLOPs (one pair per cached token), bytes (the token's K and V in every layer) and
        compute/memory times are linear in the tokens read. Its *time* is not: the kernel
        streams whole KV blocks (see :meth:`decode_run`).
        """
        return self.attention.token_slopes(self._num_layers)

    def decode_run(self, shape: BatchShape) -> tuple[IterationCost, int]:
        """Cost of the decode iteration ``shape``, and for how many consecutive iterations
        from it (each decode row one token further along) the iteration time stays the same.

        With n = ``shape.num_decode_rows``, iteration k of the run reads
        ``shape.kv_read_tokens + k x n`` cached tokens; its totals are those of ``shape`` plus
        ``k x n`` times :attr:`decode_token_slopes`, and its time equals ``shape``'s. The time
        changes when the mean context enters a new block of the attention kernel, or
        (``ideal``) every step. ``shape`` must be decode-only with one token per row and no
        sliding window cut inside the run (the caller's responsibility).
        """
        cost = self.estimate(shape)
        n = int(shape.num_decode_rows)
        if self.ideal or n <= 0:
            return cost, 1
        return cost, decode_steps_in_block(int(shape.kv_read_tokens), n)

    def _estimate_varying(self, shape: BatchShape) -> IterationCost:
        """Array path when the row count or sampled rows vary: price each element alone."""
        fields = [f for f in BatchShape._fields if getattr(shape, f) is not None]
        arrays = np.broadcast_arrays(*(np.asarray(getattr(shape, f)) for f in fields))
        n = arrays[0].size
        parts = [
            self.estimate(BatchShape(**{f: int(a.flat[i]) for f, a in zip(fields, arrays)}))
            for i in range(n)
        ]
        return IterationCost.stack(parts)

    @property
    def ridge_point(self) -> float:
        """FLOP/byte where compute and memory time are equal for this model's peak and
        bandwidth (datasheet values with ``ideal=True``, achievable ones otherwise)."""
        return self._peak / self._bw

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Weight bytes stored on one GPU: weights in ``dtype`` split by ``tp``, except those
        every rank holds in full (MLA q_a/kv_a projections, KV heads when fewer than ``tp``,
        MoE routers)."""
        rep = self.layers.replicated_params
        m = self.model
        params = m.num_params
        if not self.first_stage:
            params -= m.embedding_params
        if not self.last_stage:
            params -= m.lm_head_params + m.final_norm_params
        elif not self.first_stage and m.tie_word_embeddings:
            params += m.lm_head_matmul_params  # the last stage keeps its own copy of the table
        return ((params - rep) / self.tp + rep) * self._wb

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """KV-cache bytes one token occupies on one GPU, all layers (MLA latent replicated;
        GQA KV heads replicated when fewer than ``tp``)."""
        return self._num_layers * self.layers.attention.kv_elems * self._kvb

    def knee_batch_size(self, context_len: int, max_batch: int = 65536) -> int | None:
        """Smallest decode batch at ``context_len`` whose iteration is compute-bound.

        Doubling search then bisection (assumes compute-boundness, once reached, persists).
        Returns None when even ``max_batch`` requests are memory-bound.
        """
        window, hybrid = self.model.sliding_window, self.hybrid_window

        def compute_bound(batch: int) -> bool:
            shape = BatchShape.decode(batch, context_len, window, hybrid)
            return bool(self.estimate(shape).compute_bound)

        if compute_bound(1):
            return 1
        lo, hi = 1, 2
        while not compute_bound(hi):
            if hi >= max_batch:
                return None
            lo, hi = hi, min(2 * hi, max_batch)
        return lo + 1 + bisect.bisect_left(range(lo + 1, hi), True, key=compute_bound)

    def attention_kernel(
        self,
        num_seqs: int,
        num_tokens: int,
        kv_read_tokens: int,
        attn_pairs: int,
        prefill_tokens: int = 0,
        split_tokens: float | None = None,
    ) -> OpCost:
        """One layer's attention kernel alone (no KV-cache write); see
        :meth:`AttentionPricing.kernel <batchsim.cost.attention.AttentionPricing.kernel>`."""
        return self.attention.kernel(
            num_seqs, num_tokens, kv_read_tokens, attn_pairs, prefill_tokens, split_tokens
        )

    def all_reduce_time(self, num_bytes: float) -> float:
        """One ring all-reduce of ``num_bytes`` across the ``tp`` GPUs, s (0 at tp=1)."""
        return self.all_reduce.time(num_bytes)
