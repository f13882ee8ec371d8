"""Many engines behind a router on one SimPy environment (the ``cluster:`` block).

The cluster's arrivals come from one :class:`~batchsim.engine.arrivals.ArrivalSource`. A
router process (:class:`Dispatcher`) picks a replica for each request at its arrival time,
from what each replica looks like at that instant (:class:`ReplicaView`), and puts it into
that replica's inbox, ``router_overhead`` later. Each replica is a whole
:class:`~batchsim.engine.engine.Engine` (its own policy, KV cache, cost model and CPU
overhead) whose arrival source is its :class:`ReplicaLink`. Like the engine, this module
keeps exact times: every event carries the time it stands for, and lands on SimPy's clock at
exactly that time (:func:`at`).

Same-instant rule (tested). At one simulated time t, in this order:

1. iterations that end at t are applied (``update_from_output``, requests leave), replica by
   replica in index order;
2. the router routes every arrival due by t, in arrival order, seeing each replica as it is
   after step 1 (a closed-loop user whose request left at t with no think time sends the
   next one at t, routed now);
3. each replica's next pass (deliver its due requests and cancellations, ``schedule()``), in
   index order: a request routed at t is visible to a ``schedule()`` at t, as for one engine.

A rejection or cancellation in step 3 may make a closed-loop user send a request at t; it is
routed at once, seeing every replica as it was before its own step 3 at t, so the order of
the replicas' passes never shows through the router.

Running ahead. Replicas touch each other only through the router, and in an open loop
(without conversations) the router acts only at arrival times, all known in advance, while
a request leaving a replica brings no arrival. There a replica whose next pass comes before
the cluster's next routing instant, its next delivery and its next cancellation
(:meth:`ReplicaLink.horizon`) takes it at once, without a sleep on SimPy's clock, and logs a
stretch that ends before then at once, as one engine on its own does: nothing can happen to
it meanwhile. It drains its cohort the same way (``Engine.drains``), up to a stretch that
would reach the horizon. A pass or a stretch that reaches the horizon sleeps as below, so
that the router sees it at the routing instant and a routed request may cut it; every
pass at an instant where another event is due still waits for its turn.

Exactness of fast-forward. A replica advances a decode stretch in one sleep, cut as for one
engine at its own next event (a delivery already in its inbox, a cancellation, its policy's
timer), not at every arrival to the cluster. The stretch is priced at its start but logged
when it ends (:mod:`.plan`): a request routed to the replica during the stretch cuts it at
the first iteration that ends at or after the delivery, which is where stepping one
iteration at a time would have delivered it. What a router sees of a replica inside a
stretch (requests in flight, KV usage of the iteration under way) is what stepping shows at
that instant, so ``engine.fast_forward`` on or off give the same routes and the same run.

This module and :mod:`.engine` are the only ones that import simpy.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING

import simpy

from batchsim.cluster.plan import StretchPlan
from batchsim.engine.arrivals import ArrivalSource
from batchsim.engine.collector import rare_collections
from batchsim.engine.request import Request
from batchsim.scheduler.output import StepTimes
from batchsim.workload import RequestTable

if TYPE_CHECKING:
    from batchsim.engine.engine import Engine

END = 1.0
"""Priority of iteration ends (step 1 of the same-instant rule); + replica index / (N + 1)."""
ROUTE = 2.0
"""Priority of routing (step 2)."""
PASS = 3.0
"""Priority of a replica's pass (step 3); + replica index / (N + 1)."""


def _delay_to(now: float, time: float) -> float:
    """A delay that SimPy adds to ``now`` to land on exactly ``time``: events meant for one
    instant must share one clock value, or SimPy would order them by rounding, not by the
    same-instant rule."""
    assert time >= now, f"an event at {time!r} before the clock {now!r}"
    delay = time - now
    while now + delay < time:
        delay = math.nextafter(delay, math.inf)
    while now + delay > time:
        delay = math.nextafter(delay, -math.inf)
    return delay


class _At(simpy.Event):
    """An event at exactly ``time``, with ``priority`` among the events of that instant; its
    value is ``time`` (what a sleeping process takes as its clock)."""

    def __init__(self, env: simpy.Environment, time: float, priority: float):
        super().__init__(env)
        self._ok = True  # triggered, as simpy's own Timeout
        self._value = time
        env.schedule(self, priority, _delay_to(env.now, time))  # type: ignore[arg-type]


def at(env: simpy.Environment, time: float, priority: float) -> simpy.Event:
    """An event at exactly ``time`` (see :class:`_At`)."""
    return _At(env, time, priority)


class Sleeper:
    """One process's sleep: it ends at a planned time, or earlier when someone wakes it.

    The process yields :meth:`sleep`'s event and receives the exact time it woke at. Waking
    earlier (:meth:`wake_at`) schedules a new event and hands it the sleeper's callbacks, so
    the planned one passes unnoticed: one event per sleep, two when woken early.
    """

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._event: simpy.Event | None = None
        self._priority = 0.0
        self.until = math.inf
        """When the current sleep ends (inf: until woken)."""

    def sleep(self, until: float, priority: float) -> simpy.Event:
        """The event to yield: sleep until ``until`` (inf: until :meth:`wake_at`)."""
        self._priority = priority
        self.until = until
        if until == math.inf:
            self._event = simpy.Event(self.env)
        else:
            self._event = at(self.env, until, priority)
        return self._event

    def wake_at(self, time: float) -> None:
        """End the current sleep at ``time`` if it would end later (else nothing)."""
        event = self._event
        if event is None or not time < self.until or not event.callbacks:
            return  # not sleeping (already woken), or waking earlier anyway
        early = at(self.env, time, self._priority)
        early.callbacks, event.callbacks = event.callbacks, []
        self._event = early
        self.until = time


class ReplicaLink:
    """What ties one replica engine to its cluster.

    For the engine it is the arrival source (its inbox: the requests routed to it, each due
    at its delivery time) and the hooks of its step loop (:meth:`next_pass`, :meth:`idle`,
    :meth:`busy`). For the router it tells the replica's state at the routing instant
    (:meth:`state`) and takes deliveries (:meth:`deliver`).
    """

    def __init__(self, dispatcher: Dispatcher, index: int, num_replicas: int):
        self.dispatcher = dispatcher
        self.index = index
        self.env = dispatcher.env
        order = index / (num_replicas + 1)
        self._end_priority = END + order
        self._pass_priority = PASS + order
        self.sleeper = Sleeper(self.env)
        self.inbox: deque[tuple[float, Request]] = deque()
        self.engine: Engine | None = None
        self.plan: StretchPlan | None = None
        self.runs_ahead = dispatcher.runs_ahead
        """The replica may run on between routing instants (see the module docstring)."""
        self.num_routed = 0
        """Requests routed here (delivered or not)."""
        self.num_left = 0
        """Requests that left this replica (finished, rejected, cancelled)."""
        self._busy = False
        self._busy_with_plan = False
        self._idle = False
        # the state when this replica's pass at _pass_time began (see state())
        self._pass_time = -math.inf
        self._pass_left = 0
        self._pass_running = 0
        self._pass_swapped = 0
        self._pass_usage = 0.0

    def attach(self, engine: Engine) -> StretchPlan:
        """Bind the engine; return where its stretches are logged."""
        self.engine = engine
        self.plan = StretchPlan(engine.iterations)
        return self.plan

    # ------------------------------------------------ the engine's arrival source
    @property
    def num_total(self) -> int:
        """Requests of the whole workload (for the progress line)."""
        return self.dispatcher.source.num_total

    def pop_due(self, now: float) -> list[Request]:
        """Requests delivered by ``now``, in order."""
        inbox = self.inbox
        out = []
        while inbox and inbox[0][0] <= now:
            out.append(inbox.popleft()[1])
        return out

    def next_time(self) -> float:
        """When the next request routed here is delivered (inf if none is on its way)."""
        return self.inbox[0][0] if self.inbox else math.inf

    def exhausted(self) -> bool:
        """No further arrival is known: none on its way here, none known to the cluster."""
        return not self.inbox and self.dispatcher.source.exhausted()

    def on_left(self, request: Request, now: float) -> None:
        self.num_left += 1
        self.dispatcher.on_left(request, now)

    # ----------------------------------------------------- the step loop's hooks
    def horizon(self) -> float:
        """Until when nothing of the cluster can reach this replica: the cluster's next
        routing instant or this replica's next delivery, whichever comes first; -inf when
        the replica may not run ahead (a closed loop, conversations, a disaggregated
        cluster)."""
        if not self.runs_ahead:
            return -math.inf
        time = self.dispatcher.source.next_time()
        inbox = self.inbox
        if inbox and inbox[0][0] < time:
            return inbox[0][0]
        return time

    def settle(self, times: StepTimes) -> None:
        """Log the iterations of ``times`` at once: they end before :meth:`horizon`, so no
        request can cut them."""
        plan = self.plan
        assert plan is not None
        if plan.pending:
            plan.begin(times.end)
            kept = plan.commit()
            assert kept is None, "a stretch before the horizon was cut"

    def pass_at(self, now: float) -> simpy.Event:
        """Sleep until this replica's pass at ``now`` (after routing at that instant)."""
        return self.sleeper.sleep(now, self._pass_priority)

    def next_pass(self, now: float) -> simpy.Event | None:
        """After an iteration that ended at ``now``: the sleep until this replica's pass at
        ``now``, or None when nothing else happens at this instant (no other event is due by
        now), so that the pass may run at once: it would be the next thing anyway."""
        if self.env.peek() > now:
            return None
        return self.pass_at(now)

    def idle(self, wake: float) -> simpy.Event:
        """Sleep until ``wake`` (inf: until a request is routed here, or, holding requests,
        until the cluster's input ends: see :meth:`Dispatcher.end_of_input`)."""
        self._idle = True
        return self.sleeper.sleep(wake, self._pass_priority)

    def begin_pass(self, now: float) -> None:
        """A pass starts at ``now``: remember the state the router sees at this instant."""
        engine = self.engine
        assert engine is not None
        scheduler = engine.scheduler
        self._idle = False
        self.dispatcher.passed(now, self.index)
        self._pass_time = now
        self._pass_left = self.num_left
        self._pass_running = len(scheduler.running)
        self._pass_swapped = len(scheduler.swapped)
        self._pass_usage = scheduler.kv_cache.usage

    def busy(self, times: StepTimes) -> Generator[simpy.Event, float, StepTimes]:
        """Sleep until the iterations of ``times`` end; return their times, cut short if a
        request was routed here during a stretch (``yield from`` in the step loop)."""
        plan = self.plan
        assert plan is not None
        planned = plan.pending
        if planned:
            plan.begin(times.end)
        self._busy, self._busy_with_plan = True, planned
        end = yield self.sleeper.sleep(times.end, self._end_priority)
        self._busy = self._busy_with_plan = False
        if planned:
            kept = plan.commit()
            if kept is not None and kept != times.num_steps:
                times = StepTimes(times.first_iteration, times.start, end, kept)
        return times

    # --------------------------------------------------------- the router's side
    def state(self, now: float) -> tuple[int, int, int, float]:
        """(requests in flight, running, swapped, KV usage) as the router sees them at
        ``now``: after every iteration that ended by now, before this replica's own pass at
        now. Inside a stretch, the KV usage of the iteration under way (as stepping shows)."""
        if self._pass_time == now:
            return (
                self.num_routed - self._pass_left,
                self._pass_running,
                self._pass_swapped,
                self._pass_usage,
            )
        engine = self.engine
        assert engine is not None and self.plan is not None
        scheduler = engine.scheduler
        usage = self.plan.usage_at(now) if self._busy_with_plan else scheduler.kv_cache.usage
        return (
            self.num_routed - self.num_left,
            len(scheduler.running),
            len(scheduler.swapped),
            usage,
        )

    def wake_waiting(self, now: float) -> None:
        """Wake at ``now`` if idle while holding requests (its policy may wait for more)."""
        engine = self.engine
        if self._idle and engine is not None and engine.scheduler.has_unfinished_requests():
            self.sleeper.wake_at(now)

    def deliver(self, request: Request, time: float) -> None:
        """``request`` was routed here; it arrives at ``time``."""
        self.num_routed += 1
        self.inbox.append((time, request))
        self.wake_for(time)

    def wake_for(self, time: float) -> None:
        """Something for this replica happens at ``time`` (a delivery): have a pass at the
        first iteration boundary at or after it, as stepping would."""
        sleeper = self.sleeper
        if self._busy:  # a stretch is cut; a single iteration runs to its end
            if self._busy_with_plan and time < sleeper.until:
                assert self.plan is not None
                # Stepping, this replica would have had its pass at `time` already if a
                # replica after it in index order has had its own (a request sent by a
                # rejection or cancellation in that pass): then the request waits for the
                # next iteration's end, as it would.
                passed = self.dispatcher.passes_done_at(time) >= self.index
                sleeper.wake_at(self.plan.cut(time, passed=passed))
        else:  # idle, or waiting for its pass at this instant (then nothing changes)
            sleeper.wake_at(time)


class ReplicaView:
    """A replica as a router sees it at the routing instant (read-only).

    Attributes:
        index: The replica's number (0 .. N-1), what the router returns.
        hardware: The name of its GPU profile.
        tensor_parallel_size: GPUs it spans.
    """

    __slots__ = ("_link", "_stamp", "_state", "hardware", "index", "tensor_parallel_size")

    def __init__(self, link: ReplicaLink, hardware: str, tensor_parallel_size: int):
        self._link = link
        self.index = link.index
        self.hardware = hardware
        self.tensor_parallel_size = tensor_parallel_size
        self._stamp = -1
        self._state: tuple[int, int, int, float] = (0, 0, 0, 0.0)

    def _get(self) -> tuple[int, int, int, float]:
        dispatcher = self._link.dispatcher
        if self._stamp != dispatcher.stamp:
            self._state = self._link.state(dispatcher.now)
            self._stamp = dispatcher.stamp
        return self._state

    @property
    def outstanding(self) -> int:
        """Requests in flight: routed here and not left yet (waiting, running or swapped,
        on their way included)."""
        return self._get()[0]

    @property
    def running(self) -> int:
        """Requests in the running batch (holding KV blocks)."""
        return self._get()[1]

    @property
    def swapped(self) -> int:
        """Requests preempted to host memory."""
        return self._get()[2]

    @property
    def waiting(self) -> int:
        """Requests queued (on their way included): outstanding - running - swapped."""
        outstanding, running, swapped, _ = self._get()
        return outstanding - running - swapped

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of its KV blocks in use (during the iteration under way)."""
        return self._get()[3]

    @property
    def num_cached_prefix_blocks(self) -> int:
        """KV blocks of the request being routed that the replica's prefix cache holds (0
        without prefix caching)."""
        link = self._link
        assert link.engine is not None
        kv = link.engine.scheduler.kv_cache
        count = getattr(kv, "num_cached_prefix_blocks", None)
        request = link.dispatcher.request
        return 0 if count is None or request is None else int(count(request))

    def __repr__(self) -> str:
        return (
            f"ReplicaView(index={self.index}, hardware={self.hardware!r}, "
            f"outstanding={self.outstanding}, running={self.running}, "
            f"kv_cache_usage={self.kv_cache_usage:.3f})"
        )


Route = Callable[[Request, Sequence[ReplicaView], float], int]
"""``route(request, replicas, now) -> replica index`` (checked by the caller)."""


class Dispatcher:
    """The cluster: its arrivals, its router process and its replicas' links.

    Args:
        table: The workload's requests (the cluster's arrivals, open or closed loop).
        route: Picks a replica for a request (see :data:`Route`).
        overhead: Seconds between routing and delivery.
    """

    def __init__(self, table: RequestTable, route: Route, overhead: float = 0.0):
        self.env = simpy.Environment()
        self.source = ArrivalSource(table)
        self.route = route
        self.overhead = overhead
        self.links: list[ReplicaLink] = []
        self.views: list[ReplicaView] = []
        self.sleeper = Sleeper(self.env)
        self.now = 0.0
        """The routing instant."""
        self.request: Request | None = None
        """The request being routed."""
        self.stamp = 0
        """Counts routing decisions (views compute their state once per decision)."""
        self._input_ended = False
        self._pass_time = -math.inf
        self._pass_index = -1
        self.runs_ahead = self.source.leaving_sends_nothing
        """Replicas may run on between routing instants: an open loop without conversations
        (see the module docstring)."""

    def passed(self, now: float, index: int) -> None:
        """Replica ``index`` begins a pass at ``now``."""
        if now != self._pass_time:
            self._pass_time, self._pass_index = now, index
        elif index > self._pass_index:
            self._pass_index = index

    def passes_done_at(self, now: float) -> int:
        """The highest index of a replica that began a pass at ``now`` (-1: none yet). The
        replicas' passes at one instant run in index order (step 3 of the same-instant
        rule), so every replica up to it has had its pass at ``now``, if it had one."""
        return self._pass_index if now == self._pass_time else -1

    def add_replicas(self, hardware: Sequence[tuple[str, int]]) -> list[ReplicaLink]:
        """One link per replica, given as (hardware name, tensor parallel size)."""
        n = len(hardware)
        for index, (name, tp) in enumerate(hardware):
            link = ReplicaLink(self, index, n)
            self.links.append(link)
            self.views.append(ReplicaView(link, name, tp))
        return self.links

    def run(self, engines: Sequence[Engine]) -> None:
        """Run the router and the engines until nothing else can happen."""
        for engine in engines:
            engine.start()
        self.env.process(self._loop())
        with rare_collections(trusted=not any(engine.guarded for engine in engines)):
            self.env.run()

    def _loop(self) -> Generator[simpy.Event, float, None]:  # a SimPy process
        source = self.source
        sleeper = self.sleeper
        now = yield sleeper.sleep(source.next_time(), ROUTE)
        while True:
            self.route_due(now)
            now = yield sleeper.sleep(source.next_time(), ROUTE)

    def route_due(self, now: float) -> None:
        """Route every arrival due by ``now`` (step 2 of the same-instant rule)."""
        source = self.source
        for request in source.pop_due(now):
            self._route(request, now)
        if not self._input_ended and source.exhausted():
            self._input_ended = True
            self.end_of_input(now)

    def _route(self, request: Request, now: float) -> None:
        self.now = now
        self.request = request
        self.stamp += 1
        index = self.route(request, self.views, now)
        self.request = None
        self.links[index].deliver(request, now + self.overhead if self.overhead else now)

    def end_of_input(self, now: float) -> None:
        """No further arrival is known to the cluster: an idle replica holding requests
        learns it now, as one engine would at its last arrival (static batching then
        launches its last, partial batch)."""
        for link in self.links:
            link.wake_waiting(now)

    def on_left(self, request: Request, now: float) -> None:
        """A request left its replica at ``now`` (a closed-loop user may send the next)."""
        source = self.source
        source.on_left(request, now)
        following = source.next_time()
        if following < math.inf:
            self._input_ended = False
            self.sleeper.wake_at(following)
