"""The shapes a hardware profile's terms were fitted on: :class:`CalibratedRange`, the
``calibrated_range:`` block that ``batchsim calibrate`` writes, and what of a run lies outside
it.

Imports nothing from batchsim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CalibratedRange"]


@dataclass(frozen=True)
class CalibratedRange:
    """The shapes a profile's terms were fitted on: its ``calibrated_range:`` block, written by
    ``batchsim calibrate``. A run outside it uses the fitted terms beyond the data (``batchsim
    run`` warns). Each range is ``(lowest, highest)``, inclusive; None: not measured.

    Attributes:
        models: Names of the models whose kernels were measured.
        hidden_size: Hidden sizes of those models.
        tensor_parallel_size: The tensor-parallel degrees measured (not a range: the sharded
            shapes of another degree were not).
        tokens: Tokens (GEMM rows) per iteration of the per-layer operator measurements.
        batch_size: Requests per iteration (decode attention batches, CPU overhead batches).
        context_tokens: Cached tokens per request of the attention measurements.
    """

    models: tuple[str, ...] = ()
    hidden_size: tuple[int, int] | None = None
    tensor_parallel_size: tuple[int, ...] | None = None
    tokens: tuple[int, int] | None = None
    batch_size: tuple[int, int] | None = None
    context_tokens: tuple[int, int] | None = None

    def outside(
        self,
        *,
        model: str,
        hidden_size: int,
        tensor_parallel_size: int,
        tokens: tuple[int, int] | None,
        batch_size: tuple[int, int] | None,
        context_tokens: int | None,
    ) -> list[str]:
        """What of a run lies outside the range, one line each (empty: all inside).

        Args:
            model: The run's model name (named in the message).
            hidden_size: Its hidden size.
            tensor_parallel_size: The run's tensor-parallel degree.
            tokens: Fewest and most tokens of an iteration (None: no iteration).
            batch_size: Fewest and most requests of an iteration.
            context_tokens: Longest context of a request (prompt + output tokens); only
                contexts longer than the range are reported.
        """
        out = []

        def beyond(key: str, what: str, unit: str, lo: int, hi: int) -> None:
            span = getattr(self, key)
            if span is None or (span[0] <= lo and hi <= span[1]):
                return
            seen = f"{lo:,}-{hi:,}" if lo != hi else f"{lo:,}"
            out.append(
                f"calibrated_range.{key}: the profile's terms were fitted on {what} of "
                f"{span[0]:,}-{span[1]:,} {unit}; this run has {what} of {seen} {unit}: "
                "their times are extrapolated"
            )

        if self.hidden_size is not None and not (
            self.hidden_size[0] <= hidden_size <= self.hidden_size[1]
        ):
            out.append(
                "calibrated_range.hidden_size: the profile's terms were fitted on models of "
                f"hidden size {self.hidden_size[0]:,}-{self.hidden_size[1]:,} "
                f"({', '.join(self.models)}); this run's model {model} has {hidden_size:,}: "
                "its times are extrapolated"
            )
        tps = self.tensor_parallel_size
        if tps is not None and tensor_parallel_size not in tps:
            out.append(
                "calibrated_range.tensor_parallel_size: the profile's terms were fitted at "
                f"tensor-parallel degrees {', '.join(str(t) for t in tps)}; this run uses "
                f"{tensor_parallel_size}: its sharded shapes were not measured"
            )
        if tokens is not None:
            beyond("tokens", "iterations", "tokens", *tokens)
        if batch_size is not None:
            beyond("batch_size", "batches", "requests", *batch_size)
        span = self.context_tokens
        if context_tokens is not None and span is not None and context_tokens > span[1]:
            out.append(
                "calibrated_range.context_tokens: the profile's terms were fitted on contexts "
                f"of {span[0]:,}-{span[1]:,} tokens per request; this run has contexts of up to "
                f"{context_tokens:,} tokens: their attention times are extrapolated"
            )
        return out

    def to_yaml(self) -> dict[str, Any]:
        """The ``calibrated_range:`` block (measured entries only, lists for YAML)."""
        out: dict[str, Any] = {}
        if self.models:
            out["models"] = list(self.models)
        for key in ("hidden_size", "tensor_parallel_size", "tokens", "batch_size"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value)
        if self.context_tokens is not None:
            out["context_tokens"] = list(self.context_tokens)
        return out
