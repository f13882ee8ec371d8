"""The paged KV cache: a pool of fixed-size blocks and who holds how many.

Only counts are simulated (no block tables): a request holds ``ceil(tokens / block_size)``
blocks for the tokens it has computed or reserved (fewer with a sliding window; per layer
group for a model that mixes sliding-window and full-attention layers). All block
arithmetic lives here, including the bulk growth of a decode stretch. Capacity comes from memory:
``(memory x gpu_memory_utilization - weights - activation reserve) / bytes per block``, per GPU
under tensor parallelism (each GPU holds its share of every block).

Automatic prefix caching (``engine.enable_prefix_caching``) is the subclass
:class:`~batchsim.engine.prefix_cache.PrefixCachingKVCacheManager`: full blocks of shared
content keep a key and outlive the requests that computed them, so a later request with the
same prefix starts past them. This class answers its questions for a cache without it (no
block is ever cached: :meth:`KVCacheManager.num_cached_prefix_blocks` is 0), so the schedulers
make the same calls either way and runs without prefix caching pay nothing for it.

This module imports only :mod:`batchsim.engine.request` and :mod:`batchsim.errors`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
from mypy_extensions import mypyc_attr

from batchsim.engine.request import Request
from batchsim.errors import ConfigError


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


def kv_capacity_blocks(
    *,
    memory_bytes: float,
    gpu_memory_utilization: float,
    weight_bytes: float,
    activation_reserve_bytes: float,
    block_bytes: float,
) -> int:
    """Number of KV blocks that fit on one GPU.

    Args:
        memory_bytes: GPU memory capacity (bytes).
        gpu_memory_utilization: Fraction of it the engine may use (0-1].
        weight_bytes: Weights held by one GPU (bytes).
        activation_reserve_bytes: Peak activation memory kept free for the forward pass.
        block_bytes: KV bytes of one block on one GPU.

    Raises:
        ConfigError: The weights and activation reserve leave no room for a single block.
    """
    free = memory_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes
    blocks = int(free // block_bytes) if block_bytes > 0 else 0
    if blocks < 1:
        raise ConfigError(
            f"model does not fit: {memory_bytes * gpu_memory_utilization / 1e9:.1f} GB usable "
            f"per GPU (engine.gpu_memory_utilization={gpu_memory_utilization}) minus "
            f"{weight_bytes / 1e9:.1f} GB of weights and {activation_reserve_bytes / 1e9:.1f} GB "
            "activation reserve leaves no KV cache; use a larger GPU, "
            "parallel.tensor_parallel_size, or a smaller engine.dtype"
        )
    return blocks


def most_steps_that_fit(need: Callable[[int], int], limit: int, free: int) -> int:
    """The largest k <= ``limit`` with ``need(k) <= free`` blocks, for ``need`` non-decreasing
    and ``need(1) <= free`` (the first step is allocated already): by bisection."""
    if need(limit) <= free:
        return limit
    lo, hi = 1, limit  # need(lo) <= free, need(hi) > free
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@mypyc_attr(allow_interpreted_subclasses=True)
class KVCacheManager:
    """Block accounting for the whole engine: the GPU pool and the host swap space.

    A request holds the blocks of the tokens it has computed or reserved. With a sliding
    window of W keys (the query included), as in vLLM, blocks wholly before the window of the
    request's next query (tokens older than ``num_computed_tokens - W + 1``) are freed the
    next time the request grows.

    A hybrid model (sliding-window and full-attention layers, as gpt-oss and Gemma 2/3) splits
    its layers into groups of equal size (:meth:`~batchsim.catalog.model.ModelSpec.
    kv_layer_groups`), as vLLM's hybrid KV-cache manager does: one block of the pool then holds
    ``block_size`` tokens of one group, a request holds a block per ``block_size`` tokens in each
    of the ``full_groups`` full-attention groups and, in each of the ``window_groups``
    sliding-window groups, only those of its window. A model whose every layer slides is one
    sliding group (the defaults).

    Admission keeps a watermark: a waiting request is admitted (or a swapped one resumed) only
    if ``watermark_blocks`` stay free after its allocation, so that running requests can grow
    without preempting at once (vLLM's block-manager watermark); growth of running requests
    may use them.

    Args:
        num_blocks: Total blocks in the GPU pool.
        block_size: Tokens per block.
        num_cpu_blocks: Blocks of host memory for swapped-out requests (vLLM's
            ``swap_space``).
        window: Sliding-window length (keys per query), or None for full attention.
        watermark_blocks: Blocks admission leaves free.
        full_groups: With a window, layer groups that keep every token (hybrid models).
        window_groups: With a window, layer groups that keep only the window.
    """

    caches_prefixes: ClassVar[bool] = False
    """Whether full blocks of shared content are kept for reuse (prefix caching)."""
    num_cached_blocks: int = 0
    """Blocks holding cached content, in use or idle (always 0 without prefix caching)."""
    num_evicted_blocks: int = 0
    """Cached blocks evicted since the engine last read this counter (it resets it)."""
    num_idle_blocks: int = 0
    """Cached blocks that no request holds: free, and reusable until evicted (always 0
    without prefix caching)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        *,
        window: int | None = None,
        watermark_blocks: int = 0,
        full_groups: int = 0,
        window_groups: int = 1,
    ):
        assert num_blocks >= 1 and block_size >= 1 and num_cpu_blocks >= 0
        assert 0 <= watermark_blocks < num_blocks and (window is None or window >= 1)
        assert full_groups >= 0 and window_groups >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.num_free_cpu_blocks = num_cpu_blocks
        self.window = window
        self.watermark_blocks = watermark_blocks
        self.full_groups = full_groups if window is not None else 0
        self.window_groups = window_groups if window is not None else 1
        self.hybrid_window = window if self.full_groups else None
        """The window of a hybrid model's sliding-window layers (None unless hybrid): the
        schedulers count the cached tokens those layers read apart from the others'."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocation may take. A property, so that a subclass may act when it is
        lowered (prefix caching evicts idle cached blocks then), the compiled build included
        (compiled code reads a plain attribute directly, past a subclass's property)."""
        return self._free

    @num_free_blocks.setter
    def num_free_blocks(self, value: int) -> None:
        self._free = value

    @property
    def num_empty_blocks(self) -> int:
        """Free blocks that hold no cached content: what a decode stretch may take without
        evicting anything (every free block without prefix caching). Hot paths compute it
        inline as ``num_free_blocks - num_idle_blocks`` (no call)."""
        return self.num_free_blocks - self.num_idle_blocks

    def num_cached_prefix_blocks(self, request: Request) -> int:
        """Leading full blocks of ``request``'s sequence found in this cache now, at most
        the ``(num_tokens - 1) // block_size`` its admission could reuse (one token is always
        computed). No state changes. Always 0 without prefix caching."""
        return 0

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return (self.num_blocks - self.num_free_blocks) / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """Tokens the pool holds while no window frees any (a hybrid model's blocks are
        shared by its layer groups, as vLLM reports the size of a hybrid KV cache)."""
        groups = self.full_groups + self.window_groups if self.window is not None else 1
        return self.num_blocks // groups * self.block_size

    def blocks_held(self, num_computed_tokens: int, num_tokens: int) -> int:
        """Blocks a request holds for ``num_tokens`` tokens once ``num_computed_tokens`` of
        them are computed (the window frees the blocks the next query no longer reads)."""
        bs = self.block_size
        blocks = -(-num_tokens // bs)
        if self.window is not None:
            kept = blocks
            skipped = num_computed_tokens - self.window + 1
            if skipped >= bs:
                kept -= skipped // bs
            return self.full_groups * blocks + self.window_groups * kept
        return blocks

    def can_ever_fit(self, num_tokens: int) -> bool:
        """A request of ``num_tokens`` tokens fits the pool whole (above the watermark)."""
        need = num_blocks_for(num_tokens, self.block_size)
        if self.window is not None:
            need *= self.full_groups + self.window_groups
        return need <= self.num_blocks - self.watermark_blocks

    def can_allocate(self, request: Request, num_tokens: int, *, admission: bool = False) -> bool:
        """Whether :meth:`allocate` would succeed now."""
        need = self.blocks_held(request.num_computed_tokens, num_tokens) - request.num_blocks
        return need <= self.num_free_blocks - (self.watermark_blocks if admission else 0)

    def allocate(self, request: Request, num_tokens: int, *, admission: bool = False) -> bool:
        """Grow ``request`` to ``num_tokens`` tokens; False (no change) if the pool is short.

        ``admission``: the request is being admitted, so the watermark must stay free.
        """
        need = self.blocks_held(request.num_computed_tokens, num_tokens) - request.num_blocks
        if need > self.num_free_blocks - (self.watermark_blocks if admission else 0):
            return False
        if need > 0 or self.window is not None:  # a window may free blocks (need < 0)
            self.num_free_blocks -= need
            request.num_blocks += need
        return True

    def free(self, request: Request) -> None:
        """Return all of ``request``'s blocks (GPU and host) to their pools."""
        self.num_free_blocks += request.num_blocks
        request.num_blocks = 0
        self.num_free_cpu_blocks += request.num_cpu_blocks
        request.num_cpu_blocks = 0
        assert self.num_free_blocks <= self.num_blocks, "freed more KV blocks than allocated"
        assert self.num_free_cpu_blocks <= self.num_cpu_blocks, "freed more host blocks"

    # -------------------------------------------------------------- decode stretches
    def grow(self, requests: Sequence[Request], num_steps: int) -> None:
        """Each of ``requests`` decoded ``num_steps`` tokens, one per iteration, from its
        ``num_computed_tokens``; the first iteration's blocks were allocated by schedule().
        Hold what the last iteration needed (callers checked :meth:`max_growth_steps`)."""
        total = 0
        bs = self.block_size
        for r in requests:
            c = r.num_computed_tokens + num_steps
            held = -(-c // bs) if self.window is None else self.blocks_held(c - 1, c)
            total += held - r.num_blocks
            r.num_blocks = held
        self.num_free_blocks -= total
        assert 0 <= self.num_free_blocks <= self.num_blocks, "KV blocks over-committed"

    def max_growth_steps(self, requests: Sequence[Request], limit: int) -> int:
        """Largest k <= ``limit`` such that ``requests`` can decode k tokens each, one per
        iteration, without running out of empty blocks (the first iteration's are allocated;
        a stretch never evicts a cached block).

        With a window a request's blocks go up and down; each is bounded by the most a full
        window needs, which may cut a stretch earlier than necessary (never later).
        """
        bs = self.block_size
        free = self.num_free_blocks - self.num_idle_blocks  # a stretch never evicts
        cap = None if self.window is None else -(-self.window // bs) + 1
        full, slide = self.full_groups, self.window_groups
        if cap is not None:  # per request, in arrays: a batch of sliding-window models
            computed = np.fromiter((r.num_computed_tokens for r in requests), np.int64)
            held = np.fromiter((r.num_blocks for r in requests), np.int64)

            def windowed_need(k: int) -> int:
                blocks = -(-(computed + k) // bs)
                blocks = full * blocks + slide * np.minimum(blocks, cap)
                return int(np.maximum(blocks - held, 0).sum())

            return most_steps_that_fit(windowed_need, limit, free)

        def need(k: int) -> int:
            total = 0
            for r in requests:
                blocks = -(-(r.num_computed_tokens + k) // bs)
                if blocks > r.num_blocks:
                    total += blocks - r.num_blocks
            return total

        return most_steps_that_fit(need, limit, free)

    def usage_during_growth(self, requests: Sequence[Request], num_steps: int) -> Any:
        """Usage at each of ``num_steps`` decode iterations of ``requests`` from now (the
        first one is allocated): an array with a sliding window, else a :class:`UsageRamp`
        (see :func:`expand_usage_ramps`)."""
        bs = self.block_size
        used = self.num_blocks - self.num_free_blocks
        if self.window is not None:
            computed = np.fromiter((r.num_computed_tokens for r in requests), np.int64)
            held = np.fromiter((r.num_blocks for r in requests), np.int64)
            tokens = computed[None, :] + np.arange(1, num_steps + 1)[:, None]
            blocks = -(-tokens // bs)
            skipped = tokens - self.window  # computed - window + 1, with computed = tokens - 1
            kept = blocks - np.where(skipped >= bs, skipped // bs, 0)
            blocks = self.full_groups * blocks + self.window_groups * kept
            extra = (blocks - held[None, :]).sum(axis=1)
            return (used + extra) / self.num_blocks
        counts = [0] * (bs + 1)
        for r in requests:
            counts[r.num_computed_tokens % bs] += 1
        return self.usage_ramp(at_least_offsets(counts))

    # Without a window a request with c cached tokens needs floor((c mod bs + k) / bs) more
    # blocks by step k of a stretch: what a stretch needs depends only on how many requests
    # there are at each offset c mod bs, given as ``at_least[j]``, the requests at offset j
    # or more (bs + 1 entries: at_least[0] counts them all, at_least[bs] is 0).
    #
    # With a window of W keys and requests that have computed at least W tokens (a cohort's
    # members), a request's blocks are ``groups x ceil(t / bs) - slide x floor((t - W) / bs)``
    # for its t tokens (:meth:`~batchsim.engine.request.Group.blocks_at`): the second term
    # grows as the first does, for the requests counted by the offset of ``c - (W - 1)``
    # (``window_at_least``), so the same counts give the growth, less what the window frees.
    def usage_ramp(
        self, at_least: list[int], window_at_least: list[int] | None = None
    ) -> UsageRamp:
        """The usage during a stretch of requests counted by offset, from now (the first
        iteration's blocks taken), unexpanded; ``window_at_least`` as in
        :meth:`growth_from_offsets`."""
        used = self.num_blocks - self.num_free_blocks
        if window_at_least is None:
            return UsageRamp(used, at_least, self.num_blocks)
        groups, slide = self.full_groups + self.window_groups, self.window_groups
        return UsageRamp(used, at_least, self.num_blocks, groups, slide, window_at_least)

    def growth_from_offsets(
        self, at_least: list[int], num_steps: int, window_at_least: list[int] | None = None
    ) -> int:
        """Blocks that requests counted by offset take over a stretch of ``num_steps`` decode
        iterations, beyond the first one's (see :meth:`grow`); with a window,
        ``window_at_least`` counts them by the offset of ``num_computed_tokens - (W - 1)`` (each
        has computed at least W tokens) and the blocks the window frees are taken off."""
        bs = self.block_size
        j = num_steps - 1
        grown = at_least[0] * (j // bs) + at_least[bs - j % bs]
        if window_at_least is None:
            return grown
        freed = window_at_least[0] * (j // bs) + window_at_least[bs - j % bs]
        return (self.full_groups + self.window_groups) * grown - self.window_groups * freed

    def max_growth_from_offsets(
        self, at_least: list[int], limit: int, window_at_least: list[int] | None = None
    ) -> int:
        """:meth:`max_growth_steps` of requests counted by offset (``window_at_least`` as in
        :meth:`growth_from_offsets`). With a window, step k's new blocks are counted before
        the blocks it frees (a request allocates before the next one frees): the most the
        pool holds during step k is ``groups x grown(k) - slide x freed(k - 1)`` (``freed(k)``
        when each request's new block and freed one come on the same step)."""
        bs = self.block_size
        free = self.num_free_blocks - self.num_idle_blocks  # a stretch never evicts
        n = at_least[0]
        if window_at_least is None:

            def need(k: int) -> int:
                return n * ((k - 1) // bs) + at_least[bs - (k - 1) % bs]

            return most_steps_that_fit(need, limit, free)
        groups, slide = self.full_groups + self.window_groups, self.window_groups
        # step k in 2..bs+1 holds peak[k]; step k + m x bs holds m x full x n more
        # (a request frees its window's oldest block on the step it starts a new one when
        # W - 1 is a multiple of bs: its allocation is net of it)
        late = 0 if self.window is not None and (self.window - 1) % bs == 0 else 1
        first_over = limit + 1
        rise = self.full_groups * n
        for k in range(2, min(limit, bs + 1) + 1):
            j = k - 1
            grown = n * (j // bs) + at_least[bs - j % bs]
            i = j - late
            freed = n * (i // bs) + window_at_least[bs - i % bs]
            peak = groups * grown - slide * freed
            if peak > free:
                first_over = min(first_over, k)
                break  # (a later k of the first period is a later violation)
            if rise:
                over = k + ((free - peak) // rise + 1) * bs  # its first step above free
                first_over = min(first_over, over)
        return max(1, min(limit, first_over - 1))

    # -------------------------------------------------------------- swapping
    def can_swap_out(self, request: Request) -> bool:
        """The host swap space can take all of ``request``'s GPU blocks."""
        return request.num_blocks <= self.num_free_cpu_blocks

    def swap_out(self, request: Request) -> int:
        """Move ``request``'s blocks to host memory; return how many were copied."""
        moved = request.num_blocks
        assert moved <= self.num_free_cpu_blocks, "host swap space over-committed"
        self.num_free_blocks += moved
        self.num_free_cpu_blocks -= moved
        request.num_cpu_blocks += moved
        request.num_blocks = 0
        return moved

    def _swap_in_blocks(self, request: Request, num_tokens: int) -> int:
        held = self.blocks_held(request.num_computed_tokens, num_tokens)
        return max(request.num_cpu_blocks, held)

    def can_swap_in(self, request: Request, num_tokens: int) -> bool:
        """The GPU pool can take ``request``'s swapped blocks and grow it to ``num_tokens``,
        leaving the watermark free."""
        need = self._swap_in_blocks(request, num_tokens)
        return need <= self.num_free_blocks - self.watermark_blocks

    def swap_in(self, request: Request, num_tokens: int) -> int:
        """Copy ``request``'s blocks back and grow it to ``num_tokens`` tokens; return how many
        blocks were copied. The caller checked :meth:`can_swap_in`."""
        moved = request.num_cpu_blocks
        need = self._swap_in_blocks(request, num_tokens)
        assert need <= self.num_free_blocks, "swap-in without room"
        self.num_free_cpu_blocks += moved
        request.num_cpu_blocks = 0
        self.num_free_blocks -= need
        request.num_blocks = need
        return moved


class UsageRamp(NamedTuple):
    """KV-cache usage over a decode stretch of requests counted by offset, unexpanded: at its
    step k (0-based) the pool holds ``used`` blocks and those the requests (n =
    ``at_least[0]``) took since, ``grown(k) = n x (k // bs) + at_least[bs - k % bs]``, or with a
    window ``groups x grown(k)`` less ``slide x`` the same count of ``window_at_least`` (see
    :meth:`KVCacheManager.growth_from_offsets`); usage is that over ``total``. Expanded in
    bulk by :func:`expand_usage_ramps` when the log stores it."""

    used: int
    at_least: list[int]
    total: int
    groups: int = 1
    slide: int = 0
    window_at_least: list[int] | None = None

    def at(self, step: int) -> float:
        """The usage at step ``step`` (0-based), as :func:`expand_usage_ramps` computes it."""
        bs = len(self.at_least) - 1
        q, j = divmod(step, bs)
        held = self.at_least[0] * q + self.at_least[bs - j]
        if self.window_at_least is None:
            return (self.used + held) / self.total
        freed = self.window_at_least[0] * q + self.window_at_least[bs - j]
        return (self.used + self.groups * held - self.slide * freed) / self.total


def expand_usage_ramps(ramps: Sequence[UsageRamp], steps: Sequence[int]) -> np.ndarray:
    """The usage at each step of consecutive stretches, ``steps[i]`` steps of ``ramps[i]``
    (all of one block size), as one float64 array: the blocks are counted exactly in
    integers, then divided once, so each value equals ``(used + taken) / total``."""
    counts = np.asarray(steps, dtype=np.int64)
    n = int(counts.sum())
    first = np.cumsum(counts) - counts
    which = np.repeat(np.arange(len(ramps)), counts)
    k = np.arange(n, dtype=np.int64) - first[which]
    table = np.array([r.at_least for r in ramps], dtype=np.int64)
    bs = table.shape[1] - 1
    q, j = np.divmod(k, bs)
    used = np.array([r.used for r in ramps], dtype=np.int64)[which]
    total = np.array([r.total for r in ramps], dtype=np.int64)[which]
    held = table[which, 0] * q + table[which, bs - j]
    if all(r.window_at_least is None for r in ramps):
        return (used + held) / total
    windows = np.array(
        [r.at_least if r.window_at_least is None else r.window_at_least for r in ramps],
        dtype=np.int64,
    )
    groups = np.array([r.groups for r in ramps], dtype=np.int64)[which]
    slide = np.array([r.slide for r in ramps], dtype=np.int64)[which]
    freed = windows[which, 0] * q + windows[which, bs - j]
    return (used + groups * held - slide * freed) / total


def at_least_offsets(counts: list[int]) -> list[int]:
    """From ``counts[j]`` (how many requests are at offset j, bs + 1 entries, the last one 0)
    to ``at_least[j]`` (how many are at offset j or more)."""
    return list(itertools.accumulate(reversed(counts)))[::-1]
