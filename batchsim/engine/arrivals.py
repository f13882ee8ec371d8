"""Where an engine's requests come from: the workload, or the cluster it is a replica of.

An engine takes its arrivals from an :class:`Arrivals` source before every ``schedule()``:
the requests due by then, in order. One engine on its own reads them from the workload's
table (:class:`ArrivalSource`: open loop, closed loop, conversations); a replica of a cluster
reads the requests its router sent it from its :class:`Link`, which also orders its passes
among the cluster's events of the same instant (:mod:`batchsim.cluster.dispatch`). A later
source (requests from a live client, say) needs only what :class:`Arrivals` declares.

This module imports only the request, the workload's table and the foundation's bound of
simulated time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from batchsim.engine.request import Request, RequestStatus
from batchsim.errors import ConfigError
from batchsim.validation import MAX_SECONDS
from batchsim.workload.generation import RequestTable

if TYPE_CHECKING:
    import simpy

    from batchsim.scheduler.output import StepTimes


class Arrivals(Protocol):
    """The requests an engine has not been given yet."""

    @property
    def num_total(self) -> int:
        """Requests of the whole workload (for the progress line)."""
        ...

    def pop_due(self, now: float) -> list[Request]:
        """The requests that arrive by ``now``, in order (they are the engine's from then)."""
        ...

    def next_time(self) -> float:
        """When the next request arrives (inf if none is known)."""
        ...

    def exhausted(self) -> bool:
        """No further arrival is known (the engine tells its policy: end of input)."""
        ...

    def on_left(self, request: Request, now: float) -> None:
        """``request`` reached a final status at ``now`` (a closed-loop user may send the
        next one)."""
        ...


class Link(Arrivals, Protocol):
    """What an engine run as one replica of a cluster needs of the cluster: its arrivals
    (the requests routed to it) and the hooks of its step loop, which put its passes in the
    cluster's order of events at one instant and let a routed request cut a stretch short
    (:class:`~batchsim.cluster.dispatch.ReplicaLink` is the one implementation).

    A link may also carry ``hand_off(request, now) -> bool`` (a prefill instance of a
    disaggregated cluster hands a finished prompt on), ``limit_repeat(steps) -> int`` and
    ``receives_transfers`` (a decode instance); the engine reads them with ``getattr``.
    """

    env: simpy.Environment
    """The cluster's one SimPy environment."""

    def attach(self, engine: Any) -> Any:
        """Bind the engine; return where its stretches are logged (a plan logged when the
        stretch ends: :class:`~batchsim.cluster.plan.StretchPlan`)."""
        ...

    def pass_at(self, now: float) -> simpy.Event:
        """Sleep until this replica's pass at ``now``."""
        ...

    def begin_pass(self, now: float) -> None:
        """A pass starts at ``now``."""
        ...

    def idle(self, wake: float) -> simpy.Event:
        """Sleep until ``wake`` or until a request is routed here."""
        ...

    def busy(self, times: StepTimes) -> Generator[simpy.Event, float, StepTimes]:
        """Sleep until the iterations of ``times`` end (``yield from``); their times, cut
        short if a request was routed here during a stretch."""
        ...

    def next_pass(self, now: float) -> simpy.Event | None:
        """After an iteration that ended at ``now``: the sleep until this replica's pass at
        ``now``, or None when it may run at once."""
        ...


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
        self._push(now + delay, self.next_index, request.user_id)
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
        self._push(now + float(think[index]), index, request.user_id)

    def _push(self, time: float, index: int, user: int) -> None:
        """A request sent after a think time, or an error past the bound of simulated time
        (the check before the run bounds what the think times alone add up to; this one
        what they add to the service times)."""
        if time > MAX_SECONDS:
            raise ConfigError(
                f"workload.think_time_ms: request {index} would arrive at {time:.10g} s, more "
                f"than the limit of {MAX_SECONDS:g} s of simulated time; set a lower think "
                "time or fewer num_requests"
            )
        heapq.heappush(self._heap, (time, index, user))

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
