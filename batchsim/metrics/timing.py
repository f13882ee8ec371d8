"""When things happened, read from an iteration log stored as runs: when each iteration of a
run starts (:func:`advanced`, :func:`run_starts`) and ends (:class:`RunTable`), and the
inter-token gaps of requests whose tokens came at the ends of runs of consecutive iterations
(:class:`TokenRuns`), counted per log run and token run rather than per iteration.

This module imports nothing from batchsim.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_WINDOW_ROWS = 1 << 18
"""Most iterations expanded at once when the log is read in windows."""
_GAP_CHUNK = 1 << 18
"""Gaps between token runs counted at once (see :meth:`TokenRuns.inter_token_gaps`)."""


def advanced(start: np.ndarray, duration: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``start[i]`` with ``duration[i]`` added ``k[i]`` times, one addition after another:
    when iteration k of a run of back-to-back iterations of ``duration`` from ``start``
    starts, as the engine's clock reaches it stepping one iteration at a time (see
    :func:`~batchsim.engine.runs.run_until`; ``start + duration x k`` may differ from it in
    the last bits). Costs the sum of ``k`` additions, in numpy, one pass per step."""
    out = np.array(start, dtype=np.float64)
    top = int(k.max()) if len(k) else 0
    if top <= 0:
        return out
    order = np.argsort(k, kind="stable")
    # elements of k >= j are order[first[j]:], for j = 1..top
    first = np.searchsorted(k[order], np.arange(1, top + 1), side="left")
    for at in first:
        idx = order[at:]
        out[idx] += duration[idx]
    return out


def run_starts(start: np.ndarray, duration: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The start of every iteration of some runs, run after run: :func:`advanced` of each
    run's start by 0, 1, ... ``steps - 1`` of its duration, each iteration's start computed
    from the previous one's (one addition per iteration)."""
    steps = np.asarray(steps, dtype=np.int64)
    out = np.repeat(np.asarray(start, dtype=np.float64), steps)
    top = int(steps.max()) if len(steps) else 0
    if top <= 1:
        return out
    first = np.cumsum(steps) - steps  # where each run's iterations begin in ``out``
    order = np.argsort(-steps, kind="stable")  # the longest runs first
    # runs with more than j iterations: order[:longer[j - 1]], for j = 1..top-1
    longer = np.searchsorted(-steps[order], -np.arange(1, top), side="left")
    for j, count in enumerate(longer, start=1):
        active = order[:count]
        at = first[active] + j
        out[at] = out[at - 1] + duration[active]
    return out


class RunTable:
    """The runs of an :class:`~batchsim.metrics.iterations.IterationLog` as arrays: iteration
    k of run r starts at ``start[r]`` with ``duration[r]`` added k times (:func:`advanced`)
    and ends ``duration[r]`` later (the expressions of the expanded table, so times computed
    here equal its ``end_time_s`` exactly)."""

    def __init__(
        self, first: np.ndarray, steps: np.ndarray, start: np.ndarray, duration: np.ndarray
    ):
        self.first = first
        self.steps = steps
        self.start = start
        self.duration = duration

    def end_times(self, iterations: np.ndarray) -> np.ndarray:
        """When the given iterations (indices) ended."""
        run = np.searchsorted(self.first, iterations, side="right") - 1
        duration = self.duration[run]
        return advanced(self.start[run], duration, iterations - self.first[run]) + duration

    def end_time_chunks(
        self, max_rows: int = _WINDOW_ROWS
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(iteration indices, end times) of every iteration, in chunks of about
        ``max_rows``."""
        ends = np.cumsum(self.steps)
        lo = 0
        while lo < len(self.steps):
            hi = lo + max(1, int(np.searchsorted(ends[lo:], ends[lo] - self.steps[lo] + max_rows)))
            steps = self.steps[lo:hi]
            run = np.repeat(np.arange(lo, hi), steps)
            iterations = np.arange(self.first[lo], self.first[lo] + int(steps.sum()))
            starts = run_starts(self.start[lo:hi], self.duration[lo:hi], steps)
            yield iterations, starts + self.duration[run]
            lo = hi


class TokenRuns:
    """Token runs of some requests: a request's tokens came at the ends of the iterations
    ``first[k]..last[k]`` of each of its runs (consecutive iterations); ``is_first[k]`` marks
    a request's first run (its runs are stored together, in order).

    The gaps between a request's runs are counted at once; then only the sorted first and
    last iterations are kept (sorted copies, or with ``sort_in_place`` the arrays given,
    sorted).
    """

    def __init__(
        self,
        first: np.ndarray,
        last: np.ndarray,
        is_first: np.ndarray,
        *,
        sort_in_place: bool = False,
    ):
        self._gaps = _gap_pairs(first, last, is_first)
        if sort_in_place:
            first.sort()
            last.sort()
            self._firsts, self._lasts = first, last
        else:
            self._firsts, self._lasts = np.sort(first), np.sort(last)

    def tokens_between(self, lo: int, hi: int) -> np.ndarray:
        """How many tokens the runs sampled at each iteration of ``lo .. hi - 1``."""
        firsts, lasts = self._firsts, self._lasts
        bounds = np.array((lo, hi), dtype=firsts.dtype)  # same dtype: no converted copy
        f0, f1 = np.searchsorted(firsts, bounds, side="left")
        l0, l1 = np.searchsorted(lasts, bounds, side="left")
        began = f0 + np.cumsum(np.bincount(firsts[f0:f1] - lo, minlength=hi - lo))  # first <= i
        ended = np.cumsum(np.bincount(lasts[l0:l1] - lo, minlength=hi - lo))  # last <= i
        ended = l0 + np.concatenate(([0], ended[:-1]))  # last < i
        return began - ended

    def inter_token_gaps(self, runs: RunTable) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap, as (gap values, weights) in seconds.

        Each token after a request's first contributes the time since its previous token. A
        run that is not its request's first starts with ``end[first] - end[previous
        last]``; inside a run the gap at iteration i is ``end[i] - end[i - 1]``, which inside
        a run of the iteration log (back-to-back iterations of one duration) is that
        duration. So gaps are pooled per log run with a count, and the sample grows with
        runs and token runs, not with iterations.
        """
        # A gap between token runs depends only on the two iterations it spans, which many
        # requests share (those a prefill iteration stalled): count each pair once.
        pairs, counts = self._gaps
        boundary = runs.end_times(pairs >> 32) - runs.end_times(pairs & 0xFFFFFFFF)
        del pairs
        firsts, lasts = self._firsts, self._lasts
        first_sums, last_sums = _PrefixSums(firsts), _PrefixSums(lasts)

        def covered(x: np.ndarray) -> np.ndarray:
            """Pairs (token run, iteration i) with first < i <= min(x, last): the gaps
            inside token runs that end at iteration x or earlier (``x`` non-decreasing)."""
            q = x.astype(firsts.dtype)  # a query of another dtype would copy the arrays
            nf = np.searchsorted(firsts, q, side="left")  # token runs with first < x
            nl = np.searchsorted(lasts, q, side="left")  # ... and those with last < x
            return (nf * x - first_sums(nf)) - (nl * x - last_sums(nl))

        head_values, head_weights, body_values, body_weights = [], [], [], []
        for lo in range(0, len(runs.first), _GAP_CHUNK):  # log runs a chunk at a time
            a, n = runs.first[lo : lo + _GAP_CHUNK], runs.steps[lo : lo + _GAP_CHUNK]
            before = covered(a - 1)
            at_first = covered(a)
            inside = covered(a + n - 1) - at_first  # gaps at a log run's later iterations
            at_first -= before  # ... and at its first iteration
            del before
            head = np.flatnonzero(at_first)
            head_values.append(runs.end_times(a[head]) - runs.end_times(a[head] - 1))
            head_weights.append(at_first[head])
            body = np.flatnonzero(inside)
            body_values.append(runs.duration[lo + body])
            body_weights.append(inside[body])
        values = np.concatenate((boundary, *head_values, *body_values))
        del boundary, head_values, body_values
        weights = np.concatenate((counts, *head_weights, *body_weights))
        return values, weights


def _gap_pairs(
    first: np.ndarray, last: np.ndarray, is_first: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (iteration, previous token's iteration) pairs of the gaps between a
    request's token runs, packed as ``iteration << 32 | previous``, and their counts
    (counted in chunks, so that memory stays bounded)."""
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    for lo in range(1, len(is_first), _GAP_CHUNK):
        rows = np.flatnonzero(~is_first[lo : lo + _GAP_CHUNK]) + lo
        pairs = first[rows].astype(np.int64) << 32
        pairs |= last[rows - 1]
        unique, count = np.unique(pairs, return_counts=True)
        keys.append(unique)
        counts.append(count)
    if len(keys) <= 1:
        return (keys[0], counts[0]) if keys else (np.empty(0, np.int64),) * 2
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return unique, np.bincount(inverse, np.concatenate(counts)).astype(np.int64)


class _PrefixSums:
    """``values[:p].sum()`` in int64 for positions p, without a cumulative array as long as
    ``values``: the sums of whole blocks are kept, the rest is summed in the blocks asked
    about."""

    def __init__(self, values: np.ndarray):
        self.values = values
        blocks = [
            int(values[lo : lo + _GAP_CHUNK].sum(dtype=np.int64))
            for lo in range(0, len(values), _GAP_CHUNK)
        ]
        self.before = np.concatenate(([0], np.cumsum(blocks, dtype=np.int64)))
        """Sum of the blocks before block b."""

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The sums for non-decreasing ``positions`` (each in 0 .. len(values))."""
        out = np.empty(len(positions), dtype=np.int64)
        start = 0  # first position not yet answered
        while start < len(positions):
            block = int(positions[start]) // _GAP_CHUNK
            lo = block * _GAP_CHUNK
            stop = int(np.searchsorted(positions, lo + _GAP_CHUNK, side="left"))
            partial = np.concatenate(
                ([0], np.cumsum(self.values[lo : lo + _GAP_CHUNK], dtype=np.int64))
            )
            out[start:stop] = self.before[block] + partial[positions[start:stop] - lo]
            start = stop
        return out
