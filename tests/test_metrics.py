"""Summary arithmetic: one counting window, ITL of counted requests, vLLM's peak metrics."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchsim
from batchsim.metrics import timing
from batchsim.metrics.timing import RunTable, TokenRuns
from batchsim.scheduler.interface import Scheduler
from conftest import tiny_experiment


@pytest.fixture(scope="module")
def full():
    return batchsim.run(tiny_experiment(seed=3))


def run_recording_tokens(exp: dict[str, Any]) -> tuple[batchsim.Result, dict[int, list[float]]]:
    """Run one iteration at a time and record, outside the code under test, when every
    request got each of its tokens: after each iteration, the requests whose output count
    grew got a token at that iteration's end."""
    times: dict[int, list[float]] = defaultdict(list)
    apply = Scheduler.update_from_output

    def recording(self, output, step):
        before = [r.num_output_tokens for r in output.requests]
        finished = apply(self, output, step)
        for request, count in zip(output.requests, before):
            times[request.request_id] += [step.end] * (request.num_output_tokens - count)
        return finished

    exp = {**exp, "engine": {**exp.get("engine", {}), "fast_forward": False}}
    with mock.patch.object(Scheduler, "update_from_output", recording):
        result = batchsim.run(exp)
    return result, times


def counted(result: batchsim.Result, warmup: float, cooldown: float):
    req = result.requests
    arrivals = req["arrival_time_s"]
    inside = (arrivals >= arrivals.min() + warmup) & (arrivals <= arrivals.max() - cooldown)
    return req[inside]


CANCELLING = tiny_experiment(
    seed=5,
    workload={
        "num_requests": 80,
        "arrival": {"process": "poisson", "rate": 10.0},
        "cancel_after_ms": {"dist": "uniform", "min": 100, "max": 3000},
    },
)


def test_warmup_and_cooldown_count_only_requests_arriving_inside_the_window(full):
    arrivals = full.requests["arrival_time_s"]
    lo, hi = arrivals.min() + 2.0, arrivals.max() - 2.0
    trimmed = batchsim.run(tiny_experiment(seed=3, metrics={"warmup_s": 2.0, "cooldown_s": 2.0}))
    inside = full.requests[(arrivals >= lo) & (arrivals <= hi)]
    assert trimmed.summary["num_requests"] == len(inside) < len(full.requests)
    assert trimmed.summary["completed"] == (inside["status"] == "finished").sum()
    assert trimmed.summary["mean_ttft_ms"] == pytest.approx(inside["ttft_ms"].mean(), rel=1e-12)
    assert trimmed.summary["total_output_tokens"] == inside["output_tokens"].sum()
    # the simulation itself is unchanged: trimming affects the summary only
    assert trimmed.requests.equals(full.requests)


@pytest.mark.parametrize("warmup,cooldown", [(0.0, 0.0), (1.5, 1.0)])
def test_itl_pools_the_gaps_of_counted_finished_requests_only(warmup, cooldown):
    exp = {**CANCELLING, "metrics": {"warmup_s": warmup, "cooldown_s": cooldown}}
    result, times = run_recording_tokens(exp)
    inside = counted(result, warmup, cooldown)
    assert (inside["status"] == "cancelled").sum() > 5  # cancelled requests did get tokens
    gaps = np.concatenate(
        [np.diff(times[rid]) for rid in inside.loc[inside["status"] == "finished", "request_id"]]
    )
    s = result.summary
    assert s["mean_itl_ms"] == pytest.approx(gaps.mean() * 1e3, rel=1e-9)
    assert s["std_itl_ms"] == pytest.approx(gaps.std() * 1e3, rel=1e-6)
    for p in (50, 90, 99):
        key = "median_itl_ms" if p == 50 else f"p{p}_itl_ms"
        assert s[key] == pytest.approx(np.percentile(gaps, p) * 1e3, rel=1e-9), key
    # and fast-forwarding changes nothing
    fast = batchsim.run(exp)
    assert fast.summary["p99_itl_ms"] == pytest.approx(s["p99_itl_ms"], rel=1e-9)


def test_mean_itl_is_the_time_after_the_first_token_over_the_tokens_after_it():
    # Telescoping: a request's gaps sum to finish - first token, and it has outputs - 1 of them.
    result = batchsim.run({**CANCELLING, "metrics": {"warmup_s": 1.0}})
    done = counted(result, 1.0, 0.0)
    done = done[done["status"] == "finished"]
    span = (done["finish_time_s"] - done["first_token_time_s"]).sum()
    assert result.summary["mean_itl_ms"] == pytest.approx(
        span / (done["output_tokens"] - 1).sum() * 1e3, rel=1e-9
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data(), num_requests=st.integers(0, 6), chunk=st.sampled_from([1, 2, 5, 1 << 21]))
def test_inter_token_gaps_equal_the_differences_of_each_requests_token_times(
    data, num_requests, chunk
):
    # ``chunk``: token runs counted at once (small values exercise the bounded-memory path)
    # A random iteration log: runs of back-to-back iterations of one duration, sometimes
    # after an idle gap; random requests sampling at random sets of iterations.
    runs = data.draw(
        st.lists(
            st.tuples(st.integers(1, 6), st.floats(0.001, 2.0), st.sampled_from([0.0, 0.5])),
            min_size=1,
            max_size=12,
        )
    )
    ends: list[float] = []  # per iteration, brute force
    run_starts: list[float] = []
    t = 0.0
    for steps, duration, idle in runs:
        run_starts.append(t + idle)
        for k in range(steps):
            ends.append((run_starts[-1] + duration * k) + duration)
        t = ends[-1]
    steps = np.array([r[0] for r in runs])
    table = RunTable(
        np.cumsum(steps) - steps, steps, np.array(run_starts), np.array([r[1] for r in runs])
    )
    expected: list[float] = []
    first: list[int] = []
    last: list[int] = []
    is_first: list[bool] = []
    for _ in range(num_requests):
        sampled = sorted(data.draw(st.sets(st.integers(0, len(ends) - 1), min_size=1)))
        expected += [ends[j] - ends[i] for i, j in itertools.pairwise(sampled)]
        begin = sampled[0]  # token runs: consecutive iterations
        for prev, cur in zip(sampled, [*sampled[1:], None]):
            if cur != prev + 1:
                first.append(begin)
                last.append(prev)
                is_first.append(begin == sampled[0])
                begin = cur
    runs = TokenRuns(
        np.array(first, dtype=np.int32),
        np.array(last, dtype=np.int32),
        np.array(is_first, dtype=bool),
    )
    with mock.patch.object(timing, "_GAP_CHUNK", chunk):
        values, weights = runs.inter_token_gaps(table)
    np.testing.assert_allclose(np.sort(np.repeat(values, weights)), np.sort(expected), rtol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    spans=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), max_size=20),
    window=st.tuples(st.integers(0, 50), st.integers(0, 50)),
)
def test_tokens_between_count_the_token_runs_covering_each_iteration(spans, window):
    first = np.array([a for a, _ in spans], dtype=np.int32)
    last = np.array([a + n for a, n in spans], dtype=np.int32)
    lo, hi = min(window), max(window)
    runs = TokenRuns(first, last, np.ones(len(first), dtype=bool))
    expected = [sum(a <= i <= a + n for a, n in spans) for i in range(lo, hi)]
    assert runs.tokens_between(lo, hi).tolist() == expected


def test_a_saturated_engine_is_busy_for_the_whole_counted_span():
    # Arrivals far faster than service keep the engine busy from the first arrival on; the
    # iteration statistics must cover the same span as the duration.
    exp = tiny_experiment(
        seed=2,
        workload={"num_requests": 120, "arrival": {"process": "poisson", "rate": 200.0}},
        metrics={"warmup_s": 0.1, "cooldown_s": 0.1},
    )
    s = batchsim.run(exp).summary
    assert s["busy_fraction"] == pytest.approx(1.0, abs=1e-9)


def test_iteration_statistics_count_the_iterations_starting_inside_the_counted_span():
    exp = {**CANCELLING, "metrics": {"warmup_s": 1.0, "cooldown_s": 1.5}}
    exp["engine"] = {"num_gpu_blocks": 60}  # preemptions
    result = batchsim.run(exp)
    inside = counted(result, 1.0, 1.5)
    t0 = inside["arrival_time_s"].min()
    t1 = inside.loc[inside["status"] == "finished", "finish_time_s"].max()
    it = result.iterations
    span = it[(it["start_time_s"] >= t0) & (it["start_time_s"] < t1)]
    assert len(span) < len(it)
    s = result.summary
    assert s["duration"] == pytest.approx(t1 - t0, rel=1e-12)
    assert s["mean_batch_size"] == pytest.approx(span["num_seqs"].mean(), rel=1e-12)
    assert s["num_preemptions"] == span["num_preempted"].sum() > 0
    assert s["num_swaps"] == span["num_swapped_out"].sum()
    assert s["compute_bound_fraction"] == pytest.approx((span["bound"] == "compute").mean())
    tokens = span[["num_prefill_tokens", "num_decode_tokens", "num_padding_tokens"]].sum()
    assert s["padding_fraction"] == pytest.approx(tokens["num_padding_tokens"] / tokens.sum())
    assert s["max_kv_cache_usage"] == pytest.approx(span["kv_cache_usage"].max(), rel=1e-12)
    end = span["start_time_s"] + span["duration_ms"] / 1e3
    inside_time = np.minimum(end, t1) - np.maximum(it["start_time_s"], t0).loc[span.index]
    assert s["busy_fraction"] <= 1 + 1e-12
    assert s["busy_fraction"] >= inside_time.sum() / (t1 - t0) - 1e-12
    assert s["num_iterations"] == len(it)


def test_without_trimming_preemptions_are_those_of_the_requests():
    result = batchsim.run({**CANCELLING, "engine": {"num_gpu_blocks": 60}})
    assert result.summary["num_preemptions"] == result.requests["num_preemptions"].sum() > 0


def test_vllm_benchmark_fields_have_their_vllm_meaning():
    result, times = run_recording_tokens(CANCELLING)
    req = result.requests
    s = result.summary
    done = req[req["status"] == "finished"]
    assert s["num_prompts"] == s["num_requests"] == len(req)
    assert (
        s["failed"] == (req["status"] != "finished").sum() == s["num_rejected"] + s["num_cancelled"]
    )
    assert s["request_rate"] == 10.0
    # Brute force, as vLLM's benchmark counts: one-second buckets from the first successful
    # request's start; tokens of successful requests; a request occupies every bucket from its
    # start's to its end's.
    origin = done["arrival_time_s"].min()
    buckets: dict[int, int] = defaultdict(int)
    for rid in done["request_id"]:
        for t in times[rid]:
            buckets[int(t - origin)] += 1
    assert s["max_output_tokens_per_s"] == max(buckets.values())
    in_flight: dict[int, int] = defaultdict(int)
    for start, end in zip(done["arrival_time_s"], done["finish_time_s"]):
        for second in range(int(start - origin), int(end - origin) + 1):
            in_flight[second] += 1
    assert s["max_concurrent_requests"] == max(in_flight.values())


def test_request_rate_is_infinite_all_at_once_and_unknown_in_a_closed_loop():
    # summary.json writes both as null
    burst = tiny_experiment(workload={"arrival": {"process": "all_at_once"}})
    assert batchsim.run(burst).summary["request_rate"] == math.inf
    closed = tiny_experiment()
    closed["workload"] = {**closed["workload"], "concurrency": 4}
    del closed["workload"]["arrival"]
    assert math.isnan(batchsim.run(closed).summary["request_rate"])


def test_goodput_counts_requests_meeting_every_slo(full):
    done = full.requests[full.requests["status"] == "finished"]
    ttft_slo = float(done["ttft_ms"].median())
    result = batchsim.run(tiny_experiment(seed=3, slo={"ttft_ms": ttft_slo}))
    meeting = (done["ttft_ms"] <= ttft_slo).sum()
    assert result.summary["request_goodput"] == pytest.approx(
        meeting / full.summary["duration"], rel=1e-12
    )
    assert result.summary["request_goodput"] < full.summary["request_throughput"]


def test_goodput_is_null_without_slo(full):
    assert full.summary["request_goodput"] != full.summary["request_goodput"]  # NaN -> null


def test_iteration_log_read_in_small_windows_equals_the_whole_table(full):
    log = full.iteration_log
    whole = full.iteration_columns
    windows = list(log.windows(max_rows=7))
    assert len(windows) > 10 and all(len(w["start_time_s"]) <= 7 + 127 for w in windows)
    for key, column in whole.items():
        if key == "bound":
            parts = np.concatenate([w["bound"].strings() for w in windows])
        else:
            parts = np.concatenate([w[key] for w in windows])
        np.testing.assert_array_equal(parts, column, err_msg=key)


def test_iteration_totals_inside_a_window_match_the_table(full):
    it = full.iterations
    lo, hi = float(it["start_time_s"].quantile(0.3)), float(it["start_time_s"].quantile(0.8))
    inside = it[(it["start_time_s"] >= lo) & (it["start_time_s"] < hi)]
    totals = full.iteration_log.totals(lo, hi)
    assert totals["num_counted"] == len(inside)
    assert totals["num_compute_bound"] == (inside["bound"] == "compute").sum()
    for key in ("num_seqs", "num_slots", "num_decode_tokens", "cpu_time_ms", "duration_ms"):
        assert totals[key] == pytest.approx(inside[key].sum(), rel=1e-12), key
    # busy time: the part of every iteration that lies inside [lo, hi], brute force
    start = it["start_time_s"].to_numpy()
    end = start + it["duration_ms"].to_numpy() / 1e3
    overlap = sum(max(0.0, min(e, hi) - max(b, lo)) for b, e in zip(start, end))
    assert totals["busy_s"] == pytest.approx(overlap, rel=1e-12)


def test_slo_attainment_is_the_fraction_of_all_counted_requests_meeting_every_slo(full):
    done = full.requests[full.requests["status"] == "finished"]
    ttft_slo = float(done["ttft_ms"].quantile(0.3))
    tpot_slo = float(done["tpot_ms"].quantile(0.8))
    cancel = {"cancel_after_ms": {"dist": "fixed", "value": 600}}
    exp = tiny_experiment(seed=3, slo={"ttft_ms": ttft_slo, "tpot_ms": tpot_slo})
    exp["workload"] = {**exp["workload"], **cancel}
    result = batchsim.run(exp)
    req = result.requests
    assert (req["status"] == "cancelled").sum() > 0
    meets = (req["status"] == "finished") & (req["ttft_ms"] <= ttft_slo)
    meets &= (req["tpot_ms"] <= tpot_slo) | req["tpot_ms"].isna()
    assert 0 < meets.sum() < len(req)
    assert result.summary["slo_attainment"] == pytest.approx(meets.sum() / len(req), rel=1e-12)
    assert math.isnan(full.summary["slo_attainment"])


@pytest.mark.parametrize("rate", [3.0, 6.0])
def test_queue_delay_growth_of_an_overloaded_deterministic_queue_is_rho_minus_one(rate):
    # One request at a time, identical requests, one every 1/rate s: request i waits
    # i * (S - 1/rate) when S > 1/rate, so the delay grows by rate * S - 1 seconds per second.
    exp = tiny_experiment(
        engine={"framework": None},  # the plain engine: every request's service time is S
        scheduler={"policy": "continuous", "max_num_seqs": 1},
        workload={
            "num_requests": 40,
            "arrival": {"process": "constant", "rate": rate},
            "prompt_tokens": {"dist": "fixed", "value": 200},
            "output_tokens": {"dist": "fixed", "value": 40},
        },
    )
    alone = batchsim.run({**exp, "workload": {**exp["workload"], "num_requests": 1}})
    service_s = alone.requests["e2el_ms"].iloc[0] / 1e3
    assert rate * service_s > 1.2  # overloaded
    growth = batchsim.run(exp).summary["queue_delay_growth"]
    assert growth == pytest.approx(rate * service_s - 1, rel=1e-6)


def test_queue_delay_growth_is_near_zero_when_the_system_keeps_up(full):
    assert full.summary["busy_fraction"] < 0.9
    assert abs(full.summary["queue_delay_growth"]) < 0.01
    burst = batchsim.run(tiny_experiment(workload={"arrival": {"process": "all_at_once"}}))
    assert math.isnan(burst.summary["queue_delay_growth"])
