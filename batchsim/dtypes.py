"""Dtype names: the bytes of each stored dtype, the weight dtypes the cost model accepts, and
which KV-cache dtype ``auto`` means.

Imports nothing from batchsim but :mod:`batchsim.errors`: the command line builds its help texts
from these without loading the model catalog or the cost model.
"""

from __future__ import annotations

from batchsim.errors import ConfigError

__all__ = ["DTYPE_BYTES", "WEIGHT_DTYPES", "dtype_bytes", "resolve_kv_dtype"]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}
"""Bytes per stored element for each weight / KV-cache dtype.

``int4`` is the bare 4-bit payload: the per-group scales and zero points of GPTQ/AWQ-style
quantization (about 0.03 byte per weight at group size 128) are ignored, see
:meth:`batchsim.catalog.model.ModelSpec.weight_bytes`.
"""

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")
"""Weight dtypes the cost model accepts (``engine.dtype``)."""


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
    weight-only quantization) keep an fp16 KV cache, as vLLM does.
    """
    if kv_dtype != "auto":
        dtype_bytes(kv_dtype, "kv_cache_dtype")
        return kv_dtype
    dtype_bytes(weight_dtype, "dtype")
    return "fp16" if weight_dtype in ("int8", "int4") else weight_dtype
