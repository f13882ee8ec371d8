"""The state every policy shares and the calls the engine makes: :class:`SchedulerCore`.

The engine drives a scheduler through these calls: :meth:`~SchedulerCore.add_request` for
arrivals, :meth:`~SchedulerCore.cancel`, :meth:`~SchedulerCore.schedule_iteration` (which calls
the policy's ``schedule()``) -> cost model -> ``update_from_output()``, ``next_timer()`` when
nothing runs, and :meth:`~SchedulerCore.set_end_of_input` when it learns whether further
arrivals are known. Here too: admission checks (requests that can never fit are rejected
with a reason), cancellation at an iteration boundary, finishing, and a decode instance's
requests whose KV arrived from elsewhere.

A policy author reads :mod:`batchsim.scheduler.interface`; this is the mechanism under it
(then :mod:`.toolkit`, the helpers a policy calls, and :mod:`.cohorts`, the decodes advanced
together). This module imports no simpy and nothing from the engine loop.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from batchsim.engine.cohort import Cohort
from batchsim.engine.kv_cache import KVCacheManager, num_blocks_for
from batchsim.engine.prefix_cache import PrefixCachingKVCacheManager
from batchsim.engine.request import Request, RequestStatus
from batchsim.errors import ConfigError
from batchsim.scheduler.config import SchedulerConfig
from batchsim.scheduler.output import SchedulerOutput


@mypyc_attr(allow_interpreted_subclasses=True)
class SchedulerCore:
    """The state and the engine-facing calls of every policy (see the module docstring; a
    policy subclasses :class:`~batchsim.scheduler.interface.Scheduler`).

    Args:
        config: The ``scheduler:`` block.
        kv_cache: The engine's block pool.
        window: Sliding-window length of the model (keys per query), or None.
        max_model_len: Longest sequence (prompt + output) the engine accepts, or None.
    """

    config_keys: ClassVar[frozenset[str]] = frozenset({"policy", "max_num_seqs"})
    """Keys of :class:`SchedulerConfig` the policy reads (others are reported as unused)."""
    reserves_full_sequence: ClassVar[bool] = False
    """True if admission reserves KV for prompt + all output tokens (no preemption needed)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        *,
        window: int | None = None,
        max_model_len: int | None = None,
    ):
        self.config = config
        self.kv_cache = kv_cache
        self.window = window
        self.max_model_len = max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        """Requests preempted by swapping, in the order they resume."""
        self.transferred: deque[Request] | None = None
        """A decode instance's requests whose KV arrived, waiting for a batch slot (see
        :meth:`add_transferred`); None elsewhere."""
        self.end_of_input = False
        """True while no further arrival is known (see :meth:`set_end_of_input`)."""
        self._swap_in_blocks = 0  # copied during the current schedule_iteration()
        self._swap_out_blocks = 0
        self._lent: list[Request] | None = None
        """The running list an iteration holds as its requests (a policy that declares
        ``lends_running``: :mod:`batchsim.scheduler.fast_forward`)."""
        self._prefix: PrefixCachingKVCacheManager | None = (
            kv_cache if isinstance(kv_cache, PrefixCachingKVCacheManager) else None
        )
        """The KV cache when it caches prefixes (blocks are registered as requests compute
        them), else None."""
        self._cohort: Cohort | None = None
        """The running decodes advanced together (built-in policies that grow KV blocks as
        they decode, without a sliding window; see :mod:`batchsim.engine.cohort` and
        :mod:`.cohorts`)."""

    @classmethod
    def check_config(cls, config: SchedulerConfig) -> None:
        """Reject settings the policy cannot run with (raise :class:`ConfigError`)."""
        uses_budget = "max_num_batched_tokens" in cls.config_keys
        if uses_budget and config.max_num_batched_tokens < config.max_num_seqs:
            raise ConfigError(
                f"scheduler.max_num_batched_tokens must be >= scheduler.max_num_seqs "
                f"({config.max_num_seqs}), got {config.max_num_batched_tokens}: every running "
                "request needs at least one token of the iteration's budget"
            )

    # ---------------------------------------------------------------- engine-facing calls

    def add_request(self, request: Request) -> bool:
        """Queue an arrival, or reject it (status REJECTED, reason set) if it can never run."""
        reason = self.reject_reason(request)
        if reason:
            request.status = RequestStatus.REJECTED
            request.reject_reason = reason
            return False
        self.waiting.append(request)
        return True

    def reject_reason(self, request: Request) -> str:
        """Why ``request`` can never be served, or '' if it can."""
        return self.engine_reject_reason(request) or self.policy_reject_reason(request)

    def engine_reject_reason(self, request: Request) -> str:
        """Why ``request`` can never fit this engine (its length, its KV cache), or ''."""
        total = request.num_prompt_tokens + request.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            return f"prompt+output {total} tokens > engine.max_model_len {self.max_model_len}"
        kv = self.kv_cache
        if not kv.can_ever_fit(total):
            need = num_blocks_for(total, kv.block_size)
            room = kv.num_blocks - kv.watermark_blocks
            above = " above the admission watermark" if kv.watermark_blocks else ""
            return f"needs {need} KV blocks > KV cache capacity {room}{above}"
        return ""

    def policy_reject_reason(self, request: Request) -> str:
        """The policy's own reason to reject ``request`` (:meth:`Scheduler.policy_reject_reason
        <batchsim.scheduler.interface.Scheduler.policy_reject_reason>`)."""
        return ""

    # ------------------------------------------ a decode instance of a disaggregated cluster

    def add_transferred(self, request: Request) -> bool:
        """Take a request whose prompt was computed elsewhere and whose KV cache arrived with
        it (a decode instance of a disaggregated cluster). It holds the KV blocks of its
        prompt, so it needs no admission: it joins the running batch at the next
        :meth:`schedule_iteration` with a free batch slot (``max_num_seqs``), before anything
        waiting is admitted (as vLLM schedules a request once its remote KV is loaded), and
        the policy schedules it from then on like any running decode (its first token's KV,
        computed there, may need a new block). Its fit was checked before its KV moved
        (:meth:`engine_reject_reason`): never rejected."""
        if self.transferred is None:
            self.transferred = deque()
        self.transferred.append(request)
        return True

    def _own_running(self) -> list[Request]:
        """``running``, to change in place: a copy of it first if an iteration holds it as its
        requests (``lends_running``)."""
        running = self.running
        if running is self._lent:
            running = self.running = running.copy()
            self._lent = None
        return running

    def _admit_transferred(self, transferred: deque[Request]) -> None:
        running = self._own_running()
        while transferred and len(running) < self.max_num_seqs:
            request = transferred.popleft()
            request.status = RequestStatus.RUNNING
            running.append(request)

    def cancel(self, request: Request, now: float) -> None:
        """Drop a request whose client disconnected; called at an iteration boundary."""
        if request.status.is_final:
            return
        if request.status == RequestStatus.RUNNING:
            self._own_running().remove(request)
        elif request.status == RequestStatus.SWAPPED:
            self.swapped.remove(request)
        elif self.transferred and request in self.transferred:
            self.transferred.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_cache.free(request)
        request.status = RequestStatus.CANCELLED
        request.finish_time = now
        self.on_request_left(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.transferred)

    def set_end_of_input(self, ended: bool) -> None:
        """The engine says whether further arrivals are known: True when none is (open loop:
        the workload is exhausted; closed loop: every user waits for a reply), False when one
        becomes known again (closed loop). Request-level batching launches its last, partial
        batch at the end of input."""
        self.end_of_input = ended

    def schedule_iteration(self, now: float) -> Any:
        """The next iteration: the policy's :meth:`schedule`, with the KV blocks it copied
        between GPU and host memory (swaps) attached to the output. Returns what ``schedule()``
        returned, unchecked: the engine checks a policy written elsewhere."""
        self._swap_in_blocks = self._swap_out_blocks = 0
        transferred = self.transferred
        if transferred:
            self._admit_transferred(transferred)
        policy: Any = self  # (its answer is not assumed to be a SchedulerOutput, compiled or not)
        output = policy.schedule(now)
        if transferred and output.is_empty and len(self.running) < self.max_num_seqs:
            # the policy preempted its last running request: a request whose KV is here
            # takes the slot at this boundary (else nothing would wake the engine for it)
            self._admit_transferred(transferred)
            output = policy.schedule(now)
        if self._swap_in_blocks or self._swap_out_blocks:
            output.num_swap_in_blocks = self._swap_in_blocks
            output.num_swap_out_blocks = self._swap_out_blocks
        return output

    # The policy's hooks (documented for policy authors in batchsim.scheduler.interface).
    def schedule(self, now: float) -> SchedulerOutput:
        """The policy's next iteration (:meth:`Scheduler.schedule
        <batchsim.scheduler.interface.Scheduler.schedule>`)."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement schedule()")

    def next_timer(self, now: float) -> float | None:
        """The policy's timer (:meth:`Scheduler.next_timer
        <batchsim.scheduler.interface.Scheduler.next_timer>`)."""
        return None

    def _register(self, requests: list[Request]) -> None:
        """Prefix caching: cache the keyed blocks the running ``requests`` completed."""
        assert self._prefix is not None
        register = self._prefix.register
        for request in requests:
            if request.status == RequestStatus.RUNNING:
                register(request)

    def _finish(self, finished: list[Request], end: float) -> None:
        for request in finished:
            request.status = RequestStatus.FINISHED
            request.finish_time = end
            self.kv_cache.free(request)
            self._own_running().remove(request)
            self.on_request_left(request)

    def on_request_left(self, request: Request) -> None:
        """The policy's hook when a request leaves (:meth:`Scheduler.on_request_left
        <batchsim.scheduler.interface.Scheduler.on_request_left>`)."""
