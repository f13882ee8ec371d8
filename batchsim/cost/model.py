"""The roofline cost model: what one iteration (one forward pass) costs on one GPU.

Owns :class:`BatchShape` (the aggregates of one iteration that the cost depends on),
:class:`OpCost` / :class:`IterationCost` (FLOPs, bytes and time per operator group) and
:class:`RooflineCostModel`, a pure function ``BatchShape -> IterationCost``.

Operator groups (``OP_NAMES``), summed over all layers, per GPU:

* ``qkv_proj`` — q/k/v projections (MLA: q_a, q_b, kv_a and the absorbed W_UK);
* ``attention`` — KV-cache write + the attention kernel (causal prefill, chunked prefill over
  a cached context, decode; FLOPs from ``attn_pairs``, KV bytes from ``kv_read_tokens``);
* ``o_proj`` — output projection (MLA: absorbed W_UV + o_proj);
* ``mlp`` — dense MLP GEMMs; MoE router, routed experts (weight bytes of the expected *union*
  of experts the batch touches) and shared experts;
* ``elementwise`` — norms, activation, residual add, rotary embedding, embedding gather;
* ``lm_head`` — logits, only for the rows that sample;
* ``all_reduce`` — two ring all-reduces per layer under tensor parallelism (0 at tp=1);
* ``overhead`` — fixed GPU-side cost per forward pass.

Each GEMM-like kernel costs ``min_kernel_time + smoothmax_p(t_compute, t_memory)``, where
``t_compute`` counts tile and wave quantization on ``num_compute_units`` SMs (the library is
assumed to pick the fastest of a few tile shapes and split-K factors) and ``smoothmax_p`` is
the p-norm ``(t_c^p + t_m^p)^(1/p)``, a gradual compute/memory transition instead of the
roofline's corner. ``ideal=True`` is the pure datasheet roofline ``max(FLOPs / peak, bytes /
bandwidth)`` with no quantization, floors or overheads. Attention decode rows are priced by
FlashAttention-2's split-KV kernel streaming the cache in rounds of CTAs over the SMs
(per-SM bandwidth, split heuristic, combine kernel); prefill rows on 64-row blocks. Every
parameter and its derivation is in ``docs/calibration.md``.

Modelling choices (documented in docs/calibration.md):

* Compute dtype: bf16/fp16 use their peak; fp8 uses the fp8 peak when the GPU has one, else
  the 16-bit peak (weight-only W8A16, as vLLM's Marlin kernels on Ampere); int8 and int4 are
  weight-only (W8A16 / W4A16) and use the 16-bit peak. Weight bytes shrink with the dtype;
  activations stay 16-bit.
* MLA (DeepSeek) uses the *absorbed* formulation for every row: attention runs over the
  latent cache (``kv_lora_rank + qk_rope_head_dim`` per token, replicated on every TP rank),
  each (query, key) pair costs ``2 (kv_lora + rope) + 2 kv_lora`` FLOPs per head, and kv_b is
  applied to the new tokens only (as W_UK / W_UV). For long prefills this over-counts
  attention FLOPs versus vLLM's naive prefill path (up to ~3.4x for DeepSeek-V3).
* MoE experts are sharded by tensor parallelism (no expert parallelism), routing uniform.

Must not import simpy, nor anything about requests, schedulers or the engine: only
:mod:`batchsim.errors`, :mod:`batchsim.catalog`, numpy and stdlib.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Union, overload

import numpy as np

from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.catalog.model import DTYPE_BYTES, ModelSpec, resolve_kv_dtype
from batchsim.cost.shapes import BatchShape
from batchsim.errors import ConfigError

__all__ = [
    "OP_NAMES",
    "WEIGHT_DTYPES",
    "BatchShape",
    "IterationCost",
    "OpCost",
    "RooflineCostModel",
    "vceil",
    "vmax",
]

Num = Union[int, float, np.ndarray]  # noqa: UP007 - used at runtime in annotations only

OP_NAMES = (
    "qkv_proj",
    "attention",
    "o_proj",
    "mlp",
    "elementwise",
    "lm_head",
    "all_reduce",
    "overhead",
)
"""The operator groups of every :class:`IterationCost`, in forward-pass order."""

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")
"""Weight dtypes the cost model accepts (``engine.dtype``)."""

_ACT_BYTES = 2.0  # activations, logits inputs and all-reduce messages stay 16-bit
_SPLIT_K = (1, 2, 3, 4)  # split-K factors a GEMM library tries on skinny problems
_MIN_K_SLICE = 128  # a split-K slice is at least this deep
_MIN_TILE_M = 16  # smallest tensor-core tile height (mma m16)
# FlashAttention-2 split-KV kernel (the decode and chunked-prefill path of the profiled engine):
_ATTN_BLOCK_M = 64  # query rows per CTA
_ATTN_BLOCK_N = 128  # keys per KV block (head_dim <= 128)
_ATTN_CTAS_PER_SM = 2  # resident CTAs per SM (4 warps, ~80 KB shared memory each)
_SPLIT_FILL = 0.8  # no split-KV once the CTAs fill 80 % of the SMs
_SPLIT_TOL = 0.85  # smallest split count whose wave efficiency is >= 85 % of the best
_MAX_SPLITS = 128


# --------------------------------------------------------------------------- scalar/array helpers


def vmax(a: Num, b: Num) -> Num:
    """``max(a, b)`` for python numbers, elementwise ``np.maximum`` if either is an array."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


def vceil(x: Num) -> Num:
    """``ceil(x)`` as a python float, or elementwise ``np.ceil`` for an array."""
    if isinstance(x, np.ndarray):
        return np.ceil(x)
    return float(math.ceil(x))


@overload
def _smoothmax(a: float, b: float, p: float) -> float: ...
@overload
def _smoothmax(a: Num, b: Num, p: float) -> Num: ...
def _smoothmax(a: Num, b: Num, p: float) -> Num:
    """p-norm ``(a^p + b^p)^(1/p)`` of two non-negative times, computed without overflow."""
    hi = vmax(a, b)
    if isinstance(hi, np.ndarray):
        lo = np.minimum(a, b)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(hi > 0, lo / np.where(hi > 0, hi, 1.0), 0.0)
        return hi * (1.0 + ratio**p) ** (1.0 / p)
    if hi <= 0.0:
        return 0.0
    lo = a if a < b else b
    return hi * (1.0 + (lo / hi) ** p) ** (1.0 / p)


def _pow2ceil(x: float) -> float:
    """Smallest power of two >= x (x >= 1)."""
    return float(1 << max(0, math.ceil(math.log2(x)))) if x > 1 else 1.0


# --------------------------------------------------------------------------- costs


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one operator group over all layers, on one GPU.

    Attributes:
        flops: Floating-point operations.
        bytes: Bytes moved from/to device memory (``all_reduce``: bytes sent on the link).
        time: Predicted time, s.
        compute_time: Compute part of the roofline (tile-quantized), s.
        memory_time: Memory part of the roofline, s.
    """

    flops: Any
    bytes: Any
    time: Any
    compute_time: Any = 0.0
    memory_time: Any = 0.0


_ZERO_OP = OpCost(0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class IterationCost:
    """Cost of one iteration on one GPU (scalars, or arrays for a vectorized stretch).

    Attributes:
        ops: Exactly the groups of :data:`OP_NAMES`, each an :class:`OpCost`.
        time: Sum of the op times, s.
        flops: Sum of the op FLOPs.
        bytes: Device-memory bytes: sum of op bytes except ``all_reduce`` (link traffic).
        weight_bytes: Weight bytes read (each weight once per iteration; MoE: touched experts).
        kv_bytes: KV-cache bytes read and written.
        activation_bytes: The rest of ``bytes`` (activations in and out of kernels).
        compute_time: Summed compute time of the kernels (not the link or fixed overhead), s.
        memory_time: Summed memory time of the same kernels, s.
    """

    ops: dict[str, OpCost]
    time: Any
    flops: Any
    bytes: Any
    weight_bytes: Any
    kv_bytes: Any
    activation_bytes: Any
    compute_time: Any
    memory_time: Any

    @property
    def compute_bound(self) -> Any:
        """Summed compute time exceeds summed memory time."""
        return self.compute_time > self.memory_time

    @property
    def intensity(self) -> Any:
        """Arithmetic intensity, FLOP per device-memory byte."""
        return self.flops / self.bytes if not np.isscalar(self.bytes) or self.bytes else 0.0

    @property
    def bound(self) -> Any:
        """``"compute"`` or ``"memory"`` (an array of those for a stretch)."""
        if isinstance(self.compute_bound, np.ndarray):
            return np.where(self.compute_bound, "compute", "memory")
        return "compute" if self.compute_bound else "memory"


@dataclass(frozen=True, slots=True)
class DecodeSlopes:
    """Growth of an iteration's totals per extra cached token read by a decode row
    (see :attr:`RooflineCostModel.decode_token_slopes`)."""

    flops: float
    bytes: float
    kv_bytes: float
    compute_time: float
    memory_time: float


# --------------------------------------------------------------------------- the model


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
    kvw_bytes: float
    kvw_time: float
    kvw_tm: float


@dataclass(frozen=True, slots=True)
class _Gemm:
    """One (grouped) GEMM of a layer: ``groups`` x [M, k] @ [k, n] with M = rows per group."""

    k: int
    n: int
    groups: float = 1.0  # number of independent GEMMs of this shape (heads, experts)


class _Acc:
    """Accumulates flops / bytes / weight bytes / times of the kernels of one group."""

    __slots__ = ("bytes", "flops", "tc", "time", "tm", "weight")

    def __init__(self) -> None:
        self.flops = self.bytes = self.weight = self.time = self.tc = self.tm = 0.0

    def add(
        self,
        flops: float,
        nbytes: float,
        weight: float,
        time: float,
        tc: float,
        tm: float,
        times: float = 1.0,
    ) -> None:
        self.flops += flops * times
        self.bytes += nbytes * times
        self.weight += weight * times
        self.time += time * times
        self.tc += tc * times
        self.tm += tm * times

    def op(self) -> OpCost:
        return OpCost(self.flops, self.bytes, self.time, self.tc, self.tm)


def _eff(hardware: HardwareProfile, key: str) -> float:
    """SI value of an ``efficiency:`` term, falling back to its documented default."""
    spec = EFFICIENCY_KEYS[key]
    value = hardware.efficiency.get(spec.si_name)
    if value is None:
        value = getattr(hardware, spec.si_name, None)
    return float(value) if value is not None else spec.default / spec.per_si


class RooflineCostModel:
    """Prices iterations of ``model`` on ``hardware`` with tensor parallelism ``tp``.

    Args:
        model: Architecture.
        hardware: One GPU.
        tp: Tensor-parallel degree (weights and FLOPs split by ``tp``; 2 all-reduces/layer).
        dtype: Weight dtype: bf16, fp16, fp8, int8 (W8A16) or int4 (W4A16).
        kv_dtype: KV-cache dtype, or ``auto`` (weight dtype; fp16 for int8/int4 weights).
        ideal: Pure datasheet roofline: efficiencies 1, no quantization, floors or overheads.

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
        self.compute_dtype = self._compute_dtype(hardware, dtype)
        hw = hardware.ideal() if ideal else hardware

        # ---- hardware terms (SI)
        self._peak = hardware.peak_flops_for(self.compute_dtype) * _eff(hw, "compute")
        self._bw = hardware.memory_bandwidth * _eff(hw, "memory")
        self._sms = max(1, int(hardware.num_compute_units))
        self._lat = _eff(hw, "min_kernel_time_us")
        self._attn_peak = hardware.peak_flops_for(self.compute_dtype) * _eff(hw, "attention")
        self._attn_lat = _eff(hw, "attention_kernel_time_us")
        self._masked = _eff(hw, "attention_masked_fraction")
        fair = hardware.memory_bandwidth / self._sms  # one SM's share of the memory bandwidth
        self._sm_bw = fair * _eff(hw, "attention_sm_bandwidth")
        self._cta_lat = _eff(hw, "attention_cta_time_us")
        self._combine_lat = _eff(hw, "attention_combine_time_us")
        self._prefill_lat = _eff(hw, "attention_prefill_time_us")
        self._attn_peak_sm = self._attn_peak / self._sms
        self._split_cache: dict[tuple[int, int], int] = {}
        self._decode_cache: dict[tuple, float] = {}
        self._ew_bw = hardware.memory_bandwidth * _eff(hw, "elementwise")
        self._ew_lat = _eff(hw, "elementwise_kernel_time_us")
        self._link_bw = hardware.interconnect_bandwidth * _eff(hw, "interconnect")
        self._link_lat = _eff(hw, "interconnect_latency_us")
        self._launch = _eff(hw, "launch_overhead_ms")
        self._p = _eff(hw, "transition_exponent")
        tile_m, tile_n = _eff(hw, "gemm_tile_m"), _eff(hw, "gemm_tile_n")
        if not ideal:
            if self._p < 1:
                raise ConfigError(
                    f"hardware {hardware.name}: efficiency.transition_exponent must be >= 1, "
                    f"got {self._p!r}"
                )
            if tile_m < _MIN_TILE_M or tile_n < 8:
                raise ConfigError(
                    f"hardware {hardware.name}: efficiency.gemm_tile_m must be >= {_MIN_TILE_M} "
                    f"and gemm_tile_n >= 8, got {tile_m!r} x {tile_n!r}"
                )
        half_m, half_n = max(_MIN_TILE_M, tile_m / 2), max(8.0, tile_n / 2)
        self._tiles = tuple(
            dict.fromkeys(((tile_m, tile_n), (half_m, tile_n), (tile_m, half_n), (half_m, half_n)))
        )

        # ---- model terms (per GPU)
        self._wb = DTYPE_BYTES[dtype]
        self._kvb = DTYPE_BYTES[self.kv_dtype]
        self._build_layers()
        self._cache_t: dict[int, tuple] = {}
        self._cache_s: dict[int, OpCost] = {}
        self._rest_cache: dict[tuple[int, int], _Rest] = {}
        self._overhead = OpCost(0.0, 0.0, self._launch)

    # ----------------------------------------------------------------- construction helpers
    @staticmethod
    def _compute_dtype(hardware: HardwareProfile, dtype: str) -> str:
        def has(d: str) -> bool:
            return hardware.peak_flops.get(d) is not None

        sixteen = "bf16" if has("bf16") else "fp16"
        if dtype in ("bf16", "fp16"):
            hardware.peak_flops_for(dtype)  # ConfigError if the GPU cannot run it
            return dtype
        if dtype == "fp8" and has("fp8"):
            return "fp8"
        return sixteen  # weight-only quantization: dequantize and run 16-bit tensor cores

    def _build_layers(self) -> None:
        m, tp = self.model, self.tp
        h, nq = m.hidden_size, m.num_attention_heads
        heads = nq / tp
        self._layers = m.num_hidden_layers
        self._dense_layers = m.num_dense_layers if m.is_moe else m.num_hidden_layers
        self._moe_layers = m.num_hidden_layers - self._dense_layers
        gate = 2 if m.gated_mlp else 1

        # attention projections
        if m.is_mla:
            lora, rope = m.kv_lora_rank or 0, m.qk_rope_head_dim or 0
            nope, v = m.qk_nope_head_dim or 0, m.v_head_dim or 0
            qkv = []
            if m.q_lora_rank:
                qkv += [_Gemm(h, m.q_lora_rank), _Gemm(m.q_lora_rank, int(heads * (nope + rope)))]
            else:
                qkv += [_Gemm(h, int(heads * (nope + rope)))]
            qkv += [_Gemm(h, lora + rope), _Gemm(nope, lora, heads)]  # kv_a, absorbed W_UK
            self._qkv = qkv
            self._o = [_Gemm(lora, v, heads), _Gemm(int(heads * v), h)]  # absorbed W_UV, o_proj
            self._kv_elems_layer = float(lora + rope)  # latent, replicated on every rank
            self._attn_flops_pair = heads * (2.0 * (lora + rope) + 2.0 * lora)
            self._qo_elems = heads * ((lora + rope) + lora)
            # decode: one latent "KV head" shared by all query heads, 64 heads per CTA
            self._dec_ctas_seq = math.ceil(heads / _ATTN_BLOCK_M)
            self._dec_tok_bytes = (lora + rope) * DTYPE_BYTES[self.kv_dtype]
            self._dec_pair_flops = min(heads, _ATTN_BLOCK_M) * (2.0 * (lora + rope) + 2.0 * lora)
            rope_elems = (heads + 1) * rope
            self._extra_ew_kernels = 2 if m.q_lora_rank else 1  # q_a / kv_a layernorms
            self._extra_ew_elems = 2.0 * ((m.q_lora_rank or 0) + lora)
            # q_a and kv_a are replicated on every rank (not split by tp)
            replicated: float = h * ((m.q_lora_rank or 0) + lora + rope)
        else:
            hd = m.head_dim
            kv_heads = math.ceil(m.num_key_value_heads / tp)  # replicated when kv_heads < tp
            self._qkv = [_Gemm(h, int((heads + 2 * kv_heads) * hd))]
            self._o = [_Gemm(int(heads * hd), h)]
            self._kv_elems_layer = 2.0 * kv_heads * hd
            self._attn_flops_pair = heads * 4.0 * hd
            self._qo_elems = 2.0 * heads * hd
            # decode: the query heads of one KV head are packed into the rows of one CTA
            group = max(1.0, heads / kv_heads)
            self._dec_ctas_seq = kv_heads * math.ceil(group / _ATTN_BLOCK_M)
            self._dec_tok_bytes = 2.0 * hd * DTYPE_BYTES[self.kv_dtype]
            self._dec_pair_flops = min(group, _ATTN_BLOCK_M) * 4.0 * hd
            rope_elems = 0.0 if m.num_learned_positions else (heads + kv_heads) * hd
            self._extra_ew_kernels = 0
            self._extra_ew_elems = 0.0
            # KV heads replicated when fewer than tp: each rank holds kv_heads (not nkv/tp) of
            # them; expressed as the parameter count R with R - R/tp = that per-rank surplus
            surplus = h * 2 * hd * (kv_heads - m.num_key_value_heads / tp)
            replicated = surplus * tp / (tp - 1) if tp > 1 else 0.0
        self._rope_elems = rope_elems
        # parameters every rank holds in full (MLA q_a/kv_a, GQA KV heads < tp, MoE routers)
        self._replicated_params = self._layers * replicated + (
            (self._layers - self._dense_layers) * m.router_params if m.is_moe else 0
        )

        # MLPs
        width = m.intermediate_size / tp
        self._dense_mlp = [_Gemm(h, int(gate * width)), _Gemm(int(width), h)]
        self._dense_act_width = width
        if m.is_moe:
            ew = m.moe_intermediate_size / tp
            self._num_experts = float(m.num_local_experts or 0)
            self._top_k = float(m.num_experts_per_tok)
            self._expert = [_Gemm(h, int(gate * ew)), _Gemm(int(ew), h)]
            self._router = _Gemm(h, int(self._num_experts))
            sw = m.num_shared_experts * m.moe_intermediate_size / tp
            self._shared = [_Gemm(h, int(gate * sw)), _Gemm(int(sw), h)] if sw else []
            self._moe_act_width = ew
            self._shared_act_width = sw
        # lm_head (vocab-parallel)
        self._lm_head = _Gemm(m.word_embed_proj_dim or h, math.ceil(m.vocab_size / tp))
        self._lm_weight = self._lm_head.k * self._lm_head.n * self._wb
        self._gate_factor = 3.0 if m.gated_mlp else 2.0  # act kernel elements moved per output

    # ----------------------------------------------------------------- kernel pricing
    def _gemm_compute_time(self, rows: float, k: int, n: int, groups: float) -> float:
        """Tile- and wave-quantized compute time of ``groups`` GEMMs of rows x k x n, s."""
        peak_sm = self._peak / self._sms
        cap = min(max(_pow2ceil(rows), _MIN_TILE_M), self._tiles[0][0])
        best = math.inf
        for tm0, tn in self._tiles:
            tm = tm0 if tm0 < cap else cap
            tiles = groups * math.ceil(rows / tm) * math.ceil(n / tn)
            for split in _SPLIT_K:
                if split > 1 and k / split < _MIN_K_SLICE:
                    break
                waves = math.ceil(tiles * split / self._sms - 1e-9)
                t = waves * 2.0 * tm * tn * (k / split) / peak_sm
                if t < best:
                    best = t
        return best

    def _gemm(
        self,
        acc: _Acc,
        g: _Gemm,
        rows: float,
        times: float,
        weight_groups: float = -1.0,
        kernels: float = 1.0,
    ) -> None:
        """Add ``times`` (layers) x one GEMM kernel over ``rows`` rows per group to ``acc``.

        ``weight_groups`` overrides how many of the ``groups`` weight matrices are read (MoE:
        the expected number of touched experts); ``rows`` is then rows per touched group.
        """
        if rows <= 0 or times <= 0:
            return
        wg = g.groups if weight_groups < 0 else weight_groups
        flops = 2.0 * rows * g.k * g.n * wg
        weight = g.k * g.n * wg * self._wb
        nbytes = weight + rows * wg * (g.k + g.n) * _ACT_BYTES
        tm = nbytes / self._bw
        if self.ideal:
            tc = flops / self._peak
            time = tc if tc > tm else tm
        else:
            tc = self._gemm_compute_time(rows, g.k, g.n, wg)
            time = kernels * self._lat + _smoothmax(tc, tm, self._p)
        acc.add(flops, nbytes, weight, time, tc, tm, times)

    def _elementwise(self, acc: _Acc, elems: float, flops: float, kernels: float) -> None:
        """Add memory-bound elementwise kernels moving ``elems`` 16-bit values in total."""
        nbytes = elems * _ACT_BYTES
        tm = nbytes / self._ew_bw
        tc = flops / self._peak
        # ideal: plain roofline; else a fixed time per kernel plus the streaming time
        time = (tc if tc > tm else tm) if self.ideal else kernels * self._ew_lat + tm
        acc.add(flops, nbytes, 0.0, time, tc, tm)

    def _terms(self, tokens: int) -> tuple:
        """Everything that depends only on the number of rows T (cached per T)."""
        cached = self._cache_t.get(tokens)
        if cached is not None:
            return cached
        m, t, L = self.model, float(tokens), self._layers
        qkv, o, mlp, ew = _Acc(), _Acc(), _Acc(), _Acc()
        for g in self._qkv:
            self._gemm(qkv, g, t, L)
        for g in self._o:
            self._gemm(o, g, t, L)
        h = m.hidden_size
        act_elems = 0.0
        act_kernels = 0.0
        if self._dense_layers:
            for g in self._dense_mlp:
                self._gemm(mlp, g, t, self._dense_layers)
            act_elems += self._dense_layers * t * self._dense_act_width * self._gate_factor
            act_kernels += self._dense_layers
        if self._moe_layers and t > 0:
            n_e, k = self._num_experts, self._top_k
            touched = n_e * (1.0 - (1.0 - k / n_e) ** t) if n_e > k else n_e
            rows_per_expert = t * k / touched
            self._gemm(mlp, self._router, t, self._moe_layers, kernels=2.0)  # + top-k/align
            for g in self._expert:
                eg = _Gemm(g.k, g.n, n_e)
                self._gemm(mlp, eg, rows_per_expert, self._moe_layers, weight_groups=touched)
            for g in self._shared:
                self._gemm(mlp, g, t, self._moe_layers)
            moe_act = t * k * self._moe_act_width + t * self._shared_act_width
            act_elems += self._moe_layers * moe_act * self._gate_factor
            act_kernels += self._moe_layers * (2 if self._shared else 1)
        if t > 0:
            # per layer: 2 norms (in+out), residual add (2 in, 1 out), rotary (q,k in+out)
            per_layer = 4.0 * h + 3.0 * h + 2.0 * self._rope_elems + self._extra_ew_elems
            kernels = (3 + (1 if self._rope_elems else 0) + self._extra_ew_kernels) * L
            elems = L * t * per_layer + act_elems + 4.0 * t * h  # + embedding gather, final norm
            flops = L * t * (9.0 * h + 3.0 * self._rope_elems) + 4.0 * act_elems / 3.0
            self._elementwise(ew, elems, flops, kernels + act_kernels + 2)
        # KV-cache write of the new rows (reshape_and_cache): read K,V rows, write the cache
        kvw = _Acc()
        if t > 0:
            kv_elems = L * t * self._kv_elems_layer
            nbytes = kv_elems * (_ACT_BYTES + self._kvb)
            tm = nbytes / self._bw
            time = tm if self.ideal else L * self._ew_lat + tm
            kvw.add(0.0, nbytes, 0.0, time, 0.0, tm)
        # all-reduce: 2 per layer of T x hidden 16-bit values, ring algorithm
        if self.tp > 1 and t > 0:
            msg = t * h * _ACT_BYTES
            link = 2.0 * (self.tp - 1) / self.tp * msg
            per = link / self._link_bw + self._link_lat
            ar = OpCost(0.0, 2.0 * L * link, 2.0 * L * per)
        else:
            ar = _ZERO_OP
        kv_write_bytes = L * t * self._kv_elems_layer * self._kvb
        terms = (
            qkv.op(),
            o.op(),
            mlp.op(),
            ew.op(),
            ar,
            kvw.bytes,
            kvw.time,
            kvw.tm,
            qkv.weight + o.weight + mlp.weight,
            kv_write_bytes,
        )
        if len(self._cache_t) < 65536:
            self._cache_t[tokens] = terms
        return terms

    def _lm_head_op(self, rows: int) -> OpCost:
        cached = self._cache_s.get(rows)
        if cached is None:
            acc = _Acc()
            self._gemm(acc, self._lm_head, float(rows), 1.0)
            cached = OpCost(acc.flops, acc.bytes, acc.time, acc.tc, acc.tm)
            self._cache_s[rows] = cached
        return cached

    # ----------------------------------------------------------------- public API
    def estimate(self, shape: BatchShape) -> IterationCost:
        """Cost of one iteration of ``shape`` (python floats, or arrays for array fields)."""
        tokens = shape.num_prefill_tokens + shape.num_decode_tokens + shape.num_padding_tokens
        sampled = shape.num_sampled_tokens
        if isinstance(tokens, np.ndarray) or isinstance(sampled, np.ndarray):
            return self._estimate_varying(shape)
        tokens = int(tokens)
        if tokens <= 0:
            return _EMPTY_COST
        rest = self._rest(tokens, int(sampled))
        attn, kv_read, _ = self._attention_op(
            shape, tokens, rest.kvw_bytes, rest.kvw_time, rest.kvw_tm
        )
        return self._combine(rest, attn, kv_read)

    def _rest(self, tokens: int, sampled: int) -> _Rest:
        """Every group but attention, and their sums (cached per tokens and sampled rows)."""
        key = (tokens, sampled)
        cached = self._rest_cache.get(key)
        if cached is not None:
            return cached
        qkv, o, mlp, ew, ar, kvw_bytes, kvw_time, kvw_tm, weight, kv_written = self._terms(tokens)
        lm = self._lm_head_op(sampled) if sampled > 0 else _ZERO_OP
        overhead = self._overhead
        kernels = (qkv, o, mlp, ew, lm)  # the groups whose times decide the bound
        rest = _Rest(
            ops={  # in OP_NAMES order; "attention" is filled in by _combine
                "qkv_proj": qkv,
                "attention": _ZERO_OP,
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
            weight_bytes=weight + (self._lm_weight if sampled > 0 else 0.0),
            kv_written=kv_written,
            kvw_bytes=kvw_bytes,
            kvw_time=kvw_time,
            kvw_tm=kvw_tm,
        )
        if len(self._rest_cache) < 65536:
            self._rest_cache[key] = rest
        return rest

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

    def _attention_op(
        self, shape: BatchShape, tokens: int, kvw_bytes: float, kvw_time: float, kvw_tm: float
    ) -> tuple[OpCost, Any, Any]:
        """The attention group of an iteration: (OpCost, KV bytes read, compute time).

        Causal pairs give the FLOPs; cached plus new keys give the KV bytes read; the KV
        written for the new tokens (``kvw_*``) is part of the group.
        """
        L = self._layers
        keys = shape.kv_read_tokens + tokens
        a_flops = L * self._attn_flops_pair * shape.attn_pairs
        kv_read = L * self._kv_elems_layer * self._kvb * keys
        a_bytes = kv_read + L * tokens * self._qo_elems * _ACT_BYTES
        a_time, a_tc, a_tm = self._attention(
            shape.num_seqs + shape.num_padding_seqs,
            shape.num_decode_rows,
            shape.num_prefill_tokens + shape.num_padding_tokens - shape.num_padding_seqs,
            shape.kv_read_tokens,
            shape.attn_pairs,
            a_bytes / L,
        )
        a_time, a_tc, a_tm = L * a_time, L * a_tc, L * a_tm
        attn = OpCost(a_flops, a_bytes + kvw_bytes, a_time + kvw_time, a_tc, a_tm + kvw_tm)
        return attn, kv_read, a_tc

    def estimate_decode_stretch(
        self, shape: BatchShape, kv_read_tokens: np.ndarray
    ) -> IterationCost:
        """Cost of consecutive decode iterations of one batch whose cached context grows.

        ``shape`` is the first iteration; iteration k reads ``kv_read_tokens[k]`` cached tokens
        (and computes that many plus one pair per decode). Only the attention group depends on
        the context, so the other groups are priced once and the attention group as arrays.
        Equals :meth:`estimate` on the corresponding shapes up to float rounding.

        Returns:
            An IterationCost whose totals are arrays over the iterations; ``ops`` holds the
            first iteration's groups except ``attention``, which holds arrays.
        """
        stretch = shape.with_decode_context(kv_read_tokens)
        tokens = int(shape.num_prefill_tokens + shape.num_decode_tokens + shape.num_padding_tokens)
        if shape.num_prefill_tokens or tokens <= 0:
            return self.estimate(stretch)
        rest = self._rest(tokens, int(shape.num_sampled_tokens))
        attn, kv_read, _ = self._attention_op(
            stretch, tokens, rest.kvw_bytes, rest.kvw_time, rest.kvw_tm
        )
        return self._combine(rest, attn, kv_read)

    @functools.cached_property
    def decode_token_slopes(self) -> DecodeSlopes:
        """How an iteration's totals grow per extra cached token a decode row reads.

        In a decode iteration only the attention group depends on the context, and its
        FLOPs (one pair per cached token), bytes (the token's K and V in every layer) and
        compute/memory times are linear in the tokens read. Its *time* is not: the kernel
        streams whole KV blocks (see :meth:`decode_run`).
        """
        L = self._layers
        kv = L * self._kv_elems_layer * self._kvb
        return DecodeSlopes(
            flops=L * self._attn_flops_pair,
            bytes=kv,
            kv_bytes=kv,
            compute_time=L * self._attn_flops_pair / self._attn_peak,
            memory_time=kv / self._bw,
        )

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
        # The kernel reads ceil((kv + n) / (n x block)) blocks per row (mean context
        # kv / n plus the new token); count the steps before that number grows.
        span = n * _ATTN_BLOCK_N
        kv = int(shape.kv_read_tokens)
        blocks = -(-(kv + n) // span)
        return cost, max(1, (span * blocks - kv) // n)

    def _attention(
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
        chunks read ``kv_read`` cached tokens in all and compute ``pairs`` causal pairs.
        Decode rows are priced by how the split-KV kernel streams the cache (CTAs over SMs),
        prefill rows by their 64-row-block compute against the memory traffic; one fixed time
        per call. ``split_tokens`` is the key length the split heuristic sees (default: the
        mean decode context; the profiled engine used its padded block table).
        """
        tc = self._attn_flops_pair * pairs / self._attn_peak
        tm = nbytes / self._bw
        prefill_seqs = seqs - decodes
        if self._masked and prefill_seqs > 0 and rows > 0:
            tc = tc + self._attn_flops_pair * self._masked_pairs(rows, prefill_seqs) / (
                self._attn_peak
            )
        if self.ideal:
            return vmax(tc, tm), tc, tm
        time: Any = self._attn_lat
        # split the cached tokens (and pairs) between the decodes and the prefill chunks
        ctx_d, ctx_p, pairs_p = self._split_context(seqs, decodes, rows, kv_read, pairs)
        if decodes > 0:
            time = time + self._decode_stream(decodes, ctx_d / decodes + 1.0, split_tokens)
        if prefill_seqs > 0 and rows > 0:
            q = rows / prefill_seqs
            q_pad = math.ceil(q / _ATTN_BLOCK_M) * _ATTN_BLOCK_M
            scale = q_pad / q
            work = pairs_p * scale + self._masked * prefill_seqs * q_pad * (q_pad - 1) / 2.0
            p_tc = self._attn_flops_pair * work / self._attn_peak
            p_tm = (
                self._kv_elems_layer * self._kvb * (ctx_p + rows)
                + rows * self._qo_elems * _ACT_BYTES
            ) / self._bw
            time = time + self._prefill_lat + _smoothmax(p_tc, p_tm, self._p)
        return time, tc, tm

    @staticmethod
    def _split_context(seqs: Any, decodes: Any, rows: Any, kv_read: Any, pairs: Any) -> tuple:
        """(decode context, prefill context, prefill pairs) from the shape's aggregates.

        Decodes compute c + 1 pairs each; n prefill chunks of q = rows / n rows each compute
        q c + q (q + 1) / 2, so the pair count fixes how the cached tokens are shared (exact
        for equal chunks).
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

    def _num_splits(self, ctas: int, blocks: int) -> int:
        """Split-KV factor of FlashAttention's heuristic (cached per (ctas, blocks)).

        No split once ``ctas`` fill 80 % of the SMs; else the smallest split count whose wave
        efficiency (CTAs / SMs over its ceiling) is within 85 % of the best, counting only
        split counts that change the KV blocks per split.
        """
        key = (ctas, blocks)
        cached = self._split_cache.get(key)
        if cached is not None:
            return cached
        sms = self._sms
        best = 1
        if ctas < _SPLIT_FILL * sms:
            top = min(_MAX_SPLITS, sms, blocks)
            effs = []
            for s in range(1, top + 1):
                if s > 1 and -(-blocks // s) == -(-blocks // (s - 1)):
                    effs.append(0.0)
                    continue
                waves = ctas * s / sms
                effs.append(waves / math.ceil(waves))
            target = _SPLIT_TOL * max(effs)
            best = next(s for s, e in enumerate(effs, 1) if e > 0 and e >= target)
        if len(self._split_cache) < 65536:
            self._split_cache[key] = best
        return best

    def _decode_stream(self, seqs: Any, ctx: Any, split_tokens: float | None) -> Any:
        """Time of the decode rows of one attention call: split-KV CTAs streaming the cache.

        Each request's KV heads (MLA: 64-head row blocks) are one CTA each, or ``s`` CTAs
        when split-KV is on (then a combine kernel follows). CTAs run in rounds of
        ``_ATTN_CTAS_PER_SM`` per SM; within a round the busiest SM's k CTAs stream at
        min(per-SM rate, their share of the memory bandwidth); each round pays
        ``attention_cta_time``. KV is read in whole 128-token blocks.
        """
        if isinstance(ctx, np.ndarray):  # decode stretch: the time depends on whole blocks
            nblocks = np.maximum(1, np.ceil(ctx / _ATTN_BLOCK_N - 1e-9)).astype(np.int64)
            if nblocks.ndim == 1 and nblocks[0] == nblocks[-1] and nblocks.min() == nblocks[0]:
                # a short stretch stays within one 128-token block count: one scalar price
                one = self._decode_stream(seqs, int(nblocks[0]) * _ATTN_BLOCK_N, split_tokens)
                return np.full(ctx.shape, one, dtype=float)
            uniq, inverse = np.unique(nblocks, return_inverse=True)
            times = [self._decode_stream(seqs, b * _ATTN_BLOCK_N, split_tokens) for b in uniq]
            return np.asarray(times, dtype=float)[inverse].reshape(ctx.shape)
        blocks = max(1, math.ceil(ctx / _ATTN_BLOCK_N - 1e-9))
        key = (seqs, blocks, split_tokens)
        cached = self._decode_cache.get(key)
        if cached is not None:
            return cached
        base = int(seqs) * self._dec_ctas_seq
        split_blocks = blocks
        if split_tokens is not None:
            split_blocks = max(blocks, math.ceil(split_tokens / _ATTN_BLOCK_N - 1e-9))
        s = self._num_splits(base, split_blocks)
        per_split = -(-split_blocks // s)
        n = base * -(-blocks // per_split)  # CTAs that have KV blocks to read
        tok = min(blocks, per_split) * _ATTN_BLOCK_N
        cta_bytes = tok * self._dec_tok_bytes
        cta_flops = tok * self._dec_pair_flops
        sms, occ = self._sms, _ATTN_CTAS_PER_SM
        full, last = divmod(n, sms * occ)
        time = self._combine_lat if s > 1 else 0.0
        if full:
            rate = min(self._sm_bw, self._bw / sms)
            work = max(occ * cta_bytes / rate, occ * cta_flops / self._attn_peak_sm)
            time += full * (self._cta_lat + work)
        if last:
            k = -(-last // sms)
            rate = min(self._sm_bw, self._bw * k / last)
            time += self._cta_lat + max(k * cta_bytes / rate, k * cta_flops / self._attn_peak_sm)
        if len(self._decode_cache) < 65536:
            self._decode_cache[key] = time
        return time

    def _masked_pairs(self, rows: float, prefill_seqs: float) -> float:
        """Causally masked pairs the kernel still computes, times ``attention_masked_fraction``.

        A chunk of q rows has q(q-1)/2 masked pairs above the diagonal. The shape only holds
        the total prefill rows P of n prefill sequences, so sum(q^2) is estimated as P^2 / n:
        exact for one chunk or for padded (rectangular) prefills, a lower bound otherwise.
        """
        return self._masked * max(0.0, (rows * rows / prefill_seqs - rows) / 2.0)

    def _estimate_varying(self, shape: BatchShape) -> IterationCost:
        """Array path when the row count or sampled rows vary: price each distinct value."""
        fields = (
            "num_seqs",
            "num_prefill_tokens",
            "num_decode_tokens",
            "num_padding_tokens",
            "num_sampled_tokens",
            "kv_read_tokens",
            "attn_pairs",
            "num_padding_seqs",
        )
        arrays = np.broadcast_arrays(*(np.asarray(getattr(shape, f)) for f in fields))
        n = arrays[0].size
        parts = [self.estimate(BatchShape(*(int(a.flat[i]) for a in arrays))) for i in range(n)]

        def stack(get) -> np.ndarray:
            return np.array([get(c) for c in parts], dtype=float)

        ops = {
            name: OpCost(
                stack(lambda c, k=name: c.ops[k].flops),
                stack(lambda c, k=name: c.ops[k].bytes),
                stack(lambda c, k=name: c.ops[k].time),
                stack(lambda c, k=name: c.ops[k].compute_time),
                stack(lambda c, k=name: c.ops[k].memory_time),
            )
            for name in OP_NAMES
        }
        return IterationCost(
            ops,
            stack(lambda c: c.time),
            stack(lambda c: c.flops),
            stack(lambda c: c.bytes),
            stack(lambda c: c.weight_bytes),
            stack(lambda c: c.kv_bytes),
            stack(lambda c: c.activation_bytes),
            stack(lambda c: c.compute_time),
            stack(lambda c: c.memory_time),
        )

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
        rep = self._replicated_params
        return ((self.model.num_params - rep) / self.tp + rep) * self._wb

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """KV-cache bytes one token occupies on one GPU, all layers (MLA latent replicated;
        GQA KV heads replicated when fewer than ``tp``)."""
        return self._layers * self._kv_elems_layer * self._kvb

    def knee_batch_size(self, context_len: int, max_batch: int = 65536) -> int | None:
        """Smallest decode batch at ``context_len`` whose iteration is compute-bound.

        Doubling search then bisection (assumes compute-boundness, once reached, persists).
        Returns None when even ``max_batch`` requests are memory-bound.
        """
        window = self.model.sliding_window

        def compute_bound(batch: int) -> bool:
            return bool(self.estimate(BatchShape.decode(batch, context_len, window)).compute_bound)

        if compute_bound(1):
            return 1
        lo, hi = 1, 2
        while not compute_bound(hi):
            if hi >= max_batch:
                return None
            lo, hi = hi, min(2 * hi, max_batch)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if compute_bound(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def layer_breakdown(self, num_tokens: int) -> dict[str, OpCost]:
        """Per-layer costs of the token-wise kernels for ``num_tokens`` rows (calibration).

        Keys: ``qkv_proj``, ``o_proj``, ``mlp_up``, ``mlp_down``, ``mlp_act``, ``norms``
        (both norms), ``rope``, ``add``. One dense layer, on one GPU.
        """
        m, t, h = self.model, float(num_tokens), self.model.hidden_size
        out: dict[str, OpCost] = {}

        def gemms(gs: list[_Gemm]) -> OpCost:
            acc = _Acc()
            for g in gs:
                self._gemm(acc, g, t, 1.0)
            return acc.op()

        def elementwise(elems: float, flops: float, kernels: float) -> OpCost:
            acc = _Acc()
            self._elementwise(acc, elems, flops, kernels)
            return acc.op()

        out["qkv_proj"] = gemms(self._qkv)
        out["o_proj"] = gemms(self._o)
        out["mlp_up"] = gemms(self._dense_mlp[:1])
        out["mlp_down"] = gemms(self._dense_mlp[1:])
        act = t * self._dense_act_width * self._gate_factor
        out["mlp_act"] = elementwise(act, 4.0 * act / 3.0, 1)
        out["norms"] = elementwise(4.0 * t * h, 8.0 * t * h, 2)
        out["rope"] = elementwise(
            2.0 * t * self._rope_elems, 3.0 * t * self._rope_elems, 1 if self._rope_elems else 0
        )
        out["add"] = elementwise(3.0 * t * h, t * h, 1)
        del m
        return out

    def attention_kernel(
        self,
        num_seqs: int,
        num_tokens: int,
        kv_read_tokens: int,
        attn_pairs: int,
        prefill_tokens: int = 0,
        split_tokens: float | None = None,
    ) -> OpCost:
        """One layer's attention kernel alone (no KV-cache write), for calibration.

        ``prefill_tokens`` rows belong to the ``num_seqs - (num_tokens - prefill_tokens)``
        prefill chunks, the other rows are decodes. ``split_tokens``: key length the split-KV
        heuristic sees (the profiled engine padded its block table to ``max_model_len``).
        """
        keys = kv_read_tokens + num_tokens
        flops = self._attn_flops_pair * attn_pairs
        nbytes = self._kv_elems_layer * self._kvb * keys + num_tokens * self._qo_elems * _ACT_BYTES
        decodes = num_tokens - prefill_tokens
        time, tc, tm = self._attention(
            num_seqs, decodes, prefill_tokens, kv_read_tokens, attn_pairs, nbytes, split_tokens
        )
        return OpCost(flops, nbytes, time, tc, tm)

    def all_reduce_time(self, num_bytes: float) -> float:
        """One ring all-reduce of ``num_bytes`` across the ``tp`` GPUs, s (0 at tp=1)."""
        if self.tp == 1:
            return 0.0
        return 2.0 * (self.tp - 1) / self.tp * num_bytes / self._link_bw + self._link_lat


_EMPTY_COST = IterationCost(
    {name: _ZERO_OP for name in OP_NAMES}, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
)
