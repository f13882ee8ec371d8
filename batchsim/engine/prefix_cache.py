"""Automatic prefix caching: KV blocks of shared content outlive the requests that computed
them, and a request whose sequence starts with cached blocks skips computing them.

The semantics are vLLM's automatic prefix caching (``enable_prefix_caching``):

- **Block keys.** A full block of a request's sequence whose tokens all lie inside its
  ``prefix_segments`` (:mod:`batchsim.workload.prefix`) has a key: a hash chained from the
  previous block's key and the ``(content_id, start, end)`` pieces of segments it covers, so
  equal keys mean equal tokens at equal positions after an equal prefix. The chain stops at
  the first block that is not fully covered: a request's own tokens never match. Keys are
  Python hashes of tuples of ints (deterministic, whatever ``PYTHONHASHSEED``), computed once
  per request, when first needed.
- **Registration.** When a request has computed a keyed block (at the end of the iteration
  that completes it), the block is cached with one reference, unless its key is cached
  already: then the request's copy stays its own, uncached block. (vLLM caches a block when
  it schedules the tokens that fill it, so a request admitted later in the same iteration
  may share it; here two requests that start on the same new prefix in one iteration each
  compute it.)
- **Idle blocks.** When the last request holding a cached block lets it go (it finished, was
  cancelled, preempted by recompute or swapped out), the block keeps its content and its key
  and counts as *free*: allocation may take it. Its requests release their blocks deepest
  first, so a request's later blocks are evicted before its earlier ones.
- **Eviction.** Allocation takes free blocks that hold nothing cached first, and only when
  none is left evicts idle cached blocks, least recently freed first. That order is the one
  difference from vLLM, whose single free queue mixes the two kinds: here an uncached block
  is always used before any cached content is lost.
- **Admission.** A waiting request (nothing computed yet, a request preempted by recompute
  included) starts with every leading block found cached
  (:meth:`PrefixCachingKVCacheManager.num_cached_prefix_blocks`): those tokens count as
  computed, at most ``(num_tokens - 1) // block_size`` blocks so that at least one token is
  computed (its last position samples the next token). It takes a reference to each
  (an idle one leaves the free blocks: the admission check counts it) and new blocks only
  for the rest. The schedulers do this through one helper,
  :meth:`~batchsim.scheduler.Scheduler.admit_waiting`.
- **Swapping.** A swapped-out request's blocks are copied to host memory as its own: it
  releases its references, and the blocks it gets back on swap-in are private (their content
  is no longer shared through the cache).

Usage (``kv_cache_usage``) counts the blocks requests hold; idle cached blocks are free.
Fast-forward stays exact: a decode stretch takes only empty blocks
(:attr:`~batchsim.engine.kv_cache.KVCacheManager.num_empty_blocks`), never follows a
``schedule()`` that evicted, and ends at the latest with the iteration that completes a keyed
block, so the cached blocks are the same at every iteration of a stretch and evictions happen
only in iterations run one by one. A running decode with keyed blocks still to compute (a
segment that runs into its output) advances outside the cohort of decodes
(:mod:`batchsim.engine.cohort`) until it has computed them.

Sliding-window models are not supported (a window frees a request's leading blocks).

This module imports only :mod:`batchsim.engine.kv_cache` and :mod:`batchsim.engine.request`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from batchsim.engine.kv_cache import KVCacheManager
from batchsim.engine.request import Request

_NO_KEY = 1 << 62
"""A token count past any sequence: "no further keyed block"."""


def block_keys(segments: Sequence[tuple[int, int]] | None, block_size: int) -> list[int]:
    """The key of each full block that lies wholly inside ``segments`` (``(content_id,
    num_tokens)`` pairs, in sequence order), in block order.

    Block j's key is ``hash((key of block j - 1, c0, s0, e0, c1, s1, e1, ...))``: the previous
    key (0 for the first block) and the pieces ``(content_id, start, end)`` of the segments
    it covers, as token offsets within each segment.
    """
    keys: list[int] = []
    if not segments:
        return keys
    prev = 0
    pieces: list[int] = [prev]
    filled = 0
    for content, length in segments:
        pos = 0
        while pos < length:
            take = min(length - pos, block_size - filled)
            pieces += (content, pos, pos + take)
            pos += take
            filled += take
            if filled == block_size:
                prev = hash(tuple(pieces))
                keys.append(prev)
                pieces = [prev]
                filled = 0
    return keys


class _RequestBlocks:
    """A request's view of the cache: its block keys and the cached blocks it holds."""

    __slots__ = ("block_size", "held", "keys", "lookup", "next_at", "num_done")

    def __init__(self, keys: list[int], block_size: int):
        self.block_size = block_size
        self.keys = keys
        """Keys of its keyed blocks, in block order."""
        self.held: list[int] = []
        """Keys of the cached blocks it holds a reference to, in block order (the others of
        its blocks are its own)."""
        self.num_done = 0
        """Leading keyed blocks it has computed or reused (registered, found cached or kept
        as its own duplicate)."""
        self.next_at = block_size if keys else _NO_KEY
        """Computed tokens at which its next keyed block is complete."""
        self.lookup: tuple[object, int, int, int, int] = (None, -1, 0, 0, 0)
        """(cache, its version, the request's tokens, blocks found, of which idle) of the
        last lookup (a router may look the request up in several caches)."""


class PrefixCachingKVCacheManager(KVCacheManager):
    """A :class:`~batchsim.engine.kv_cache.KVCacheManager` that keeps full blocks of shared
    content for reuse (see the module).

    ``num_free_blocks`` counts the empty blocks and the idle cached ones; lowering it (the
    shared block arithmetic does ``num_free_blocks -= n``) takes empty blocks first and then
    evicts idle cached blocks, least recently freed first.

    Args:
        num_blocks: Total blocks in the GPU pool.
        block_size: Tokens per block.
        num_cpu_blocks: Blocks of host memory for swapped-out requests.
        watermark_blocks: Blocks admission leaves free.
    """

    caches_prefixes = True

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        *,
        watermark_blocks: int = 0,
    ):
        self._refs: dict[int, int] = {}
        """Cached blocks: key -> how many running requests hold it (0: idle)."""
        self._idle: OrderedDict[int, None] = OrderedDict()
        """Idle cached blocks, least recently freed first."""
        self._free = num_blocks
        self._version = 0  # changes whenever a lookup's answer may change
        self.num_evictions = 0
        """Cached blocks evicted over the whole run."""
        self.num_cached_blocks = 0
        self.num_evicted_blocks = 0
        self.num_idle_blocks = 0
        super().__init__(num_blocks, block_size, num_cpu_blocks, watermark_blocks=watermark_blocks)

    # ---------------------------------------------------------------- free blocks
    @property
    def num_free_blocks(self) -> int:
        """Blocks allocation may take: empty ones and idle cached ones."""
        return self._free

    @num_free_blocks.setter
    def num_free_blocks(self, value: int) -> None:
        short = self.num_idle_blocks - value  # the empty blocks cannot cover the decrease
        if short > 0:
            self._evict(short)
        self._free = value

    def _evict(self, count: int) -> None:
        idle, refs = self._idle, self._refs
        assert count <= len(idle), "KV blocks over-committed"
        for _ in range(count):
            key, _ = idle.popitem(last=False)
            del refs[key]
        self.num_idle_blocks -= count
        self.num_cached_blocks -= count
        self.num_evicted_blocks += count
        self.num_evictions += count
        self._version += 1

    # ---------------------------------------------------------------- keys and lookup
    def _blocks_of(self, request: Request) -> _RequestBlocks:
        state = request._prefix
        bs = self.block_size
        if state is None or (state.block_size != bs and not state.held and not state.num_done):
            # (a cache of another block size looked it up before: its keys do not apply)
            state = _RequestBlocks(block_keys(request.prefix_segments, bs), bs)
            request._prefix = state
        assert state.block_size == bs, "a request's blocks belong to one cache at a time"
        return state

    def _lookup(self, request: Request) -> tuple[int, int]:
        """(leading blocks of ``request`` found cached, at most those admission may reuse;
        how many of them are idle)."""
        state = self._blocks_of(request)
        num_tokens = request.num_tokens
        cache, version, tokens, found, idle = state.lookup
        if cache is self and version == self._version and tokens == num_tokens:
            return found, idle
        refs = self._refs
        found = idle = 0
        for key in state.keys[: (num_tokens - 1) // self.block_size]:
            count = refs.get(key)
            if count is None:
                break
            found += 1
            idle += count == 0
        state.lookup = (self, self._version, num_tokens, found, idle)
        return found, idle

    def num_cached_prefix_blocks(self, request: Request) -> int:
        return self._lookup(request)[0]

    def admission_blocks(self, request: Request, num_tokens: int, num_hit_blocks: int) -> int:
        """Free blocks that :meth:`allocate_admission` would take: new blocks for the tokens
        past the ``num_hit_blocks`` cached ones (:meth:`num_cached_prefix_blocks`), plus the
        cached ones that sit idle (counted as free until a request takes them)."""
        assert request.num_computed_tokens == 0 and request.num_blocks == 0, "not waiting"
        found, idle = self._lookup(request)
        assert num_hit_blocks == found, "reuse what the lookup found"
        return -(-num_tokens // self.block_size) - found + idle

    def allocate_admission(self, request: Request, num_tokens: int, num_hit_blocks: int) -> bool:
        """Admit waiting ``request`` with ``num_tokens`` tokens of KV: take a reference to
        its first ``num_hit_blocks`` cached blocks (their tokens count as computed) and
        allocate the rest, leaving the watermark free. False (no change) if the pool is
        short."""
        need = self.admission_blocks(request, num_tokens, num_hit_blocks)
        if need > self._free - self.watermark_blocks:
            return False
        state = self._blocks_of(request)
        hits = state.keys[:num_hit_blocks]
        refs, idle = self._refs, self._idle
        for key in hits:
            count = refs[key]
            if count == 0:
                del idle[key]
                self.num_idle_blocks -= 1
                self._free -= 1
                need -= 1
            refs[key] = count + 1
        if hits:
            self._version += 1
        state.held = hits
        state.num_done = num_hit_blocks
        state.next_at = self._next_at(state)
        request.num_computed_tokens = num_hit_blocks * self.block_size
        self.num_free_blocks -= need  # the hit blocks are held: eviction spares them
        request.num_blocks = num_hit_blocks + need
        return True

    def _next_at(self, state: _RequestBlocks) -> int:
        done = state.num_done
        return (done + 1) * self.block_size if done < len(state.keys) else _NO_KEY

    # ---------------------------------------------------------------- registration
    def settled(self, request: Request) -> bool:
        """Whether every keyed block of ``request`` is computed (nothing left to register:
        it may advance with the cohort of decodes)."""
        state = request._prefix
        return state is None or state.next_at == _NO_KEY

    def steps_to_register(self, request: Request, tokens_per_step: int) -> int:
        """Iterations of ``tokens_per_step`` computed tokens each until ``request`` completes
        its next keyed block (that iteration included); a large number if none is left."""
        state = request._prefix
        if state is None or state.next_at == _NO_KEY:
            return _NO_KEY
        return -(-(state.next_at - request.num_computed_tokens) // tokens_per_step)

    def register(self, request: Request) -> None:
        """Cache the keyed blocks ``request`` has completed (call after its computed tokens
        advanced): each with one reference, unless its key is cached already."""
        state = request._prefix
        if state is None:
            state = self._blocks_of(request)
        computed = request.num_computed_tokens
        if computed < state.next_at:
            return
        keys, refs = state.keys, self._refs
        end = min(computed // self.block_size, len(keys))
        added = 0
        for j in range(state.num_done, end):
            key = keys[j]
            if key not in refs:
                refs[key] = 1
                state.held.append(key)
                added += 1
        state.num_done = end
        state.next_at = self._next_at(state)
        if added:
            self.num_cached_blocks += added
            self._version += 1

    # ---------------------------------------------------------------- releasing blocks
    def _release(self, request: Request) -> int:
        """Drop ``request``'s references, deepest block first; return how many of its GPU
        blocks became free (its own ones and cached ones no one else holds)."""
        state = request._prefix
        held: list[int] = [] if state is None else state.held
        freed = request.num_blocks - len(held)
        if held:
            refs, idle = self._refs, self._idle
            for key in reversed(held):
                count = refs[key] - 1
                refs[key] = count
                if count == 0:
                    idle[key] = None
                    self.num_idle_blocks += 1
                    freed += 1
            assert state is not None
            state.held = []
            self._version += 1
        return freed

    def free(self, request: Request) -> None:
        self._free += self._release(request)
        request.num_blocks = 0
        state = request._prefix
        if state is not None:  # it computes from scratch if it comes back (recompute)
            state.num_done = 0
            state.next_at = self._next_at(state)
        self.num_free_cpu_blocks += request.num_cpu_blocks
        request.num_cpu_blocks = 0
        assert self._free <= self.num_blocks, "freed more KV blocks than allocated"
        assert self.num_free_cpu_blocks <= self.num_cpu_blocks, "freed more host blocks"

    def swap_out(self, request: Request) -> int:
        moved = request.num_blocks
        assert moved <= self.num_free_cpu_blocks, "host swap space over-committed"
        self._free += self._release(request)
        self.num_free_cpu_blocks -= moved
        request.num_cpu_blocks += moved
        request.num_blocks = 0
        return moved

    # ---------------------------------------------------------------- inspection
    def num_references(self) -> dict[int, int]:
        """Cached blocks: key -> how many requests hold it (a copy, for checks)."""
        return dict(self._refs)

    def held_keys(self, request: Request) -> list[int]:
        """Keys of the cached blocks ``request`` holds (a copy, for checks)."""
        state = request._prefix
        return [] if state is None else list(state.held)
