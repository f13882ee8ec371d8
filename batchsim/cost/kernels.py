"""One kernel's predicted time on a GPU profile: :func:`kernel` (``batchsim kernel``).

So that anyone can check a profile against their own kernel measurements, the cost model's
kernel prices are public, one kernel at a time, through the same pricing classes a simulation
uses (the GEMM correction grid included):

- ``gemm``: one ``m x k @ k x n`` GEMM of weights in ``dtype`` (``bf16``, ``fp16``, ``fp8`` —
  per-tensor scales, fp8 tensor cores — or ``fp8_block`` — block scales, priced as fp8 with
  the profile's fp8-block corrections).
- ``attention``: one layer's attention kernel, ``phase="context"`` (``batch`` prompts of
  ``q_len`` new tokens each after ``kv_len`` cached ones, causal) or ``"generation"``
  (``batch`` decode rows, each reading ``kv_len`` cached tokens and its own new key), with
  ``heads`` query heads, ``kv_heads`` KV heads of ``head_dim`` on one GPU and the KV cache in
  ``kv_dtype``.
- ``moe``: the routed experts of one MoE layer (a fused MoE kernel's GEMMs): ``tokens`` rows,
  each sent to ``top_k`` of ``experts`` experts of ``hidden`` -> ``inter`` (gated: gate and up,
  then down), split over ``tp`` GPUs by tensor parallelism, weights in ``dtype`` — the grouped
  GEMMs over the experts the tokens touch (uniform routing), as a simulation prices them. The
  router GEMM, the activation and the token permutation are not in it.
- ``allreduce``: one ring all-reduce of ``size_bytes`` over ``gpus`` GPUs.

Each returns a :class:`KernelEstimate`: time, FLOPs, bytes and the bound — ``"compute"`` or
``"memory"`` for GEMM, MoE and attention (the larger of the kernel's compute and memory times),
``"latency"`` or ``"bandwidth"`` for an all-reduce (its fixed latency against its transfer).

Must not import anything from batchsim above the cost model.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.hardware_files import load_hardware
from batchsim.cost.attention import AttentionGeometry
from batchsim.cost.comm import ring_all_reduce_time
from batchsim.cost.costs import CostSum
from batchsim.cost.gemm import Gemm
from batchsim.cost.moe import expected_experts
from batchsim.cost.terms import HardwareTerms, gemm_correction
from batchsim.dtypes import DTYPE_BYTES
from batchsim.errors import ConfigError
from batchsim.validation import number_problem

__all__ = ["GEMM_DTYPES", "KERNEL_KINDS", "KV_DTYPES", "KernelEstimate", "kernel"]

KERNEL_KINDS = ("gemm", "attention", "moe", "allreduce")
GEMM_DTYPES = ("bf16", "fp16", "fp8", "fp8_block", "nvfp4")
KV_DTYPES = ("bf16", "fp16", "fp8")
PHASES = ("context", "generation")
_MAX_DIM = 2**24


@dataclass(frozen=True)
class KernelEstimate:
    """One kernel's predicted cost.

    Attributes:
        time_us: Predicted time, microseconds.
        bound: ``compute``/``memory`` (GEMM, attention) or ``latency``/``bandwidth``
            (all-reduce).
        flops: Floating-point operations (0 for an all-reduce: its sums are not counted).
        bytes: Device-memory bytes moved (all-reduce: bytes each GPU sends).
    """

    time_us: float
    bound: str
    flops: float
    bytes: float

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready mapping."""
        return asdict(self)


def _count(name: str, value: Any, *, lo: int = 1, hi: int = _MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    problem = number_problem(value, ge=lo, le=hi)
    if problem is not None:
        raise ConfigError(f"{name} {problem}")
    return value


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _hardware(hardware: HardwareProfile | str) -> HardwareProfile:
    return load_hardware(hardware) if isinstance(hardware, str) else hardware


def gemm_kernel(hw: HardwareProfile, m: int, n: int, k: int, dtype: str) -> KernelEstimate:
    """One GEMM (see the module docstring)."""
    weight = "fp8" if dtype == "fp8_block" else dtype
    terms = HardwareTerms.from_profile(hw, weight)
    correction = gemm_correction(hw, weight, terms.compute_dtype)
    if dtype == "fp8_block":
        table = hw.gemm_table
        fp8_cores = terms.compute_dtype == "fp8"
        correction = (
            functools.partial(table.log_factor, "fp8_block")
            if table is not None and fp8_cores and "fp8_block" in table.values
            else None
        )
    pricing = terms.gemm_pricing(DTYPE_BYTES[weight], correction=correction)
    cost = pricing.price(Gemm(k, n), float(m))
    bound = "compute" if cost.compute_time > cost.memory_time else "memory"
    return KernelEstimate(cost.time * 1e6, bound, cost.flops, cost.bytes)


def attention_kernel(
    hw: HardwareProfile,
    *,
    phase: str,
    batch: int,
    q_len: int,
    kv_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    kv_dtype: str,
) -> KernelEstimate:
    """One layer's attention kernel (see the module docstring)."""
    if heads % kv_heads:
        raise ConfigError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    terms = HardwareTerms.from_profile(hw, "bf16")
    pricing = terms.attention_pricing(
        AttentionGeometry.dense(float(heads), kv_heads, head_dim), DTYPE_BYTES[kv_dtype]
    )
    if phase == "generation":
        if q_len != 1:
            raise ConfigError(f"q_len must be 1 in the generation phase, got {q_len}")
        cost = pricing.kernel(batch, batch, batch * kv_len, batch * (kv_len + 1))
    else:
        rows = batch * q_len
        pairs = batch * (q_len * kv_len + q_len * (q_len + 1) // 2)
        cost = pricing.kernel(batch, rows, batch * kv_len, pairs, prefill_tokens=rows)
    bound = "compute" if cost.compute_time > cost.memory_time else "memory"
    return KernelEstimate(cost.time * 1e6, bound, cost.flops, cost.bytes)


def moe_kernel(
    hw: HardwareProfile,
    *,
    tokens: int,
    hidden: int,
    inter: int,
    top_k: int,
    experts: int,
    tp: int,
    dtype: str,
) -> KernelEstimate:
    """The routed experts of one MoE layer (see the module docstring)."""
    if top_k > experts:
        raise ConfigError(f"top_k ({top_k}) must be at most experts ({experts})")
    if inter % tp:
        raise ConfigError(f"inter ({inter}) must be a multiple of tp ({tp})")
    weight = "fp8" if dtype == "fp8_block" else dtype
    terms = HardwareTerms.from_profile(hw, weight)
    pricing = terms.expert_gemm_pricing(DTYPE_BYTES[weight])
    width = inter // tp
    gemms = (Gemm(hidden, 2 * width, float(experts)), Gemm(width, hidden, float(experts)))
    touched = expected_experts(float(experts), float(top_k), float(tokens))
    acc = CostSum()
    pricing.add(acc, gemms, tokens * top_k / touched, 1.0, weight_groups=touched)
    bound = "compute" if acc.compute_time > acc.memory_time else "memory"
    return KernelEstimate(acc.time * 1e6, bound, acc.flops, acc.bytes)


def allreduce_kernel(hw: HardwareProfile, size_bytes: int, gpus: int) -> KernelEstimate:
    """One ring all-reduce (see the module docstring)."""
    terms = HardwareTerms.from_profile(hw, "bf16")
    if gpus == 1:
        return KernelEstimate(0.0, "latency", 0.0, 0.0)
    time = ring_all_reduce_time(size_bytes, gpus, terms.link_bandwidth, terms.link_latency)
    sent = 2.0 * (gpus - 1) / gpus * size_bytes
    bound = "latency" if terms.link_latency >= time - terms.link_latency else "bandwidth"
    return KernelEstimate(float(time) * 1e6, bound, 0.0, sent)


def kernel(hardware: HardwareProfile | str, kind: str, **shape: Any) -> KernelEstimate:
    """The predicted time of one kernel on ``hardware`` (a profile or its name/path).

    ``kind`` and its shape keywords::

        kernel("h100-sxm", "gemm", m=128, n=4096, k=4096, dtype="bf16")
        kernel("h100-sxm", "attention", phase="generation", batch=64, kv_len=2048,
               heads=32, kv_heads=8, head_dim=128, kv_dtype="bf16")
        kernel("h100-sxm", "moe", tokens=256, hidden=7168, inter=2048, top_k=8,
               experts=256, tp=8, dtype="fp8_block")
        kernel("h100-sxm", "allreduce", size_bytes=2**20, gpus=8)

    Raises:
        ConfigError: Unknown kind, a missing or unknown shape keyword, or a value out of
            range (one line naming it and what is allowed).
    """
    kind = _choice("kind", kind, KERNEL_KINDS)
    required: dict[str, tuple[str, ...]] = {
        "gemm": ("m", "n", "k"),
        "attention": ("phase", "batch", "kv_len", "heads", "kv_heads", "head_dim"),
        "moe": ("tokens", "hidden", "inter", "top_k", "experts"),
        "allreduce": ("size_bytes", "gpus"),
    }
    optional: dict[str, dict[str, Any]] = {
        "gemm": {"dtype": "bf16"},
        "attention": {"q_len": None, "kv_dtype": "bf16"},
        "moe": {"tp": 1, "dtype": "bf16"},
        "allreduce": {},
    }
    unknown = sorted(set(shape) - set(required[kind]) - set(optional[kind]))
    if unknown:
        allowed = ", ".join((*required[kind], *optional[kind]))
        raise ConfigError(f"{kind}: unknown keyword {unknown[0]!r}; allowed: {allowed}")
    missing = [key for key in required[kind] if shape.get(key) is None]
    if missing:
        raise ConfigError(f"{kind}: {missing[0]} is required")
    values = {**optional[kind], **{k: v for k, v in shape.items() if v is not None}}
    hw = _hardware(hardware)
    if kind == "gemm":
        return gemm_kernel(
            hw,
            _count("m", values["m"]),
            _count("n", values["n"]),
            _count("k", values["k"]),
            _choice("dtype", values["dtype"], GEMM_DTYPES),
        )
    if kind == "attention":
        phase = _choice("phase", values["phase"], PHASES)
        q_len = values["q_len"]
        if q_len is None:
            if phase == "context":
                raise ConfigError("attention: q_len is required in the context phase")
            q_len = 1
        return attention_kernel(
            hw,
            phase=phase,
            batch=_count("batch", values["batch"]),
            q_len=_count("q_len", q_len),
            kv_len=_count("kv_len", values["kv_len"], lo=0),
            heads=_count("heads", values["heads"], hi=4096),
            kv_heads=_count("kv_heads", values["kv_heads"], hi=4096),
            head_dim=_count("head_dim", values["head_dim"], hi=4096),
            kv_dtype=_choice("kv_dtype", values["kv_dtype"], KV_DTYPES),
        )
    if kind == "moe":
        return moe_kernel(
            hw,
            tokens=_count("tokens", values["tokens"]),
            hidden=_count("hidden", values["hidden"]),
            inter=_count("inter", values["inter"]),
            top_k=_count("top_k", values["top_k"], hi=4096),
            experts=_count("experts", values["experts"], hi=65536),
            tp=_count("tp", values["tp"], hi=4096),
            dtype=_choice("dtype", values["dtype"], GEMM_DTYPES),
        )
    size = _count("size_bytes", values["size_bytes"], hi=2**40)
    return allreduce_kernel(hw, size, _count("gpus", values["gpus"], hi=4096))
