"""The running decodes that advance together: per-iteration work that does not grow with the
batch.

At most iterations of a continuous or chunked-prefill policy every running decode computes its
last sampled token and samples the next one. A :class:`Cohort` holds such requests and keeps
what the iteration needs as running sums: how many they are, their cached tokens, how many of
them start a new KV block at the next token (counts by ``num_computed_tokens mod block_size``)
and which of them finishes first (a heap of finishing steps). An iteration of the whole cohort
is then one :meth:`Cohort.tick`: a member's computed and output tokens are its own value at
joining plus the cohort's ``steps``, its KV blocks follow from its computed tokens, and the
iterations of its token runs from the cohort's own runs of ticks. Members read and write
those through the :class:`~batchsim.engine.request.Request` attributes as before; a write
takes the request out first (:meth:`Cohort.detach`), so code that knows nothing of cohorts
stays exact.

Invariants of a member (checked when it joins): running, a decode (one token left to compute,
at least one sampled), not finished, and holding exactly the blocks of its computed tokens
(``ceil((computed + ahead) / block_size)``; ``ahead`` is 1 between a
:meth:`~batchsim.scheduler.Scheduler.schedule` that took the blocks of every member's next
token and the update that computes it).

**Sliding windows.** With a window of W keys (every layer, or a hybrid model's sliding-window
layer groups beside full-attention ones), a member has computed at least W tokens, so each of
its reads is the whole window and its blocks are a function of its tokens t = computed +
``ahead`` alone (:meth:`~batchsim.engine.request.Group.blocks_at`): ``groups x ceil(t / bs) -
slide x floor((t - W) / bs)``. The next token then starts a block in every group when
``t mod bs = 0`` and frees one in each sliding group when ``(t + 1 - W) mod bs = 0``: both are
counts of the members by ``computed mod bs``, the second shifted by W - 1
(:meth:`Cohort.crossing`, :meth:`Cohort.freed`, :meth:`Cohort.window_offsets`).

This module imports only :mod:`batchsim.engine.request`, whose :class:`~batchsim.engine.request.
Group` it implements.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

from batchsim.engine.request import HANDED_OFF, Group, Request

_COMPACT_MIN = 256
"""Runs of ticks kept before the ones no member needs are dropped."""


class Cohort(Group):
    """Running decodes advanced one token per iteration together.

    Args:
        block_size: Tokens per KV block.

    Attributes:
        steps: Iterations the cohort has run (ticks); a member's progress is its own plus
            ``steps``.
        ahead: 1 when the blocks of every member's next token are taken (scheduled, not yet
            computed), else 0.
        n: Members.
        sum_base: Sum of the members' stored computed tokens (add ``n x steps`` for theirs).
        residues: Members by stored computed tokens mod ``block_size``.
        last_iteration: The iteration of the latest tick (-1: none).
        version: Changes whenever a request joins or leaves.
    """

    __slots__ = (
        "_compact_at",
        "_heap",
        "_members",
        "_offsets",
        "_offsets_key",
        "_run_iterations",
        "_run_ticks",
        "_tickets",
        "_window_key",
        "_window_offsets",
        "n",
        "residues",
        "sum_base",
        "version",
    )

    def __init__(self, block_size: int, window: int = 0, groups: int = 1, slide: int = 0):
        assert window >= 0 and (slide > 0) == (window > 0) and groups >= max(1, slide)
        super().__init__(block_size, window, groups, slide)
        self.n = 0
        self.sum_base = 0
        self.residues = [0] * block_size
        self.version = 0
        self._tickets = 0
        self._members: dict[int, Request] = {}
        self._heap: list[tuple[int, int, Request]] = []  # (finishing step, ticket, request)
        self._run_ticks: list[int] = []  # first tick of each run of consecutive iterations
        self._run_iterations: list[int] = []  # and its iteration
        self._compact_at = _COMPACT_MIN
        self._offsets: list[int] = []
        self._offsets_key = (-1, -1)
        self._window_offsets: list[int] = []
        self._window_key = (-1, -1)

    # ------------------------------------------------------------------ membership
    def can_join(self, r: Request) -> bool:
        """Whether ``r`` (running, outside any cohort) meets a member's invariants now."""
        outputs = r._outputs
        return (
            r._group is None
            and 0 < outputs < r.max_tokens
            and (r._last >= 0 or r._last == HANDED_OFF)
            and r.num_prompt_tokens + outputs - r._computed == 1
            and r._computed >= self.window
            and r._blocks == self.blocks_at(r._computed + self.ahead)
        )

    def join(self, r: Request) -> None:
        """Add ``r``, which :meth:`can_join`."""
        steps = self.steps
        self._tickets += 1
        ticket = self._tickets
        r._group = self
        r._ticket = ticket
        r._joined = steps
        base = r._computed - steps
        r._computed = base
        r._outputs -= steps
        self.n += 1
        self.sum_base += base
        self.residues[base % self.block_size] += 1
        self._members[ticket] = r
        heapq.heappush(self._heap, (r.max_tokens - r._outputs, ticket, r))
        self.version += 1

    def detach(self, r: Request) -> None:
        """Take ``r`` out: its progress, blocks and token runs become its own again."""
        steps = self.steps
        base = r._computed
        self.n -= 1
        self.sum_base -= base
        self.residues[base % self.block_size] -= 1
        del self._members[r._ticket]
        self.version += 1
        computed = base + steps
        r._computed = computed
        r._outputs += steps
        r._blocks = self.blocks_at(computed + self.ahead)
        if steps > r._joined:
            r._segments += self._history(r)
            r._last = self.last_iteration
        r._group = None
        if not self.n:
            self._reset()
        elif len(self._heap) > 2 * self.n + 64:  # mostly requests that left early
            self._heap = [e for e in self._heap if e[2]._group is self and e[2]._ticket == e[1]]
            heapq.heapify(self._heap)

    def _reset(self) -> None:
        """Empty: start counting again (nothing refers to the old steps)."""
        self.steps = 0
        self.ahead = 0
        self.last_iteration = -1
        self._heap.clear()
        self._run_ticks.clear()
        self._run_iterations.clear()
        self._compact_at = _COMPACT_MIN

    # ------------------------------------------------------------------ iterations
    def tick(self, first_iteration: int, num_steps: int) -> None:
        """Every member computed ``num_steps`` tokens, one per iteration from
        ``first_iteration``, and sampled one at each."""
        if first_iteration != self.last_iteration + 1 or not self._run_ticks:
            self._run_ticks.append(self.steps)
            self._run_iterations.append(first_iteration)
            if len(self._run_ticks) > self._compact_at:
                self._compact()
        self.steps += num_steps
        self.last_iteration = first_iteration + num_steps - 1
        self.ahead = 0

    def context_tokens(self) -> int:
        """The members' computed tokens, summed."""
        return self.sum_base + self.n * self.steps

    def crossing(self) -> int:
        """Blocks the members' next tokens start: one per member (per layer group with a
        window) whose next token starts a new KV block."""
        return self.groups * self.residues[-self.steps % self.block_size]

    def freed(self) -> int:
        """Blocks the members' next tokens free (a window's sliding groups; 0 without one):
        one per sliding group of each member whose window leaves a block behind."""
        if not self.window:
            return 0
        return self.slide * self.residues[(self.window - 1 - self.steps) % self.block_size]

    def growing(self) -> int:
        """Blocks the pool must have for the members' next tokens, each member's allocation
        net of what its own window frees (:meth:`crossing` without a window): a member frees
        its window's oldest block on the step it starts a new one when ``(W - 1) mod bs = 0``."""
        crossing = self.crossing()
        if self.window and (self.window - 1) % self.block_size == 0:
            return crossing - self.freed()
        return crossing

    def offsets(self) -> list[int]:
        """``at_least[j]``: members with ``num_computed_tokens mod block_size`` >= j, for j in
        0..block_size (the form :meth:`~batchsim.engine.kv_cache.KVCacheManager.
        usage_ramp` takes)."""
        key = (self.version, self.steps)
        if self._offsets_key != key:
            self._offsets = self._rotated(self.steps)
            self._offsets_key = key
        return self._offsets

    def window_offsets(self) -> list[int] | None:
        """With a window of W keys, :meth:`offsets` of ``num_computed_tokens - (W - 1)``:
        when each member's window frees a block (None without a window)."""
        if not self.window:
            return None
        key = (self.version, self.steps)
        if self._window_key != key:
            self._window_offsets = self._rotated(self.steps - self.window + 1)
            self._window_key = key
        return self._window_offsets

    def _rotated(self, shift: int) -> list[int]:
        """at_least_offsets() of the residues rotated by ``shift``, in one loop."""
        bs = self.block_size
        shift %= bs
        residues = self.residues
        out = [0] * (bs + 1)
        total = 0
        for j in range(bs - 1, -1, -1):
            total += residues[(j - shift) % bs]
            out[j] = total
        return out

    def min_remaining(self) -> int:
        """The fewest output tokens any member has left."""
        heap = self._heap
        while heap:
            _, ticket, r = heap[0]
            if r._group is self and r._ticket == ticket:
                return heap[0][0] - self.steps
            heapq.heappop(heap)
        return 1 << 62

    def pop_finished(self) -> list[Request]:
        """Members that sampled their last token (still members), first to join first."""
        heap = self._heap
        steps = self.steps
        done: list[Request] = []
        while heap and heap[0][0] <= steps:
            end, ticket, r = heapq.heappop(heap)
            if r._group is self and r._ticket == ticket:
                assert end == steps, "a cohort member ran past its output length"
                done.append(r)
        return done

    # ------------------------------------------------------------------ token runs
    def segments_of(self, r: Request) -> list[int]:
        """``r.token_segments`` of a member, as if it had recorded its ticks itself."""
        if self.steps == r._joined:
            return list(r._segments)
        return r._segments + self._history(r)

    def _history(self, r: Request) -> list[int]:
        """The bounds to append to member ``r``'s token runs for its ticks."""
        ticks, iterations = self._run_ticks, self._run_iterations
        joined = r._joined
        k = bisect_right(ticks, joined) - 1
        first = iterations[k] + (joined - ticks[k])
        out: list[int] = []
        last = r._last
        if last == HANDED_OFF:  # its first token came from a prefill instance: a new run
            out.append(first)
        elif last != first - 1:
            out += (last, first)
        for m in range(k + 1, len(ticks)):
            out += (iterations[m - 1] + ticks[m] - ticks[m - 1] - 1, iterations[m])
        return out

    def _compact(self) -> None:
        """Drop the runs of ticks before any member joined."""
        joined = min(r._joined for r in self._members.values())
        k = bisect_right(self._run_ticks, joined) - 1
        if k > 0:
            del self._run_ticks[:k]
            del self._run_iterations[:k]
        self._compact_at = max(_COMPACT_MIN, 2 * len(self._run_ticks))
