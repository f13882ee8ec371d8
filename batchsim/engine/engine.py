"""The simulated serving engine (with :mod:`.dispatch`, the only modules that import simpy).

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
- **Sleeping.** The loop sleeps on SimPy's clock until a pass ends only when an arrival or
  cancellation is due by then; otherwise nothing can happen meanwhile and the next pass starts
  at once on the engine's own clock (:attr:`Engine.clock`). Garbage is collected rarely while
  the loop runs (:func:`rare_collections`).
- **End of input.** The engine tells the policy, through
  :meth:`~batchsim.scheduler.Scheduler.set_end_of_input`, when no further arrival is known
  (and when one is known again, in a closed loop).
- **Decode stretches.** For a policy that opts in, a decode-only batch that would repeat is
  advanced over many iterations in one timeout, cut at the next arrival, cancellation or
  timer (:mod:`batchsim.engine.stretch`); so are chunked prefill's chunks of one prompt.
  For the built-in continuous and chunked-prefill policies, after a pass, the running
  decodes then run on stretch after stretch through their requests' last tokens while no
  waiting request would be admitted and nothing is due (:attr:`Engine.drains`).
  ``fast_forward=False`` runs them one at a time (same results).
- **Replicas.** With a :class:`~batchsim.engine.dispatch.ReplicaLink`, the engine is one
  replica of a cluster: its arrivals are the requests a router sends it, it shares the
  cluster's SimPy environment, and the link orders its passes among the cluster's events of
  the same instant and logs its stretches when they end (a routed request may cut one).
  Without it (one engine on its own) nothing of this runs. A prefill instance of a
  disaggregated cluster hands a finished prompt to its link instead of logging it, and a
  decode instance queues the requests whose KV arrived (:mod:`batchsim.engine.handoff`).
- **Progress guard.** A policy written elsewhere (``package.module:Class``) is checked at
  every call: an exception it raises, an iteration that schedules a request that is not
  running, more tokens than a request has, a count below 1 or tokens without KV blocks, a
  timer that does not lie in the future, waiting forever while holding requests, or a
  million iterations without a sampled token stop the run with a :class:`PolicyError`
  naming the policy and the rule. The built-in policies are trusted (their invariants are
  tested).
"""

from __future__ import annotations

import gc
import heapq
import math
import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from batchsim.cost import BatchShape, RooflineCostModel
from batchsim.cost.costs import StepCost
from batchsim.cost.shapes import cuda_graph_padded
from batchsim.engine.request import Request, RequestStatus
from batchsim.engine.stretch import StretchRunner, repeat_limit, run_row, stretches_allowed
from batchsim.errors import BatchsimError, PolicyError, describe_exception
from batchsim.metrics.iterations import TIME_EPS, IterationLog
from batchsim.metrics.requests import RequestLog
from batchsim.metrics.slots import SlotLog
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.scheduler.registry import built_in, policy_name
from batchsim.workload import RequestTable

if TYPE_CHECKING:
    from batchsim.engine.dispatch import ReplicaLink

MAX_STEPS_WITHOUT_TOKEN = 1_000_000
"""Iterations in a row that sample no token before a policy is deemed stuck."""
MAX_IDLE_WAKEUPS = 100_000
"""Wake-ups in a row on a policy's own timer, with nothing scheduled, before it is deemed
stuck."""
MAX_STALLED_PASSES = 10_000
"""Passes in a row with nothing scheduled and an event due at their own time (which a pass
should have consumed) before the engine stops with an internal error instead of spinning."""
GC_THRESHOLD = 100_000
"""Net new container objects between two young-generation garbage collections while the
engine runs (Python's default: 700)."""


@contextmanager
def rare_collections() -> Iterator[None]:
    """Collect garbage rarely while the step loop runs, then restore the interpreter's
    thresholds.

    The loop makes and drops many small tuples (rows, shapes, costs) that reference counting
    frees at once; at the default threshold the collector still scans the young generation
    every 700 net allocations, about 5 % of a run's time, to find almost no cycles. Cycles
    are still collected, every :data:`GC_THRESHOLD` net allocations. A collector that the
    caller turned off (threshold 0) stays off.
    """
    old = gc.get_threshold()
    if old[0] == 0 or old[0] >= GC_THRESHOLD:
        yield
        return
    gc.set_threshold(GC_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings in SI units."""

    cpu_overhead_base: float = 0.0
    """CPU time per iteration (s)."""
    cpu_overhead_per_seq: float = 0.0
    """Extra CPU time per request in the iteration (s)."""
    async_scheduling: bool = False
    cuda_graph_max_batch_size: int = 0
    """Pad decode-only batches up to the next CUDA-graph size up to this (0: no padding)."""
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

    Conversations (``table.next_turn``): a turn that finished sends its conversation's next
    turn ``think_time`` after it left; a turn that was rejected or cancelled ends its
    conversation (the later turns are never sent). Open loop: first turns arrive at their
    table times. Closed loop: each user runs one conversation after another, taking the next
    conversation not yet started (in table order) ``think_time`` after its previous one ended.
    At equal times, requests are delivered in the order of their index.
    """

    def __init__(self, table: RequestTable):
        self.table = table
        self.num_total = len(table.prompt_tokens)
        self.next_index = 0
        """Open loop: the next arrival; closed loop: the next request (conversation) a user
        takes."""
        self.closed_loop = table.concurrency is not None
        self._heap: list[tuple[float, int, int]] = []  # (time, request index, user)
        self._next_turn = table.next_turn
        self._starts: np.ndarray | None = None  # conversations: their first turns, in order
        if self._next_turn is not None:
            first = np.ones(self.num_total, dtype=bool)
            first[self._next_turn[self._next_turn >= 0]] = False
            self._starts = np.flatnonzero(first)
        if self.closed_loop:
            assert table.concurrency is not None
            num_firsts = self.num_total if self._starts is None else len(self._starts)
            for user in range(min(table.concurrency, num_firsts)):
                index = user if self._starts is None else int(self._starts[user])
                self._heap.append((0.0, index, user))
            self.next_index = len(self._heap)
        self._next = math.inf  # open loop: the next arrival time
        if not self.closed_loop:
            self._arrivals = table.arrival_time
            if self._starts is not None:
                self._arrivals = table.arrival_time[self._starts]
            self._next = self._arrival(0)

    @property
    def leaving_sends_nothing(self) -> bool:
        """A request that leaves brings no arrival (:meth:`on_left` does nothing): an open
        loop without conversations."""
        return not self.closed_loop and self._next_turn is None

    def _arrival(self, index: int) -> float:
        arrivals = self._arrivals
        return float(arrivals[index]) if index < len(arrivals) else math.inf

    def next_time(self) -> float:
        if self.closed_loop:
            return self._heap[0][0] if self._heap else math.inf
        if self._heap:  # open-loop conversations: a next turn is waiting
            return min(self._heap[0][0], self._next)
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
        if self._starts is not None:
            return self._pop_turns(now)
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

    def _pop_turns(self, now: float) -> list[Request]:
        """Open-loop conversations: the first turns and next turns due by now, in order of
        time, then index."""
        due: list[tuple[float, int, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap))
        starts = self._starts
        assert starts is not None
        arrivals = self._arrivals
        i = self.next_index
        while i < len(starts) and arrivals[i] <= now:
            due.append((float(arrivals[i]), int(starts[i]), -1))
            i += 1
        self.next_index = i
        self._next = self._arrival(i)
        due.sort()
        return [self._make(index, time, user) for time, index, user in due]

    def on_left(self, request: Request, now: float) -> None:
        """Closed loop: the request's user sends its next one after thinking. Conversations:
        the next turn, if the request finished and has one."""
        if self._next_turn is not None:
            self._turn_left(request, now)
            return
        if not self.closed_loop or self.next_index >= self.num_total:
            return
        think = self.table.think_time
        delay = float(think[self.next_index]) if think is not None else 0.0
        heapq.heappush(self._heap, (now + delay, self.next_index, request.user_id))
        self.next_index += 1

    def _turn_left(self, request: Request, now: float) -> None:
        assert self._next_turn is not None and self._starts is not None
        think = self.table.think_time
        assert think is not None, "a conversation workload has think times"
        index = int(self._next_turn[request.request_id])
        if index < 0 or request.status != RequestStatus.FINISHED:
            # the conversation ended: in a closed loop, its user starts the next one
            if not self.closed_loop or self.next_index >= len(self._starts):
                return
            index = int(self._starts[self.next_index])
            self.next_index += 1
        heapq.heappush(self._heap, (now + float(think[index]), index, request.user_id))

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


_OUTPUT_COUNTS = (
    "num_prefill_seqs",
    "num_decode_seqs",
    "num_slots",
    "num_output_tokens",
    "num_swap_in_blocks",
    "num_swap_out_blocks",
    "padding_context",
)
"""The integer fields of a :class:`SchedulerOutput` besides its token counts."""


def _python_int(value: Any) -> Any:
    """``value`` as a python int if it is an integer of another type (numpy's, say)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


@mypyc_attr(allow_interpreted_subclasses=True)
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
        table: RequestTable | None,
        options: EngineOptions,
        on_step: Callable[[Engine], None] | None = None,
        *,
        link: ReplicaLink | None = None,
    ):
        self.scheduler = scheduler
        self.kv_cache = scheduler.kv_cache
        self._caches_prefixes = self.kv_cache.caches_prefixes
        self.cost_model = cost_model
        self.options = options
        self.link = link
        """A replica's tie to its cluster (:mod:`batchsim.engine.dispatch`): its arrivals
        come from the router and it shares the cluster's SimPy environment; None for one
        engine on its own."""
        self.request_log = RequestLog()
        """Requests that left (finished, rejected, cancelled), one row each."""
        self.num_arrived = 0
        self.iterations = IterationLog()
        self._cancels: list[tuple[float, int, Request]] = []
        self._last_end = -math.inf
        policy = type(scheduler)
        self.fast_forward = options.fast_forward and stretches_allowed(policy)
        self.stretch = StretchRunner(self)
        self.source: ArrivalSource | ReplicaLink
        if link is None:
            assert table is not None, "an engine on its own needs the workload"
            self.source = ArrivalSource(table)
            self.env = simpy.Environment()
        else:
            self.source = link  # the requests the router sends
            self.env = link.env
            self.stretch.log = link.attach(self)  # a stretch is logged when it ends
        self.hand_off: Callable[[Request, float], bool] | None = getattr(link, "hand_off", None)
        """A prefill instance of a disaggregated cluster: takes a request whose prompt is done
        off to a decode instance (then it has not left the cluster); None otherwise."""
        self.limit_repeat: Callable[[int], int] | None = getattr(link, "limit_repeat", None)
        """A decode instance of a disaggregated cluster: how far a stretch may go before a
        pass could take KV blocks for a transfer; None otherwise."""
        self._add_request = scheduler.add_request
        if getattr(link, "receives_transfers", False):  # a decode instance: KV comes with it
            self._add_request = scheduler.add_transferred
        self.policy_name = policy_name(policy)
        self.slot_log = SlotLog() if options.record_slots else None
        self.guarded = not built_in(policy)
        """Check the policy at every call (policies written outside batchsim)."""
        self.on_step = on_step
        self.drains = (
            link is None
            and self.fast_forward
            and not self.guarded
            and vars(policy).get("drains_cohort", False) is True
            and scheduler._cohort is not None
            and scheduler._prefix is None
            and not cost_model.ideal
            and self.slot_log is None
            and type(self) is Engine
            and isinstance(self.source, ArrivalSource)
            and self.source.leaving_sends_nothing
        )
        """Decode stretches run on through their members' last tokens
        (:meth:`~batchsim.engine.stretch.StretchRunner.drain`): a built-in policy that runs
        its running requests first (``drains_cohort``), one engine on its own, whose
        requests leaving bring no arrival (open loop, no conversations)."""
        self._price: Callable[[SchedulerOutput, float], StepTimes] = self._price_step
        """Prices and logs one iteration (the proposals too with speculative decoding)."""
        if getattr(scheduler, "speculator", None) is not None:
            self._price = self._price_speculative_step

    @property
    def clock(self) -> float:
        """Simulated time the engine has reached (s): the end of its last iteration, or when
        it last woke (SimPy's clock lags while no arrival or cancellation is due)."""
        return max(self.env.now, self._last_end)

    def run(self) -> None:
        """Simulate until every request has finished, been rejected or been cancelled."""
        self.start()
        with rare_collections():
            self.env.run()

    def start(self) -> None:
        """Start the step loop as a process of :attr:`env` (a cluster runs many at once)."""
        self.env.process(self._step_loop())

    def check_done(self) -> None:
        """After the run: no request may be left waiting or running (a replica of a cluster
        can only be judged stuck when nothing else can happen anywhere)."""
        if self.scheduler.has_unfinished_requests():
            self._stuck()

    # ----------------------------------------------------------------- timing helpers
    def cpu_time(self, num_seqs: int) -> float:
        """CPU scheduling time of an iteration of ``num_seqs`` requests (s)."""
        o = self.options
        return o.cpu_overhead_base + o.cpu_overhead_per_seq * num_seqs

    def back_to_back(self, start: float) -> bool:
        """An iteration starting at ``start`` follows the previous one without a gap (within
        :data:`~batchsim.metrics.logs.TIME_EPS`: two paths to one instant, such as another
        replica's iteration end that brings a request, may round an ulp apart)."""
        return start - self._last_end <= TIME_EPS

    @staticmethod
    def duration(cpu: float, gpu: float, overlap: bool) -> float:
        """Iteration time: CPU work then the GPU step (``overlap``: the CPU work hides behind
        the previous GPU step)."""
        if overlap:
            return cpu if cpu > gpu else gpu
        return cpu + gpu

    def batch_row(self, output: SchedulerOutput, cpu: float) -> tuple:
        """The :data:`~batchsim.metrics.logs.BATCH_COLUMNS` of an iteration. With prefix
        caching: the blocks cached now and those evicted since the previous row (by the
        ``schedule()`` of this iteration); 0 and 0 without."""
        shape = output.shape
        cached = evicted = 0
        if self._caches_prefixes:
            kv = self.kv_cache
            cached, evicted = kv.num_cached_blocks, kv.num_evicted_blocks
            kv.num_evicted_blocks = 0
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
            cached,
            evicted,
        )

    def take_arrivals(self, now: float) -> None:
        """What a pass at ``now`` does first: hand the requests due by then to the scheduler
        (or reject them), cancel those due, and tell it whether further arrivals are known."""
        self._deliver_due(now)
        ended = self.source.exhausted()
        scheduler = self.scheduler
        if ended != scheduler.end_of_input:
            self._call("set_end_of_input", scheduler.set_end_of_input, ended)

    def next_arrival_time(self) -> float:
        """The next arrival (inf if none is known)."""
        return self.source.next_time()

    def next_cancel_time(self) -> float:
        """The next cancellation (inf if none is due)."""
        return self._cancels[0][0] if self._cancels else math.inf

    def next_other_event_time(self, now: float) -> float:
        """The next cancellation or scheduler timer after ``now`` (inf if none)."""
        t = self.next_cancel_time()
        timer = self._timer(now)
        return t if timer is None else min(t, timer)

    # ----------------------------------------------------------------------- internals
    def _deliver_due(self, now: float) -> None:
        scheduler = self.scheduler
        for request in self.source.pop_due(now):
            self.num_arrived += 1
            if self._call("add_request", self._add_request, request):
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
        """``request`` reached a final status at ``now`` (on a prefill instance, a finished
        prompt may instead move on to a decode instance)."""
        hand_off = self.hand_off
        if hand_off is not None and hand_off(request, now):
            return
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
        return None if timer is None else float(timer)  # (a policy may use numpy numbers)

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
        guarded = self.guarded
        on_step = self.on_step
        idle_wakeups = steps_without_token = stalled = 0
        graph_max = self.options.cuda_graph_max_batch_size
        # The engine's own clock: exactly the times it computed (an iteration's end, the
        # arrival or timer it slept until). SimPy's clock only sleeps it, and env.now + (t -
        # env.now) may round an ulp away from t: a request would then wait 1e-16 s on one
        # path and not at all on another.
        now = env.now
        link = self.link
        if link is not None:
            now = yield link.pass_at(now)
        while True:
            if on_step is not None:
                on_step(self)
            if link is not None:
                link.begin_pass(now)
            self.take_arrivals(now)
            if guarded:
                checked = self._call("schedule", scheduler.schedule_iteration, now)
                self._check_output(checked)
                output = checked
            else:
                output = scheduler.schedule_iteration(now)
            if output.is_empty:
                wake = self._next_event_time(now)
                if wake == math.inf and link is None:
                    if scheduler.has_unfinished_requests():
                        self._stuck()
                    return
                # a pass consumes every event due at its time: one still due would wake the
                # engine at this instant again and again (a livelock, never a policy's doing)
                stalled = stalled + 1 if wake <= now else 0
                if stalled > MAX_STALLED_PASSES:
                    raise AssertionError(
                        f"engine of policy {self.policy_name}: {MAX_STALLED_PASSES:,} passes at "
                        f"t={now!r} s with an event due then and nothing scheduled"
                    )
                timer_only = wake < self._next_external_time()
                idle_wakeups = idle_wakeups + 1 if timer_only else 0
                if idle_wakeups > MAX_IDLE_WAKEUPS:
                    raise self._broke(
                        f"woke the engine {MAX_IDLE_WAKEUPS:,} times in a row on its timer "
                        "without scheduling anything"
                    )
                if link is None:
                    yield env.timeout(max(0.0, wake - env.now))
                    now = wake
                else:  # a replica also wakes when a request is routed to it
                    now = yield link.idle(wake)
                    if now < wake:
                        idle_wakeups = 0
                continue
            idle_wakeups = stalled = 0
            if graph_max:
                output.shape = cuda_graph_padded(output.shape, graph_max)
            num_steps = repeat_limit(scheduler, output) if self.fast_forward else 1
            if num_steps > 1 and self.limit_repeat is not None:
                num_steps = self.limit_repeat(num_steps)
            if num_steps > 1 and output.num_prefill_seqs and self.slot_log is not None:
                num_steps = 1  # the slots of a prompt's chunks are recorded one by one
            if num_steps > 1:
                times = self.stretch.run(output, now, num_steps, self._next_event_time(now))
            else:
                times = self._price(output, now)
            if self.slot_log is not None:
                self.slot_log.record(
                    output, scheduler.running, times.first_iteration, times.num_steps
                )
            if link is None:
                # Sleep until the pass ends only if an arrival or a cancellation is due by then;
                # otherwise nothing can happen meanwhile and the engine's own clock moves on
                # alone (SimPy's catches up at the next sleep).
                external = self._next_external_time()
                if times.end >= external:
                    yield env.timeout(max(0.0, times.end - env.now))
            else:  # a request routed here during a stretch cuts it short
                times = yield from link.busy(times)
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
            # (an engine that drains has no link, and the update brought no arrival: the next
            # external event is the one found above)
            if self.drains and now < external:
                now = self.stretch.drain(now, external)
                if now >= external:  # its last stretch was cut there: sleep till it ends
                    yield env.timeout(max(0.0, now - env.now))
            if link is not None:  # the router's turn first at this instant
                turn = link.next_pass(now)
                if turn is not None:
                    now = yield turn

    def _price_step(self, output: SchedulerOutput, now: float) -> StepTimes:
        return self._log_step(output, now, self.cost_model.step_cost(output.shape))

    def _price_speculative_step(self, output: SchedulerOutput, now: float) -> StepTimes:
        """:meth:`_price_step` of a speculative run: the proposals (draft model or proposer)
        run on the GPU before the target's verification pass; the iteration row counts the
        verification rows as decode tokens."""
        cost = self.cost_model.step_cost(output.shape)
        propose = getattr(output, "propose_cost", None)
        if propose is not None:
            cost = StepCost(
                cost.time + propose.time,
                cost.flops + propose.flops,
                cost.bytes + propose.bytes,
                cost.weight_bytes + propose.weight_bytes,
                cost.kv_bytes + propose.kv_bytes,
                cost.margin,
            )
        return self._log_step(output, now, cost, getattr(output, "num_verify_tokens", 0))

    def _log_step(
        self, output: SchedulerOutput, now: float, cost: StepCost, verify: int = 0
    ) -> StepTimes:
        """Time one iteration of ``output`` priced at ``cost`` from ``now`` and log it;
        ``verify`` prefill-counted rows are logged as decode tokens (speculative
        verification)."""
        cpu = self.cpu_time(output.num_seqs)
        swap = (output.num_swap_in_blocks + output.num_swap_out_blocks) * (
            self.options.swap_time_per_block
        )
        overlap = self.options.async_scheduling and self.back_to_back(now)
        duration = self.duration(cpu, cost.time + swap, overlap)
        first = self.iterations.num_rows
        row = self.batch_row(output, cpu)
        if verify:  # (num_prefill_tokens, num_decode_tokens) at 5 and 6
            row = (*row[:5], row[5] - verify, row[6] + verify, *row[7:])
        self.iterations.append(run_row(now, 1, duration, cost, row), self.kv_cache.usage)
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
            raise self._broke(f"{what}() raised {describe_exception(exc)}") from None

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
        # (read as Any: the values are a policy's, checked here, not assumed to be ints)
        requests: Any = output.requests
        tokens: Any = output.num_scheduled_tokens
        if len(requests) != len(tokens):
            raise self._broke(
                f"schedule() returned {len(requests)} requests but {len(tokens)} token counts"
            )
        kv = self.scheduler.kv_cache
        seen: set[int] = set()
        python_ints = True
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
            count = 0 if isinstance(q, bool) or not isinstance(q, numbers.Integral) else int(q)
            python_ints = python_ints and type(q) is int
            if count < 1:
                raise self._broke(
                    f"schedule() scheduled {q!r} tokens for request {rid}; each scheduled "
                    "request computes an integer number of tokens >= 1"
                )
            left = request.num_remaining_tokens
            if count > left:
                raise self._broke(
                    f"schedule() scheduled {count} tokens for request {rid}, which has only "
                    f"{left} to compute"
                )
            total = request.num_computed_tokens + count
            if kv.blocks_held(request.num_computed_tokens, total) > request.num_blocks:
                raise self._broke(
                    f"schedule() scheduled {total} tokens of request {rid} without the KV "
                    f"blocks to hold them (it holds {request.num_blocks}; allocate() first)"
                )
        # Integers of other types (numpy's, say) become python ints, which the engine and the
        # cost model compute with (and, compiled, require).
        if not python_ints:
            output.num_scheduled_tokens = [int(q) for q in tokens]
        shape: Any = output.shape
        if any(type(v) is not int and isinstance(v, numbers.Integral) for v in shape):
            output.shape = BatchShape(*(_python_int(v) for v in shape))
        for name in _OUTPUT_COUNTS:
            value = getattr(output, name)
            if type(value) is not int:
                setattr(output, name, _python_int(value))
