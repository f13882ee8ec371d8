"""Summary arithmetic: warm-up/cool-down trimming and goodput."""

from __future__ import annotations

import numpy as np
import pytest

import batchsim
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
