"""Dtype names: the bytes of each stored dtype and the weight dtypes the cost model accepts.

Imports nothing: the command line builds its help texts from these without loading the model
catalog or the cost model.
"""

from __future__ import annotations

__all__ = ["DTYPE_BYTES", "WEIGHT_DTYPES"]

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
