"""The step loop of a pipeline-parallel engine (``parallel.pipeline_parallel_size`` P > 1).

As vLLM's virtual engines, the engine keeps up to P batches in flight, one per stage: the
scheduler forms a new batch as soon as stage 0 is free, while earlier batches are in later
stages. A request of a batch in flight is not schedulable until its batch leaves the last
stage (its next token depends on the one being computed). With fewer batches in flight than
stages, stages sit idle: the pipeline *bubble*.

**Virtual engines.** Each running request belongs to one of P virtual engines (vLLM V0's
``virtual_engine``): the one whose ``schedule()`` admitted or resumed it. A batch is one
virtual engine's ``schedule()`` over its own running requests (the others' out of sight), so
batches keep their members and never merge; ``scheduler.max_num_seqs`` and
``max_num_batched_tokens`` apply to each batch. The waiting queue and the KV pool are shared
(vLLM V0 splits the blocks evenly among virtual engines instead). When stage 0 is free, the
virtual engines without a batch in flight are asked in round-robin order; the first that
schedules something launches.

Timing of batch b, each rule tested:

- ``schedule()`` runs when stage 0 is free (it finished batch b-1), fewer than P batches are
  in flight and something is schedulable; an arrival, a cancellation or a batch leaving the
  pipeline at that instant is seen first (a leaving batch's ``update_from_output()`` comes
  before the ``schedule()`` of the same instant).
- Stage 0 starts after the batch's CPU time (and any swap copies); stage s starts when stage
  s-1 finished batch b and its activations arrived (``transfer_time``) and stage s finished
  batch b-1; each stage takes the time its layers cost
  (:class:`~batchsim.cost.pipeline.PipelineCostModel`).
- ``update_from_output()`` of batch b happens when it leaves the last stage; its row in
  ``iterations.csv`` runs from its ``schedule()`` to then, and its ``gpu_time_ms`` is the
  sum of its stage times and transfers. Batches leave in the order they entered.
- ``async_scheduling`` does not apply (each batch pays its CPU time before stage 0), and
  decode stretches are not fast-forwarded: every batch is one ``schedule()`` and one row
  (a stretch would interleave P batches, which the argument of :mod:`batchsim.engine.stretch`
  does not cover).

**Speed.** Each virtual engine has its own decode cohort (:mod:`batchsim.engine.cohort`),
the scheduler's while that engine schedules or applies a batch, so a batch of decodes is
built and applied in constant time whatever its size. When nothing waits, nothing is swapped
out and every running request of a virtual engine is a member of its cohort, that engine's
``schedule()`` can only return the cohort alone: the engine builds that output itself (the
same object the scheduler would return, :meth:`PipelineEngine._cohort_output`), without
showing the scheduler a filtered running list. And, as the single engine's loop does, the
loop sleeps on SimPy's clock only when an arrival or a cancellation is due by its next wake.
The results are those of the general path (tested against it with
``engine.fast_forward: false``, which turns both off).

``bubble_fraction``: over the time the engine holds at least one request (waiting, running or
in flight), the fraction of stage-time during which a stage runs no batch,
``1 - sum over stages of busy time / (P x that time)``. CPU time and transfers count as idle.
With one request alone it is ``1 - sum of stage times / (P x iteration time)``, about
``(P-1)/P``; at saturation it tends to 0.

The built-in ``continuous`` and ``chunked_prefill`` policies run with a pipeline, on one
engine (not as a replica of a cluster).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from batchsim.cost.costs import StepCost
from batchsim.cost.pipeline import PipelineCostModel
from batchsim.cost.shapes import BatchShape
from batchsim.engine.cohort import Cohort
from batchsim.engine.engine import Engine
from batchsim.engine.options import EngineOptions
from batchsim.engine.request import Request
from batchsim.engine.runs import run_row
from batchsim.errors import ConfigError
from batchsim.scheduler.fast_forward import declaration
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import CohortBatch, SchedulerOutput, StepTimes
from batchsim.workload import RequestTable

__all__ = ["PipelineEngine"]

_new_tuple = tuple.__new__  # a named tuple without its Python-level __new__
MAX_PREEMPTIONS_WITHOUT_TOKEN = 10_000
"""Preemptions in a row, with no batch sampling a token, before a pipeline is deemed unable
to make progress (:meth:`PipelineEngine._check_progress`)."""


class _Batch:
    """A batch in flight."""

    def __init__(self, output: SchedulerOutput, times: StepTimes, virtual_engine: int):
        self.output = output
        self.times = times
        self.virtual_engine = virtual_engine


class PipelineEngine(Engine):
    """Runs one simulation of an engine whose layers are split into pipeline stages.

    Args:
        scheduler: The batching policy (``continuous`` or ``chunked_prefill``).
        pipeline: Prices each batch on each stage and the transfers between stages.
        table: The workload's requests.
        options: CPU overhead and loop settings.
        on_step: As :class:`~batchsim.engine.engine.Engine`'s.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        pipeline: PipelineCostModel,
        table: RequestTable,
        options: EngineOptions,
        on_step: Callable[[Engine], None] | None = None,
    ):
        super().__init__(scheduler, pipeline.stages[0], table, options, on_step)
        self.pipeline = pipeline
        self.num_stages = pipeline.num_stages
        self._stages = list(pipeline.stages)
        self.fast_forward = False
        # A decode cohort advances every member at once, and a batch in flight holds one
        # virtual engine's requests: each virtual engine has its own cohort, the scheduler's
        # while that engine schedules or applies a batch (None in between).
        shared = scheduler._cohort
        self._cohorts: list[Cohort | None] = [
            None
            if shared is None
            else Cohort(shared.block_size, shared.window, shared.groups, shared.slide)
            for _ in range(self.num_stages)
        ]
        scheduler._cohort = None
        self._quick = (
            options.fast_forward
            and shared is not None
            and not self.guarded
            and declaration(type(scheduler)).drains_cohort
            and scheduler._prefix is None
            and scheduler.kv_cache.window is None
        )
        """Build a virtual engine's cohort-alone batch without the scheduler when that is all
        its ``schedule()`` could return (see the module docstring)."""
        self._budget = scheduler.config.max_num_batched_tokens
        self.stage_free = [0.0] * self.num_stages
        """When each stage finishes the last batch it was given (s)."""
        self.stage_busy_time = 0.0
        """Sum over stages of the time they ran batches (s)."""
        self.work_time = 0.0
        """Time during which the engine held at least one request (s)."""
        self._in_flight: deque[_Batch] = deque()
        self._engine_of: dict[int, int] = {}  # id() of a running request -> its virtual engine
        self._own: list[list[Request]] = [[] for _ in range(self.num_stages)]
        """Each virtual engine's running requests, in the scheduler's running order."""
        self._busy: set[int] = set()  # virtual engines with a batch in flight
        self._next_engine = 0  # where the round robin over virtual engines goes on
        self._transfers: dict[int, float] = {}  # rows -> transfer_time(rows)
        self._preempted_idle = 0  # preemptions since a batch last sampled a token

    @property
    def bubble_fraction(self) -> float:
        """Idle stage-time while the engine held work (see the module docstring)."""
        if self.work_time <= 0:
            return 0.0
        return max(0.0, 1.0 - self.stage_busy_time / (self.num_stages * self.work_time))

    def _step_loop(self):  # a SimPy process
        env = self.env
        scheduler = self.scheduler
        on_step = self.on_step
        in_flight = self._in_flight
        free = self.stage_free
        num_stages = self.num_stages
        # the loop's own clock, as the single engine's (SimPy's sleeps it when an arrival or
        # a cancellation is due by the next wake; otherwise nothing else can happen meanwhile)
        now = env.now
        while True:
            if on_step is not None:
                on_step(self)
            while in_flight and in_flight[0].times.end <= now:
                self._leave(in_flight.popleft())
            self.take_arrivals(now)
            if free[0] <= now:
                for v in self._ready_engines():
                    output = self._schedule_visible(now, v)
                    if output.preempted or output.num_output_tokens:
                        self._check_progress(output)
                    if not output.is_empty:
                        self._launch(output, now, v)
                        self._next_engine = (v + 1) % num_stages
                        break
            wake = in_flight[0].times.end if in_flight else math.inf
            if free[0] > now and self._ready_engines():
                wake = min(wake, free[0])  # stage 0 takes the next batch when it is free
            else:  # nothing to run before an arrival, a cancellation, a timer or a batch
                wake = min(wake, self._next_event_time(now))
            if wake == math.inf:
                if scheduler.has_unfinished_requests():
                    self._stuck()
                return
            if in_flight or scheduler.has_unfinished_requests():
                self.work_time += wake - now
            if not self._quick or wake >= self._next_external_time():
                yield env.timeout(max(0.0, wake - env.now))
            now = wake

    def _ready_engines(self) -> list[int]:
        """The virtual engines that may schedule something, in round-robin order: without a
        batch in flight, and with running requests (or requests waiting or swapped out)."""
        num_stages = self.num_stages
        busy = self._busy
        if len(busy) == num_stages:
            return []
        s = self.scheduler
        anyone = bool(s.waiting or s.swapped)
        own = self._own
        out = []
        for k in range(num_stages):
            v = (self._next_engine + k) % num_stages
            if v not in busy and (anyone or own[v]):
                out.append(v)
        return out

    def _schedule_visible(self, now: float, engine: int) -> SchedulerOutput:
        """``schedule_iteration()`` of virtual engine ``engine``: the running requests of the
        others out of sight; the requests it admits or resumes become its own."""
        if self._quick:
            output = self._cohort_output(engine)
            if output is not None:
                return output
        scheduler = self.scheduler
        owner = self._engine_of
        before = scheduler.running
        scheduler.running = self._own[engine].copy()
        scheduler._cohort = self._cohorts[engine]
        try:
            output = scheduler.schedule_iteration(now)
        finally:
            scheduler._cohort = None
            # back in their order; requests admitted or resumed now go last
            after = scheduler.running
            kept = {id(r) for r in after}
            known = {id(r) for r in before}
            new = [r for r in after if id(r) not in known]
            for r in new:
                owner[id(r)] = engine
            out = []  # the engine's requests preempted now: running no more
            for r in before:
                if owner[id(r)] != engine or id(r) in kept:
                    out.append(r)
                else:
                    del owner[id(r)]
            running = scheduler.running = out + new
            self._own[engine] = [r for r in running if owner[id(r)] == engine]
        return output

    def _check_progress(self, output: SchedulerOutput) -> None:
        """Stop a run that can never end: the virtual engines preempt one another's prompts
        by turns. Each preempts only its own requests (the others' are in flight), so when
        the KV cache holds less than a prompt beside the other batches' partial prompts, a
        preempted prompt is admitted again and preempted again, and no token is ever
        sampled."""
        if output.num_output_tokens:
            self._preempted_idle = 0
            return
        self._preempted_idle += len(output.preempted)
        if self._preempted_idle > MAX_PREEMPTIONS_WITHOUT_TOKEN:
            kv = self.kv_cache
            raise ConfigError(
                f"the KV cache ({kv.num_blocks} blocks of {kv.block_size} tokens) is too small "
                f"for {self.num_stages} pipeline batches in flight: "
                f"{MAX_PREEMPTIONS_WITHOUT_TOKEN:,} preemptions in a row without a sampled "
                "token (the virtual engines' partial prompts evict one another); give the "
                "engine KV blocks for a whole prompt beside the other batches' or use fewer "
                "stages"
            )

    def _cohort_output(self, engine: int) -> SchedulerOutput | None:
        """What ``schedule_iteration()`` of virtual engine ``engine`` returns when that can only
        be its cohort alone (nothing waits, is swapped out or transferred, and each of its
        running requests is a member, within the token budget and the free KV blocks): the
        same output, built as the policy builds it, the same blocks taken. None otherwise
        (nothing changed)."""
        scheduler = self.scheduler
        cohort = self._cohorts[engine]
        own = self._own[engine]
        n = len(own)
        if (
            cohort is None
            or cohort.n != n
            or not 0 < n <= self._budget
            or scheduler.waiting
            or scheduler.swapped
            or scheduler.transferred
        ):
            return None
        kv = self.kv_cache
        need = 0 if cohort.ahead else cohort.crossing()
        if need > kv.num_free_blocks:
            return None  # the policy would preempt
        kv.num_free_blocks -= need
        cohort.ahead = 1
        requests = own.copy()
        batch = CohortBatch(cohort, cohort.version, n, [], n)
        kv_read = cohort.context_tokens()
        shape = _new_tuple(BatchShape, (n, 0, n, 0, n, kv_read, kv_read + n, 0, 0, None, None))
        batch.requests, batch.size = requests, n
        return SchedulerOutput(requests, [1] * n, shape, 0, n, n, n, [], batch=batch)

    def _launch(self, output: SchedulerOutput, now: float, engine: int) -> None:
        """Price ``output`` of virtual engine ``engine`` on every stage and put it in
        flight."""
        shape = output.shape
        costs = [stage.step_cost(shape) for stage in self._stages]
        rows = shape.num_prefill_tokens + shape.num_decode_tokens + shape.num_padding_tokens
        transfer = self._transfers.get(rows)
        if transfer is None:
            transfer = self._transfers[rows] = self.pipeline.transfer_time(rows)
        cpu = self.cpu_time(output.num_seqs)
        swap = (output.num_swap_in_blocks + output.num_swap_out_blocks) * (
            self.options.swap_time_per_block
        )
        free = self.stage_free
        ready = now + cpu + swap
        busy = 0.0
        for s, cost in enumerate(costs):
            if s:
                ready += transfer
            start = ready if ready > free[s] else free[s]
            ready = free[s] = start + cost.time
            busy += cost.time
        self.stage_busy_time += busy
        total = _new_tuple(
            StepCost,
            (
                busy + transfer * (len(costs) - 1),
                math.fsum([c.flops for c in costs]),
                math.fsum([c.bytes for c in costs]),
                math.fsum([c.weight_bytes for c in costs]),
                math.fsum([c.kv_bytes for c in costs]),
                max([c.margin for c in costs]),
            ),
        )
        first = self.iterations.num_rows
        self.iterations.append(
            run_row(now, 1, ready - now, total, self.batch_row(output, cpu)),
            self.scheduler.kv_cache.usage,
        )
        times = _new_tuple(StepTimes, (first, now, ready, 1))
        if self.slot_log is not None:
            self.slot_log.record(output, self.scheduler.running, first, 1)
        self._busy.add(engine)
        self._in_flight.append(_Batch(output, times, engine))

    def leave(self, request: Request, now: float) -> None:
        engine = self._engine_of.pop(id(request), None)
        if engine is not None:  # it was running
            self._own[engine].remove(request)
        super().leave(request, now)

    def _leave(self, batch: _Batch) -> None:
        """``batch`` left the last stage: apply it."""
        self._busy.discard(batch.virtual_engine)
        times = batch.times
        self.last_end = times.end
        scheduler = self.scheduler
        scheduler._cohort = self._cohorts[batch.virtual_engine]
        try:
            finished = scheduler.update_from_output(batch.output, times)
        finally:
            scheduler._cohort = None
        for request in finished:
            self.leave(request, times.end)
