"""Summary arithmetic: warm-up/cool-down trimming and goodput."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchsim
from batchsim.metrics.logs import ItlLog
from conftest import tiny_experiment


@pytest.fixture(scope="module")
def full():
    return batchsim.run(tiny_experiment(seed=3))


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


def test_trimmed_itl_keeps_only_gaps_inside_the_counted_window(full):
    trimmed = batchsim.run(tiny_experiment(seed=3, metrics={"warmup_s": 2.0}))
    assert trimmed.summary["mean_itl_ms"] != full.summary["mean_itl_ms"]
    assert np.isfinite(trimmed.summary["p99_itl_ms"])


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
    inside = it[(it["start_time_s"] >= lo) & (it["start_time_s"] <= hi)]
    totals = full.iteration_log.totals(lo, hi)
    assert totals["num_iterations"] == len(it)
    assert totals["num_counted"] == len(inside)
    assert totals["num_compute_bound"] == (inside["bound"] == "compute").sum()
    for key in ("num_seqs", "num_slots", "num_decode_tokens", "cpu_time_ms", "duration_ms"):
        assert totals[key] == pytest.approx(inside[key].sum(), rel=1e-12), key


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False),
            st.floats(0, 2, allow_nan=False),
            st.integers(1, 4),
            st.integers(0, 5),
            st.integers(0, 40),
        ),
        min_size=1,
        max_size=20,
    ),
    bounds=st.tuples(st.floats(-10, 200), st.floats(-10, 200)),
)
def test_itl_runs_trimmed_to_a_window_equal_the_expanded_gaps(runs, bounds):
    # A run's gaps end at start + j x gap; trimming counts exactly those inside [lo, hi].
    lo, hi = min(bounds), max(bounds)
    log = ItlLog()
    expected: dict[float, int] = {}
    for start, gap, count, first, length in runs:
        last = first + length - 1
        log.add_run(start, gap, count, first, last)
        for j in range(first, last + 1):
            if lo <= start + gap * j <= hi:
                expected[gap] = expected.get(gap, 0) + count
    gaps, weights = log.samples(lo, hi)
    got: dict[float, int] = {}
    for g, w in zip(gaps.tolist(), weights.tolist()):
        got[g] = got.get(g, 0) + w
    assert got == expected
