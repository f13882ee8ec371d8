"""``batchsim capacity`` and :func:`batchsim.capacity`: the bisection finds closed-form
capacities of single-server queues (M/D/1 by Pollaczek-Khinchine, D/D/1 exactly), the
stability criterion and SLO attainment behave as stated, and the study folder resumes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from test_sweep import count_runs

import batchsim
from batchsim import cli
from batchsim.studies.backends import InlineExecutor

INLINE = InlineExecutor()


def single_server(process: str, num_requests: int, seed: int = 1) -> dict[str, Any]:
    """One request at a time, every request one 512-token prefill and one output token, no
    CPU overhead: a single server with a fixed service time S (the prefill's)."""
    return {
        "name": "single-server",
        "seed": seed,
        "hardware": "a100-80gb",
        "model": "llama-2-7b",
        "engine": {"cpu_overhead_ms": 0.0, "cpu_overhead_per_seq_ms": 0.0},
        "scheduler": {"policy": "continuous", "max_num_seqs": 1},
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": process, "rate": 1.0},
            "prompt_tokens": {"dist": "fixed", "value": 512},
            "output_tokens": {"dist": "fixed", "value": 1},
        },
    }


def service_time(exp: dict[str, Any]) -> float:
    alone = batchsim.run({**exp, "workload": {**exp["workload"], "num_requests": 1}})
    return float(alone.requests["ttft_ms"].iloc[0]) / 1e3


@pytest.mark.parametrize("w_over_s", [1.5, 2.0, 3.0])
def test_md1_capacity_under_a_mean_ttft_slo_matches_pollaczek_khinchine(w_over_s):
    # M/D/1: mean time in system W = S + lambda S^2 / (2 (1 - lambda S)), so the highest
    # rate with W at most the SLO is lambda = 2 (W - S) / (S (2W - S)).
    exp = single_server("poisson", 4000)
    s = service_time(exp)
    w = w_over_s * s
    expected = 2 * (w - s) / (s * (2 * w - s))
    table = batchsim.capacity(exp, {"mean_ttft_ms": w * 1e3}, rtol=0.005, executor=INLINE)
    row = table.iloc[0]
    assert row["error"] == "" and row["limited_by"].startswith("mean_ttft_ms")
    # 4,000 requests estimate the mean wait to within a few per cent
    assert row["max_request_rate"] == pytest.approx(expected, rel=0.04)
    assert row["mean_ttft_ms"] <= w * 1e3
    assert row["request_rate"] == row["max_request_rate"]


def test_dd1_capacity_is_where_the_queue_starts_growing():
    # D/D/1 above saturation: request i waits i (S - 1/lambda), so queue_delay_growth is
    # exactly lambda S - 1; with a loose SLO only stability binds: lambda = 1.05 / S.
    exp = single_server("constant", 200)
    s = service_time(exp)
    table = batchsim.capacity(exp, {"mean_e2el_ms": 1e9}, rtol=0.002, executor=INLINE)
    rate = table["max_request_rate"].iloc[0]
    assert 1.05 / s / 1.002 <= rate <= 1.05 / s * (1 + 1e-9)
    assert table["limited_by"].iloc[0].startswith("queue grows (queue_delay_growth")
    assert table["queue_delay_growth"].iloc[0] <= 0.05


def test_dd1_capacity_under_slo_attainment():
    # N requests, TTFT limit L = S + d: above saturation request i meets it iff
    # i (S - 1/lambda) <= d, so at least A N requests meet it iff
    # lambda <= 1 / (S - d / (A N - 1)); with d = 0.961 S, N = 100, A = 0.5: 1.02 / S.
    exp = single_server("constant", 100)
    s = service_time(exp)
    d = 0.961 * s
    expected = 1 / (s - d / (0.5 * 100 - 1))
    table = batchsim.capacity(
        exp, {"ttft_ms": (s + d) * 1e3}, attainment=0.5, rtol=0.002, executor=INLINE
    )
    row = table.iloc[0]
    assert expected / 1.002 <= row["max_request_rate"] <= expected * (1 + 1e-9)
    assert row["limited_by"].startswith("slo_attainment")
    assert row["slo_attainment"] >= 0.5


def test_an_slo_no_rate_meets_gives_zero(tmp_path):
    exp = single_server("poisson", 50)
    s = service_time(exp)
    table = batchsim.capacity(exp, {"p90_ttft_ms": s * 1e3 / 2}, executor=INLINE)
    row = table.iloc[0]
    assert row["max_request_rate"] == 0 and row["limited_by"].startswith("no rate from ")
    assert ": p90_ttft_ms " in row["limited_by"]
    # upwards until the queue grows, then 10 halvings below the experiment's rate
    assert row["num_evaluations"] > 11


def write_exp(path: Path, exp: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(exp, sort_keys=False), encoding="utf-8")
    return path


def policies_experiment() -> dict[str, Any]:
    return {
        "name": "cap",
        "seed": 0,
        "hardware": "a100-80gb",
        "model": "llama-2-7b",
        "scheduler": {"policy": "continuous", "max_num_seqs": 16},
        "workload": {
            "num_requests": 60,
            "arrival": {"process": "poisson", "rate": 4.0},
            "prompt_tokens": {"dist": "uniform", "min": 64, "max": 512},
            "output_tokens": {"dist": "uniform", "min": 16, "max": 64},
        },
    }


def test_cli_capacity_per_configuration_resumes_and_matches_its_points(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", policies_experiment())
    out = tmp_path / "c"
    argv = [
        "capacity", str(exp), "-o", str(out), "--workers", "1",
        "--slo", "p99_ttft_ms=1500", "--slo", "p99_tpot_ms=60",
        "--grid", "scheduler.policy=dynamic,continuous",
        "--grid", "parallel.tensor_parallel_size=1,2",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "max_request_rate" in printed and "p99_ttft_ms <= 1500" in printed
    table = pd.read_csv(out / "capacity.csv", keep_default_na=False)
    assert list(table.columns[:5]) == [
        "scheduler.policy",
        "parallel.tensor_parallel_size",
        "max_request_rate",
        "max_request_rate_per_gpu",
        "num_gpus",
    ]
    assert len(table) == 4 and (table["error"] == "").all()
    for _, row in table.iterrows():
        assert row["max_request_rate"] > 0
        assert row["max_request_rate_per_gpu"] * row["parallel.tensor_parallel_size"] == (
            pytest.approx(row["max_request_rate"], rel=1e-12)
        )
        summary = json.loads((out / "points" / row["point"] / "summary.json").read_text())
        assert summary["request_rate"] == row["max_request_rate"]
        assert summary["p99_ttft_ms"] <= 1500 and summary["p99_tpot_ms"] <= 60
        assert row["p99_ttft_ms"] == pytest.approx(summary["p99_ttft_ms"], rel=1e-12)
    cap = dict(zip(zip(table["scheduler.policy"], table["parallel.tensor_parallel_size"]),
                   table["max_request_rate"]))  # fmt: skip
    assert cap[("continuous", 1)] > cap[("dynamic", 1)]  # continuous batching sustains more
    assert cap[("continuous", 2)] > cap[("continuous", 1)]  # two GPUs serve faster
    # a rerun finds every rate it needs already simulated
    assert count_runs(lambda: cli.main([*argv, "-q"])) == 0
    again = pd.read_csv(out / "capacity.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(table, again)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--slo", "p99_ttfs_ms=100"], "unknown metric 'p99_ttfs_ms'"),
        (["--slo", "p99_ttft_ms=fast"], "must be a number"),
        (["--slo", "p99_ttft_ms=-5"], "> 0"),
        (["--slo", "p99_ttft_ms=100", "--attainment", "0.9"], "per-request limit"),
        (["--slo", "ttft_ms=100", "--attainment", "1.5"], "--attainment must be a fraction"),
        ([], "at least one --slo"),
        (["--slo", "p99_ttft_ms=100", "--grid", "workload.arrival.rate=1,2"], "do not vary it"),
        (["--slo", "p99_ttft_ms=100", "--rtol", "0"], "--rtol"),
        (["--slo", "p99_ttft_ms=100", "--set", "workload.arrival={process: all_at_once}"],
         "no arrival rate"),
    ],
)  # fmt: skip
def test_bad_capacity_input_is_one_line_exit_2(tmp_path, capsys, extra, words):
    exp = write_exp(tmp_path / "e.yaml", policies_experiment())
    out = tmp_path / "c"
    assert cli.main(["capacity", str(exp), "-o", str(out), "--workers", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err
    assert not out.exists()


def test_every_configuration_failing_is_an_error_and_a_bug_exits_1(tmp_path, capsys, monkeypatch):
    exp = write_exp(tmp_path / "e.yaml", policies_experiment())
    argv = ["capacity", str(exp), "--workers", "1", "-q", "--slo", "p99_ttft_ms=1500"]
    grid = ["--grid", "hardware=no-such-gpu,nor-this-one"]
    assert cli.main([*argv, "-o", str(tmp_path / "a"), *grid]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        f"batchsim: error: every configuration failed (see {tmp_path / 'a'}/capacity.csv); "
        "the first: --grid hardware=no-such-gpu: hardware: unknown name 'no-such-gpu'"
    )
    import batchsim.simulation as simulation

    def broken(config, base_dir=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(simulation, "simulate", broken)
    assert cli.main([*argv, "-o", str(tmp_path / "b")]) == 1
    assert "internal error" in capsys.readouterr().err
    table = pd.read_csv(tmp_path / "b/capacity.csv", keep_default_na=False)
    assert table["error"].iloc[0].startswith("internal error (RuntimeError at ")


def test_capacity_and_sweep_folders_are_not_mixed(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", policies_experiment())
    out = tmp_path / "study"
    assert cli.main(["sweep", str(exp), "-o", str(out), "--workers", "1", "-q"]) == 0
    argv = ["capacity", str(exp), "-o", str(out), "--slo", "p99_ttft_ms=100"]
    assert cli.main(argv) == 2
    assert "holds a batchsim sweep, not a capacity" in capsys.readouterr().err


def test_capacity_is_deterministic():
    exp = single_server("poisson", 300)
    a = batchsim.capacity(exp, {"p99_ttft_ms": 200}, executor=INLINE)
    b = batchsim.capacity(exp, {"p99_ttft_ms": 200}, executor=INLINE)
    assert a["max_request_rate"].iloc[0] == b["max_request_rate"].iloc[0]
    assert not math.isnan(a["max_request_rate"].iloc[0])


def test_a_policy_too_slow_at_low_rates_is_searched_upwards():
    # Static batching waits for a full batch: at low rates the wait to fill it breaks the
    # TTFT SLO although the queue is stable, so the search doubles the rate first.
    exp = policies_experiment()
    exp["scheduler"] = {"policy": "static", "max_num_seqs": 8}
    exp["workload"]["arrival"]["rate"] = 0.5
    slo = {"p99_ttft_ms": 3000}
    row = batchsim.capacity(exp, slo, executor=INLINE).iloc[0]
    assert row["max_request_rate"] > 4 and row["p99_ttft_ms"] <= 3000
    slower = batchsim.run(exp, **{"workload.arrival.rate": row["max_request_rate"] / 4})
    assert slower.summary["p99_ttft_ms"] > 3000  # below the capacity it misses the SLO


def test_a_narrow_band_between_a_slow_fill_and_overload_is_found():
    # Static batching of 8 meets p99 TTFT <= 1600 ms only in a narrow band of rates: below
    # it, batches take too long to fill; above it, the queue grows. Doubling from 1 req/s
    # jumps from 8 (too slow) to 16 (overloaded); the search then looks between them.
    exp = policies_experiment()
    exp["scheduler"] = {"policy": "static", "max_num_seqs": 8}
    exp["workload"]["arrival"]["rate"] = 1.0
    slo = {"p99_ttft_ms": 1600}
    row = batchsim.capacity(exp, slo, rtol=0.01, executor=INLINE).iloc[0]
    rate = row["max_request_rate"]
    assert 8 < rate < 16 and row["p99_ttft_ms"] <= 1600
    for outside in (8.0, rate * 1.02):
        summary = batchsim.run(exp, **{"workload.arrival.rate": outside}).summary
        fails = summary["p99_ttft_ms"] > 1600 or summary["queue_delay_growth"] > 0.05
        assert fails, outside
