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
  at once on the engine's own clock (:attr:`Engine.clock`). The garbage collector is off while
  the built-in policies' loop runs, and runs rarely with a policy written elsewhere
  (:func:`rare_collections`).
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
- **Replicas.** With a :class:`~batchsim.engine.arrivals.Link`, the engine is one
  replica of a cluster: its arrivals are the requests a router sends it, it shares the
  cluster's SimPy environment, and the link orders its passes among the cluster's events of
  the same instant and logs its stretches when they end (a routed request may cut one).
  Without it (one engine on its own) nothing of this runs. A prefill instance of a
  disaggregated cluster hands a finished prompt to its link instead of logging it, and a
  decode instance queues the requests whose KV arrived (:mod:`batchsim.cluster.handoff`).
- **Progress guard.** A policy written elsewhere (``package.module:Class``) is checked at
  every call: anything it raises (any ``BaseException``: ``SystemExit`` and a
  ``KeyboardInterrupt`` of its own too; the command line's Ctrl-C is the user's), a
  ``policy_max_repeat()`` below 1, an iteration that schedules a request that is not
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
from collections.abc import Callable
from typing import Any

import simpy
from mypy_extensions import mypyc_attr

from batchsim.cost import RooflineCostModel
from batchsim.cost.costs import StepCost
from batchsim.cost.shapes import cuda_graph_padded
from batchsim.engine.arrivals import Arrivals, ArrivalSource, Link
from batchsim.engine.collector import rare_collections
from batchsim.engine.guard import check_output
from batchsim.engine.options import EngineOptions
from batchsim.engine.repeat import repeat_limit, stretches_allowed
from batchsim.engine.request import Request
from batchsim.engine.runs import run_row
from batchsim.engine.speculative_drain import SpeculativeDrain
from batchsim.engine.stretch import StretchRunner
from batchsim.errors import BatchsimError, Interrupted, PolicyError, describe_exception
from batchsim.metrics.iterations import TIME_EPS, IterationLog
from batchsim.metrics.requests import RequestLog
from batchsim.metrics.slots import SlotLog
from batchsim.scheduler.fast_forward import declaration
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.scheduler.registry import built_in, policy_name
from batchsim.scheduler.speculation import with_proposals
from batchsim.workload.generation import RequestTable

MAX_STEPS_WITHOUT_TOKEN = 1_000_000
"""Iterations in a row that sample no token before a policy is deemed stuck."""
MAX_IDLE_WAKEUPS = 100_000
"""Wake-ups in a row on a policy's own timer, with nothing scheduled, before it is deemed
stuck."""
MAX_STALLED_PASSES = 10_000
"""Passes in a row with nothing scheduled and an event due at their own time (which a pass
should have consumed) before the engine stops with an internal error instead of spinning."""


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
        link: Link | None = None,
    ):
        self.scheduler = scheduler
        self.kv_cache = scheduler.kv_cache
        self._caches_prefixes = self.kv_cache.caches_prefixes
        self.cost_model = cost_model
        self.options = options
        self.link = link
        """A replica's tie to its cluster (:mod:`batchsim.cluster.dispatch`): its arrivals
        come from the router and it shares the cluster's SimPy environment; None for one
        engine on its own."""
        self.request_log = RequestLog()
        """Requests that left (finished, rejected, cancelled), one row each."""
        self.num_arrived = 0
        self.iterations = IterationLog()
        self._cancels: list[tuple[float, int, Request]] = []
        self.last_end = -math.inf
        """The end of the engine's last iteration (s)."""
        policy = type(scheduler)
        self.fast_forward = options.fast_forward and stretches_allowed(policy)
        self.stretch = StretchRunner(self, self.iterations)
        self.source: Arrivals
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
        self.runs_ahead = link is not None and getattr(link, "runs_ahead", False) is True
        """A replica that may run on between its cluster's routing instants
        (:meth:`~batchsim.cluster.dispatch.ReplicaLink.horizon`)."""
        self.drains = (
            self.fast_forward
            and not self.guarded
            and declaration(policy).drains_cohort
            and scheduler._cohort is not None
            and not scheduler._cohort.window
            and scheduler._prefix is None
            and not cost_model.ideal
            and self.slot_log is None
            and type(self) is Engine
            and (
                self.runs_ahead
                or (
                    link is None
                    and isinstance(self.source, ArrivalSource)
                    and self.source.leaving_sends_nothing
                )
            )
        )
        """Decode stretches run on through their members' last tokens
        (:meth:`~batchsim.engine.stretch.StretchRunner.drain`): a built-in policy that runs
        its running requests first (``drains_cohort``), one engine on its own or a replica
        that runs ahead, whose requests leaving bring no arrival (open loop, no
        conversations)."""
        self._price: Callable[[SchedulerOutput, float], StepTimes] = self._price_step
        """Prices and logs one iteration (the proposals too with speculative decoding)."""
        self.speculative_drain: SpeculativeDrain | None = None
        """Runs a speculative run's verification iterations back to back (one engine on its
        own, without prefix caching, a window or recorded slots; see
        :mod:`batchsim.engine.speculative_drain`)."""
        speculator = getattr(scheduler, "speculator", None)
        if speculator is not None:
            self._price = self._price_speculative_step
            if (
                options.fast_forward
                and link is None
                and not self.guarded
                and scheduler._prefix is None
                and scheduler.window is None
                and self.kv_cache.window is None
                and self.slot_log is None
                and type(self) is Engine
            ):
                self.speculative_drain = SpeculativeDrain(self, self.iterations, speculator)

    @property
    def is_replica(self) -> bool:
        """A replica of a cluster (its arrivals come from its :attr:`link`)."""
        return self.link is not None

    @property
    def clock(self) -> float:
        """Simulated time the engine has reached (s): the end of its last iteration, or when
        it last woke (SimPy's clock lags while no arrival or cancellation is due)."""
        return max(self.env.now, self.last_end)

    def run(self) -> None:
        """Simulate until every request has finished, been rejected or been cancelled."""
        self.start()
        with rare_collections(trusted=not self.guarded):
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
        :data:`~batchsim.metrics.iterations.TIME_EPS`: two paths to one instant, such as another
        replica's iteration end that brings a request, may round an ulp apart)."""
        return start - self.last_end <= TIME_EPS

    @staticmethod
    def duration(cpu: float, gpu: float, overlap: bool) -> float:
        """Iteration time: CPU work then the GPU step (``overlap``: the CPU work hides behind
        the previous GPU step)."""
        if overlap:
            return cpu if cpu > gpu else gpu
        return cpu + gpu

    def batch_row(self, output: SchedulerOutput, cpu: float) -> tuple:
        """The :data:`~batchsim.metrics.iterations.BATCH_COLUMNS` of an iteration. With prefix
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
                self.leave(request, now)
        while self._cancels and self._cancels[0][0] <= now:
            request = heapq.heappop(self._cancels)[2]
            if not request.status.is_final:
                self._call("cancel", scheduler.cancel, request, now)
                self.leave(request, now)

    def leave(self, request: Request, now: float) -> None:
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

    def _horizon(self) -> float:
        """A replica's horizon (:meth:`~batchsim.cluster.dispatch.ReplicaLink.horizon`), or
        its next cancellation if that comes first; -inf if it may not run ahead."""
        if not self.runs_ahead:
            return -math.inf
        link: Any = self.link
        t: float = link.horizon()
        if self._cancels and self._cancels[0][0] < t:
            return self._cancels[0][0]
        return t

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
                check_output(checked, scheduler.kv_cache, self._broke)
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
            if not self.fast_forward:
                num_steps = 1
            elif guarded:  # (it asks the policy's policy_max_repeat())
                num_steps = self._call("policy_max_repeat", repeat_limit, scheduler, output)
            else:
                num_steps = repeat_limit(scheduler, output)
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
            else:
                # A replica likewise, before its horizon (nothing of the cluster can reach it
                # sooner); from there on a request routed here during a stretch cuts it short.
                external = self._horizon()
                if times.end < external:
                    link.settle(times)
                else:
                    times = yield from link.busy(times)
            now = self.last_end = times.end
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
                self.leave(request, times.end)
            # (the update brought no arrival: the next external event is the one found above)
            if self.drains and now < external:
                now = self.stretch.drain(now, external, cross=link is None)
                if now >= external:  # its last stretch was cut there: sleep till it ends
                    yield env.timeout(max(0.0, now - env.now))
                planned = self.stretch.planned
                if planned is not None:  # a replica's stretch that reaches its horizon
                    self.stretch.planned = None
                    assert link is not None
                    times, cohort, running = planned
                    times = yield from link.busy(times)
                    now = self.last_end = times.end
                    for request in scheduler._advance_cohort(
                        cohort, times.first_iteration, times.num_steps, times.end, running
                    ):
                        self.leave(request, times.end)
                    external = -math.inf  # (its pass at this instant waits for its turn)
            if self.speculative_drain is not None:
                external = self._next_external_time()  # (a closed-loop user may have sent one)
                if now < external:
                    now = self.speculative_drain.drain(now, external)
                    if now >= external:  # its last iteration ends there: sleep till it ends
                        yield env.timeout(max(0.0, now - env.now))
            if link is not None and now >= external:  # the router's turn first at this instant
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
            cost = with_proposals(cost, propose)
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
        except (BatchsimError, Interrupted):  # batchsim's own errors; the user's Ctrl-C
            raise
        except BaseException as exc:  # SystemExit(0), KeyboardInterrupt, ...: the policy's
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
