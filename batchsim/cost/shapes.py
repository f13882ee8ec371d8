"""The shape of one iteration: the aggregates of a batch that its cost depends on.

:class:`BatchShape` is THE aggregation of a batch: schedulers build it from their requests
(:meth:`BatchShape.from_requests`), the cost model prices it. This module imports nothing
from batchsim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple


def cached_keys(context: int, window: int | None) -> int:
    """Cached tokens a query after ``context`` cached tokens attends to: all of them, or with a
    sliding window of ``window`` keys (the query itself included) the last ``window - 1``."""
    if window is None or context < window:
        return context
    return window - 1


def window_pairs(rows: int, context: int, window: int | None) -> int:
    """Causal (query, key) pairs of ``rows`` new queries after ``context`` cached tokens.

    Query j (0-based) sees ``context + j + 1`` keys, at most ``window`` with a sliding window.
    """
    if window is None:
        return rows * context + rows * (rows + 1) // 2
    first = context + 1
    below = min(max(window - first + 1, 0), rows)  # queries that see at most `window` keys
    return below * first + below * (below - 1) // 2 + (rows - below) * window


class BatchShape(NamedTuple):
    """Aggregates of ONE iteration — everything its cost depends on.

    Fields are python ints, or equal-length numpy arrays for a vectorized decode stretch (one
    element per step; typically only ``kv_read_tokens`` and ``attn_pairs`` vary). Build one
    with :meth:`from_requests` (the one aggregation of a batch) or the single-sequence
    helpers :meth:`decode` and :meth:`prefill`.

    Attributes:
        num_seqs: Requests in the iteration.
        num_prefill_tokens: New prompt tokens computed this step (all prefill chunks).
        num_decode_tokens: Decode tokens (one per decoding request).
        num_padding_tokens: Rows computed but wasted: prefill padding and the rows of padding
            sequences.
        num_sampled_tokens: Rows that go through lm_head (requests emitting a token + padding
            sequences, which sample too).
        kv_read_tokens: Sum over requests and padding sequences of the cached tokens attention
            reads (see :func:`cached_keys`).
        attn_pairs: Sum of causal (query, key) pairs computed (padding rows included).
        num_padding_seqs: Padding sequences: one-row decodes of no request (naive static
            batching keeps computing the rows of finished requests).
        num_graph_padding_tokens: Rows a CUDA graph adds to a decode batch (counted in
            ``num_padding_tokens`` too): they run through the GEMMs, elementwise kernels and
            all-reduces but attend to nothing and sample nothing (:func:`cuda_graph_padded`).
        window_kv_read_tokens: For a model that mixes sliding-window and full-attention layers
            (gpt-oss, Gemma 2/3), the cached tokens its sliding-window layers read (``kv_read_
            tokens`` is then the full-attention layers'); None: every layer reads
            ``kv_read_tokens`` (what the cost model charges a hybrid model without it, an upper
            bound).
        window_attn_pairs: The (query, key) pairs of those sliding-window layers, with
            ``window_kv_read_tokens``.
    """

    num_seqs: Any
    num_prefill_tokens: Any = 0
    num_decode_tokens: Any = 0
    num_padding_tokens: Any = 0
    num_sampled_tokens: Any = 0
    kv_read_tokens: Any = 0
    attn_pairs: Any = 0
    num_padding_seqs: Any = 0
    num_graph_padding_tokens: Any = 0
    window_kv_read_tokens: Any = None
    window_attn_pairs: Any = None

    @property
    def num_tokens(self) -> Any:
        """Rows of every GEMM: prefill + decode + padding tokens."""
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_padding_tokens

    @property
    def num_decode_rows(self) -> Any:
        """One-row decode sequences the attention kernel runs: decodes + padding sequences.
        Each reads one more cached token per step of a decode stretch."""
        return self.num_decode_tokens + self.num_padding_seqs

    @classmethod
    def from_requests(
        cls,
        new_tokens: Sequence[int],
        context_tokens: Sequence[int],
        *,
        decode: Sequence[bool] | None = None,
        sampled: Sequence[bool] | None = None,
        pad_to: int | None = None,
        num_padding_seqs: int = 0,
        padding_context: int = 0,
        window: int | None = None,
        hybrid_window: int | None = None,
    ) -> BatchShape:
        """Aggregate per-request token counts into a shape.

        Args:
            new_tokens: Tokens each request computes this step (q).
            context_tokens: Tokens each request already has in the KV cache (c), as attention
                sees them (a padded cache counts its padding).
            decode: Whether each request is a decode (computes its last sampled token);
                default: one new token after a non-empty context.
            sampled: Whether each request emits a token (default: all do).
            pad_to: Pad every prefill row to this many rows (rectangular prefill); the padding
                rows compute (attention included) but do not sample.
            num_padding_seqs: One-row padding sequences (they sample, as naive batched
                generation computes logits for every row).
            padding_context: Cached tokens of each padding sequence.
            window: Sliding-window length in keys of every layer, or None.
            hybrid_window: Sliding-window length of the sliding-window layers of a hybrid
                model (their reads are counted in ``window_kv_read_tokens`` and
                ``window_attn_pairs``), or None.

        Raises:
            ValueError: Mismatched lengths, negative counts, or ``pad_to`` below a prefill.
        """
        n = len(new_tokens)
        if len(context_tokens) != n:
            raise ValueError("new_tokens and context_tokens must have the same length")
        if (sampled is not None and len(sampled) != n) or (decode is not None and len(decode) != n):
            raise ValueError("decode and sampled must have one entry per request")
        if num_padding_seqs < 0 or padding_context < 0:
            raise ValueError("padding sequences and their context must be >= 0")
        prefill = decodes = padding = kv_read = pairs = 0
        if decode is None:
            decode = [q == 1 and c > 0 for q, c in zip(new_tokens, context_tokens)]
        if window is None and n and all(decode) and min(context_tokens) >= 0:
            # decodes only (most iterations): one pair per cached key plus the query itself
            decodes = sum(new_tokens)
            if decodes != n:
                raise ValueError("a decode computes one token")
            kv_read = sum(context_tokens)
            pairs = kv_read + n
        else:
            for q, c, is_decode in zip(new_tokens, context_tokens, decode):
                if q < 0 or c < 0:
                    raise ValueError(f"token counts must be >= 0, got new={q} context={c}")
                cached = c if window is None or c < window else window - 1  # cached_keys()
                rows = q
                if is_decode:
                    decodes += q
                else:
                    prefill += q
                    if pad_to is not None:
                        if pad_to < q:
                            raise ValueError(f"pad_to={pad_to} is shorter than a prefill of {q}")
                        rows = pad_to
                        padding += pad_to - q
                kv_read += cached
                pairs += window_pairs(rows, cached, window)
        if num_padding_seqs:
            cached = cached_keys(padding_context, window)
            padding += num_padding_seqs
            kv_read += num_padding_seqs * cached
            pairs += num_padding_seqs * window_pairs(1, cached, window)
        num_sampled = n if sampled is None else sum(sampled)
        window_kv_read = window_pairs_sum = None
        if hybrid_window is not None:
            window_kv_read = window_pairs_sum = 0
            for q, c, is_decode in zip(new_tokens, context_tokens, decode):
                cached = cached_keys(c, hybrid_window)
                rows = q if is_decode or pad_to is None else pad_to
                window_kv_read += cached
                window_pairs_sum += window_pairs(rows, cached, hybrid_window)
            if num_padding_seqs:
                cached = cached_keys(padding_context, hybrid_window)
                window_kv_read += num_padding_seqs * cached
                window_pairs_sum += num_padding_seqs * window_pairs(1, cached, hybrid_window)
        return cls(
            num_seqs=n,
            num_prefill_tokens=prefill,
            num_decode_tokens=decodes,
            num_padding_tokens=padding,
            num_sampled_tokens=num_sampled + num_padding_seqs,
            kv_read_tokens=kv_read,
            attn_pairs=pairs,
            num_padding_seqs=num_padding_seqs,
            window_kv_read_tokens=window_kv_read,
            window_attn_pairs=window_pairs_sum,
        )

    def with_decode_context(
        self, kv_read_tokens: Any, window_kv_read_tokens: Any = None
    ) -> BatchShape:
        """This decode batch with ``kv_read_tokens`` cached tokens read (a number, or an array
        over the iterations of a decode stretch). Each decode row computes one pair more than
        the cached keys it reads (exact with a window too: :func:`cached_keys` leaves room for
        the query). A hybrid model's sliding-window layers read ``window_kv_read_tokens``
        (default: as many as the others, true while no context exceeds their window)."""
        if self.window_kv_read_tokens is None:
            return self._replace(
                kv_read_tokens=kv_read_tokens, attn_pairs=kv_read_tokens + self.num_decode_rows
            )
        if window_kv_read_tokens is None:
            window_kv_read_tokens = kv_read_tokens
        return self._replace(
            kv_read_tokens=kv_read_tokens,
            attn_pairs=kv_read_tokens + self.num_decode_rows,
            window_kv_read_tokens=window_kv_read_tokens,
            window_attn_pairs=window_kv_read_tokens + self.num_decode_rows,
        )

    @classmethod
    def decode(
        cls,
        batch_size: int,
        context_len: int,
        window: int | None = None,
        hybrid_window: int | None = None,
    ) -> BatchShape:
        """``batch_size`` decoding requests, each with ``context_len`` cached tokens
        (:meth:`from_requests` of identical decodes, in closed form)."""
        cached = cached_keys(context_len, window)
        window_read = window_pairs_sum = None
        if hybrid_window is not None:
            hybrid = cached_keys(context_len, hybrid_window)
            window_read = batch_size * hybrid
            window_pairs_sum = batch_size * window_pairs(1, hybrid, hybrid_window)
        return cls(
            num_seqs=batch_size,
            num_decode_tokens=batch_size,
            num_sampled_tokens=batch_size,
            kv_read_tokens=batch_size * cached,
            attn_pairs=batch_size * window_pairs(1, cached, window),
            window_kv_read_tokens=window_read,
            window_attn_pairs=window_pairs_sum,
        )

    @classmethod
    def prefill(
        cls,
        num_tokens: int,
        context_len: int = 0,
        window: int | None = None,
        hybrid_window: int | None = None,
    ) -> BatchShape:
        """One prefill chunk of ``num_tokens`` after ``context_len`` cached tokens; it samples."""
        return cls.from_requests(
            [num_tokens], [context_len], decode=[False], window=window, hybrid_window=hybrid_window
        )


def cuda_graph_size(num_rows: int, max_size: int) -> int | None:
    """The CUDA-graph batch size a decode batch of ``num_rows`` runs as: the smallest captured
    size >= ``num_rows`` among 1, 2, 4 and the multiples of 8 up to ``max_size`` (vLLM's
    capture sizes), or None when ``num_rows`` exceeds every captured size (eager, unpadded)."""
    if num_rows <= 2:
        size = num_rows
    elif num_rows <= 4:
        size = 4
    else:
        size = -(-num_rows // 8) * 8
    return size if 0 < size <= max_size else None


def cuda_graph_padded(shape: BatchShape, max_size: int) -> BatchShape:
    """``shape`` as a CUDA graph runs it: a decode-only batch (one token per request, no
    other padding; python ints) of n requests padded with ``cuda_graph_size(n) - n`` rows;
    any other shape, or a batch above every captured size, unchanged. THE place where
    CUDA-graph padding happens (the engine applies it to every scheduled iteration)."""
    n = shape.num_decode_tokens
    if shape.num_prefill_tokens or shape.num_padding_tokens or n != shape.num_seqs:
        return shape
    size = cuda_graph_size(int(n), max_size)
    if size is None or size == n:
        return shape
    return shape._replace(num_padding_tokens=size - n, num_graph_padding_tokens=size - n)
