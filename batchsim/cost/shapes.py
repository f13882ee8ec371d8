"""The shape of one iteration: the aggregates of a batch that its cost depends on.

:class:`BatchShape` is THE aggregation of a batch: schedulers build it from their requests
(:meth:`BatchShape.from_requests`), the cost model prices it. This module imports nothing
from batchsim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _window_pairs(rows: int, context: int, window: int | None) -> int:
    """Causal (query, key) pairs of ``rows`` new queries after ``context`` cached tokens.

    Query j (0-based) sees ``context + j + 1`` keys, at most ``window`` with sliding window.
    """
    if window is None:
        return rows * context + rows * (rows + 1) // 2
    first = context + 1
    below = min(max(window - first + 1, 0), rows)  # queries that see fewer than `window` keys
    return below * first + below * (below - 1) // 2 + (rows - below) * window


@dataclass(frozen=True, slots=True)
class BatchShape:
    """Aggregates of ONE iteration — everything its cost depends on.

    Fields are python ints, or equal-length numpy arrays for a vectorized decode stretch (one
    element per step; typically only ``kv_read_tokens`` and ``attn_pairs`` vary).

    Attributes:
        num_seqs: Requests in the iteration.
        num_prefill_tokens: New prompt tokens computed this step (all prefill chunks).
        num_decode_tokens: Decode tokens (one per decoding request).
        num_padding_tokens: Rows computed but wasted (prefill padding, empty static slots).
        num_sampled_tokens: Rows that go through lm_head (requests emitting a token + padded
            rows that sample).
        kv_read_tokens: Sum over requests of cached tokens attention reads (window-capped).
        attn_pairs: Sum over requests of causal (query, key) pairs computed,
            ``q*c + q*(q+1)/2`` (padding rows included).
    """

    num_seqs: Any
    num_prefill_tokens: Any = 0
    num_decode_tokens: Any = 0
    num_padding_tokens: Any = 0
    num_sampled_tokens: Any = 0
    kv_read_tokens: Any = 0
    attn_pairs: Any = 0

    @property
    def num_tokens(self) -> Any:
        """Rows of every GEMM: prefill + decode + padding tokens."""
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_padding_tokens

    @classmethod
    def from_requests(
        cls,
        new_tokens: Sequence[int],
        context_tokens: Sequence[int],
        *,
        sampled: Sequence[bool] | None = None,
        pad_to: int | None = None,
        window: int | None = None,
    ) -> BatchShape:
        """Aggregate per-request token counts into a shape.

        A request with one new token after a non-empty context is a decode; anything else is
        a prefill (chunk).

        Args:
            new_tokens: Tokens each request computes this step (q).
            context_tokens: Tokens each request already has in the KV cache (c).
            sampled: Whether each request emits a token (default: all do).
            pad_to: Pad every prefill row to this many rows (rectangular prefill); the padding
                rows compute (attention included) but do not sample.
            window: Sliding-window size in tokens, or None.

        Raises:
            ValueError: Mismatched lengths, negative counts, or ``pad_to`` below a prefill.
        """
        if len(new_tokens) != len(context_tokens):
            raise ValueError("new_tokens and context_tokens must have the same length")
        if sampled is not None and len(sampled) != len(new_tokens):
            raise ValueError("sampled must have one entry per request")
        prefill = decode = padding = kv_read = pairs = 0
        for q, c in zip(new_tokens, context_tokens):
            if q < 0 or c < 0:
                raise ValueError(f"token counts must be >= 0, got new={q} context={c}")
            cached = c if window is None else min(c, window)
            rows = q
            if q == 1 and c > 0:
                decode += 1
            else:
                prefill += q
                if pad_to is not None:
                    if pad_to < q:
                        raise ValueError(f"pad_to={pad_to} is shorter than a prefill of {q}")
                    rows = pad_to
                    padding += pad_to - q
            kv_read += cached
            pairs += _window_pairs(rows, cached, window)
        num_sampled = len(new_tokens) if sampled is None else sum(1 for s in sampled if s)
        return cls(
            num_seqs=len(new_tokens),
            num_prefill_tokens=prefill,
            num_decode_tokens=decode,
            num_padding_tokens=padding,
            num_sampled_tokens=num_sampled,
            kv_read_tokens=kv_read,
            attn_pairs=pairs,
        )

    def with_decode_context(self, kv_read_tokens: Any) -> BatchShape:
        """This decode batch with ``kv_read_tokens`` cached tokens read (a number, or an array
        over the iterations of a decode stretch); each decode computes one more pair."""
        return BatchShape(
            num_seqs=self.num_seqs,
            num_prefill_tokens=self.num_prefill_tokens,
            num_decode_tokens=self.num_decode_tokens,
            num_padding_tokens=self.num_padding_tokens,
            num_sampled_tokens=self.num_sampled_tokens,
            kv_read_tokens=kv_read_tokens,
            attn_pairs=kv_read_tokens + self.num_decode_tokens,
        )

    @classmethod
    def decode(cls, batch_size: int, context_len: int, window: int | None = None) -> BatchShape:
        """``batch_size`` decoding requests, each with ``context_len`` cached tokens."""
        cached = context_len if window is None else min(context_len, window)
        return cls(
            num_seqs=batch_size,
            num_decode_tokens=batch_size,
            num_sampled_tokens=batch_size,
            kv_read_tokens=batch_size * cached,
            attn_pairs=batch_size * _window_pairs(1, cached, window),
        )

    @classmethod
    def prefill(
        cls, num_tokens: int, context_len: int = 0, window: int | None = None
    ) -> BatchShape:
        """One prefill chunk of ``num_tokens`` after ``context_len`` cached tokens; it samples."""
        cached = context_len if window is None else min(context_len, window)
        return cls(
            num_seqs=1,
            num_prefill_tokens=num_tokens,
            num_sampled_tokens=1,
            kv_read_tokens=cached,
            attn_pairs=_window_pairs(num_tokens, cached, window),
        )
