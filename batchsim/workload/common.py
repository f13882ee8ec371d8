"""Pieces shared by the workload config models: constrained number types and ``describe()``.

Owns the pydantic field types ``PositiveFinite``, ``NonNegativeFinite`` and ``TokenCount`` and
the one-line ``kind(key=value, ...)`` rendering that the distributions and arrival processes use
for their ``describe()``. Imports nothing from :mod:`batchsim.workload`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from batchsim.validation import ConfigModel

PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
TokenCount = Annotated[int, Field(ge=1)]


def _describe_model(model: ConfigModel, tag: str) -> str:
    values = model.model_dump(exclude_defaults=True, exclude={tag})
    kind = getattr(model, tag)
    parts = []
    for name, value in values.items():
        if isinstance(value, tuple | list) and len(value) > 4:
            value = f"[{len(value)} values]"
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        parts.append(f"{name}={value}")
    return f"{kind}({', '.join(parts)})"
