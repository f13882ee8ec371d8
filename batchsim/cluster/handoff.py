"""Disaggregated prefill/decode on the cluster's SimPy environment (``cluster.disaggregation``).

The prefill and decode instances are replica engines of one cluster (:mod:`.dispatch`), each
tied to it by a :class:`PrefillLink` or a :class:`DecodeLink`. A request's way:

1. At its arrival the cluster's router sends it to a prefill instance, where it runs with
   ``max_tokens`` 1: the prefill instance's own policy computes its prompt and samples its
   first token (TTFT ends there: DistServe's convention). A request of one output token
   finishes there; so does one the prefill instance rejects or that is cancelled there.
2. Its prompt done, the request leaves the prefill instance's scheduler, which frees its KV
   blocks; the link takes as many back at once (:meth:`PrefillLink.hand_off`): the prompt's
   KV stays on the prefill instance until it has moved.
3. At the same instant, after the iterations that end then and before the arrivals of that
   instant are routed, the decode router picks a decode instance (:class:`DisaggregatedDispatcher`).
   The request waits there, first come first served (:attr:`DecodeLink.pending`), until one
   of the decode instance's passes (its iteration boundaries) finds the KV blocks of its
   prompt free above the admission watermark; they are taken then. (A
   request whose client has disconnected by then is cancelled there instead.)
4. Its KV moves over the prefill instance's outgoing link, one transfer at a time in the order
   they became ready (FIFO per source link): from when the link is free, it occupies the link
   for its link time, and lands the link's latency later. Then the decode instance receives
   it (:meth:`~batchsim.scheduler.Scheduler.add_transferred`: a request whose KV is in place
   joins the running batch at its next iteration with a free slot) and the prefill instance
   gets its blocks back (at its first pass at or after that time).
5. It decodes on the decode instance; preempted there, it is recomputed there.

The transfer's link time (:class:`KVTransferModel`): ``after_prefill``, the prompt's KV over
the link (:func:`~batchsim.cost.comm.kv_transfer_link_time`); ``layerwise``, when the decode
instance takes the blocks at its first pass after the routing (as if it had reserved them
before the prefill began), only the part the prompt's last iteration did not hide
(:func:`~batchsim.cost.comm.layerwise_exposed_time`, over the part of that iteration's GPU time
the link was free); otherwise the whole.

Same instant, same order as any cluster (:mod:`.dispatch`): hand-offs are routed at the routing
step, before arrivals; a decode instance takes blocks at the start of its pass, before it
delivers and schedules; blocks go back to a prefill instance at the start of its pass. Each of
those events cuts a stretch where stepping would have passed, so ``engine.fast_forward`` on
or off give the same run.

This module imports no simpy (its events are :mod:`.dispatch`'s).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from batchsim.cluster.dispatch import Dispatcher, ReplicaLink, ReplicaView, Route
from batchsim.cost.comm import kv_transfer_link_time, layerwise_exposed_time
from batchsim.engine.request import HANDED_OFF, Request, RequestStatus
from batchsim.metrics.requests import RequestLog
from batchsim.workload import RequestTable


@dataclass(frozen=True)
class KVTransferModel:
    """How long a prompt's KV takes between the pools."""

    bytes_per_token_per_gpu: float
    """The larger per-GPU shard of one token's KV, of the prefill and the decode side (all
    layers): the GPUs' shards move in parallel, one link each."""
    bytes_per_token: float
    """One token's KV, all layers, all heads (the bytes a transfer moves)."""
    bandwidth: float
    """One link, bytes/s."""
    latency: float
    """Added to every transfer, s."""
    layerwise: bool
    num_layers: int
    window: int | None = None
    """Sliding window of the model (only the window's tokens move), or None."""
    hybrid_window: int | None = None
    """A hybrid model's sliding-window layers' window, when the decode pool keeps its KV per
    layer group: those layers move only the window's tokens."""
    window_share: float = 0.0
    """The part of a token's KV in those sliding-window layers."""

    def num_tokens(self, num_prompt_tokens: int) -> float:
        """Tokens' worth of every layer's KV that moves for a prompt of ``num_prompt_tokens``
        (a fraction with a hybrid model's sliding-window layers)."""
        window = self.window
        if window is not None:
            return min(num_prompt_tokens, window)
        if self.hybrid_window is None:
            return num_prompt_tokens
        share = self.window_share
        windowed = min(num_prompt_tokens, self.hybrid_window)
        return num_prompt_tokens * (1.0 - share) + windowed * share

    def link_time(self, num_tokens: float) -> float:
        """Time ``num_tokens`` tokens' KV takes on the link, s (latency excluded)."""
        time = kv_transfer_link_time(num_tokens, self.bytes_per_token_per_gpu, self.bandwidth)
        return float(time)


@dataclass(slots=True)
class Transfer:
    """A request whose prompt is done, on its way to a decode instance."""

    request: Request
    """The request as the decode instance will see it."""
    source: PrefillLink
    prefill_end: float
    """When its prefill instance's iteration sampling its first token ended, s."""
    held_blocks: int
    """KV blocks it holds on the prefill instance until it has moved."""
    num_tokens: float
    """Tokens' worth of KV that moves (:meth:`KVTransferModel.num_tokens`)."""
    compute_time: float
    """GPU time of the prompt's last iteration, s (``layerwise`` only; else 0)."""
    first_pass: int = 0
    """The decode instance's pass count at its first pass after the routing."""


class PrefillLink(ReplicaLink):
    """A prefill instance's tie to its disaggregated cluster: it runs each request to its
    first token, hands it off, holds its KV blocks until they have moved, and sends them over
    its outgoing link (:attr:`link_free`)."""

    dispatcher: DisaggregatedDispatcher

    def __init__(self, dispatcher: DisaggregatedDispatcher, index: int, num_replicas: int):
        super().__init__(dispatcher, index, num_replicas)
        self.releases: list[tuple[float, int]] = []
        """(time, blocks): KV blocks of transfers, back to the pool at that time."""
        self.link_free = -math.inf
        """When the outgoing link has sent every transfer queued on it, s."""
        self.num_handed_off = 0

    def deliver(self, request: Request, time: float) -> None:
        self.dispatcher.prefill_replica[request.request_id] = self.index
        request.max_tokens = 1  # the prompt and its first token; the rest is decoded elsewhere
        super().deliver(request, time)

    def next_time(self) -> float:
        t = super().next_time()
        releases = self.releases
        return min(t, releases[0][0]) if releases else t

    def begin_pass(self, now: float) -> None:
        releases = self.releases
        if releases and releases[0][0] <= now:
            assert self.engine is not None
            kv = self.engine.scheduler.kv_cache
            while releases and releases[0][0] <= now:
                kv.num_free_blocks += heapq.heappop(releases)[1]
            assert kv.num_free_blocks <= kv.num_blocks, "released more KV blocks than held"
        super().begin_pass(now)

    def release_at(self, time: float, blocks: int) -> None:
        """``blocks`` held for a transfer go back to the pool at ``time``."""
        heapq.heappush(self.releases, (time, blocks))
        self.wake_for(time)

    def on_left(self, request: Request, now: float) -> None:
        self.dispatcher.upstream_left(now)
        super().on_left(request, now)

    def hand_off(self, request: Request, now: float) -> bool:
        """The engine's hook for a request that reached a final status here: True if it moves
        on to a decode instance (its prompt is done and it has more tokens to come)."""
        dispatcher = self.dispatcher
        max_tokens = int(dispatcher.source.table.output_tokens[request.request_id])
        if request.status != RequestStatus.FINISHED or max_tokens <= 1:
            request.max_tokens = max_tokens  # logged as the workload asked
            return False
        engine = self.engine
        assert engine is not None
        self.num_left += 1
        self.num_handed_off += 1
        kv = engine.scheduler.kv_cache
        prompt = request.num_prompt_tokens
        held = kv.blocks_held(prompt, prompt)  # the scheduler freed them as it finished
        kv.num_free_blocks -= held
        assert kv.num_free_blocks >= 0, "a finished prompt's blocks were taken already"
        model = dispatcher.transfer
        compute = engine.iterations.last_gpu_time() if model.layerwise else 0.0
        dispatcher.prefill_iteration[request.request_id] = request.last_token_iteration
        decoding = Request(
            request.request_id,
            request.arrival_time,
            prompt,
            max_tokens,
            request.cancel_time,
            num_computed_tokens=prompt,
            num_output_tokens=1,
            num_preemptions=request.num_preemptions,
            num_swaps=request.num_swaps,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            user_id=request.user_id,
            last_token_iteration=HANDED_OFF,
            prefix_segments=request.prefix_segments,
        )
        transfer = Transfer(decoding, self, now, held, model.num_tokens(prompt), compute)
        dispatcher.hand_off(transfer, now)
        return True


class DecodeLink(ReplicaLink):
    """A decode instance's tie to its disaggregated cluster: the requests routed to it wait
    for its KV blocks (:attr:`pending`), then arrive when their KV has moved."""

    dispatcher: DisaggregatedDispatcher
    receives_transfers = True
    """Its engine queues arrivals with :meth:`~batchsim.scheduler.Scheduler.add_transferred`."""

    def __init__(self, dispatcher: DisaggregatedDispatcher, index: int, num_replicas: int):
        super().__init__(dispatcher, index, num_replicas)
        self.pending: deque[Transfer] = deque()
        """Requests routed here waiting for KV blocks, first come first served."""
        self.arrivals: list[tuple[float, int, Request]] = []
        """(landing time, order, request): transfers under way (a heap: transfers from
        different prefill instances land out of order)."""
        self._order = 0
        self._next_cancel = math.inf
        """The earliest cancellation time of the pending requests."""
        self.num_passes = 0

    def route_here(self, transfer: Transfer, now: float) -> None:
        self.num_routed += 1
        transfer.first_pass = self.num_passes + 1
        self.pending.append(transfer)
        cancel = transfer.request.cancel_time
        if cancel < self._next_cancel:
            self._next_cancel = cancel
        self.wake_for(now)

    def cancel_due(self, now: float) -> list[Transfer]:
        """The pending requests whose client left by ``now``, taken out of the queue wherever
        they stand (a request that waits behind one that does not fit still leaves when
        cancelled), in queue order."""
        if self._next_cancel > now:
            return []
        gone = [t for t in self.pending if t.request.cancel_time <= now]
        self.pending = deque(t for t in self.pending if t.request.cancel_time > now)
        self._next_cancel = min((t.request.cancel_time for t in self.pending), default=math.inf)
        return gone

    def taken(self) -> Transfer:
        """The first pending request leaves the queue (its blocks taken, or cancelled)."""
        transfer = self.pending.popleft()
        if transfer.request.cancel_time == self._next_cancel:
            self._next_cancel = min((t.request.cancel_time for t in self.pending), default=math.inf)
        return transfer

    def limit_repeat(self, num_steps: int) -> int:
        """The engine's hook before a stretch: 1 if the next pass could take blocks for the
        first pending request (a preemption of this pass freed them), which stepping would
        do; else ``num_steps`` (free blocks only shrink during a stretch)."""
        pending = self.pending
        if not pending:
            return num_steps
        assert self.engine is not None
        kv = self.engine.scheduler.kv_cache
        prompt = pending[0].request.num_prompt_tokens
        if kv.blocks_held(prompt, prompt) <= kv.num_free_blocks - kv.watermark_blocks:
            return 1
        return num_steps

    def land(self, time: float, request: Request) -> None:
        self._order += 1
        heapq.heappush(self.arrivals, (time, self._order, request))

    def pop_due(self, now: float) -> list[Request]:
        arrivals = self.arrivals
        out = []
        while arrivals and arrivals[0][0] <= now:
            out.append(heapq.heappop(arrivals)[2])
        return out

    def next_time(self) -> float:
        """The next landing, or the next cancellation of a pending request (a pass then
        cancels it, where stepping would)."""
        landing = self.arrivals[0][0] if self.arrivals else math.inf
        return landing if landing < self._next_cancel else self._next_cancel

    def exhausted(self) -> bool:
        return not self.arrivals and not self.pending and self.dispatcher.upstream_done()

    def begin_pass(self, now: float) -> None:
        self.num_passes += 1
        if self.pending:
            self.dispatcher.take_blocks(self, now)
        super().begin_pass(now)


class DisaggregatedDispatcher(Dispatcher):
    """A disaggregated cluster: arrivals routed to the prefill pool, hand-offs to the decode
    pool, KV transfers between them, and what each request went through (by request id).

    Args:
        table: The workload's requests.
        route: Picks a prefill instance for an arrival.
        decode_route: Picks a decode instance for a hand-off (indices into the decode pool).
        overhead: Seconds between routing an arrival and its delivery.
        transfer: How long KV takes between the pools.
        decode_reject_reason: Why a request can never decode on the decode pool ('' if it
            can): such a request is rejected at its arrival.
    """

    def __init__(
        self,
        table: RequestTable,
        route: Route,
        decode_route: Route,
        overhead: float,
        transfer: KVTransferModel,
        decode_reject_reason: Callable[[Request], str],
    ):
        super().__init__(table, route, overhead)
        self.runs_ahead = False  # hand-offs and KV landings reach replicas at any time
        self.decode_route = decode_route
        self.transfer = transfer
        self.decode_reject_reason = decode_reject_reason
        self.prefill_links: list[PrefillLink] = []
        self.decode_links: list[DecodeLink] = []
        self.decode_views: list[ReplicaView] = []
        self.handoffs: list[Transfer] = []
        self.rejected = RequestLog()
        """Requests no decode instance could ever hold, rejected at their arrival."""
        self.num_upstream = 0
        """Requests on a prefill instance or waiting for their decode route."""
        n = self.source.num_total
        self.prefill_replica = np.full(n, -1, dtype=np.int64)
        self.decode_replica = np.full(n, -1, dtype=np.int64)
        self.prefill_iteration = np.full(n, -1, dtype=np.int64)
        """The prefill instance's iteration that sampled a handed-off request's first token."""
        self.kv_wait = np.full(n, math.nan)
        """From the prefill's end to the transfer's start on the link, s."""
        self.kv_transfer = np.full(n, math.nan)
        """From the transfer's start on the link to the KV's landing, s."""
        self.kv_bytes = np.zeros(n)

    def add_pools(
        self, prefill: Sequence[tuple[str, int]], decode: Sequence[tuple[str, int]]
    ) -> list[ReplicaLink]:
        """The links of the prefill instances (replicas 0..P-1), then the decode instances
        (P..P+D-1), each given as (hardware name, tensor parallel size)."""
        n = len(prefill) + len(decode)
        for index, (name, tp) in enumerate(prefill):
            link = PrefillLink(self, index, n)
            self.prefill_links.append(link)
            self.views.append(ReplicaView(link, name, tp))
        for position, (name, tp) in enumerate(decode):
            decode_link = DecodeLink(self, len(prefill) + position, n)
            self.decode_links.append(decode_link)
            view = ReplicaView(decode_link, name, tp)
            view.index = position  # the decode router answers with a position in its pool
            self.decode_views.append(view)
        self.links = [*self.prefill_links, *self.decode_links]
        return self.links

    # ------------------------------------------------------------------ routing
    def _route(self, request: Request, now: float) -> None:
        reason = self.decode_reject_reason(request)
        if reason:
            request.status = RequestStatus.REJECTED
            request.reject_reason = f"decode instances: {reason}"
            self.rejected.add(request)
            self.on_left(request, now)
            return
        self.num_upstream += 1
        super()._route(request, now)

    def hand_off(self, transfer: Transfer, now: float) -> None:
        """A prefill instance is done with ``transfer``'s request at ``now`` (the end of an
        iteration): route it at this instant's routing step."""
        self.handoffs.append(transfer)
        self.sleeper.wake_at(now)

    def route_due(self, now: float) -> None:
        if self.handoffs:
            handoffs, self.handoffs = self.handoffs, []
            for transfer in handoffs:
                self._route_decode(transfer, now)
        super().route_due(now)

    def _route_decode(self, transfer: Transfer, now: float) -> None:
        request = transfer.request
        self.now = now
        self.request = request
        self.stamp += 1
        position = self.decode_route(request, self.decode_views, now)
        self.request = None
        link = self.decode_links[position]
        self.decode_replica[request.request_id] = link.index
        link.route_here(transfer, now)
        self.upstream_left(now)

    # ------------------------------------------------------------------ transfers
    def take_blocks(self, link: DecodeLink, now: float) -> None:
        """At ``link``'s pass at ``now``: take KV blocks for its pending requests, first come
        first served, while they fit above the watermark, and start their transfers."""
        assert link.engine is not None
        kv = link.engine.scheduler.kv_cache
        for transfer in link.cancel_due(now):  # the client left: cancelled on delivery
            link.land(now, transfer.request)
            transfer.source.release_at(now, transfer.held_blocks)
        pending = link.pending
        model = self.transfer
        while pending:
            transfer = pending[0]
            request = transfer.request
            prompt = request.num_prompt_tokens
            need = kv.blocks_held(prompt, prompt)
            if need > kv.num_free_blocks - kv.watermark_blocks:
                return
            link.taken()
            kv.num_free_blocks -= need
            request.num_blocks = need
            source = transfer.source
            busy = link_time = model.link_time(transfer.num_tokens)
            if model.layerwise and link.num_passes == transfer.first_pass:
                # the layers streamed while the link was free during the last iteration
                overlap = min(transfer.compute_time, transfer.prefill_end - source.link_free)
                if overlap > 0:
                    busy = layerwise_exposed_time(link_time, overlap, model.num_layers)
            start = max(now, source.link_free)
            done = start + busy
            source.link_free = done
            landed = done + model.latency
            rid = request.request_id
            self.kv_wait[rid] = start - transfer.prefill_end
            self.kv_transfer[rid] = landed - start
            self.kv_bytes[rid] = transfer.num_tokens * model.bytes_per_token
            link.land(landed, request)
            source.release_at(landed, transfer.held_blocks)

    # ------------------------------------------------------------------ end of input
    def upstream_left(self, now: float) -> None:
        """A request left the prefill pool (to a decode instance, or for good)."""
        self.num_upstream -= 1
        if not self.num_upstream and self.source.exhausted():
            for link in self.decode_links:
                link.wake_waiting(now)

    def upstream_done(self) -> bool:
        """No request can still come to a decode instance that is not on its way there."""
        return not self.num_upstream and self.source.exhausted()
