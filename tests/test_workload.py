"""Claims about workloads: distributions sample what their analytic moments say, arrival
processes have the right rates and shapes, seeds and streams behave, traces load, and bad input
gives one clear line.

Statistical claims compare a large sample with the analytic value within several standard
errors; they do not pin seeded numbers.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchsim.workload as wl
from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.workload import (
    ARRIVAL_PROCESSES,
    LENGTH_DISTRIBUTIONS,
    TraceConfig,
    WorkloadConfig,
    generate,
    load_trace,
    load_workload,
    parse_workload,
    workload_table,
)

N = 200_000  # samples per statistical check
Z = 5.0  # tolerance in standard errors


def workload(**overrides: Any) -> WorkloadConfig:
    data: dict[str, Any] = {
        "num_requests": 100,
        "arrival": {"process": "poisson", "rate": 10.0},
        "prompt_tokens": {"dist": "uniform", "min": 10, "max": 100},
        "output_tokens": {"dist": "fixed", "value": 16},
    }
    data.update(overrides)
    return parse_workload({k: v for k, v in data.items() if v is not None})


def length_dist(spec: Any):
    return parse_workload(
        {"num_requests": 1, "arrival": "all_at_once", "prompt_tokens": spec, "output_tokens": 1}
    ).prompt_tokens


def draw(spec: Any, n: int = N, seed: int = 0) -> np.ndarray:
    return length_dist(spec).sample(np.random.default_rng(seed), n)


def config_error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_workload(data)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------
# Length distributions

LENGTH_SPECS = [
    {"dist": "fixed", "value": 77},
    {"dist": "uniform", "min": 3, "max": 9},
    {"dist": "normal", "mean": 200, "std": 40},
    {"dist": "normal", "mean": 5, "std": 10},  # a third of the mass clipped up to 1
    {"dist": "normal", "mean": 3, "std": 0.4, "max": 3},  # rounding and clipping dominate
    {"dist": "lognormal", "mean": 512, "sigma": 0.8, "max": 4096},
    {"dist": "lognormal", "mean": 300, "sigma": 1.2},
    {"dist": "exponential", "mean": 128, "max": 1536},
    {"dist": "exponential", "mean": 100, "max": 60, "min": 5},
    {"dist": "exponential", "mean": 0.7},  # mostly rounds to 0 -> clipped to 1
    {"dist": "zipf", "theta": 0.6, "min": 10, "max": 4000},
    {"dist": "zipf", "theta": 1.5, "max": 1000},
    {"dist": "empirical", "values": [1, 5, 5, 9, 120, 3000]},
    {"dist": "empirical", "values": [1, 5, 5, 9, 120, 3000], "max": 100},
]


@pytest.mark.parametrize("spec", LENGTH_SPECS, ids=lambda s: json.dumps(s, sort_keys=True))
def test_length_sample_mean_matches_analytic_mean(spec: dict[str, Any]) -> None:
    dist = length_dist(spec)
    x = dist.sample(np.random.default_rng(1), N)
    mean, var = dist.analytic_moments()
    assert abs(x.mean() - mean) <= Z * math.sqrt(var / N) + 1e-12


@pytest.mark.parametrize(
    "spec",
    [s for s in LENGTH_SPECS if s["dist"] not in ("fixed",) and s.get("sigma", 0) < 1],
    ids=lambda s: json.dumps(s, sort_keys=True),
)
def test_length_sample_variance_matches_analytic_variance(spec: dict[str, Any]) -> None:
    dist = length_dist(spec)
    x = dist.sample(np.random.default_rng(2), N).astype(float)
    assert x.var() == pytest.approx(dist.analytic_variance(), rel=0.03)


def test_every_sample_is_an_int64_of_at_least_one_token() -> None:
    for spec in LENGTH_SPECS:
        x = draw(spec, n=10_000)
        assert x.dtype == np.int64
        assert x.min() >= 1


def test_lognormal_mean_is_the_mean_of_token_counts_not_of_their_log() -> None:
    x = draw({"dist": "lognormal", "mean": 1000, "sigma": 1.0})
    se = 1000 * math.sqrt(math.expm1(1.0) / N)
    assert abs(x.mean() - 1000) < Z * se
    assert np.median(x) == pytest.approx(1000 * math.exp(-0.5), rel=0.02)


def test_lognormal_max_lowers_the_sampled_mean_and_analytic_mean_says_by_how_much() -> None:
    dist = length_dist({"dist": "lognormal", "mean": 1000, "sigma": 1.0, "max": 1500})
    assert dist.analytic_mean() < 800
    x = dist.sample(np.random.default_rng(3), N)
    assert abs(x.mean() - dist.analytic_mean()) < Z * math.sqrt(dist.analytic_variance() / N)


@pytest.mark.parametrize(
    "spec",
    [
        {"dist": "normal", "mean": 100, "std": 80, "min": 20, "max": 150},
        {"dist": "lognormal", "mean": 500, "sigma": 1.5, "min": 50, "max": 2000},
        {"dist": "exponential", "mean": 300, "min": 40, "max": 900},
        {"dist": "empirical", "values": [1, 2, 50, 400, 9000], "min": 3, "max": 500},
    ],
)
def test_min_and_max_bound_every_sample(spec: dict[str, Any]) -> None:
    x = draw(spec, n=50_000)
    assert x.min() == spec["min"]
    assert x.max() <= spec["max"]


def test_exponential_max_redraws_like_anyscale_capped_exponential_instead_of_clipping() -> None:
    mean, cap = 100.0, 100
    x = draw({"dist": "exponential", "mean": mean, "max": cap})
    # Clipping would put exp(-1) ~ 37% of the requests at exactly the cap.
    assert np.mean(x == cap) < 0.01
    # Reference law written from the benchmark's description: round(Exp(mean)), keep <= cap,
    # then at least one token.
    rng = np.random.default_rng(99)
    ref = np.rint(rng.exponential(mean, size=4 * N))
    ref = np.maximum(ref[ref <= cap][:N], 1)
    assert abs(x.mean() - ref.mean()) < Z * math.sqrt(2 * x.var() / N)
    for k in (1, 2, 50, 100):
        p, q = np.mean(x == k), np.mean(ref == k)
        assert abs(p - q) < Z * math.sqrt(2 * q * (1 - q) / N) + 1e-4
    # Continuous truncated-exponential mean: m - c e^{-c/m} / (1 - e^{-c/m}), c = cap + 1/2.
    c = cap + 0.5
    continuous = mean - c * math.exp(-c / mean) / -math.expm1(-c / mean)
    assert length_dist({"dist": "exponential", "mean": mean, "max": cap}).analytic_mean() == (
        pytest.approx(continuous, abs=0.2)
    )


def test_zipf_makes_min_the_most_likely_value_with_ratio_two_to_the_theta() -> None:
    theta = 1.2
    x = draw({"dist": "zipf", "theta": theta, "min": 20, "max": 10_000})
    assert x.min() == 20 and x.max() <= 10_000
    ratio = np.mean(x == 20) / np.mean(x == 21)
    assert ratio == pytest.approx(2**theta, rel=0.05)


def test_zipf_with_theta_zero_is_uniform() -> None:
    dist = length_dist({"dist": "zipf", "theta": 0, "min": 1, "max": 99})
    assert dist.analytic_mean() == pytest.approx(50.0)


def test_analytic_mean_does_not_depend_on_the_exact_summation_cutoff(monkeypatch) -> None:
    spec = {"dist": "lognormal", "mean": 2000, "sigma": 1.5, "max": 10**7}
    exact = length_dist(spec).analytic_moments()
    monkeypatch.setattr(wl.moments, "_EXACT_SUM_POINTS", 500)
    approx = length_dist(spec).analytic_moments()
    assert approx[0] == pytest.approx(exact[0], rel=1e-4)
    assert approx[1] == pytest.approx(exact[1], rel=1e-3)


def test_empirical_reads_one_integer_column_with_header_and_comments(tmp_path: Path) -> None:
    (tmp_path / "lengths.txt").write_text("# observed\ntokens\n10\n20\n\n30\n")
    cfg = workload(prompt_tokens={"dist": "empirical", "path": "lengths.txt"})
    assert cfg.prompt_tokens.analytic_mean(tmp_path) == pytest.approx(20.0)
    table = generate(cfg, 0, tmp_path)
    assert set(table.prompt_tokens) <= {10, 20, 30}


def test_empirical_column_of_a_builtin_trace_matches_the_trace_mean() -> None:
    dist = length_dist(
        {"dist": "empirical", "path": "azure_conv_sample.csv", "column": "GeneratedTokens"}
    )
    trace = load_trace(TraceConfig(path="azure_conv_sample.csv"))
    assert dist.analytic_mean() == pytest.approx(trace.output_tokens.mean())


def test_number_shorthand_means_fixed_length() -> None:
    cfg = workload(output_tokens=128)
    assert cfg.output_tokens == length_dist({"dist": "fixed", "value": 128})


# ------------------------------------------------------------------------------------------
# Arrival processes


def arrivals(process: dict[str, Any], n: int = N, seed: int = 0, **kw: Any) -> np.ndarray:
    return generate(workload(arrival=process, num_requests=n, **kw), seed).arrival_time


def test_poisson_interarrival_mean_is_one_over_rate_and_cv_is_one() -> None:
    rate = 4.0
    gaps = np.diff(arrivals({"process": "poisson", "rate": rate}), prepend=0.0)
    assert abs(gaps.mean() - 1 / rate) < Z * (1 / rate) / math.sqrt(N)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_interarrival_cv_matches_cv(cv: float) -> None:
    gaps = np.diff(arrivals({"process": "gamma", "rate": 2.0, "cv": cv}), prepend=0.0)
    assert gaps.mean() == pytest.approx(0.5, rel=Z * cv / math.sqrt(N))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_constant_arrivals_are_exactly_evenly_spaced() -> None:
    t = arrivals({"process": "constant", "rate": 8.0}, n=1000)
    assert t[0] == pytest.approx(0.125)
    np.testing.assert_allclose(np.diff(t), 0.125, rtol=0, atol=1e-9)


def test_burst_has_no_arrivals_in_off_periods_and_the_duty_cycle_rate() -> None:
    on, off, rate = 2.0, 3.0, 50.0
    t = arrivals({"process": "burst", "rate": rate, "on_s": on, "off_s": off})
    phase = np.mod(t, on + off)
    assert np.all(phase < on + 1e-9)
    expected = rate * on / (on + off)
    assert len(t) / t[-1] == pytest.approx(expected, rel=0.02)


def test_all_at_once_puts_every_request_at_time_zero() -> None:
    t = arrivals({"process": "all_at_once"}, n=500)
    assert len(t) == 500 and not t.any()


def test_arrival_shorthand_string_means_the_process_without_parameters() -> None:
    assert (
        workload(arrival="all_at_once").arrival
        == workload(arrival={"process": "all_at_once"}).arrival
    )


def test_duration_alone_bounds_arrivals_and_count_matches_rate() -> None:
    rate, duration = 20.0, 500.0
    cfg = workload(
        num_requests=None, duration_s=duration, arrival={"process": "poisson", "rate": rate}
    )
    t = generate(cfg, 0).arrival_time
    assert t.max() < duration
    assert abs(len(t) - rate * duration) < Z * math.sqrt(rate * duration)


def test_num_requests_and_duration_stop_at_whichever_comes_first() -> None:
    few = generate(workload(num_requests=50, duration_s=1000.0), 0)
    assert len(few) == 50
    short = generate(workload(num_requests=10_000, duration_s=10.0), 0)
    assert len(short) < 10_000 and short.arrival_time.max() < 10.0


def test_duration_limit_cuts_the_same_arrival_sequence_as_num_requests() -> None:
    by_count = generate(workload(num_requests=5000), 0).arrival_time
    both = generate(workload(num_requests=5000, duration_s=1e9), 0).arrival_time
    by_time = generate(workload(num_requests=None, duration_s=100.0), 0).arrival_time
    assert np.array_equal(by_count, both)
    assert np.array_equal(by_time, by_count[: len(by_time)])


def test_arrival_times_are_float64_and_non_decreasing() -> None:
    for process in ARRIVAL_PROCESSES:
        spec: dict[str, Any] = {"process": process}
        if process != "all_at_once":
            spec["rate"] = 3.0
        if process == "gamma":
            spec["cv"] = 2.0
        if process == "burst":
            spec.update(on_s=1.0, off_s=1.0)
        t = arrivals(spec, n=5000)
        assert t.dtype == np.float64 and np.all(np.diff(t) >= 0)


# ------------------------------------------------------------------------------------------
# Seeds and streams


def test_same_seed_gives_identical_tables_and_another_seed_differs() -> None:
    cfg = workload(num_requests=2000, cancel_after_ms={"dist": "exponential", "mean": 5000})
    a, b, c = generate(cfg, 7), generate(cfg, 7), generate(cfg, 8)
    for name in ("arrival_time", "prompt_tokens", "output_tokens", "cancel_after"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_time, c.arrival_time)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_changing_the_output_distribution_leaves_arrivals_and_prompts_unchanged() -> None:
    a = generate(workload(num_requests=1000), 3)
    b = generate(
        workload(num_requests=1000, output_tokens={"dist": "lognormal", "mean": 200, "sigma": 1}), 3
    )
    assert np.array_equal(a.arrival_time, b.arrival_time)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.output_tokens, b.output_tokens)


def test_changing_the_arrival_process_leaves_lengths_unchanged() -> None:
    a = generate(
        workload(num_requests=1000, output_tokens={"dist": "uniform", "min": 1, "max": 500}), 3
    )
    b = generate(
        workload(
            num_requests=1000,
            arrival={"process": "gamma", "rate": 1, "cv": 4},
            output_tokens={"dist": "uniform", "min": 1, "max": 500},
        ),
        3,
    )
    assert not np.array_equal(a.arrival_time, b.arrival_time)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.output_tokens, b.output_tokens)


def test_generation_does_not_touch_numpy_global_random_state() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    generate(workload(num_requests=1000), 0)
    assert np.array_equal(np.random.get_state()[1], before)


def test_negative_seed_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="seed"):
        generate(workload(), -1)


def test_one_million_requests_generate_fast() -> None:
    cfg = workload(
        num_requests=1_000_000,
        prompt_tokens={"dist": "lognormal", "mean": 512, "sigma": 0.8, "max": 4096},
        output_tokens={"dist": "exponential", "mean": 128, "max": 1536},
    )
    start = time.perf_counter()
    table = generate(cfg, 0)
    assert time.perf_counter() - start < 1.0
    assert len(table) == 1_000_000


# ------------------------------------------------------------------------------------------
# Closed loop and cancellations


def test_closed_loop_has_nan_arrivals_users_and_think_times_in_seconds() -> None:
    cfg = workload(
        arrival=None,
        concurrency=8,
        num_requests=50_000,
        think_time_ms={"dist": "exponential", "mean": 2000},
    )
    table = generate(cfg, 0)
    assert table.concurrency == 8
    assert np.all(np.isnan(table.arrival_time))
    assert table.think_time is not None
    assert table.think_time.mean() == pytest.approx(2.0, rel=Z / math.sqrt(50_000))


def test_closed_loop_think_time_defaults_to_zero_and_open_loop_has_none() -> None:
    closed = generate(workload(arrival=None, concurrency=2), 0)
    assert closed.think_time is not None and not closed.think_time.any()
    open_ = generate(workload(), 0)
    assert open_.think_time is None and open_.concurrency is None


def test_cancel_after_is_converted_from_ms_to_seconds() -> None:
    table = generate(workload(num_requests=1000, cancel_after_ms=1500), 0)
    assert table.cancel_after is not None
    np.testing.assert_allclose(table.cancel_after, 1.5)
    assert generate(workload(), 0).cancel_after is None


@pytest.mark.parametrize(
    "spec",
    [
        {"dist": "uniform", "min": 100, "max": 300},
        {"dist": "lognormal", "mean": 800, "sigma": 0.7},
        {"dist": "normal", "mean": 100, "std": 150},  # clipped at 0
    ],
)
def test_time_distribution_sample_mean_matches_analytic_mean(spec: dict[str, Any]) -> None:
    dist = workload(cancel_after_ms=spec).cancel_after_ms
    x = dist.sample(np.random.default_rng(0), N)
    assert x.min() >= 0
    assert abs(x.mean() - dist.analytic_mean()) < Z * math.sqrt(dist.analytic_variance() / N)


# ------------------------------------------------------------------------------------------
# Traces


def trace_workload(**trace: Any) -> WorkloadConfig:
    extra = {k: trace.pop(k) for k in ("num_requests", "duration_s", "arrival") if k in trace}
    return parse_workload({"trace": trace, **extra})


def test_azure_conv_sample_loads_2000_rows_with_the_file_values() -> None:
    table = generate(trace_workload(path="azure_conv_sample.csv", format="azure"), 0)
    assert len(table) == 2000
    # 2023-11-16 18:15:46.6805900 -> 18:15:50.9951690 -> 18:15:51.2224670
    np.testing.assert_allclose(table.arrival_time[:3], [0.0, 4.314579, 4.541877], atol=1e-6)
    assert table.prompt_tokens[:3].tolist() == [374, 396, 879]
    assert table.output_tokens[:3].tolist() == [44, 109, 55]
    assert table.prefix is None


def test_azure_code_sample_loads_500_rows() -> None:
    table = generate(trace_workload(path="azure_code_sample.csv"), 0)  # format inferred
    assert len(table) == 500
    assert table.prompt_tokens[:2].tolist() == [4808, 3180]


def test_mooncake_sample_loads_times_lengths_and_prefix_hash_ids() -> None:
    table = generate(trace_workload(path="mooncake_synthetic_sample.jsonl", format="mooncake"), 0)
    assert len(table) == 200
    np.testing.assert_allclose(table.arrival_time[:4], [0.0, 0.0, 0.040, 0.277])
    assert table.prompt_tokens[:2].tolist() == [40160, 36640]
    assert table.output_tokens[:2].tolist() == [6, 4]
    assert table.prefix is not None and len(table.prefix) == 200
    # the first line: 40,160 prompt tokens, hash_ids 0..78 of 512 tokens each, the last one
    # holding what the prompt leaves: 40,160 - 78 x 512 = 224 tokens
    first = table.prefix.segments(0)
    assert first is not None and len(first) == 79
    assert first[:3] == ((0, 512), (1, 512), (2, 512)) and first[-1] == (78, 224)
    assert sum(tokens for _, tokens in first) == 40160


def test_mooncake_hash_ids_past_the_prompt_are_dropped_and_short_lists_leave_own_tokens(
    tmp_path: Path,
) -> None:
    rows = [
        '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [7, 8, 9]}',
        '{"timestamp": 1, "input_length": 1500, "output_length": 2, "hash_ids": [7]}',
        '{"timestamp": 2, "input_length": 10, "output_length": 2, "hash_ids": []}',
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(rows) + "\n")
    table = generate(trace_workload(path=str(path), format="mooncake"), 0)
    assert table.prefix is not None
    assert table.prefix.segments(0) == ((7, 512), (8, 88))  # 600 = 512 + 88: id 9 is past it
    assert table.prefix.segments(1) == ((7, 512),)  # 988 tokens of its own after the block
    assert table.prefix.segments(2) is None


def test_time_scale_half_replays_twice_as_fast() -> None:
    base = generate(trace_workload(path="azure_conv_sample.csv"), 0).arrival_time
    fast = generate(trace_workload(path="azure_conv_sample.csv", time_scale=0.5), 0)
    np.testing.assert_allclose(fast.arrival_time, base * 0.5)


def test_num_requests_and_duration_truncate_a_trace() -> None:
    assert len(generate(trace_workload(path="azure_conv_sample.csv", num_requests=100), 0)) == 100
    cut = generate(trace_workload(path="azure_conv_sample.csv", duration_s=60.0), 0)
    assert 0 < len(cut) < 2000 and cut.arrival_time.max() < 60.0


def test_trace_with_an_arrival_process_keeps_trace_lengths_in_order() -> None:
    table = generate(
        trace_workload(
            path="azure_conv_sample.csv",
            num_requests=10,
            arrival={"process": "constant", "rate": 1},
        ),
        0,
    )
    np.testing.assert_allclose(table.arrival_time, np.arange(1, 11))
    assert table.prompt_tokens[:3].tolist() == [374, 396, 879]


def test_generic_csv_with_custom_columns_and_milliseconds(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("t_ms,in,out,extra\n0,10,2,x\n1500,20,3,y\n4000,30,4,z\n")
    cfg = trace_workload(
        path="t.csv",
        format="csv",
        time_unit="ms",
        columns={"arrival_time": "t_ms", "prompt_tokens": "in", "output_tokens": "out"},
    )
    table = generate(cfg, 0, tmp_path)
    np.testing.assert_allclose(table.arrival_time, [0.0, 1.5, 4.0])
    assert table.prompt_tokens.tolist() == [10, 20, 30]
    assert table.output_tokens.tolist() == [2, 3, 4]


def test_generic_csv_default_columns_in_seconds(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_time,prompt_tokens,output_tokens\n2.5,7,1\n3,8,2\n")
    table = generate(trace_workload(path="t.csv", format="csv"), 0, tmp_path)
    np.testing.assert_allclose(table.arrival_time, [2.5, 3.0])  # used as given


def test_relative_trace_path_is_found_next_to_the_experiment_before_the_catalog(
    tmp_path: Path,
) -> None:
    shutil.copy(
        catalog_dir("workloads") / "azure_code_sample.csv", tmp_path / "azure_conv_sample.csv"
    )
    table = generate(trace_workload(path="azure_conv_sample.csv"), 0, tmp_path)
    assert len(table) == 500  # the local file shadows the built-in one


def test_builtin_trace_is_found_from_any_working_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert len(generate(trace_workload(path="azure_conv_sample.csv"), 0)) == 2000


# ------------------------------------------------------------------------------------------
# Errors: one line naming the file, line or key


def base_data(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "num_requests": 10,
        "arrival": {"process": "poisson", "rate": 1.0},
        "prompt_tokens": 10,
        "output_tokens": 10,
    }
    data.update(overrides)
    return data


def test_unknown_process_lists_the_allowed_processes() -> None:
    message = config_error(base_data(arrival={"process": "poison", "rate": 1}))
    assert message.startswith("workload.arrival.process must be one of")
    for name in ARRIVAL_PROCESSES:
        assert repr(name) in message
    assert "'poison'" in message


def test_unknown_dist_lists_the_allowed_distributions() -> None:
    message = config_error(base_data(output_tokens={"dist": "pareto", "alpha": 2}))
    assert message.startswith("workload.output_tokens.dist must be one of")
    for name in LENGTH_DISTRIBUTIONS:
        assert repr(name) in message


def test_negative_rate_names_the_key_rule_and_value() -> None:
    message = config_error(base_data(arrival={"process": "gamma", "rate": -1, "cv": 2}))
    assert message == "workload.arrival.rate must be > 0, got -1"


def test_infinite_rate_is_rejected() -> None:
    message = config_error(base_data(arrival={"process": "poisson", "rate": math.inf}))
    assert message.startswith("workload.arrival.rate must be a finite number")


def test_min_greater_than_max_is_rejected() -> None:
    message = config_error(base_data(prompt_tokens={"dist": "uniform", "min": 10, "max": 5}))
    assert message == "workload.prompt_tokens.max must be >= min (10), got 5"


def test_unknown_key_lists_the_allowed_keys() -> None:
    message = config_error(base_data(arrival={"process": "poisson", "rate": 1, "cv": 2}))
    assert message == "workload.arrival.cv: unknown key; allowed keys: process, rate"
    assert config_error(base_data(arival=1)).startswith("workload.arival: unknown key")


def test_missing_lengths_name_the_missing_key() -> None:
    message = config_error({"num_requests": 5, "arrival": "all_at_once", "prompt_tokens": 9})
    assert message == "workload.output_tokens is required (or give a trace)"


def test_arrival_and_concurrency_are_mutually_exclusive() -> None:
    message = config_error(base_data(concurrency=4))
    assert message.startswith("workload.concurrency cannot be combined with arrival")


def test_trace_excludes_synthetic_lengths() -> None:
    message = config_error({"trace": {"path": "azure_conv_sample.csv"}, "prompt_tokens": 5})
    assert message.startswith("workload.prompt_tokens cannot be combined with trace")


def test_missing_trace_file_names_the_key_and_the_places_looked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        generate(trace_workload(path="nope.csv"), 0, tmp_path)
    message = str(info.value)
    assert message.startswith("workload.trace.path: file not found: nope.csv")
    assert str(tmp_path) in message and "azure_conv_sample.csv" in message
    assert "\n" not in message


def corrupted_copy(tmp_path: Path, line: int, new: str) -> None:
    src = (catalog_dir("workloads") / "azure_conv_sample.csv").read_text().splitlines()
    src[line - 1] = new
    (tmp_path / "azure_conv_sample.csv").write_text("\n".join(src) + "\n")


def trace_error(tmp_path: Path, path: str = "azure_conv_sample.csv") -> str:
    with pytest.raises(ConfigError) as info:
        generate(trace_workload(path=path), 0, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_malformed_trace_row_names_file_line_and_column(tmp_path: Path) -> None:
    corrupted_copy(tmp_path, 17, "2023-11-16 18:16:06.0000000,abc,12")
    assert trace_error(tmp_path) == (
        "azure_conv_sample.csv:17: ContextTokens: expected a positive integer <= 16777216 "
        "(tokens), got 'abc'"
    )


def test_zero_output_tokens_in_a_trace_is_rejected(tmp_path: Path) -> None:
    corrupted_copy(tmp_path, 5, "2023-11-16 18:15:51.3910170,91,0")
    assert trace_error(tmp_path).startswith("azure_conv_sample.csv:5: GeneratedTokens")


def test_bad_timestamp_and_backwards_timestamps_name_their_line(tmp_path: Path) -> None:
    corrupted_copy(tmp_path, 9, "yesterday,10,10")
    assert trace_error(tmp_path).startswith("azure_conv_sample.csv:9: TIMESTAMP: expected")
    corrupted_copy(tmp_path, 9, "2023-11-16 18:00:00.0000000,10,10")
    message = trace_error(tmp_path)
    assert message.startswith("azure_conv_sample.csv:9: TIMESTAMP goes backwards")


def test_short_row_names_its_line(tmp_path: Path) -> None:
    corrupted_copy(tmp_path, 4, "2023-11-16 18:15:51.2224670,879")
    assert trace_error(tmp_path) == "azure_conv_sample.csv:4: expected 3 fields, got 2"


def test_empty_trace_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert trace_error(tmp_path, "empty.csv") == "empty.csv: empty trace: no data rows"


def test_missing_column_names_the_header(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("time,prompt_tokens,output_tokens\n1,2,3\n")
    message = trace_error(tmp_path, "t.csv")
    assert message.startswith("t.csv:1: missing column 'arrival_time'")


def test_malformed_mooncake_line_names_its_line(tmp_path: Path) -> None:
    lines = (catalog_dir("workloads") / "mooncake_synthetic_sample.jsonl").read_text().splitlines()
    lines[2] = '{"timestamp": 40, "input_length": -5, "output_length": 3}'
    lines[6] = "{not json"
    (tmp_path / "m.jsonl").write_text("\n".join(lines[:5]) + "\n")
    assert trace_error(tmp_path, "m.jsonl") == (
        "m.jsonl:3: input_length: expected a positive integer <= 16777216 (tokens), got -5"
    )
    (tmp_path / "m.jsonl").write_text("\n".join(lines[3:8]) + "\n")
    assert trace_error(tmp_path, "m.jsonl").startswith("m.jsonl:4: invalid JSON")


def test_num_requests_beyond_the_trace_is_an_error() -> None:
    with pytest.raises(ConfigError, match="exceeds the 200 requests"):
        generate(trace_workload(path="mooncake_synthetic_sample.jsonl", num_requests=201), 0)


def test_no_arrival_before_duration_is_an_error() -> None:
    cfg = workload(num_requests=None, duration_s=1e-9, arrival={"process": "constant", "rate": 1})
    with pytest.raises(ConfigError, match="no request arrives"):
        generate(cfg, 0)


# ------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lo=st.integers(1, 10_000), width=st.integers(0, 10_000), seed=st.integers(0, 2**32))
def test_any_valid_uniform_config_yields_values_in_its_range(lo: int, width: int, seed: int):
    x = draw({"dist": "uniform", "min": lo, "max": lo + width}, n=500, seed=seed)
    assert x.min() >= lo and x.max() <= lo + width


@settings(max_examples=60, deadline=None)
@given(
    mean=st.floats(-1e4, 1e5),
    std=st.floats(0.01, 1e4),
    lo=st.integers(1, 100),
    width=st.integers(0, 10_000),
)
def test_clipped_normal_stays_within_bounds_and_so_does_its_analytic_mean(
    mean: float, std: float, lo: int, width: int
) -> None:
    dist = length_dist({"dist": "normal", "mean": mean, "std": std, "min": lo, "max": lo + width})
    x = dist.sample(np.random.default_rng(0), 200)
    assert x.min() >= lo and x.max() <= lo + width
    assert lo - 1e-6 <= dist.analytic_mean() <= lo + width + 1e-6


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.sampled_from(["poisson", "fixed", "uniform", "x", "azure"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "process",
                    "dist",
                    "rate",
                    "value",
                    "min",
                    "max",
                    "num_requests",
                    "arrival",
                    "prompt_tokens",
                    "bogus",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(data=_json)
def test_any_input_is_either_valid_or_a_one_line_config_error(data: Any) -> None:
    try:
        parse_workload(data)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc)


# ------------------------------------------------------------------------------------------
# Catalog


def test_workload_table_lists_files_processes_and_distributions() -> None:
    rows = workload_table()
    by_name = {(r["kind"], r["name"]): r for r in rows}
    for name in ("sharegpt-like", "anyscale-capped-exponential", "azure-conv-sample"):
        assert ("workload", name) in by_name
    for name in (
        "azure_conv_sample.csv",
        "azure_code_sample.csv",
        "mooncake_synthetic_sample.jsonl",
    ):
        assert ("trace", name) in by_name
    for name in ARRIVAL_PROCESSES:
        assert ("arrival", name) in by_name
    for name in LENGTH_DISTRIBUTIONS:
        assert ("length", name) in by_name
    assert by_name[("trace", "azure_conv_sample.csv")]["requests"] == 2000
    sharegpt = by_name[("workload", "sharegpt-like")]
    assert sharegpt["mean_prompt_tokens"] == pytest.approx(2340, rel=0.01)
    assert sharegpt["mean_output_tokens"] == pytest.approx(438.7, rel=0.01)
    assert "rate" in by_name[("arrival", "gamma")]["parameters"]


@pytest.mark.parametrize(
    "name", ["sharegpt-like", "anyscale-capped-exponential", "azure-conv-sample"]
)
def test_builtin_workload_files_load_and_generate(name: str) -> None:
    definition = load_workload(name)
    table = generate(definition.config, 0, definition.base_dir)
    assert len(table) > 0 and definition.description


def test_anyscale_workload_has_the_benchmark_output_mean() -> None:
    table = generate(load_workload("anyscale-capped-exponential").config, 0)
    assert np.all(table.arrival_time == 0) and np.all(table.prompt_tokens == 512)
    assert table.output_tokens.max() <= 1536
    assert abs(table.output_tokens.mean() - 128) < Z * 128 / math.sqrt(1000)


# ------------------------------------------------------------------------------------------
# The pydantic -> ConfigError helper the whole config uses


def test_config_error_helper_drops_union_tags_and_finds_the_model_by_name() -> None:
    from pydantic import ValidationError

    from batchsim.validation import config_error_from_pydantic

    data = base_data(prompt_tokens={"dist": "empirical", "values": [3, 0]})
    with pytest.raises(ValidationError) as info:
        WorkloadConfig.model_validate(data)
    error = config_error_from_pydantic(info.value, "workload", "exp.yaml")
    assert str(error) == "exp.yaml: workload.prompt_tokens.values[1] must be >= 1, got 0"
    assert error.source == "exp.yaml"


def test_config_error_helper_counts_further_errors_on_the_same_line() -> None:
    data = base_data(arrival={"process": "poisson", "rate": -1}, num_requests=0)
    message = config_error(data)
    assert message.endswith("(and 1 more error)")


# ------------------------------------------------------------------------------------------
# Caps and number rules: every number finite and bounded, token counts integers in [1, 2^24]

NUMERIC_KEYS = {
    "normal": ("mean", "std"),
    "lognormal": ("mean", "sigma"),
    "exponential": ("mean",),
    "zipf": ("theta",),
}
TIME_KEYS = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "sigma")}


@settings(max_examples=60, deadline=None)
@given(
    dist=st.sampled_from(sorted(NUMERIC_KEYS)),
    data=st.data(),
    value=st.sampled_from([math.nan, math.inf, -math.inf]) | st.floats(1e13, 1e308),
)
def test_any_non_finite_or_huge_distribution_parameter_is_rejected_naming_it(
    dist: str, data: st.DataObject, value: float
) -> None:
    key = data.draw(st.sampled_from(NUMERIC_KEYS[dist]))
    spec: dict[str, Any] = {"dist": dist, "mean": 100, "std": 10, "sigma": 1, "theta": 1}
    spec = {k: v for k, v in spec.items() if k == "dist" or k in NUMERIC_KEYS[dist]}
    if dist == "zipf":
        spec["max"] = 100
    spec[key] = value
    message = config_error({"num_requests": 1, "arrival": "all_at_once", "prompt_tokens": spec})
    assert message.startswith(f"workload.prompt_tokens.{key} must be"), message


@settings(max_examples=30, deadline=None)
@given(
    dist=st.sampled_from(sorted(TIME_KEYS)),
    data=st.data(),
    value=st.sampled_from([math.nan, math.inf, -math.inf]) | st.floats(1e13, 1e308),
)
def test_any_non_finite_or_huge_time_parameter_is_rejected_naming_it(
    dist: str, data: st.DataObject, value: float
) -> None:
    key = data.draw(st.sampled_from(TIME_KEYS[dist]))
    spec: dict[str, Any] = {"dist": dist, "value": 1, "min": 1, "max": 2, "mean": 5, "sigma": 1}
    spec = {k: v for k, v in spec.items() if k == "dist" or k in TIME_KEYS[dist]}
    spec[key] = value
    data_in = {"num_requests": 2, "arrival": "all_at_once", "prompt_tokens": 1}
    message = config_error({**data_in, "output_tokens": 1, "cancel_after_ms": spec})
    assert message.startswith(f"workload.cancel_after_ms.{key} must be"), message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"num_requests": 10_000_001}, "workload.num_requests must be <= 10000000, got 10000001"),
        ({"num_requests": 1e9}, "workload.num_requests must be <= 10000000, got 1000000000.0"),
        ({"num_requests": 1.5}, "workload.num_requests must be an integer, got 1.5"),
        ({"num_requests": True}, "workload.num_requests must be an integer, got true"),
        ({"output_tokens": 2**24 + 1}, "workload.output_tokens.value must be <= 16777216"),
        # (the value is echoed as 1e+20 or as 100000000000000000000 by pydantic's version)
        ({"output_tokens": 1e20}, "workload.output_tokens.value must be <= 16777216, got 1"),
        ({"duration_s": 1e10, "num_requests": None}, "workload.duration_s must be <= 1000000000"),
        (
            {"duration_s": 2e6, "num_requests": None},
            "workload.duration_s x arrival rate (10 req/s) must be <= 10,000,000 requests, "
            "got about 2e+07",
        ),
    ],
)
def test_sizes_are_capped_at_validation(data: dict[str, Any], expected: str) -> None:
    base = {
        "num_requests": 100,
        "arrival": {"process": "poisson", "rate": 10.0},
        "prompt_tokens": 10,
        "output_tokens": 16,
    }
    merged = {k: v for k, v in {**base, **data}.items() if v is not None}
    assert config_error(merged).startswith(expected)


def test_whole_floats_are_integers() -> None:
    cfg = workload(num_requests=1e3, output_tokens={"dist": "fixed", "value": 1.6e1})
    assert cfg.num_requests == 1000 and isinstance(cfg.num_requests, int)
    assert generate(cfg, 0).output_tokens[0] == 16


def test_a_drawn_length_over_the_cap_is_an_error_naming_the_key() -> None:
    cfg = workload(prompt_tokens={"dist": "normal", "mean": 2**24, "std": 1e6})
    with pytest.raises(
        ConfigError, match=r"^workload\.prompt_tokens: a drawn value is 1\.\d+e\+07"
    ):
        generate(cfg, 0)
    capped = workload(prompt_tokens={"dist": "normal", "mean": 2**24, "std": 1e6, "max": 2**24})
    assert generate(capped, 0).prompt_tokens.max() == 2**24  # with a max, it clips as documented


def test_sampling_never_overflows_int64() -> None:
    # The largest lognormal the rules admit, without a max: the draws stay finite and exact.
    x = draw({"dist": "lognormal", "mean": 2**24, "sigma": 10}, n=1000)
    assert x.dtype == np.int64 and x.min() >= 1 and x.max() <= 2**62


def test_a_drawn_time_over_the_cap_is_an_error() -> None:
    cfg = workload(cancel_after_ms={"dist": "lognormal", "mean": 1e12, "sigma": 1})
    with pytest.raises(ConfigError, match=r"^workload\.cancel_after_ms: a drawn value"):
        generate(cfg, 0)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("t.csv", "arrival_time,prompt_tokens,output_tokens\n0,1e23,5\n", "t.csv:2: prompt_tokens"),
        ("t.csv", "arrival_time,prompt_tokens,output_tokens\n0,16777217,5\n", "t.csv:2:"),
        ("t.csv", "arrival_time,prompt_tokens,output_tokens\n0,5,5\n2e9,5,5\n", "t.csv:3:"),
        ("t.jsonl", '{"timestamp": 0, "input_length": 1e23, "output_length": 1}\n', "t.jsonl:1:"),
        ("t.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1e400}\n', "t.jsonl:1:"),
        ("t.jsonl", '{"timestamp": 1e300, "input_length": 1, "output_length": 1}\n', None),
    ],
)
def test_trace_numbers_out_of_range_name_file_and_line(
    tmp_path: Path, name: str, text: str, expected: str | None
) -> None:
    (tmp_path / name).write_text(text)
    if expected is None:  # a single huge timestamp is fine: times count from the first row
        assert len(generate(trace_workload(path=name), 0, tmp_path)) == 1
        return
    message = trace_error(tmp_path, name)
    assert message.startswith(expected), message


def test_trace_time_scale_past_the_time_limit_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_time,prompt_tokens,output_tokens\n0,5,5\n9e8,5,5\n")
    with pytest.raises(ConfigError, match=r"workload\.trace\.time_scale=2 puts the last arrival"):
        generate(trace_workload(path="t.csv", time_scale=2.0), 0, tmp_path)


def test_data_files_are_utf8_text_of_bounded_size(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "t.csv").write_bytes("arrival_time,prompt_tokens\n".encode("utf-16"))
    assert "UTF-16" in trace_error(tmp_path, "t.csv")
    (tmp_path / "n.txt").write_bytes(b"12\n\xff\n")
    spec = {"dist": "empirical", "path": str(tmp_path / "n.txt")}
    with pytest.raises(ConfigError, match=r"n.txt:2: not UTF-8 text: byte 0xff"):
        draw(spec, n=1)
    monkeypatch.setattr("batchsim.yamlio.reading.MAX_DATA_BYTES", 10)
    (tmp_path / "m.txt").write_text("12\n13\n14\n15\n")
    with pytest.raises(ConfigError, match=r"m.txt: file is larger than 0 MiB"):
        draw({"dist": "empirical", "path": str(tmp_path / "m.txt")}, n=1)


def test_empirical_file_values_are_token_counts(tmp_path: Path) -> None:
    (tmp_path / "n.txt").write_text("0\n12\n")  # "0" is a bad value, not a header line
    with pytest.raises(ConfigError, match=r"n.txt:1: value: expected a positive integer"):
        draw({"dist": "empirical", "path": str(tmp_path / "n.txt")}, n=1)
    (tmp_path / "m.txt").write_text("tokens\n12\n1e23\n")
    with pytest.raises(ConfigError, match=r"m.txt:3: value: expected a positive integer <= 1677"):
        draw({"dist": "empirical", "path": str(tmp_path / "m.txt")}, n=1)


def test_numpy_numbers_from_the_python_api_are_numbers_but_not_booleans() -> None:
    cfg = workload(num_requests=np.int64(5), arrival={"process": "poisson", "rate": np.float32(2)})
    assert cfg.num_requests == 5 and cfg.arrival is not None and cfg.arrival.mean_rate() == 2.0
    assert "must be an integer" in config_error(
        {"num_requests": np.bool_(True), "arrival": "all_at_once", "prompt_tokens": 1}
    )
