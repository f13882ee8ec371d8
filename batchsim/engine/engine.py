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
- **Decode stretches.** When ``schedule()`` returns only decodes, the scheduler says how many
  identical iterations may follow (until a request finishes or KV blocks run short); the engine
  cuts that at the next arrival, cancellation or timer and advances in one timeout. The
  iterations differ only in context; the cost model says for how many of them the time stays
  the same (until the attention kernel streams one more KV block), and each such run is priced
  and logged once. The log expands runs into the individual iterations' records.
  ``fast_forward=False`` runs them one at a time (same results).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from batchsim.cost import IterationCost, RooflineCostModel
from batchsim.engine.request import Request
from batchsim.metrics.logs import IterationLog, RequestLog
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes
from batchsim.workload import RequestTable


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
        else:
            self._arrivals = table.arrival_time

    def next_time(self) -> float:
        if self.closed_loop:
            return self._heap[0][0] if self._heap else math.inf
        if self.next_index < self.num_total:
            return float(self._arrivals[self.next_index])
        return math.inf

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
        arrivals = self._arrivals
        n = self.num_total
        i = self.next_index
        while i < n and arrivals[i] <= now:
            out.append(self._make(i, float(arrivals[i]), -1))
            i += 1
        self.next_index = i
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
        )


class Engine:
    """Runs one simulation.

    Args:
        scheduler: The batching policy, holding the KV cache.
        cost_model: Prices each iteration.
        table: The workload's requests.
        options: CPU overhead and loop settings.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        cost_model: RooflineCostModel,
        table: RequestTable,
        options: EngineOptions,
    ):
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.options = options
        self.source = ArrivalSource(table)
        self.request_log = RequestLog()
        """Requests that left (finished, rejected, cancelled), one row each."""
        self.num_arrived = 0
        self.iterations = IterationLog(cost_model.decode_token_slopes)
        self._cancels: list[tuple[float, int, Request]] = []
        self._last_end = -math.inf
        self.env = simpy.Environment()

    def run(self) -> None:
        """Simulate until every request has finished, been rejected or been cancelled."""
        self.env.process(self._step_loop())
        self.env.run()

    # ----------------------------------------------------------------------- internals
    def _deliver_due(self, now: float) -> None:
        scheduler = self.scheduler
        for request in self.source.pop_due(now):
            self.num_arrived += 1
            if scheduler.add_request(request):
                if request.cancel_time != math.inf:
                    heapq.heappush(
                        self._cancels, (request.cancel_time, request.request_id, request)
                    )
            else:
                self._left(request, now)
        while self._cancels and self._cancels[0][0] <= now:
            request = heapq.heappop(self._cancels)[2]
            if not request.status.is_final:
                scheduler.cancel(request, now)
                self._left(request, now)

    def _left(self, request: Request, now: float) -> None:
        """``request`` reached a final status at ``now``."""
        self.request_log.add(request)
        self.source.on_left(request, now)

    def _next_event_time(self, now: float) -> float:
        t = self.source.next_time()
        if self._cancels:
            t = min(t, self._cancels[0][0])
        timer = self.scheduler.next_timer(now)
        if timer is not None:
            t = min(t, timer)
        return t

    def _cpu_time(self, num_seqs: int) -> float:
        o = self.options
        return o.cpu_overhead_base + o.cpu_overhead_per_seq * num_seqs

    def _step_loop(self):  # a SimPy process
        env = self.env
        scheduler = self.scheduler
        source = self.source
        while True:
            now = env.now
            self._deliver_due(now)
            scheduler.arrivals_pending = not source.exhausted()
            output = scheduler.schedule(now)
            if output.is_empty:
                wake = self._next_event_time(now)
                if wake == math.inf:
                    assert not scheduler.has_unfinished_requests(), (
                        f"{type(scheduler).__name__} holds requests but schedules nothing and "
                        "waits for no event"
                    )
                    return
                yield env.timeout(wake - now)
                continue
            num_steps = scheduler.max_repeat_steps(output) if self.options.fast_forward else 1
            if num_steps > 1:
                times = self._price_stretch(output, now, num_steps)
            else:
                times = self._price_step(output, now)
            yield env.timeout(times.last_end - now)
            self._last_end = env.now
            for request in scheduler.update_from_output(output, times):
                self._left(request, times.last_end)

    def _batch_row(self, output: SchedulerOutput, cpu: float) -> tuple:
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
        )

    def _duration(self, cpu: float, gpu: float, overlap: bool) -> float:
        """Iteration time: CPU work then the GPU step (``overlap``: the CPU work hides behind
        the previous GPU step)."""
        if overlap:
            return cpu if cpu > gpu else gpu
        return cpu + gpu

    def _price_step(self, output: SchedulerOutput, now: float) -> StepTimes:
        cost = self.cost_model.estimate(output.shape)
        cpu = self._cpu_time(output.num_seqs)
        swap = (output.num_swap_in_blocks + output.num_swap_out_blocks) * (
            self.options.swap_time_per_block
        )
        gpu = cost.time
        overlap = self.options.async_scheduling and now == self._last_end
        duration = self._duration(cpu, gpu + swap, overlap)
        self.iterations.append(
            _run_row(now, 1, duration, cost, self._batch_row(output, cpu)),
            self.scheduler.kv_cache.usage,
        )
        end = now + duration
        return StepTimes(end, end)

    def _price_stretch(self, output: SchedulerOutput, now: float, num_steps: int) -> StepTimes:
        """Run up to ``num_steps`` identical decode iterations; stop at the first one that
        ends at or after the next external event.

        Step k differs from step 0 only in context: every request has k more cached tokens.
        The cost model says for how many steps the iteration time stays the same (until the
        attention kernel streams one more KV block); each such run is priced and logged once.
        """
        requests = output.requests
        window = self.scheduler.window
        if self.cost_model.ideal or (
            window is not None and max(r.num_computed_tokens for r in requests) + num_steps > window
        ):
            return self._price_stretch_arrays(output, now, num_steps)
        shape = output.shape
        n = len(requests)
        cpu = self._cpu_time(n)
        event = self._next_event_time(now)
        batch = self._batch_row(output, cpu)
        overlap = self.options.async_scheduling
        back_to_back = now == self._last_end
        runs: list[tuple] = []
        later: list[tuple[float, float, int, int]] = []
        start = now
        done = 0
        while done < num_steps:
            at = shape if done == 0 else shape.with_decode_context(shape.kv_read_tokens + n * done)
            cost, same = self.cost_model.decode_run(at)
            gpu = cost.time
            if overlap and done == 0 and not back_to_back:  # nothing to hide the CPU behind
                same = 1
            duration = self._duration(cpu, gpu, overlap and (done > 0 or back_to_back))
            steps = min(same, num_steps - done)
            cut = start + duration * steps >= event
            if cut:
                steps = _steps_until(start, duration, event, steps)
            runs.append(_run_row(start, steps, duration, cost, batch))
            # the ends of this run are start + j x duration, j = 1..steps
            if done:
                later.append((start, duration, 1, steps))
            elif steps > 1:  # the stretch's first end is StepTimes.first_end
                later.append((start, duration, 2, steps))
            start = start + duration * steps
            done += steps
            if cut:
                break
        self.iterations.add_runs(runs, self._stretch_usage(requests, done))
        return StepTimes(now + runs[0][2], start, done, later)

    def _stretch_usage(self, requests: list[Request], num_steps: int) -> np.ndarray | float:
        """KV-cache usage at each step of a decode stretch of ``requests``.

        Blocks are allocated lazily, one per block_size tokens: a request with c cached
        tokens needs floor((c mod block_size + k) / block_size) more blocks by step k.
        """
        kv = self.scheduler.kv_cache
        if self.scheduler.reserves_full_sequence:
            return kv.usage
        block = kv.block_size
        counts = [0] * (block + 1)
        for r in requests:
            counts[r.num_computed_tokens % block] += 1
        at_least = list(itertools.accumulate(reversed(counts)))[::-1]  # #{offset >= j}
        n = len(requests)
        k = np.arange(num_steps)
        extra = n * (k // block) + np.array(at_least)[block - k % block]
        return (kv.num_used_blocks + extra) / kv.num_blocks

    def _price_stretch_arrays(
        self, output: SchedulerOutput, now: float, num_steps: int
    ) -> StepTimes:
        """:meth:`_price_stretch` for contexts that a sliding window caps (or the ideal
        roofline): steps priced in vectorized chunks and logged one by one."""
        cpu = self._cpu_time(len(output.requests))
        event = self._next_event_time(now)
        pieces: list[tuple] = []
        done = 0
        chunk = _FIRST_CHUNK
        start = now
        while done < num_steps:
            size = min(chunk, num_steps - done)
            cost, durations = self._stretch_chunk(output, cpu, done, size, start == self._last_end)
            ends = np.cumsum(durations)
            ends += start
            keep = size
            if event < ends[-1]:
                keep = int(np.searchsorted(ends, event, side="left")) + 1
            starts = np.concatenate(([start], ends[: keep - 1]))
            pieces.append((starts, cost, durations, ends, keep))
            done += keep
            if keep < size:
                break
            start = float(ends[-1])
            chunk *= 4
        batch = self._batch_row(output, cpu)
        usage = self._stretch_usage(output.requests, done)
        offset = 0
        for starts, cost, durations, _, keep in pieces:

            def cut(value: Any, keep: int = keep) -> Any:
                return value[:keep] if isinstance(value, np.ndarray) and value.ndim else value

            self.iterations.extend(
                (
                    starts,
                    1,
                    cut(durations),
                    cut(cost.time) * 1e3,
                    cut(cost.flops),
                    cut(cost.bytes),
                    cut(cost.weight_bytes),
                    cut(cost.kv_bytes),
                    cut(cost.compute_time - cost.memory_time),
                    *batch,
                ),
                keep,
                usage[offset : offset + keep] if isinstance(usage, np.ndarray) else usage,
            )
            offset += keep
        return StepTimes.from_ends(np.concatenate([p[3][: p[4]] for p in pieces]))

    def _stretch_chunk(
        self, output: SchedulerOutput, cpu: float, first: int, size: int, back_to_back: bool
    ):
        """Cost and durations of steps ``first .. first + size - 1`` of a decode stretch."""
        shape = output.shape
        requests = output.requests
        n = len(requests)
        window = self.scheduler.window
        steps = np.arange(first, first + size)
        if (
            window is not None
            and max(r.num_computed_tokens for r in requests) + first + size > window
        ):
            contexts = np.fromiter((r.num_computed_tokens for r in requests), np.int64, n)
            kv_read = np.minimum(contexts[None, :] + steps[:, None], window).sum(axis=1)
        else:
            kv_read = shape.kv_read_tokens + steps * n
        cost = self.cost_model.estimate_decode_stretch(shape, kv_read)
        gpu = cost.time
        if not isinstance(gpu, np.ndarray) or gpu.shape != (size,):
            gpu = np.full(size, gpu, dtype=float)
        if self.options.async_scheduling:
            durations = np.maximum(cpu, gpu)
            if first == 0 and not back_to_back:
                durations[0] = cpu + gpu[0]
        else:
            durations = gpu + cpu
        return cost, durations


def _run_row(start: float, steps: int, duration: float, cost: IterationCost, batch: tuple):
    """A row of :data:`~batchsim.metrics.logs.RUN_COLUMNS` + ``BATCH_COLUMNS``: ``steps``
    iterations of ``duration`` from ``start``, the first costing ``cost``."""
    return (
        start,
        steps,
        duration,
        cost.time * 1e3,
        cost.flops,
        cost.bytes,
        cost.weight_bytes,
        cost.kv_bytes,
        cost.compute_time - cost.memory_time,
        *batch,
    )


def _steps_until(start: float, duration: float, event: float, most: int) -> int:
    """The first step j in 1..most whose end ``start + duration x j`` is at or after
    ``event`` (the caller knows step ``most`` is)."""
    if duration <= 0:
        return most
    j = min(most, max(1, math.ceil((event - start) / duration)))
    while j > 1 and start + duration * (j - 1) >= event:
        j -= 1
    while j < most and start + duration * j < event:
        j += 1
    return j


_FIRST_CHUNK = 32
"""Decode steps priced in the first vectorized call of a stretch (then 4x more per call)."""
