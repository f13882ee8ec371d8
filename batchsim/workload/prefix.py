"""Prefix structure: which tokens of a request are the same content as another request's.

A request's known sequence (its prompt, then the tokens it generates) may start with
*segments* of shared content: ``(content_id, num_tokens)`` pairs, in order. Two requests whose
sequences start with the same segments hold the same tokens there, so with prefix caching
the KV blocks of those tokens can be computed once. Tokens past the segments are the
request's own. Segments usually cover part or all of the prompt; a multi-turn conversation's
turn may add its reply as one more segment (the next turn's prompt repeats it).

The KV cache keys each full block by the chain of segment pieces it covers (see
:mod:`batchsim.engine.kv_cache`), so segments of any length map onto any block size.

Sources: Mooncake ``hash_ids`` (:meth:`PrefixTable.from_hash_ids`, each id one 512-token
block of the original tokenizer), synthetic shared prefixes, multi-turn conversations and a
CSV trace's prefix group columns.

This module imports only numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry (the trace's README: one hash per 512-token block)."""

Segments = tuple[tuple[int, int], ...]
"""``((content_id, num_tokens), ...)``: the shared content a request's sequence starts with."""


@dataclass(frozen=True, eq=False)
class PrefixTable:
    """The segments of every request, stored flat: request ``i`` starts with
    ``zip(ids[j], tokens[j])`` for ``j`` in ``offsets[i] .. offsets[i + 1] - 1``.

    Attributes:
        ids: int64 content ids (equal ids: equal tokens, for as long as both segments last).
        tokens: int64 tokens of each segment, >= 1.
        offsets: int64, one more than there are requests, non-decreasing from 0.
    """

    ids: np.ndarray
    tokens: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        assert len(self.ids) == len(self.tokens) == int(self.offsets[-1]), "ragged prefix table"

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def segments(self, index: int) -> Segments | None:
        """Request ``index``'s segments, or None when it shares nothing."""
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        if lo == hi:
            return None
        return tuple(zip(self.ids[lo:hi].tolist(), self.tokens[lo:hi].tolist()))

    def head(self, rows: int) -> PrefixTable:
        """The first ``rows`` requests."""
        end = int(self.offsets[rows])
        return PrefixTable(self.ids[:end], self.tokens[:end], self.offsets[: rows + 1])

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[tuple[int, int]] | None]) -> PrefixTable:
        """From each request's segments (None or empty: shares nothing)."""
        counts = [len(r) if r else 0 for r in rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = [seg for r in rows if r for seg in r]
        ids = np.array([s[0] for s in flat], dtype=np.int64)
        tokens = np.array([s[1] for s in flat], dtype=np.int64)
        return cls(ids, tokens, offsets)

    @classmethod
    def from_hash_ids(
        cls,
        values: np.ndarray,
        offsets: np.ndarray,
        prompt_tokens: np.ndarray,
        block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    ) -> PrefixTable:
        """Mooncake ``hash_ids``: row ``i``'s ids are ``values[offsets[i]:offsets[i + 1]]``,
        id ``j`` of a row standing for prompt tokens ``j x block_tokens`` up to the next
        block (the last one as long as the prompt leaves; ids past the prompt are dropped)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        counts = np.diff(offsets)
        start = np.repeat(offsets[:-1], counts)
        position = np.arange(int(offsets[-1]) - int(offsets[0]), dtype=np.int64) + offsets[0]
        position -= start  # index of the id within its row
        prompt = np.repeat(np.asarray(prompt_tokens, dtype=np.int64), counts)
        tokens = np.minimum(block_tokens, prompt - position * block_tokens)
        keep = tokens > 0
        ids = np.asarray(values, dtype=np.int64)[int(offsets[0]) : int(offsets[-1])][keep]
        rows = np.repeat(np.arange(len(counts)), counts)[keep]
        new_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=len(counts)), out=new_offsets[1:])
        return cls(ids, tokens[keep], new_offsets)
