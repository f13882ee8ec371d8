"""The simulated serving engine: the only module that imports simpy.

One SimPy process runs the engine's step loop::

    deliver arrivals and cancellations due by now
    output = scheduler.schedule(now)                      # CPU
    cost   = cost_model.estimate(output.shape)            # one atomic forward pass
    yield timeout(cpu_overhead + cost.time)
    scheduler.update_from_output(output, end_times)       # CPU: sample, finish, free KV
    record

Rules, each tested:

- **Same-time arrivals.** Before every ``schedule()`` the loop delivers every request whose
  arrival time is <= now. An arrival at exactly the time of a ``schedule()`` is therefore
  visible to it. An arrival during an iteration waits for the next boundary: a forward pass is
  atomic and nothing changes its membership.
- **Idle.** When nothing is runnable, the loop sleeps until the next arrival, cancellation or
  policy timer (dynamic batching's max delay). No polling; when none exists the run ends.
- **Cancellation.** A client disconnect at time t lets the launched iteration complete; the
  request leaves at the first boundary at or after t.
- **CPU overhead.** Every iteration pays ``cpu_overhead_base + cpu_overhead_per_seq x
  num_seqs`` of scheduling / input preparation before the GPU runs. With
  ``async_scheduling`` the CPU work of an iteration hides behind the previous GPU step when the
  engine is busy back to back, so the iteration costs ``max(cpu, gpu)`` instead of the sum.
- **Swaps.** KV blocks swapped out or in while building an iteration (``preemption_mode:
  swap``) are copied over the host link before its forward pass: the GPU side of the
  iteration grows by ``blocks x swap_time_per_block``.
- **End of input.** The engine tells the policy, through
  :meth:`~batchsim.scheduler.Scheduler.set_end_of_input`, when no further arrival is known
  (and when one is known again, in a closed loop).
- **Decode stretches.** For a policy that opts in, a decode-only batch that would repeat is
  advanced over many iterations in one timeout, cut at the next arrival, cancellation or
  timer (:mod:`batchsim.engine.stretch`); so are chunked prefill's chunks of one prompt.
  ``fast_forward=False`` runs them one at a time (same results).
- **Progress guard.** A policy written elsewhere (``package.module:Class``) is checked at
  every call: an exception it raises, an iteration that schedules a request that is not
  running, more tokens than a request has, a count below 1 or tokens without KV blocks, a
  timer that does not lie in the future, waiting forever while holding requests, or a
  million iterations without a sampled token stop the run with a :class:`PolicyError`
  naming the policy and the rule. The built-in policies are trusted (their invariants are
  tested).
"""

from __future__ import annotations

import heapq
import math
import numbers
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy

import batchsim
from batchsim.cost import RooflineCostModel
from batchsim.engine.request import Request, RequestStatus
from batchsim.engine.stretch import StretchRunner, repeat_limit, run_row, stretches_allowed
from batchsim.errors import BatchsimError, PolicyError
from batchsim.metrics.logs import IterationLog, RequestLog
from batchsim.metrics.slots import SlotLog
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.scheduler.registry import POLICIES
from batchsim.workload import RequestTable

MAX_STEPS_WITHOUT_TOKEN = 1_000_000
"""Iterations in a row that sample no token before a policy is deemed stuck."""
MAX_IDLE_WAKEUPS = 100_000
"""Wake-ups in a row on a policy's own timer, with nothing scheduled, before it is deemed
stuck."""


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings in SI units."""

    cpu_overhead_base: float = 0.0
    """CPU time per iteration (s)."""
    cpu_overhead_per_seq: float = 0.0
    """Extra CPU time per request in the iteration (s)."""
    async_scheduling: bool = False
    swap_time_per_block: float = 0.0
    """Time to copy one KV block between GPU and host memory (s)."""
    fast_forward: bool = True
    record_slots: bool = False
    """Keep a :class:`~batchsim.metrics.slots.SlotLog` of the batch slots."""


class ArrivalSource:
    """Requests not yet delivered, in arrival order.

    Open loop: arrival times come from the workload table. Closed loop (``concurrency`` users):
    each user's first request arrives at t=0 and the next one ``think_time`` after the previous
    one left (finished, rejected or cancelled).
    """

    def __init__(self, table: RequestTable):
        self.table = table
        self.num_total = len(table.prompt_tokens)
        self.next_index = 0
        self.closed_loop = table.concurrency is not None
        self._heap: list[tuple[float, int, int]] = []  # (time, request index, user)
        if self.closed_loop:
            assert table.concurrency is not None
            for user in range(min(table.concurrency, self.num_total)):
                self._heap.append((0.0, user, user))
            self.next_index = len(self._heap)
        self._next = math.inf  # open loop: the next arrival time
        if not self.closed_loop:
            self._arrivals = table.arrival_time
            self._next = self._arrival(0)

    def _arrival(self, index: int) -> float:
        return float(self._arrivals[index]) if index < self.num_total else math.inf

    def next_time(self) -> float:
        if self.closed_loop:
            return self._heap[0][0] if self._heap else math.inf
        return self._next

    def exhausted(self) -> bool:
        """No further arrival is known (closed loop: every user is waiting on the engine)."""
        return self.next_time() == math.inf

    def pop_due(self, now: float) -> list[Request]:
        """Requests whose arrival time is <= now, in order."""
        out: list[Request] = []
        if self.closed_loop:
            while self._heap and self._heap[0][0] <= now:
                time, index, user = heapq.heappop(self._heap)
                out.append(self._make(index, time, user))
            return out
        if self._next > now:
            return out
        arrivals = self._arrivals
        n = self.num_total
        i = self.next_index
        while i < n and arrivals[i] <= now:
            out.append(self._make(i, float(arrivals[i]), -1))
            i += 1
        self.next_index = i
        self._next = self._arrival(i)
        return out

    def on_left(self, request: Request, now: float) -> None:
        """Closed loop: the request's user sends its next one after thinking."""
        if not self.closed_loop or self.next_index >= self.num_total:
            return
        think = self.table.think_time
        delay = float(think[self.next_index]) if think is not None else 0.0
        heapq.heappush(self._heap, (now + delay, self.next_index, request.user_id))
        self.next_index += 1

    def _make(self, index: int, time: float, user: int) -> Request:
        table = self.table
        cancel = math.inf
        if table.cancel_after is not None:
            cancel = time + float(table.cancel_after[index])
        return Request(
            request_id=index,
            arrival_time=time,
            num_prompt_tokens=int(table.prompt_tokens[index]),
            max_tokens=int(table.output_tokens[index]),
            cancel_time=cancel,
            user_id=user,
            prefix_segments=None if table.prefix is None else table.prefix.segments(index),
        )


class Engine:
    """Runs one simulation.

    Args:
        scheduler: The batching policy, holding the KV cache.
        cost_model: Prices each iteration.
        table: The workload's requests.
        options: CPU overhead and loop settings.
        on_step: Called with the engine before every pass of the step loop (a progress
            report; it must be cheap and must not change anything).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        cost_model: RooflineCostModel,
        table: RequestTable,
        options: EngineOptions,
        on_step: Callable[[Engine], None] | None = None,
    ):
        self.scheduler = scheduler
        self.kv_cache = scheduler.kv_cache
        if self.kv_cache.caches_prefixes:
            self.batch_row = self._batch_row_with_cache  # type: ignore[method-assign]
        self.cost_model = cost_model
        self.options = options
        self.source = ArrivalSource(table)
        self.request_log = RequestLog()
        """Requests that left (finished, rejected, cancelled), one row each."""
        self.num_arrived = 0
        self.iterations = IterationLog()
        self._cancels: list[tuple[float, int, Request]] = []
        self._last_end = -math.inf
        self.env = simpy.Environment()
        policy = type(scheduler)
        self.fast_forward = options.fast_forward and stretches_allowed(policy)
        self.stretch = StretchRunner(self)
        self.policy_name = f"{policy.__module__}:{policy.__qualname__}"
        self.slot_log = SlotLog() if options.record_slots else None
        self.guarded = policy not in POLICIES.values()
        """Check the policy at every call (policies written outside batchsim)."""
        self.on_step = on_step

    def run(self) -> None:
        """Simulate until every request has finished, been rejected or been cancelled."""
        self.env.process(self._step_loop())
        self.env.run()

    # ----------------------------------------------------------------- timing helpers
    def cpu_time(self, num_seqs: int) -> float:
        """CPU scheduling time of an iteration of ``num_seqs`` requests (s)."""
        o = self.options
        return o.cpu_overhead_base + o.cpu_overhead_per_seq * num_seqs

    def back_to_back(self, start: float) -> bool:
        """An iteration starting at ``start`` follows the previous one without a gap."""
        return start == self._last_end

    @staticmethod
    def duration(cpu: float, gpu: float, overlap: bool) -> float:
        """Iteration time: CPU work then the GPU step (``overlap``: the CPU work hides behind
        the previous GPU step)."""
        if overlap:
            return cpu if cpu > gpu else gpu
        return cpu + gpu

    def batch_row(self, output: SchedulerOutput, cpu: float) -> tuple:
        """The :data:`~batchsim.metrics.logs.BATCH_COLUMNS` of an iteration."""
        shape = output.shape
        swap_in, swap_out = output.num_swap_in_blocks, output.num_swap_out_blocks
        return (
            cpu * 1e3,
            output.num_seqs,
            output.num_slots,
            output.num_prefill_seqs,
            output.num_decode_seqs,
            shape.num_prefill_tokens,
            shape.num_decode_tokens,
            shape.num_padding_tokens,
            output.num_output_tokens,
            len(output.preempted),
            swap_in,
            swap_out,
            (swap_in + swap_out) * self.options.swap_time_per_block * 1e3,
            output.num_swapped_out if output.preempted else 0,
            0,  # num_cached_blocks and num_evicted_blocks: no prefix caching
            0,
        )

    def _batch_row_with_cache(self, output: SchedulerOutput, cpu: float) -> tuple:
        """:meth:`batch_row` with prefix caching: the blocks cached now and those evicted
        since the previous row (by the ``schedule()`` of this iteration)."""
        kv = self.kv_cache
        evicted = kv.num_evicted_blocks
        kv.num_evicted_blocks = 0
        return (*Engine.batch_row(self, output, cpu)[:-2], kv.num_cached_blocks, evicted)

    # ----------------------------------------------------------------------- internals
    def _deliver_due(self, now: float) -> None:
        scheduler = self.scheduler
        for request in self.source.pop_due(now):
            self.num_arrived += 1
            if self._call("add_request", scheduler.add_request, request):
                if request.cancel_time != math.inf:
                    heapq.heappush(
                        self._cancels, (request.cancel_time, request.request_id, request)
                    )
            else:
                self._left(request, now)
        while self._cancels and self._cancels[0][0] <= now:
            request = heapq.heappop(self._cancels)[2]
            if not request.status.is_final:
                self._call("cancel", scheduler.cancel, request, now)
                self._left(request, now)

    def _left(self, request: Request, now: float) -> None:
        """``request`` reached a final status at ``now``."""
        self.request_log.add(request)
        self.source.on_left(request, now)

    def _timer(self, now: float) -> float | None:
        timer = self._call("next_timer", self.scheduler.next_timer, now)
        bad = timer is not None and (
            not isinstance(timer, numbers.Real) or not now < float(timer) < math.inf
        )
        if self.guarded and bad:
            raise self._broke(
                f"next_timer() returned {timer!r} at t={now!r} s; a timer must be a "
                "finite time after now (or None)"
            )
        return timer

    def _next_external_time(self) -> float:
        """The next arrival or cancellation (inf if none is known)."""
        t = self.source.next_time()
        if self._cancels:
            t = min(t, self._cancels[0][0])
        return t

    def _next_event_time(self, now: float) -> float:
        t = self._next_external_time()
        timer = self._timer(now)
        return t if timer is None else min(t, timer)

    def _step_loop(self):  # a SimPy process
        env = self.env
        scheduler = self.scheduler
        source = self.source
        guarded = self.guarded
        on_step = self.on_step
        idle_wakeups = steps_without_token = 0
        # The engine's own clock: exactly the times it computed (an iteration's end, the
        # arrival or timer it slept until). SimPy's clock only sleeps it, and env.now + (t -
        # env.now) may round an ulp away from t: a request would then wait 1e-16 s on one
        # path and not at all on another.
        now = env.now
        while True:
            if on_step is not None:
                on_step(self)
            self._deliver_due(now)
            ended = source.exhausted()
            if ended != scheduler.end_of_input:
                self._call("set_end_of_input", scheduler.set_end_of_input, ended)
            if guarded:
                output = self._call("schedule", scheduler.schedule_iteration, now)
                self._check_output(output)
            else:
                output = scheduler.schedule_iteration(now)
            if output.is_empty:
                wake = self._next_event_time(now)
                if wake == math.inf:
                    if scheduler.has_unfinished_requests():
                        self._stuck()
                    return
                timer_only = wake < self._next_external_time()
                idle_wakeups = idle_wakeups + 1 if timer_only else 0
                if idle_wakeups > MAX_IDLE_WAKEUPS:
                    raise self._broke(
                        f"woke the engine {MAX_IDLE_WAKEUPS:,} times in a row on its timer "
                        "without scheduling anything"
                    )
                yield env.timeout(max(0.0, wake - env.now))
                now = wake
                continue
            idle_wakeups = 0
            num_steps = repeat_limit(scheduler, output) if self.fast_forward else 1
            if num_steps > 1 and output.num_prefill_seqs and self.slot_log is not None:
                num_steps = 1  # the slots of a prompt's chunks are recorded one by one
            if num_steps > 1:
                times = self.stretch.run(output, now, num_steps, self._next_event_time(now))
            else:
                times = self._price_step(output, now)
            if self.slot_log is not None:
                self.slot_log.record(
                    output, scheduler.running, times.first_iteration, times.num_steps
                )
            yield env.timeout(max(0.0, times.end - env.now))
            now = self._last_end = times.end
            if guarded:
                finished = self._call(
                    "update_from_output", scheduler.update_from_output, output, times
                )
            else:
                finished = scheduler.update_from_output(output, times)
            steps_without_token = 0 if output.num_output_tokens else steps_without_token + 1
            if steps_without_token > MAX_STEPS_WITHOUT_TOKEN:
                raise self._broke(
                    f"ran {MAX_STEPS_WITHOUT_TOKEN:,} iterations in a row without any request "
                    "sampling a token"
                )
            for request in finished:
                self._left(request, times.end)

    def _price_step(self, output: SchedulerOutput, now: float) -> StepTimes:
        cost = self.cost_model.step_cost(output.shape)
        cpu = self.cpu_time(output.num_seqs)
        swap = (output.num_swap_in_blocks + output.num_swap_out_blocks) * (
            self.options.swap_time_per_block
        )
        overlap = self.options.async_scheduling and now == self._last_end
        duration = self.duration(cpu, cost.time + swap, overlap)
        first = self.iterations.num_rows
        self.iterations.append(
            run_row(now, 1, duration, cost, self.batch_row(output, cpu)),
            self.scheduler.kv_cache.usage,
        )
        return StepTimes(first, now, now + duration)

    # ------------------------------------------------------------------ the guard
    def _call(self, what: str, method: Callable[..., Any], *args: Any) -> Any:
        """Call the scheduler; a policy written elsewhere that raises is reported as such."""
        if not self.guarded:
            return method(*args)
        try:
            return method(*args)
        except BatchsimError:
            raise
        except Exception as exc:
            raise self._broke(f"{what}() raised {_describe(exc)}") from None

    def _broke(self, rule: str) -> PolicyError:
        if not self.guarded:  # a built-in policy: a bug in batchsim
            raise AssertionError(f"policy {self.policy_name} {rule}")
        return PolicyError(f"scheduler.policy {self.policy_name}: {rule}")

    def _stuck(self) -> None:
        s = self.scheduler
        raise self._broke(
            f"holds {len(s.waiting)} waiting, {len(s.running)} running and "
            f"{len(s.swapped)} swapped requests but scheduled nothing and set no timer "
            "(nothing else can happen)"
        )

    def _check_output(self, output: Any) -> None:
        """The rules an iteration must follow (checked for policies written elsewhere)."""
        if not isinstance(output, SchedulerOutput):
            raise self._broke(
                f"schedule() returned {type(output).__name__}, not a SchedulerOutput "
                "(build it with make_output())"
            )
        requests, tokens = output.requests, output.num_scheduled_tokens
        if len(requests) != len(tokens):
            raise self._broke(
                f"schedule() returned {len(requests)} requests but {len(tokens)} token counts"
            )
        kv = self.scheduler.kv_cache
        seen: set[int] = set()
        for request, q in zip(requests, tokens):
            if not isinstance(request, Request):
                raise self._broke(f"schedule() returned {request!r} as a request")
            rid = request.request_id
            if request.status != RequestStatus.RUNNING:
                raise self._broke(
                    f"schedule() scheduled request {rid}, which is "
                    f"{request.status.name.lower()}, not running (admit() it first)"
                )
            if id(request) in seen:
                raise self._broke(f"schedule() scheduled request {rid} twice")
            seen.add(id(request))
            if isinstance(q, bool) or not isinstance(q, numbers.Integral) or q < 1:
                raise self._broke(
                    f"schedule() scheduled {q!r} tokens for request {rid}; each scheduled "
                    "request computes an integer number of tokens >= 1"
                )
            left = request.num_remaining_tokens
            if q > left:
                raise self._broke(
                    f"schedule() scheduled {q} tokens for request {rid}, which has only "
                    f"{left} to compute"
                )
            total = request.num_computed_tokens + q
            if kv.blocks_held(request.num_computed_tokens, total) > request.num_blocks:
                raise self._broke(
                    f"schedule() scheduled {total} tokens of request {rid} without the KV "
                    f"blocks to hold them (it holds {request.num_blocks}; allocate() first)"
                )


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line)``, pointing at the innermost frame outside batchsim."""
    package = os.path.dirname(batchsim.__file__)
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith(package):
            where = f" (at {frame.filename}:{frame.lineno})"
            break
    message = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"
