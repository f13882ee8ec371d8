"""End-to-end behaviour of the engine loop: whole experiments through ``simulate()``.

Each test states one rule of the engine (architecture.md sections 2-6, concepts.md) and checks
it on a small experiment whose numbers follow from the rule, not from a pinned seeded run.
"""

from __future__ import annotations

import gc
import itertools
import math
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchsim
from batchsim.catalog import catalog_dir
from batchsim.catalog.model_files import load_model
from batchsim.config import validate_experiment
from batchsim.cost import BatchShape
from batchsim.engine.engine import Engine
from batchsim.errors import ConfigError
from batchsim.metrics.summary import percentile, weighted_percentiles
from batchsim.scheduler.interface import Scheduler
from batchsim.simulation import Result, simulate
from conftest import (
    SUMMARY_KEYS,
    assert_same_clock,
    assert_same_run,
    capture_engines,
    tiny_experiment,
    without_cohort,
)

POLICIES = ("static", "dynamic", "continuous", "chunked_prefill")

# ----------------------------------------------------------------------------- helpers


def fixed(value: int) -> dict[str, Any]:
    return {"dist": "fixed", "value": value}


def uniform(lo: int, hi: int) -> dict[str, Any]:
    return {"dist": "uniform", "min": lo, "max": hi}


def experiment(
    workload: dict[str, Any],
    scheduler: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """Llama-2-7B on an A100-80GB with exactly this workload block."""
    data = tiny_experiment(**top)
    data["workload"] = workload
    data["scheduler"] = scheduler or {"policy": "continuous", "max_num_seqs": 32}
    if engine:
        data["engine"] = engine
    return data


def offline(num: int, prompt: Any, output: Any, **extra: Any) -> dict[str, Any]:
    """``num`` requests all at t=0 (an offline throughput benchmark)."""
    return {
        "num_requests": num,
        "arrival": {"process": "all_at_once"},
        "prompt_tokens": prompt,
        "output_tokens": output,
        **extra,
    }


def poisson(num: int, rate: float, prompt: Any, output: Any, **extra: Any) -> dict[str, Any]:
    return {
        "num_requests": num,
        "arrival": {"process": "poisson", "rate": rate},
        "prompt_tokens": prompt,
        "output_tokens": output,
        **extra,
    }


def write_trace(path: Path, rows: list[tuple[float, int, int]]) -> dict[str, Any]:
    """A csv trace of (arrival s, prompt, output) rows; ``repr`` keeps every float exact."""
    lines = ["arrival_time,prompt_tokens,output_tokens"]
    lines += [f"{t!r},{p},{o}" for t, p, o in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"trace": {"path": str(path), "format": "csv"}}


def sim(data: dict[str, Any]) -> Result:
    return simulate(validate_experiment(data))


def sim_with_engine(data: dict[str, Any]) -> tuple[Result, Engine]:
    with capture_engines() as engines:
        result = sim(data)
    (engine,) = engines
    return result, engine


def iteration_ends(result: Result) -> np.ndarray:
    it = result.iterations
    return it["start_time_s"].to_numpy() + it["duration_ms"].to_numpy() / 1e3


# ----------------------------------------------------------------------------- same-time rule


@pytest.mark.parametrize(
    ("second_arrival", "joins"), [(0.1, True), (math.nextafter(0.1, 1.0), False)]
)
def test_arrival_exactly_at_dynamic_deadline_joins_the_batch(tmp_path, second_arrival, joins):
    # max_wait 100 ms: the batch of the request arriving at t=0 launches at exactly t=0.1.
    # A third, late arrival keeps arrivals pending so that no partial batch launches early.
    trace = write_trace(tmp_path / "t.csv", [(0.0, 32, 4), (second_arrival, 32, 4), (5.0, 32, 4)])
    result = sim(experiment(trace, {"policy": "dynamic", "max_num_seqs": 4, "max_wait_ms": 100}))
    first = result.iterations.iloc[0]
    assert first["start_time_s"] == 0.1
    assert first["num_seqs"] == (2 if joins else 1)
    scheduled = result.requests["first_scheduled_time_s"].to_numpy()
    assert scheduled[0] == 0.1
    assert (scheduled[1] == 0.1) == joins


@pytest.mark.parametrize("late", [False, True])
def test_arrival_exactly_at_iteration_end_is_scheduled_at_that_boundary(tmp_path, late):
    # Request A alone at t=0: its prefill ends at T. B arriving exactly at T is visible to the
    # schedule() at T (prefill first, zero queue delay); one ulp later it waits for A's decode.
    alone = sim(experiment(write_trace(tmp_path / "a.csv", [(0.0, 64, 8)])))
    end_of_prefill = float(alone.requests["first_token_time_s"].iloc[0])
    arrival = math.nextafter(end_of_prefill, math.inf) if late else end_of_prefill
    trace = write_trace(tmp_path / "ab.csv", [(0.0, 64, 8), (arrival, 64, 8)])
    result = sim(experiment(trace))
    b = result.requests.iloc[1]
    starts = result.iterations["start_time_s"].to_numpy()
    assert starts[1] == end_of_prefill
    if late:
        assert b["first_scheduled_time_s"] == starts[2] > arrival
        assert result.iterations["num_decode_seqs"].iloc[1] == 1  # A decoded first
    else:
        assert b["first_scheduled_time_s"] == end_of_prefill
        assert b["queue_delay_ms"] == 0.0


# ----------------------------------------------------------------------------- dynamic's timer


@pytest.mark.parametrize("later_arrival", [False, True])
def test_dynamic_batch_waits_for_its_timer_whether_or_not_more_requests_will_come(
    tmp_path, later_arrival
):
    # Three requests at t=0 with B=8 and max_wait 100 ms: dynamic batching decides by its
    # queue and its timer only, so it launches at t=0.1 s, not at once because nothing else
    # is coming.
    rows = [(0.0, 32, 4)] * 3 + ([(5.0, 32, 4)] if later_arrival else [])
    trace = write_trace(tmp_path / "t.csv", rows)
    result = sim(experiment(trace, {"policy": "dynamic", "max_num_seqs": 8, "max_wait_ms": 100}))
    first = result.iterations.iloc[0]
    assert first["start_time_s"] == 0.1 and first["num_seqs"] == 3


# ----------------------------------------------------------------------------- idle engine


def test_idle_engine_sleeps_until_next_arrival(tmp_path):
    one = sim(experiment(write_trace(tmp_path / "one.csv", [(0.0, 64, 16)])))
    two = sim(experiment(write_trace(tmp_path / "two.csv", [(0.0, 64, 16), (100.0, 64, 16)])))
    # No iteration runs during the 100 s gap: two isolated requests cost twice one request.
    assert one.summary["num_iterations"] == 16  # 1 prefill + 15 decodes
    assert two.summary["num_iterations"] == 2 * one.summary["num_iterations"]
    first, second = two.requests.iloc[0], two.requests.iloc[1]
    starts = two.iterations["start_time_s"].to_numpy()
    assert not np.any((starts > first["finish_time_s"]) & (starts < 100.0))
    assert second["queue_delay_ms"] == 0.0
    assert second["e2el_ms"] == pytest.approx(first["e2el_ms"], rel=1e-9)


# ----------------------------------------------------------------------------- static, dynamic


@pytest.mark.parametrize(("num", "cap"), [(10, 4), (12, 4), (5, 8), (7, 1)])
def test_static_batch_finishes_in_ceil_n_over_b_waves(num, cap):
    data = experiment(offline(num, fixed(64), fixed(16)), {"policy": "static", "max_num_seqs": cap})
    req = sim(data).requests
    finish = req["finish_time_s"].to_numpy()
    waves = np.unique(finish)
    assert len(waves) == math.ceil(num / cap)
    sizes = [int((finish == t).sum()) for t in waves]
    assert sizes == [cap] * (num // cap) + ([num % cap] if num % cap else [])
    # A wave starts when the previous one has ended, not before.
    starts = np.unique(req["first_scheduled_time_s"].to_numpy())
    assert starts[0] == 0.0
    np.testing.assert_array_equal(starts[1:], waves[:-1])


def test_dynamic_queue_delay_at_low_rate_is_bounded_by_max_wait_or_running_batch():
    max_wait_s = 0.050
    data = experiment(
        poisson(100, 1.0, uniform(32, 128), uniform(4, 32)),
        {"policy": "dynamic", "max_num_seqs": 8, "max_wait_ms": 50},
    )
    req = sim(data).requests
    arrival = req["arrival_time_s"].to_numpy()
    start = req["first_scheduled_time_s"].to_numpy()
    batch_start = np.unique(start)
    batch_end = np.array([req["finish_time_s"][start == s].max() for s in batch_start])
    for a, s in zip(arrival, start, strict=True):
        # A request arriving during a batch can also wait for that batch to end.
        running = (batch_start <= a) & (a < batch_end)
        residual = float(batch_end[running].max() - a) if running.any() else 0.0
        assert s - a <= max(max_wait_s, residual) + 1e-12
    # The timer is exact: a request alone on an idle engine waits max_wait_ms, no more.
    alone = np.isclose(start - arrival, max_wait_s, rtol=0, atol=1e-12)
    assert alone.sum() > len(req) / 2


def test_dynamic_batches_are_full_at_high_rate():
    # 1000 req/s: ~50 arrivals per 50 ms window, far more than the batch cap of 8.
    data = experiment(
        poisson(100, 1000.0, uniform(32, 128), uniform(4, 32)),
        {"policy": "dynamic", "max_num_seqs": 8, "max_wait_ms": 50},
    )
    it = sim(data).iterations
    batch_sizes = it.loc[it["num_prefill_seqs"] > 0, "num_seqs"].tolist()
    assert batch_sizes == [8] * 12 + [4]  # the last batch takes what is left of 100


# ----------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("policy", POLICIES)
def test_cancelled_request_leaves_at_first_boundary_after_cancel_time_and_frees_kv(policy):
    data = experiment(
        poisson(
            40,
            10.0,
            uniform(64, 256),
            uniform(8, 200),
            cancel_after_ms={"dist": "uniform", "min": 50, "max": 2000},
        ),
        {"policy": policy, "max_num_seqs": 4, "max_wait_ms": 20},
    )
    result, engine = sim_with_engine(data)
    it = result.iterations
    starts = it["start_time_s"].to_numpy()
    ends = iteration_ends(result)
    req = result.requests
    cancelled = req[req["status"] == "cancelled"]
    assert len(cancelled), "the workload is meant to cancel some requests"
    assert cancelled["first_scheduled_time_s"].notna().any()
    cancel_after = engine.source.table.cancel_after
    assert cancel_after is not None
    for r in cancelled.itertuples():
        leave = r.finish_time_s
        cancel = r.arrival_time_s + float(cancel_after[r.request_id])
        assert leave >= cancel
        assert r.output_tokens < r.max_tokens
        in_flight = (starts < cancel) & (cancel < ends - 1e-12)
        if in_flight.any():  # the launched iteration completes; the request leaves at its end
            assert leave == pytest.approx(float(ends[in_flight][0]), abs=1e-9)
        else:  # the engine was at a boundary or idle: the request leaves at once
            assert leave == pytest.approx(cancel, abs=1e-9)
    assert result.summary["num_cancelled"] == len(cancelled)
    status = result.requests["status"]
    assert set(status) <= {"finished", "cancelled"}
    assert engine.scheduler.kv_cache.num_used_blocks == 0
    assert not engine.scheduler.has_unfinished_requests()


# ----------------------------------------------------------------------------- async scheduling


def test_async_scheduling_hides_cpu_overhead_behind_the_gpu_step():
    cpu_ms = 20.0  # far above a Llama-2-7B decode step (~10 ms): the CPU is the bottleneck

    def run(async_scheduling: bool) -> Result:
        engine = {
            "cpu_overhead_ms": cpu_ms,
            "cpu_overhead_per_seq_ms": 0.0,
            "async_scheduling": async_scheduling,
        }
        return sim(
            experiment(
                offline(16, fixed(64), fixed(32)),
                {"policy": "continuous", "max_num_seqs": 8},
                engine,
            )
        )

    sync, overlapped = run(False), run(True)
    assert overlapped.summary["mean_itl_ms"] < sync.summary["mean_itl_ms"]
    for result in (sync, overlapped):
        assert (result.iterations["cpu_time_ms"] == cpu_ms).all()
    it = sync.iterations
    np.testing.assert_allclose(it["duration_ms"], it["cpu_time_ms"] + it["gpu_time_ms"], 1e-12)
    it = overlapped.iterations
    # all_at_once keeps the engine busy back to back after the first iteration.
    starts = it["start_time_s"].to_numpy()
    np.testing.assert_allclose(starts[1:], iteration_ends(overlapped)[:-1], rtol=0, atol=1e-9)
    first = it.iloc[0]
    assert first["duration_ms"] == pytest.approx(first["cpu_time_ms"] + first["gpu_time_ms"])
    rest = it.iloc[1:]
    np.testing.assert_allclose(
        rest["duration_ms"], np.maximum(rest["cpu_time_ms"], rest["gpu_time_ms"]), 1e-12
    )


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("threshold", [700, 0, 250_000])
@pytest.mark.parametrize("cluster", [False, True])
def test_the_run_of_built_in_policies_turns_the_collector_off_and_leaves_it_as_it_was(
    threshold, cluster, enabled
):
    # The step loop frees its short-lived tuples by reference counting and makes almost no
    # cycles: with the built-in policies the collector is off while it runs (unless the
    # caller turned it off already), and the caller's settings are back afterwards.
    seen: list[tuple[bool, int]] = []
    schedule = Scheduler.schedule_iteration

    def spy(scheduler: Scheduler, now: float) -> Any:
        seen.append((gc.isenabled(), gc.get_threshold()[0]))
        return schedule(scheduler, now)

    data = experiment(poisson(20, 4.0, fixed(64), fixed(16)))
    if cluster:
        data["cluster"] = {"replicas": 2, "router": "round_robin"}
    saved = gc.get_threshold()
    was_enabled = gc.isenabled()
    try:
        gc.set_threshold(threshold, 13, 17)
        if not enabled:
            gc.disable()
        with mock.patch.object(Scheduler, "schedule_iteration", spy):
            sim(data)
        assert gc.get_threshold() == (threshold, 13, 17)
        assert gc.isenabled() == enabled
    finally:
        gc.set_threshold(*saved)
        if was_enabled:
            gc.enable()
    # off while the loop runs; a collector turned off (disabled, or threshold 0) stays so
    expected = (False, threshold) if enabled and threshold else (enabled, threshold)
    assert seen and set(seen) == {expected}


# ----------------------------------------------------------------------------- fast-forward


def count_stretches(run: Any, what: str = "num_stretches") -> tuple[Any, int]:
    """``run()``'s result and how many decode stretches it advanced in one go (``what``: a
    counter of :class:`StretchRunner`, summed over the engines the run built)."""
    with capture_engines() as engines:
        result = run()
    return result, sum(getattr(engine.stretch, what) for engine in engines)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("num_gpu_blocks", [None, 40])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_fast_forward_off_gives_the_same_run(policy, num_gpu_blocks, async_scheduling):
    # Decode stretches must be exact: the same run, iteration by iteration, agrees to 1e-9,
    # with arrivals, cancellations, completions and (small KV cache) preemptions cutting them.
    workload = poisson(
        40,
        8.0,
        uniform(16, 200),
        uniform(1, 120),
        cancel_after_ms={"dist": "uniform", "min": 200, "max": 6000},
    )
    scheduler = {
        "policy": policy,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "max_wait_ms": 30,
    }
    engine: dict[str, Any] = {"async_scheduling": async_scheduling}
    if num_gpu_blocks is not None:
        engine["num_gpu_blocks"] = num_gpu_blocks
    metrics = {"warmup_s": 0.5, "cooldown_s": 0.5}  # trimming cuts through stretches
    fast, num_stretches = count_stretches(
        lambda: sim(experiment(workload, scheduler, engine, metrics=metrics))
    )
    slow, slow_stretches = count_stretches(
        lambda: sim(
            experiment(workload, scheduler, {**engine, "fast_forward": False}, metrics=metrics)
        )
    )
    assert num_stretches > 0 and slow_stretches == 0  # only the fast run skips ahead
    if num_gpu_blocks is not None and policy in ("continuous", "chunked_prefill"):
        assert slow.summary["num_preemptions"] > 0
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
@pytest.mark.parametrize("mix", [False, True])
def test_fast_forward_is_exact_with_swap_preemption(policy, mix):
    workload = poisson(40, 20.0, uniform(16, 200), uniform(1, 160))
    scheduler = {
        "policy": policy,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "preemption_mode": "swap",
    }
    if policy == "continuous":
        scheduler["mix_prefill_decode"] = mix
    engine = {"num_gpu_blocks": 40}
    fast, num_stretches = count_stretches(lambda: sim(experiment(workload, scheduler, engine)))
    slow = sim(experiment(workload, scheduler, {**engine, "fast_forward": False}))
    assert num_stretches > 0 and slow.summary["num_swaps"] > 0
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


def test_arrivals_do_not_end_a_stretch_of_whole_prompt_chunks(tmp_path):
    # A decode runs; a 2,000-token prompt arrives and is computed in chunks of 63 tokens
    # (the 64-token budget minus the decode), 32 iterations. Four short requests arrive
    # during its chunks: each chunk takes the whole budget, so they wait, and the chunks'
    # stretch takes them and runs on. Only the prompt's last chunk, whose leftover budget
    # the first of them takes, needs a pass of its own.
    trace = write_trace(
        tmp_path / "t.csv",
        [(0.0, 16, 400), (0.05, 2000, 4)] + [(0.1 + 0.02 * i, 100, 4) for i in range(4)],
    )
    scheduler = {"policy": "chunked_prefill", "max_num_seqs": 8, "max_num_batched_tokens": 64}
    times: list[float] = []
    schedule = Scheduler.schedule_iteration

    def spy(scheduler: Scheduler, now: float) -> Any:
        times.append(now)
        return schedule(scheduler, now)

    with mock.patch.object(Scheduler, "schedule_iteration", spy):
        fast, engine = sim_with_engine(experiment(trace, scheduler))
    slow = sim(experiment(trace, scheduler, {"fast_forward": False}))
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)
    long = fast.requests.iloc[1]
    assert long["first_token_time_s"] > 0.2  # the four arrived during its chunks
    during = [t for t in times if long["first_scheduled_time_s"] <= t < long["first_token_time_s"]]
    assert len(during) == 2  # the chunks' stretch, and the last chunk with a newcomer's
    assert engine.stretch.num_arrival_passes == 4


@pytest.mark.parametrize(
    ("scheduler", "engine"),
    [
        ({"policy": "continuous"}, {}),
        ({"policy": "continuous", "mix_prefill_decode": True}, {"async_scheduling": True}),
        ({"policy": "chunked_prefill", "max_num_batched_tokens": 64}, {"num_gpu_blocks": 80}),
        ({"policy": "continuous"}, {"framework": "vllm-v0", "cuda_graph_max_batch_size": 4}),
    ],
)
def test_decode_stretches_run_on_through_completions_exactly(scheduler, engine):
    # With nothing waiting, a stretch of the running decodes goes on past a request's last
    # token (it leaves, the others go on) without a pass of the engine, until an arrival,
    # a cancellation or a short KV cache stops it: the same iterations and requests as
    # stepping one at a time.
    workload = poisson(
        50, 3.0, uniform(16, 300), uniform(1, 250), cancel_after_ms=uniform(2000, 30000)
    )
    sched = {"max_num_seqs": 12, "max_num_batched_tokens": 512, **scheduler}
    fast, drained = count_stretches(
        lambda: sim(experiment(workload, sched, engine)), "num_drained_finished"
    )
    slow = sim(experiment(workload, sched, {**engine, "fast_forward": False}))
    assert drained > 10  # requests finished inside drained stretches
    if "num_gpu_blocks" in engine:
        assert fast.summary["num_preemptions"] > 0
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


@pytest.mark.parametrize(
    ("workload", "scheduler", "engine"),
    [
        # The KV cache holds only a few of the requests: the waiting head's chunk of its
        # prompt (the 500 tokens the decodes leave of the budget) does not fit the free
        # blocks, though one token would.
        (
            offline(30, fixed(400), fixed(300)),
            {"policy": "chunked_prefill", "max_num_batched_tokens": 512},
            {"num_gpu_blocks": 120},
        ),
        # Mixed iterations: once 33 decodes run, a 480-token prompt no longer fits the 479
        # tokens they leave of the 512-token budget, however free the KV cache is.
        (
            offline(60, fixed(480), uniform(150, 400)),
            {"policy": "continuous", "mix_prefill_decode": True, "max_num_batched_tokens": 512},
            {},
        ),
    ],
    ids=["chunk-over-kv", "prompt-over-budget"],
)
def test_decodes_fast_forward_while_the_waiting_head_would_not_be_admitted(
    workload, scheduler, engine
):
    # Every request arrives at once and the waiting ones cannot be admitted (see above). The
    # next iterations are the same decodes (free blocks only shrink during a stretch, and
    # what the batch leaves of the budget stays), and after a request finishes, the same
    # without it while the head still would not be admitted: they are advanced many at a
    # time, with the same results as stepping.
    scheduler = {"max_num_seqs": 64, **scheduler}
    passes = []
    schedule = Scheduler.schedule_iteration

    def spy(scheduler: Scheduler, now: float) -> Any:
        passes.append(bool(scheduler.waiting))
        return schedule(scheduler, now)

    with mock.patch.object(Scheduler, "schedule_iteration", spy):
        fast = sim(experiment(workload, scheduler, engine))
    slow = sim(experiment(workload, scheduler, {**engine, "fast_forward": False}))
    # a pass of the engine loop per few dozen iterations, nearly all with requests waiting
    assert 5 * len(passes) < len(fast.iterations) and sum(passes) > 0.9 * len(passes)
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


@pytest.mark.parametrize(
    ("engine", "output", "cancel"),
    [
        ({}, uniform(1, 300), False),
        ({"async_scheduling": True}, uniform(1, 300), True),
        ({"num_gpu_blocks": 160}, uniform(1, 300), False),  # chunks cut short of KV blocks
        ({"num_gpu_blocks": 160, "swap_space_gib": 0.3}, uniform(1, 40), False),
    ],
)
def test_fast_forward_is_exact_over_a_long_prompts_chunks(engine, output, cancel):
    # Chunked prefill of prompts many budgets long, next to running decodes: the chunks of
    # one prompt repeat (each as long, further along the prompt) and are advanced in one
    # step, the first one (its admission) and, when nothing else could take its leftover
    # budget, the last one included. Every iteration and request must be the same as
    # stepping one at a time, through arrivals, cancellations, finishes and preemptions.
    extra = {"cancel_after_ms": uniform(300, 4000)} if cancel else {}
    workload = poisson(60, 6.0, uniform(200, 2500), output, **extra)
    scheduler = {"policy": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 256}
    if "swap_space_gib" in engine:
        scheduler["preemption_mode"] = "swap"
    fast, chunk_stretches = count_stretches(
        lambda: sim(experiment(workload, scheduler, engine)), "num_chunk_stretches"
    )
    slow = sim(experiment(workload, scheduler, {**engine, "fast_forward": False}))
    assert chunk_stretches > 10  # stretches of chunks ran
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


@pytest.mark.parametrize(
    ("scheduler", "engine"),
    [
        ({"policy": "continuous"}, {}),
        ({"policy": "continuous", "mix_prefill_decode": True}, {"async_scheduling": True}),
        ({"policy": "continuous", "preemption_mode": "swap"}, {"num_gpu_blocks": 120}),
        ({"policy": "chunked_prefill"}, {"num_gpu_blocks": 120}),
        ({"policy": "chunked_prefill", "preemption_mode": "swap"}, {"num_gpu_blocks": 120}),
    ],
)
@pytest.mark.parametrize("fast_forward", [True, False])
def test_the_cohort_of_running_decodes_changes_no_result(scheduler, engine, fast_forward):
    # The built-in policies advance their running decodes as one cohort (running sums
    # instead of a look at every request). Without it, every request is scheduled, priced and
    # applied one by one: the run must be the same, iteration by iteration.
    workload = poisson(
        50,
        10.0,
        uniform(16, 900),
        uniform(1, 200),
        cancel_after_ms={"dist": "uniform", "min": 200, "max": 6000},
    )
    scheduler = {**scheduler, "max_num_seqs": 12, "max_num_batched_tokens": 512}
    data = experiment(workload, scheduler, {**engine, "fast_forward": fast_forward})
    with_cohort = sim(data)
    with without_cohort():
        without = sim(data)
    assert_same_run(with_cohort, without)
    if not fast_forward:  # the same arithmetic, iteration by iteration: to the last bit
        for column in with_cohort.iterations.columns:
            assert with_cohort.iterations[column].equals(without.iterations[column]), column
        assert with_cohort.requests.equals(without.requests)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_fast_forward_is_exact_when_a_sliding_window_caps_the_context(policy):
    # Mistral-7B attends to the last 4096 tokens: decode stretches that grow past the window
    # read a capped context, and their runs of equal time are no longer linear.
    workload = poisson(12, 4.0, uniform(3900, 4090), uniform(20, 400))
    scheduler = {"policy": policy, "max_num_seqs": 4, "max_num_batched_tokens": 8192}
    data = experiment(workload, scheduler, model="mistral-7b")
    fast, capped = count_stretches(lambda: sim(data), "num_stepwise_stretches")
    slow = sim(experiment(workload, scheduler, {"fast_forward": False}, model="mistral-7b"))
    assert capped > 0  # some stretches grew past the window
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


# ----------------------------------------------------------------------------- the knee


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("padding", [True, False])
def test_static_padding_keeps_finished_rows_and_the_padded_cache_in_every_decode(tmp_path, padding):
    # Prompts 100 and 300, outputs 3 and 6, batch of 2. Naive batched generation keeps a
    # rectangular KV cache: every decode step reads both rows at the longest prompt plus the
    # steps so far, finished row included, and each slot reserves 300 + 6 tokens.
    trace = write_trace(tmp_path / "t.csv", [(0.0, 100, 3), (0.0, 300, 6)])
    result = sim(
        experiment(
            trace,
            {"policy": "static", "max_num_seqs": 2, "padding": padding},
            {"num_gpu_blocks": 1000},
        )
    )
    it = result.iterations
    assert len(it) == 6  # one prefill, five decodes
    # KV traffic of a decode step: the K and V of every cached and new key read, and of the
    # new tokens written, for each row attention runs.
    per_token = load_model("llama-2-7b").kv_bytes_per_token("bf16")
    steps = np.arange(1, 6)
    if padding:  # two rows at 300 + s - 1 cached tokens each, finished or not
        keys = 2 * (300 + steps - 1) + 2 * 2
        assert (it["num_seqs"] + it["num_padding_tokens"]).iloc[1:].eq(2).all()
        assert round(it["kv_cache_usage"].iloc[0] * 1000) == 2 * math.ceil(306 / 16)
    else:  # a (100 + s - 1 cached) decodes twice more, b (300 + s - 1) five times
        live_a = steps <= 2
        keys = (300 + steps - 1) + 2 + np.where(live_a, (100 + steps - 1) + 2, 0)
        reserved = math.ceil(103 / 16) + math.ceil(306 / 16)
        assert round(it["kv_cache_usage"].iloc[0] * 1000) == reserved
    np.testing.assert_allclose(it["kv_bytes"].iloc[1:], keys * per_token, rtol=1e-12)


# ----------------------------------------------------------------------------- sliding window


def test_sliding_window_prices_a_long_prefill_with_the_pairs_inside_the_window():
    # Mistral-7B (4096-key window): an 8000-token prompt computes 24,381,440 causal pairs
    # (brute force in test_cost), not the 32,004,000 of full attention.
    data = experiment(offline(1, fixed(8000), fixed(1)), model="mistral-7b")
    result, engine = sim_with_engine(data)
    windowed = BatchShape(
        num_seqs=1, num_prefill_tokens=8000, num_sampled_tokens=1, attn_pairs=24_381_440
    )
    expected = engine.cost_model.estimate(windowed).flops
    assert result.iterations["flops"].iloc[0] == pytest.approx(expected, rel=1e-12)


def test_sliding_window_frees_the_kv_blocks_that_fall_out_of_the_window():
    # A 1000 + 6000-token sequence on Mistral-7B holds at most the blocks of one window
    # (4096 / 16 = 256, plus the block the newest token starts), not the 438 of its length.
    data = experiment(
        offline(1, fixed(1000), fixed(6000)), engine={"num_gpu_blocks": 1000}, model="mistral-7b"
    )
    result = sim(data)
    blocks = np.rint(result.iterations["kv_cache_usage"].to_numpy() * 1000)
    assert blocks.max() == 257 and blocks[-1] in (256, 257)
    assert result.summary["completed"] == 1


# ----------------------------------------------------------------------------- watermark


def test_admission_keeps_the_watermark_free_but_running_requests_may_use_it(tmp_path):
    # 100 blocks of 16 tokens, watermark 1 %: a 1584-token request (99 blocks) is admitted;
    # a 1600-token one (100 blocks) never fits above the watermark.
    trace = write_trace(tmp_path / "t.csv", [(0.0, 1564, 20), (0.0, 1590, 10)])
    result = sim(experiment(trace, engine={"num_gpu_blocks": 100}))
    req = result.requests
    assert list(req["status"]) == ["finished", "rejected"]
    assert "above the admission watermark" in req["reject_reason"].iloc[1]
    without = sim(experiment(trace, engine={"num_gpu_blocks": 100, "watermark": 0}))
    assert list(without.requests["status"]) == ["finished", "finished"]


def test_batch_token_budget_below_the_batch_cap_is_a_config_error():
    data = experiment(
        offline(4, fixed(16), fixed(4)),
        {"policy": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 32},
    )
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens must be >= .*max_num_seqs"):
        sim(data)
    static = {"policy": "static", "max_num_seqs": 64, "max_num_batched_tokens": 32}
    assert sim(experiment(offline(4, fixed(16), fixed(4)), static)).summary["completed"] == 4


def test_throughput_rises_with_batch_cap_and_flattens_past_the_knee():
    caps = [1, 4, 16, 64, 128, 256]
    throughput = []
    for cap in caps:
        data = experiment(
            offline(256, fixed(128), fixed(128)),
            {"policy": "continuous", "max_num_seqs": cap, "max_num_batched_tokens": 32768},
        )
        summary = sim(data).summary
        assert summary["num_preemptions"] == 0
        throughput.append(summary["output_throughput"])
    # Memory-bound: batching B decodes costs about one weight read, so throughput grows ~B...
    assert all(b > a for a, b in itertools.pairwise(throughput))
    assert throughput[2] / throughput[0] > 8  # 16x the batch, far more than 8x the tokens/s
    # ...until KV reads and compute catch up: the last doubling gains little.
    assert throughput[-1] / throughput[-2] < 1.3


# ----------------------------------------------------------------------------- policies compared


def test_continuous_beats_static_on_varied_output_lengths():
    workload = poisson(200, 20.0, uniform(64, 256), {"dist": "exponential", "mean": 64, "max": 512})
    static = sim(experiment(workload, {"policy": "static", "max_num_seqs": 16})).summary
    continuous = sim(experiment(workload, {"policy": "continuous", "max_num_seqs": 16})).summary
    assert continuous["output_throughput"] > static["output_throughput"]
    assert continuous["mean_e2el_ms"] < static["mean_e2el_ms"]
    assert static["empty_slot_fraction"] > 0  # finished requests' slots wait for the batch
    assert continuous["empty_slot_fraction"] == 0


LONG_PROMPTS_INTO_DECODES = poisson(60, 2.0, uniform(2048, 4000), uniform(64, 256))


def test_chunked_prefill_lowers_p99_itl_versus_continuous_without_mixing():
    no_mix = sim(
        experiment(
            LONG_PROMPTS_INTO_DECODES,
            {"policy": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 4096},
        )
    ).summary
    chunked = sim(
        experiment(
            LONG_PROMPTS_INTO_DECODES,
            {"policy": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 512},
        )
    ).summary
    # Without mixing, a running decode stalls for a whole 2-4k-token prefill; chunks of 512
    # tokens bound that stall.
    assert chunked["p99_itl_ms"] < no_mix["p99_itl_ms"] / 2


@pytest.mark.parametrize("mix", [False, True])
def test_mix_prefill_decode_puts_running_decodes_into_prefill_iterations(mix):
    result = sim(
        experiment(
            LONG_PROMPTS_INTO_DECODES,
            {
                "policy": "continuous",
                "max_num_seqs": 64,
                "max_num_batched_tokens": 4096,
                "mix_prefill_decode": mix,
            },
        )
    )
    it = result.iterations
    prefill = it[it["num_prefill_seqs"] > 0]
    mixed = prefill["num_decode_seqs"] > 0
    if mix:
        # Every prefill that arrives while others decode carries those decodes along.
        assert mixed.sum() > len(prefill) / 2
    else:
        assert not mixed.any()


# ----------------------------------------------------------------------------- KV cache limits


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_small_kv_cache_preempts_and_every_request_still_completes_in_full(policy):
    data = experiment(
        poisson(40, 50.0, uniform(32, 128), uniform(32, 200)),
        {"policy": policy, "max_num_seqs": 32, "max_num_batched_tokens": 512},
        {"num_gpu_blocks": 64},  # 1024 tokens for up to 32 requests of up to 328 tokens
    )
    result, engine = sim_with_engine(data)
    summary, req = result.summary, result.requests
    assert summary["num_preemptions"] > 0
    assert summary["num_preemptions"] == req["num_preemptions"].sum()
    assert summary["completed"] == 40
    assert (req["status"] == "finished").all()
    assert (req["output_tokens"] == req["max_tokens"]).all()
    assert summary["max_kv_cache_usage"] <= 1.0
    assert engine.scheduler.kv_cache.num_used_blocks == 0


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_swap_preemption_keeps_progress_and_pays_the_host_link(policy):
    # The same KV-starved run preempting by recompute and by swap: swapping recomputes no
    # prompt token, and each swap costs its blocks' bytes over the host link.
    workload = poisson(40, 50.0, uniform(32, 128), uniform(32, 200))
    scheduler = {"policy": policy, "max_num_seqs": 32, "max_num_batched_tokens": 512}
    engine = {"num_gpu_blocks": 64, "framework": None}  # each iteration's CPU time paid
    recompute = sim(experiment(workload, scheduler, engine))
    swap, eng = sim_with_engine(
        experiment(workload, {**scheduler, "preemption_mode": "swap"}, engine)
    )
    prompts = swap.requests["prompt_tokens"].sum()
    assert recompute.summary["num_swaps"] == 0 and recompute.summary["num_preemptions"] > 0
    assert recompute.iterations["num_prefill_tokens"].sum() > prompts  # recomputed KV
    assert swap.summary["num_swaps"] == swap.summary["num_preemptions"] > 0
    assert swap.summary["num_swaps"] == swap.requests["num_swaps"].sum()
    assert swap.iterations["num_prefill_tokens"].sum() == prompts  # nothing recomputed
    assert (swap.requests["status"] == "finished").all()
    assert (swap.requests["output_tokens"] == swap.requests["max_tokens"]).all()
    it = swap.iterations
    swapped = it["num_swap_in_blocks"] + it["num_swap_out_blocks"]
    assert it["num_swap_out_blocks"].sum() == it["num_swap_in_blocks"].sum() > 0
    # Llama-2-7B: 2 (K, V) x 32 layers x 4096 x 2 bytes = 512 KiB per token; a 16-token block
    # is 8 MiB, copied at 80 % of the A100's 32 GB/s PCIe Gen4 link.
    per_block_ms = 16 * 2 * 32 * 4096 * 2 / (32e9 * 0.8) * 1e3
    np.testing.assert_allclose(it["swap_time_ms"], swapped * per_block_ms, rtol=1e-12)
    np.testing.assert_allclose(
        it["duration_ms"], it["cpu_time_ms"] + it["gpu_time_ms"] + it["swap_time_ms"], rtol=1e-12
    )
    kv = eng.scheduler.kv_cache
    assert kv.num_used_blocks == 0 and kv.num_free_cpu_blocks == kv.num_cpu_blocks > 0


def test_swap_mode_on_a_profile_without_host_link_is_a_config_error(tmp_path):
    profile = tmp_path / "gpu.yaml"
    text = catalog_dir("hardware_profiles") / "l4.yaml"
    lines = [
        line
        for line in text.read_text(encoding="utf-8").splitlines()
        if "host_bandwidth_gb_s" not in line
    ]
    profile.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = experiment(
        poisson(4, 1.0, fixed(16), fixed(4)),
        {"policy": "continuous", "preemption_mode": "swap"},
        hardware=str(profile),
    )
    with pytest.raises(batchsim.ConfigError, match="host_bandwidth_gb_s"):
        sim(data)


@pytest.mark.parametrize("policy", POLICIES)
def test_prompt_longer_than_kv_capacity_is_rejected_and_run_finishes(tmp_path, policy):
    trace = write_trace(tmp_path / "t.csv", [(0.0, 64, 8), (0.5, 1000, 8), (1.0, 64, 8)])
    data = experiment(
        trace, {"policy": policy, "max_num_seqs": 4, "max_wait_ms": 10}, {"num_gpu_blocks": 16}
    )
    result = sim(data)  # 16 blocks x 16 = 256 tokens: request 1 can never fit
    req = result.requests.set_index("request_id")
    assert req.loc[1, "status"] == "rejected"
    assert "KV" in req.loc[1, "reject_reason"]
    assert math.isnan(req.loc[1, "ttft_ms"])
    assert (req.loc[[0, 2], "status"] == "finished").all()
    assert result.summary["num_rejected"] == 1
    assert result.summary["completed"] == 2


# ----------------------------------------------------------------------------- closed loop


def closed_loop(concurrency: int, think_ms: float) -> dict[str, Any]:
    return experiment(
        {
            "num_requests": 60,
            "concurrency": concurrency,
            "think_time_ms": {"dist": "fixed", "value": think_ms},
            "prompt_tokens": uniform(32, 128),
            "output_tokens": uniform(8, 64),
        },
        {"policy": "continuous", "max_num_seqs": 32},
    )


def max_in_system(req) -> int:
    events = [(t, 1) for t in req["arrival_time_s"]] + [(t, -1) for t in req["finish_time_s"]]
    events.sort()  # at equal times a departure (-1) sorts before the arrival it triggers
    count = peak = 0
    for _, delta in events:
        count += delta
        peak = max(peak, count)
    return peak


@pytest.mark.parametrize("concurrency", [1, 4])
def test_closed_loop_never_has_more_than_concurrency_requests_in_system(concurrency):
    result = sim(closed_loop(concurrency, 500.0))
    req = result.requests
    assert (req["status"] == "finished").all()
    assert max_in_system(req) == concurrency
    assert result.iterations["num_seqs"].max() <= concurrency
    # Each user's next request arrives exactly think time after its previous one finished.
    gaps = np.sort(req["arrival_time_s"].to_numpy())[concurrency:]
    finishes = np.sort(req["finish_time_s"].to_numpy())[: len(gaps)]
    np.testing.assert_allclose(gaps, finishes + 0.5, rtol=0, atol=1e-9)


def test_closed_loop_without_think_time_has_at_least_the_throughput_of_long_think_time():
    busy = sim(closed_loop(4, 0.0)).summary
    thinking = sim(closed_loop(4, 2000.0)).summary
    assert busy["request_throughput"] >= thinking["request_throughput"]
    assert busy["mean_batch_size"] > thinking["mean_batch_size"]


# ----------------------------------------------------------------------------- summary contract


@pytest.fixture(scope="module")
def varied_run() -> Result:
    """A busy run with varied lengths, preemptions and an SLO (no cancellations)."""
    data = experiment(
        poisson(80, 12.0, uniform(16, 400), uniform(1, 150)),
        {"policy": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 256},
        {"num_gpu_blocks": 120},
        slo={"ttft_ms": 200, "tpot_ms": 30},
    )
    return batchsim.run(data)


def test_summary_has_every_contract_key(varied_run):
    summary = varied_run.summary
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    assert not missing
    assert summary["config"]["scheduler"]["policy"] == "chunked_prefill"
    assert summary["num_iterations"] == len(varied_run.iterations)
    assert 0 <= summary["request_goodput"] <= summary["request_throughput"]


def test_latency_metrics_follow_their_definitions_from_the_request_table(varied_run):
    req, summary = varied_run.requests, varied_run.summary
    done = req[req["status"] == "finished"]
    arrival, first = done["arrival_time_s"], done["first_token_time_s"]
    finish, outputs = done["finish_time_s"], done["output_tokens"]
    np.testing.assert_allclose(done["ttft_ms"], (first - arrival) * 1e3, rtol=1e-12)
    np.testing.assert_allclose(done["e2el_ms"], (finish - arrival) * 1e3, rtol=1e-12)
    multi = outputs > 1
    tpot = (done["e2el_ms"] - done["ttft_ms"])[multi] / (outputs[multi] - 1)
    np.testing.assert_allclose(done["tpot_ms"][multi], tpot, rtol=1e-9)
    assert done["tpot_ms"][~multi].isna().all()
    np.testing.assert_allclose(
        done["queue_delay_ms"], (done["first_scheduled_time_s"] - arrival) * 1e3, rtol=1e-12
    )
    assert summary["mean_ttft_ms"] == pytest.approx(done["ttft_ms"].mean(), rel=1e-9)
    assert summary["p99_e2el_ms"] == pytest.approx(np.percentile(done["e2el_ms"], 99), rel=1e-9)
    assert summary["median_tpot_ms"] == pytest.approx(np.median(tpot), rel=1e-9)
    assert summary["total_output_tokens"] == outputs.sum()
    duration = finish.max() - req["arrival_time_s"].min()
    assert summary["duration"] == pytest.approx(duration, rel=1e-12)
    assert summary["output_throughput"] == pytest.approx(outputs.sum() / duration, rel=1e-12)


def test_mean_itl_is_the_token_weighted_mean_of_request_gaps(varied_run):
    req = varied_run.requests
    done = req[req["status"] == "finished"]
    # The gaps of one request telescope to finish - first token, preemptions included.
    total_gap_ms = ((done["finish_time_s"] - done["first_token_time_s"]) * 1e3).sum()
    num_gaps = (done["output_tokens"] - 1).sum()
    assert varied_run.summary["num_preemptions"] > 0
    assert varied_run.summary["mean_itl_ms"] == pytest.approx(total_gap_ms / num_gaps, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False), st.integers(1, 30)),
        min_size=1,
        max_size=25,
    ),
    st.lists(st.floats(0, 100), min_size=1, max_size=5),
)
def test_weighted_percentile_equals_percentile_of_expanded_sample(pairs, percents):
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs], dtype=np.int64)
    expanded = np.repeat(values, weights)
    got = weighted_percentiles(values, weights, percents)
    want = np.percentile(expanded, percents)
    np.testing.assert_array_equal(got, want)  # the same interpolation, to the last bit


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-1e9, 1e9, allow_nan=False), min_size=1, max_size=60),
    st.floats(0, 100),
)
def test_percentile_equals_numpy_to_the_last_bit(values, percent):
    sample = np.array(values)
    before = sample.copy()
    assert percentile(sample, percent) == np.percentile(sample, percent)
    np.testing.assert_array_equal(sample, before)  # the caller's array is left as it was
