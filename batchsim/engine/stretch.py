"""Fast-forward: run many identical decode iterations of one batch as one step.

When a policy returns a decode-only batch and nothing else can change before the next
request finishes, the KV cache runs short or an external event (arrival, cancellation,
timer) happens, the following iterations are the same batch with every context one token
longer. How many iterations that is, is :mod:`batchsim.engine.repeat`'s question; this module
runs them:

- :class:`StretchRunner` — prices the stretch and logs it, for the engine it runs for (a
  :class:`StretchHost`: what fast-forward may ask of an engine, and nothing else). The
  iterations differ only in context, and their time changes only when the attention kernel
  streams one more KV block
  (the cost model's :meth:`~batchsim.cost.RooflineCostModel.decode_run`), so a stretch is
  priced and logged as a few *runs* of equal time whose FLOPs and bytes grow by a fixed step.
  The KV blocks the requests need are taken in one call,
  :meth:`~batchsim.engine.kv_cache.KVCacheManager.grow`, when the scheduler applies the
  stretch. When the batch is a built-in policy's cohort
  (:mod:`batchsim.engine.cohort`), the stretch's length, KV growth and usage come from the
  cohort's counts by block offset, whatever the batch size.
- :meth:`StretchRunner.drain` — when nothing waits and no arrival or cancellation is due,
  the cohort's stretches run on one after another, each member leaving at the end of the
  stretch that samples its last token, without a pass of the engine per stretch (policies
  that declare ``drains_cohort`` (:mod:`batchsim.scheduler.fast_forward`), one engine on its own).
  Each stretch is priced, logged and applied by the same helpers as a pass's
  (:func:`~batchsim.engine.repeat.cohort_repeat`, ``_price_runs``, the scheduler's
  ``_advance_cohort``).
- Prompt chunks: chunked prefill's iterations of the cohort's decodes and one prompt's
  chunk that takes the rest of the token budget repeat too (nothing can be admitted), each
  chunk as long and further along the prompt, up to its last chunk
  (:meth:`~batchsim.scheduler.Scheduler.prompt_chunk_repeat`, honoured only next to the
  ``schedule()`` that promises it). Their times are not equal, so each is priced on its own
  (:meth:`~batchsim.cost.RooflineCostModel.step_cost`, as stepping does) and logged as a
  run of one.

``engine.fast_forward: false`` steps one iteration at a time; the results are identical
(tested row by row).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from batchsim.cost import BatchShape, IterationCost, RooflineCostModel
from batchsim.cost.model import as_int
from batchsim.cost.shapes import cuda_graph_padded
from batchsim.engine.cohort import Cohort
from batchsim.engine.kv_cache import KVCacheManager, UsageRamp, expand_usage_ramps
from batchsim.engine.options import EngineOptions
from batchsim.engine.repeat import cohort_repeat
from batchsim.engine.request import Request
from batchsim.engine.runs import NO_DELTAS, run_row, run_until
from batchsim.scheduler.cohorts import prompt_chunk_of
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput, StepTimes

_FIRST_CHUNK = 32
"""Decode steps priced in the first vectorized call of a windowed stretch (then 4x more)."""
_new_shape = tuple.__new__
"""Builds a :class:`BatchShape` of all its fields without its Python-level ``__new__``."""


class IterationSink(Protocol):
    """Where a stretch's iterations go: the engine's :class:`IterationLog`, or, for a
    replica of a cluster, a plan logged when the stretch ends
    (:class:`~batchsim.cluster.dispatch.StretchPlan`)."""

    @property
    def num_rows(self) -> int: ...

    def add_runs(
        self, runs: list[tuple], kv_cache_usage: Any, num_steps: int | None = None
    ) -> None: ...

    def extend(self, values: tuple, n: int, kv_cache_usage: Any) -> None: ...


class StretchHost(Protocol):
    """What fast-forward needs of the engine it runs stretches for
    (:class:`~batchsim.engine.engine.Engine` is one)."""

    scheduler: Scheduler
    kv_cache: KVCacheManager
    """The scheduler's block pool."""
    cost_model: RooflineCostModel
    options: EngineOptions
    on_step: Any
    """Called with the engine before every pass (a progress line), or None."""
    last_end: float
    """The end of the engine's last iteration (s): a drain moves it on."""

    @property
    def is_replica(self) -> bool:
        """A replica of a cluster: its router hands arrivals over between passes."""
        ...

    def cpu_time(self, num_seqs: int) -> float:
        """CPU time of an iteration of ``num_seqs`` requests (s)."""
        ...

    def back_to_back(self, start: float) -> bool:
        """An iteration starting at ``start`` follows the previous one without a gap."""
        ...

    def batch_row(self, output: SchedulerOutput, cpu: float) -> tuple:
        """The batch columns of an iteration's row."""
        ...

    def take_arrivals(self, now: float) -> None:
        """A pass's first step at ``now``: hand the requests due to the scheduler."""
        ...

    def next_arrival_time(self) -> float: ...

    def next_cancel_time(self) -> float: ...

    def next_other_event_time(self, now: float) -> float:
        """The next cancellation or policy timer after ``now``."""
        ...

    def leave(self, request: Request, now: float) -> None:
        """``request`` reached a final status at ``now``."""
        ...


class StretchRunner:
    """Prices and logs decode stretches for a :class:`StretchHost` (the engine)."""

    def __init__(self, engine: StretchHost, log: IterationSink):
        self.engine = engine
        self.cost_model: RooflineCostModel = engine.cost_model
        self.log = log
        """Where a pass's stretches go: the engine's log, or a replica's plan (logged when
        the stretch ends: a routed request may cut it)."""
        self.records = log
        """The engine's own log, where drained stretches go (nothing can cut them)."""
        self.planned: tuple[StepTimes, Cohort, list[Request]] | None = None
        """A replica's drained stretch that reaches its horizon, planned and not applied:
        (its times, the cohort, the running list it runs); see :meth:`drain`."""
        self._deltas: dict[tuple[int, int], tuple[float, float, float, float]] = {}
        """Per (decode rows, run mode): :meth:`_mode_deltas`."""
        self._pure_rows: dict[tuple[int, int], tuple[float, tuple]] = {}  # drain(): CPU, row
        # What fast-forward did (read by tests and benchmarks; no result depends on them).
        self.num_stretches = 0
        """Stretches run from a pass of the engine (:meth:`run`)."""
        self.num_chunk_stretches = 0
        """Of those, stretches of prompt chunks."""
        self.num_stepwise_stretches = 0
        """Of those, stretches priced step by step (a sliding window, the ideal roofline)."""
        self.num_drained_stretches = 0
        """Stretches run by :meth:`drain`."""
        self.num_drained_finished = 0
        """Requests that finished inside drained stretches."""
        self.num_arrival_passes = 0
        """Passes' arrivals taken inside stretches of prompt chunks (the stretch went on)."""

    def run(self, output: SchedulerOutput, now: float, num_steps: int, event: float) -> StepTimes:
        """Run up to ``num_steps`` iterations of the decode-only ``output`` from ``now``;
        stop at the first one that ends at or after the external ``event`` time."""
        engine = self.engine
        first = self.log.num_rows
        self.num_stretches += 1
        if output.num_prefill_seqs:
            self.num_chunk_stretches += 1
            done, end = self._run_chunks(output, now, num_steps, event)
            return StepTimes(first, now, end, done)
        window = engine.scheduler.window
        if window is None:  # a hybrid model's sliding-window layers' (runs need no window cut)
            window = engine.kv_cache.hybrid_window
        if self.cost_model.ideal:
            self.num_stepwise_stretches += 1
            done, end = self._run_arrays(output, now, num_steps, event)
        elif window is not None and _past_window(engine.scheduler, output):
            # every member reads its whole window: each step costs the same (a window on
            # every layer), or grows in the full-attention layers alone (a hybrid model)
            mode = _CONSTANT if engine.scheduler.window is not None else _FULL_LAYERS_GROW
            done, end = self._run_runs(output, now, num_steps, event, mode)
        elif (
            window is not None
            and max(max(output.context_tokens), output.padding_context) + num_steps >= window
        ):
            self.num_stepwise_stretches += 1
            done, end = self._run_arrays(output, now, num_steps, event)
        else:
            done, end = self._run_runs(output, now, num_steps, event)
        return StepTimes(first, now, end, done)

    def _run_runs(
        self, output: SchedulerOutput, now: float, num_steps: int, event: float, mode: int = 0
    ) -> tuple[int, float]:
        """Steps priced as runs of equal time (contexts that no window caps, or that all
        fill it: ``mode``, see :meth:`_price_runs`)."""
        engine = self.engine
        cpu = engine.cpu_time(len(output.requests))
        runs, done, end = self._price_runs(
            output.shape, cpu, engine.batch_row(output, cpu), now, num_steps, event, mode
        )
        self.log.add_runs(runs, self._usage(output, done))
        return done, end

    def _price_runs(
        self,
        shape: BatchShape,
        cpu: float,
        batch: tuple,
        now: float,
        num_steps: int,
        event: float,
        mode: int = 0,
    ) -> tuple[list[tuple], int, float]:
        """The runs of up to ``num_steps`` decode iterations of ``shape`` from ``now``, cut at
        the first that ends at or after ``event``: (runs, iterations, end). ``mode``: each
        step reads one more cached token per decode (0), reads the same (``_CONSTANT``: every
        context fills a window on every layer), or one more in a hybrid model's
        full-attention layers alone (``_FULL_LAYERS_GROW``)."""
        rows = shape.num_decode_tokens + shape.num_padding_seqs
        engine = self.engine
        overlap = engine.options.async_scheduling
        back_to_back = engine.back_to_back(now)
        deltas = self._deltas.get((rows, mode))
        if deltas is None:
            deltas = self._deltas[(rows, mode)] = self._mode_deltas(rows, mode)
        price = self.cost_model.decode_run_step
        window_read = shape.window_kv_read_tokens if mode == _FULL_LAYERS_GROW else None
        runs: list[tuple] = []
        start = now
        done = 0
        while done < num_steps:
            if mode == _CONSTANT:
                cost, same = self.cost_model.step_cost(shape), num_steps
            else:
                at = (
                    shape
                    if done == 0
                    else shape.with_decode_context(shape.kv_read_tokens + rows * done, window_read)
                )
                cost, same = price(at)
            gpu = cost.time
            if overlap and (done or back_to_back):  # the CPU work hides behind the GPU
                duration = cpu if cpu > gpu else gpu
            else:
                duration = cpu + gpu
                if overlap:  # nothing to hide the CPU behind at the first step
                    same = 1
            steps = num_steps - done
            if same < steps:
                steps = same
            steps, end = run_until(start, duration, event, steps)
            cut = end >= event
            runs.append(run_row(start, steps, duration, cost, batch, deltas))
            start = end
            done += steps
            if cut:
                break
        return runs, done, start

    def _mode_deltas(self, rows: int, mode: int) -> tuple[float, float, float, float]:
        """Per-step growth of a run's totals (FLOPs, bytes, KV bytes, bound margin) for
        ``mode`` (see :meth:`_price_runs`)."""
        if mode == _CONSTANT:
            return NO_DELTAS
        model = self.cost_model
        full_only = mode == _FULL_LAYERS_GROW
        slopes = model.full_layer_token_slopes if full_only else model.decode_token_slopes
        return (
            rows * slopes.flops,
            rows * slopes.bytes,
            rows * slopes.kv_bytes,
            rows * (slopes.compute_time - slopes.memory_time),
        )

    def drain(self, now: float, event: float, cross: bool = True) -> float:
        """Run the whole cohort on from ``now``, stretch after stretch, while the next
        iteration would be the cohort and nothing else and no arrival or cancellation is due
        (before ``event``): each stretch up to its first member's last token or what the KV
        blocks allow, applied at once (its finished members leave at its end), then the next.
        The same iterations as a pass of the engine each (``schedule()``,
        :func:`repeat_limit`, :meth:`run`, ``update_from_output()``), without building their
        outputs. Returns the engine's time after the last one: at or after ``event`` if it
        was cut there, else when nothing could be drained any more. Without ``cross`` (a
        replica, whose ``event`` is its horizon), the stretch that would reach ``event`` is
        priced as a pass would price it (to its first member's last token, the KV blocks'
        limit or the replica's own next event) into the replica's plan, not applied:
        :attr:`planned` holds it for the engine, which sleeps until it ends (a routed
        request may cut it) and then applies it with the scheduler's ``_advance_cohort``."""
        engine = self.engine
        scheduler = engine.scheduler
        kv = scheduler.kv_cache
        log = self.records
        on_step = engine.on_step
        graph_max = engine.options.cuda_graph_max_batch_size
        rows = self._pure_rows
        first = log.num_rows
        while now < event:
            cohort = scheduler._cohort_iteration()
            if cohort is None:
                break
            if on_step is not None:
                on_step(engine)
            running = scheduler.running  # (a member leaving may have replaced it)
            n = cohort.n
            kv_read = cohort.context_tokens()
            shape = _new_shape(BatchShape, (n, 0, n, 0, n, kv_read, kv_read + n, 0, 0, None, None))
            if graph_max:
                shape = cuda_graph_padded(shape, graph_max)
            key = (n, shape.num_padding_tokens)
            cpu_row = rows.get(key)
            if cpu_row is None:  # the row of schedule()'s output of the cohort alone
                cpu = engine.cpu_time(n)
                output = SchedulerOutput(running, [1] * n, shape, 0, n, n, n)
                cpu_row = rows[key] = (cpu, engine.batch_row(output, cpu))
            cpu, row = cpu_row
            steps = cohort_repeat(kv, cohort, 1 << 62)
            if cross:
                runs, done, end = self._price_runs(shape, cpu, row, now, steps, event)
            else:  # to the replica's own next event, as a pass would price it
                own = min(engine.next_arrival_time(), engine.next_other_event_time(now))
                runs, done, end = self._price_runs(shape, cpu, row, now, steps, own)
            if end >= event and not cross:
                self.log.add_runs(runs, kv.usage_ramp(cohort.offsets(), cohort.window_offsets()))
                self.num_stretches += 1
                self.planned = (StepTimes(first, now, end, done), cohort, running)
                return now
            log.add_runs(runs, kv.usage_ramp(cohort.offsets(), cohort.window_offsets()), done)
            finished = scheduler._advance_cohort(cohort, first, done, end, running)
            first += done
            engine.last_end = now = end
            self.num_drained_stretches += 1
            self.num_drained_finished += len(finished)
            for request in finished:
                engine.leave(request, end)
        return now

    def _run_chunks(
        self, output: SchedulerOutput, now: float, num_steps: int, event: float
    ) -> tuple[int, float]:
        """Iterations of the cohort's decodes and one prompt's chunks of q tokens (the last
        one maybe shorter): each step reads one more cached token per decode and q more for
        the chunk, whose pairs grow by q x q; each is priced on its own, as stepping would.

        A whole chunk takes what the decodes leave of the budget, so a request arriving
        meanwhile waits without changing the iteration (:meth:`~Scheduler.prompt_chunk_repeat`):
        arrivals do not end the stretch. Each is handed to the scheduler at the start of the
        first iteration at or after it, as a pass of the engine there would; a cancellation
        or a timer ends the stretch as usual, and so does a request waiting when the prompt's
        last chunk, whose leftover budget it could take, comes."""
        engine = self.engine
        scheduler = engine.scheduler
        batch = scheduler.cohort_batch(output)
        chunk = None if batch is None else prompt_chunk_of(output, batch)
        assert batch is not None and chunk is not None, "not a stretch of prompt chunks"
        request, q = chunk
        remaining = request.num_remaining_tokens
        full = -(-remaining // q) - 1  # steps with a whole chunk
        shape = output.shape
        decodes = as_int(shape.num_decode_tokens)  # (ints: unboxed when compiled)
        computed = request.num_computed_tokens
        cpu = engine.cpu_time(len(output.requests))
        row = engine.batch_row(output, cpu)
        overlap = engine.options.async_scheduling
        back_to_back = engine.back_to_back(now)
        step_cost = self.cost_model.step_cost
        kv_step, pairs_step = decodes + q, decodes + q * q
        seqs, sampled = as_int(shape.num_seqs), as_int(shape.num_sampled_tokens)
        kv_read, pairs = as_int(shape.kv_read_tokens), as_int(shape.attn_pairs)
        member_pairs = pairs - (q * computed + q * (q + 1) // 2)
        # arrivals are handed over inside the stretch (a lone engine only: a replica's
        # router hands them over between passes)
        arrival = math.inf
        if not engine.is_replica:
            arrival = engine.next_arrival_time()
            if arrival <= event:  # the event was an arrival: end at the next other one
                event = engine.next_other_event_time(now)
        runs: list[tuple] = []
        start = now
        done = 0
        while done < num_steps:
            if done and arrival <= start:  # a pass would begin here: it takes the arrivals
                engine.take_arrivals(start)
                self.num_arrival_passes += 1
                arrival = engine.next_arrival_time()
                event = min(event, engine.next_cancel_time())  # of a request just arrived
            if done == full and scheduler.waiting:
                break  # the last chunk would leave budget to a request that arrived
            if done == full:  # the prompt's last chunk: shorter, and it samples
                last = remaining - full * q
                context = computed + full * q
                # A recomputed request's last token alone is a decode (as make_output() says)
                as_decode = last == 1 and request.num_output_tokens > 0
                at = BatchShape(
                    seqs,
                    0 if as_decode else last,
                    decodes + 1 if as_decode else decodes,
                    0,
                    sampled + 1,
                    kv_read + full * kv_step,
                    member_pairs + full * decodes + last * context + last * (last + 1) // 2,
                )
                tokens = list(output.num_scheduled_tokens)
                tokens[-1] = last
                final = SchedulerOutput(
                    output.requests,
                    tokens,
                    at,
                    num_prefill_seqs=0 if as_decode else 1,
                    num_decode_seqs=output.num_decode_seqs + as_decode,
                    num_slots=output.num_slots,
                    num_output_tokens=output.num_output_tokens + 1,
                )
                row = engine.batch_row(final, cpu)
            elif done:
                read, grown = kv_read + done * kv_step, pairs + done * pairs_step
                at = _new_shape(
                    BatchShape, (seqs, q, decodes, 0, sampled, read, grown, 0, 0, None, None)
                )
            else:
                at = shape
            cost = step_cost(at)
            gpu = cost.time
            if overlap and (done or back_to_back):
                duration = cpu if cpu > gpu else gpu
            else:
                duration = cpu + gpu
            runs.append(run_row(start, 1, duration, cost, row))
            start = start + duration
            done += 1
            if start >= event:
                break
        # KV usage at each step: the cohort's growth and the chunks' blocks
        kv = scheduler.kv_cache
        offsets = batch.cohort.offsets()  # growth_from_offsets(), inlined
        members = offsets[0]
        total = kv.num_blocks
        used = total - kv.num_free_blocks
        held, bs = request.num_blocks, kv.block_size
        usage = []
        for k in range(1, done + 1):
            blocks = -(-(computed + (k * q if k <= full else remaining)) // bs) - held
            grown = members * ((k - 1) // bs) + offsets[bs - (k - 1) % bs]
            usage.append((used + grown + (blocks if blocks > 0 else 0)) / total)
        self.log.add_runs(runs, np.array(usage))
        return done, start

    def _usage(self, output: SchedulerOutput, num_steps: int) -> Any:
        """KV-cache usage at each step (constant when admission reserved everything)."""
        scheduler = self.engine.scheduler
        if scheduler.reserves_full_sequence:
            return scheduler.kv_cache.usage
        batch = scheduler.cohort_batch(output)
        if batch is not None and batch.pure:
            cohort = batch.cohort
            return scheduler.kv_cache.usage_ramp(cohort.offsets(), cohort.window_offsets())
        return scheduler.kv_cache.usage_during_growth(output.requests, num_steps)

    def _run_arrays(
        self, output: SchedulerOutput, now: float, num_steps: int, event: float
    ) -> tuple[int, float]:
        """Steps priced in vectorized chunks and logged one by one (contexts that a sliding
        window caps, or the ideal roofline, whose time changes every step)."""
        engine = self.engine
        cpu = engine.cpu_time(output.num_seqs)
        pieces: list[tuple] = []
        done = 0
        chunk = _FIRST_CHUNK
        start = now
        while done < num_steps:
            size = min(chunk, num_steps - done)
            back_to_back = engine.back_to_back(start) if done == 0 else True
            cost, durations = self._chunk(output, cpu, done, size, back_to_back)
            # each end the previous one plus a duration, from ``start`` (as stepping adds them;
            # ``start + cumsum(durations)`` may differ in the last bits)
            ends = np.cumsum(np.concatenate(([start], durations)))[1:]
            keep = size
            if event < ends[-1]:
                keep = int(np.searchsorted(ends, event, side="left")) + 1
            starts = np.concatenate(([start], ends[: keep - 1]))
            pieces.append((starts, cost, durations, keep))
            done += keep
            start = float(ends[keep - 1])
            if start >= event or keep < size:  # (cut at the chunk's last step too)
                break
            chunk *= 4
        batch = engine.batch_row(output, cpu)
        usage = self._usage(output, done)
        if isinstance(usage, UsageRamp):
            usage = expand_usage_ramps([usage], [done])
        offset = 0
        for starts, cost, durations, keep in pieces:

            def cut(value: Any, keep: int = keep) -> Any:
                return value[:keep] if isinstance(value, np.ndarray) and value.ndim else value

            self.log.extend(
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
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    *batch,
                ),
                keep,
                usage[offset : offset + keep] if isinstance(usage, np.ndarray) else usage,
            )
            offset += keep
        return done, start

    def _chunk(
        self, output: SchedulerOutput, cpu: float, first: int, size: int, back_to_back: bool
    ) -> tuple[IterationCost, np.ndarray]:
        """Cost and durations of steps ``first .. first + size - 1`` of a decode stretch."""
        engine = self.engine
        shape = output.shape
        window, hybrid = engine.scheduler.window, engine.kv_cache.hybrid_window
        steps = np.arange(first, first + size)
        window_read = None
        if _past_window(engine.scheduler, output):  # the cohort alone, every member past W
            if window is not None:  # each reads W - 1 cached keys at every step
                kv_read = np.full(size, shape.kv_read_tokens, dtype=np.int64)
            else:  # the full-attention layers' reads grow, the sliding ones' stay
                kv_read = shape.kv_read_tokens + steps * shape.num_decode_rows
                window_read = np.full(size, shape.window_kv_read_tokens, dtype=np.int64)
        else:
            if window is not None or hybrid is not None:
                contexts = np.array(output.context_tokens, dtype=np.int64)
                if shape.num_padding_seqs:
                    padding = np.full(int(shape.num_padding_seqs), output.padding_context)
                    contexts = np.concatenate((contexts, padding))
                grown = contexts[None, :] + steps[:, None]
                if hybrid is not None:  # a hybrid model's sliding-window layers
                    window_read = np.minimum(grown, hybrid - 1).sum(axis=1)
            if window is not None:
                kv_read = np.minimum(grown, window - 1).sum(axis=1)
            else:
                kv_read = shape.kv_read_tokens + steps * shape.num_decode_rows
        cost = self.cost_model.estimate_decode_stretch(shape, kv_read, window_read)
        gpu = cost.time
        if not isinstance(gpu, np.ndarray) or gpu.shape != (size,):
            gpu = np.full(size, gpu, dtype=float)
        if engine.options.async_scheduling:
            durations = np.maximum(cpu, gpu)
            if first == 0 and not back_to_back:
                durations[0] = cpu + gpu[0]
        else:
            durations = gpu + cpu
        return cost, durations


def _past_window(scheduler: Scheduler, output: SchedulerOutput) -> bool:
    """``output`` is a windowed cohort alone: every member has computed its window (so each
    reads the whole of it at every step)."""
    batch = scheduler.cohort_batch(output)
    return batch is not None and batch.pure and batch.cohort.window > 0


_CONSTANT = 1
"""A run mode of :meth:`StretchRunner._price_runs`: every step the same shape."""
_FULL_LAYERS_GROW = 2
"""A run mode: only a hybrid model's full-attention layers read more at each step."""
