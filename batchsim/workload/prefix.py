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
    def from_groups(cls, ids: np.ndarray, tokens: np.ndarray) -> PrefixTable:
        """One segment per request: request ``i`` starts with ``tokens[i]`` tokens of content
        ``ids[i]``; a request with 0 tokens shares nothing."""
        tokens = np.asarray(tokens, dtype=np.int64)
        keep = tokens > 0
        offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
        np.cumsum(keep, out=offsets[1:])
        return cls(np.asarray(ids, dtype=np.int64)[keep], tokens[keep], offsets)

    @classmethod
    def from_conversations(
        cls,
        turns: np.ndarray,
        user: np.ndarray,
        reply: np.ndarray,
        system_ids: np.ndarray,
        system_tokens: np.ndarray,
        first_id: int,
    ) -> PrefixTable:
        """The segments of multi-turn conversations, listed conversation by conversation.

        Request ``i`` is turn ``i - s`` of its conversation ``c``, whose first turn is request
        ``s``. Its sequence is ``c``'s system prefix (when ``system_ids[c] >= 0``), then for
        every turn ``j`` from ``s`` to ``i`` the user tokens ``(first_id + 2j, user[j])`` and
        the reply ``(first_id + 2j + 1, reply[j])``: the whole history, its own new user
        tokens, and last its own reply (which the next turn's prompt repeats). Every turn's
        user tokens and reply have content ids of their own.

        Args:
            turns: Turns of each conversation (>= 1; they add up to the requests).
            user: New user tokens of each turn (>= 1).
            reply: Reply tokens of each turn (>= 1).
            system_ids: Content id of each conversation's system prefix (-1: none).
            system_tokens: Its tokens.
            first_id: Content id of request 0's user tokens; ids up to ``first_id + 2 x
                requests - 1`` are taken.
        """
        turns = np.asarray(turns, dtype=np.int64)
        user = np.asarray(user, dtype=np.int64)
        reply = np.asarray(reply, dtype=np.int64)
        n = len(user)
        conv = np.repeat(np.arange(len(turns)), turns)
        first = (np.cumsum(turns) - turns)[conv]  # each request's first turn
        has_system = (np.asarray(system_ids) >= 0).astype(np.int64)[conv]
        counts = 2 * (np.arange(n, dtype=np.int64) - first + 1) + has_system
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        row = np.repeat(np.arange(n), counts)
        position = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[row] - has_system[row]
        system = position < 0  # the slot of the system prefix
        # index into the sequence user[0], reply[0], user[1], reply[1], ...
        piece = np.where(system, 0, 2 * first[row] + position)
        turn = piece >> 1
        ids = first_id + piece
        tokens = np.where(piece & 1, reply[turn], user[turn])
        if system.any():
            owner = conv[row[system]]
            ids[system] = np.asarray(system_ids, dtype=np.int64)[owner]
            tokens[system] = np.asarray(system_tokens, dtype=np.int64)[owner]
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
