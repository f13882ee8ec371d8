"""Dtype names: the bytes of each stored dtype, the weight dtypes the cost model accepts, and
which KV-cache dtype ``auto`` means.

Imports nothing from batchsim but :mod:`batchsim.errors`: the command line builds its help texts
from these without loading the model catalog or the cost model.
"""

from __future__ import annotations

from batchsim.errors import ConfigError

__all__ = ["DTYPE_BYTES", "KV_DTYPES", "WEIGHT_DTYPES", "dtype_bytes", "resolve_kv_dtype"]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "nvfp4": 0.5625,
}
"""Bytes per stored element for each weight / KV-cache dtype.

``int4`` is the bare 4-bit payload: the per-group scales and zero points of GPTQ/AWQ-style
quantization (about 0.03 byte per weight at group size 128) are ignored, see
:meth:`batchsim.catalog.model.ModelSpec.weight_bytes`. ``nvfp4`` counts its scales, which are
not small: 4-bit E2M1 values with one FP8 (E4M3) scale per block of 16 (NVIDIA, "Introducing
NVFP4 for Efficient and Accurate Low-Precision Inference", 2025; the per-tensor FP32 scale is
negligible), 4.5 bits per weight. A weight dtype only (not a KV-cache dtype).
"""

KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
"""Dtypes a KV cache may be stored in (``engine.kv_cache_dtype``, besides ``auto``)."""

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "nvfp4")
"""Weight dtypes the cost model accepts (``engine.dtype``). ``nvfp4`` runs on FP4 tensor cores
where the GPU has them (Blackwell: weights and activations in FP4), else dequantized to 16 bits
(weight-only, as vLLM's FP4 Marlin kernels on Hopper and Ampere)."""


def dtype_bytes(dtype: str, key: str = "dtype") -> float:
    """Bytes per element of ``dtype``.

    Raises:
        ConfigError: Unknown dtype; the message lists the allowed ones.
    """
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        allowed = ", ".join(DTYPE_BYTES)
        raise ConfigError(f"{key}: unknown dtype {dtype!r}; allowed: {allowed}") from None


def resolve_kv_dtype(kv_dtype: str, weight_dtype: str) -> str:
    """The KV-cache dtype that ``kv_dtype`` means when the weights are ``weight_dtype``.

    ``auto`` follows the weight dtype, except that integer-quantized weights (int8/int4 —
    weight-only quantization) keep an fp16 KV cache, as vLLM does, and FP4 weights a bf16 one
    (the activations' dtype; a checkpoint that quantizes its KV cache says so, and
    ``engine.kv_cache_dtype`` sets it).
    """
    if kv_dtype != "auto":
        if kv_dtype not in KV_DTYPES:
            allowed = ", ".join(KV_DTYPES)
            raise ConfigError(f"kv_cache_dtype: unknown dtype {kv_dtype!r}; allowed: {allowed}")
        return kv_dtype
    dtype_bytes(weight_dtype, "dtype")
    if weight_dtype == "nvfp4":
        return "bf16"
    return "fp16" if weight_dtype in ("int8", "int4") else weight_dtype
