"""Pieces shared by the workload config models: constrained number types and ``describe()``.

Owns the pydantic field types (finite, strict, bounded by the limits of
:mod:`batchsim.validation`) and the one-line ``kind(key=value, ...)`` rendering that the
distributions and arrival processes use for their ``describe()``. Imports nothing from
:mod:`batchsim.workload`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from batchsim.validation import (
    MAX_MS,
    MAX_SECONDS,
    MAX_TOKENS,
    ConfigModel,
    StrictFloat,
    StrictInt,
)

MAX_SIGMA = 10.0
"""Largest ``sigma`` (standard deviation of the log) of a log-normal distribution."""
MAX_RATE = 1e6
"""Largest arrival rate, requests/s."""

PositiveFinite = Annotated[StrictFloat, Field(gt=0)]
NonNegativeFinite = Annotated[StrictFloat, Field(ge=0)]
TokenCount = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
"""A token count of one request: an integer in [1, 2^24]."""
TokenMean = Annotated[StrictFloat, Field(gt=0, le=MAX_TOKENS)]
"""A positive token-count parameter (mean, standard deviation), tokens."""
Sigma = Annotated[StrictFloat, Field(gt=0, le=MAX_SIGMA)]
"""Standard deviation of the log of a log-normal distribution."""
Millis = Annotated[StrictFloat, Field(ge=0, le=MAX_MS)]
"""A duration >= 0, ms."""
PositiveMillis = Annotated[StrictFloat, Field(gt=0, le=MAX_MS)]
"""A duration > 0, ms."""
Seconds = Annotated[StrictFloat, Field(ge=0, le=MAX_SECONDS)]
"""A duration >= 0, s."""
PositiveSeconds = Annotated[StrictFloat, Field(gt=0, le=MAX_SECONDS)]
"""A duration > 0, s."""
Rate = Annotated[StrictFloat, Field(gt=0, le=MAX_RATE)]
"""An arrival rate, requests/s."""


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
