"""``batchsim sweep`` and :func:`batchsim.sweep`: grid expansion, one row per point equal to a
run of that point on its own, resume, failing points, seeds with confidence intervals, and
identical rows from every backend."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

import batchsim
from batchsim import cli
from batchsim.errors import ConfigError
from batchsim.studies import backends
from batchsim.studies import runner as runner_module
from batchsim.studies.backends import InlineExecutor, local_pool, run_point
from batchsim.studies.grid import parse_grid_item, parse_values
from batchsim.studies.sweep import grid_axes, merge_axes
from conftest import tiny_experiment

INLINE = InlineExecutor()


def small(**overrides: Any) -> dict[str, Any]:
    exp = tiny_experiment(**overrides)
    exp["workload"] = {**exp["workload"], "num_requests": 20}
    return exp


def write_exp(path: Path, exp: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(exp, sort_keys=False), encoding="utf-8")
    return path


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=["wall_time_s"])


# ---- value specs and grids ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("pow2:1..512", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
        ("pow2:3..40", [4, 8, 16, 32]),
        ("range:0..10:2.5", [0.0, 2.5, 5.0, 7.5, 10.0]),
        ("range:2..5", [2, 3, 4, 5]),
        ("range:0..1:0.1", [round(0.1 * i, 10) for i in range(11)]),
        ("lin:0..1:5", [0.0, 0.25, 0.5, 0.75, 1.0]),
        ("log:1..1000:4", [1, 10, 100, 1000]),
        ("lin:0..100:5", [0, 25, 50, 75, 100]),
        ("log:1..4:5", [1.0, 1.41421356237, 2.0, 2.82842712475, 4.0]),
        ("log:0.1..10:3", [0.1, 1.0, 10.0]),
        ("1,2,4", [1, 2, 4]),
        ("a100-80gb,h100-sxm", ["a100-80gb", "h100-sxm"]),
        ("0.5, null, true", [0.5, None, True]),
        (
            "{process: poisson, rate: 8},{process: constant, rate: 16}",
            [{"process": "poisson", "rate": 8}, {"process": "constant", "rate": 16}],
        ),
        ("[1, 2]", [1, 2]),
        ([3, "x"], [3, "x"]),
    ],
)
def test_value_specs(spec, expected):
    assert parse_values(spec, "--grid k") == expected


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("pow2:8..4", "below the lower bound"),
        ("pow2:0..4", "> 0"),
        ("lin:0..1", "needs N"),
        ("log:0..10:3", "> 0"),
        ("range:0..10:0", "STEP"),
        ("range:0..1e9:1e-3", "an axis may have"),
        ("", "no values"),
        ("{unclosed", "malformed"),
    ],
)
def test_bad_value_specs_are_one_line_errors(spec, words):
    with pytest.raises(ConfigError) as info:
        parse_values(spec, "--grid scheduler.max_num_seqs")
    message = str(info.value)
    assert message.startswith("--grid scheduler.max_num_seqs: ") and words in message
    assert "\n" not in message


def test_product_and_zip_groups_expand_like_itertools():
    axes = merge_axes(
        [],
        grid_axes(
            {
                "scheduler.policy": ["static", "continuous"],
                ("scheduler.max_num_seqs", "scheduler.max_num_batched_tokens"): [
                    (8, 2048),
                    (16, 4096),
                    (32, 8192),
                ],
                "seed": "1,2",
            }
        ),
    )
    from batchsim.studies.grid import expand

    got = list(expand(axes))
    want = [
        {
            "scheduler.policy": p,
            "scheduler.max_num_seqs": s,
            "scheduler.max_num_batched_tokens": t,
            "seed": seed,
        }
        for p, (s, t), seed in itertools.product(
            ["static", "continuous"], [(8, 2048), (16, 4096), (32, 8192)], [1, 2]
        )
    ]
    assert got == want


@pytest.mark.parametrize(
    ("grid", "words"),
    [
        ({"scheduler": ["{policy: static}"], "scheduler.max_num_seqs": [1]}, "already varied"),
        ({("a.b", "c.d"): [(1, 2), (3,)]}, "tuple of 2 values"),
        ({"scheduler..x": [1]}, "not a dotted key path"),
    ],
)
def test_bad_grids_are_refused(grid, words):
    with pytest.raises(ConfigError, match=words):
        merge_axes([], grid_axes(grid))


def test_a_grid_too_large_is_refused_before_anything_runs(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--seeds", "11"]
    grid = ["--grid", "seed=range:0..99", "--grid", "workload.num_requests=range:1..100"]
    assert cli.main([*argv, *grid]) == 2
    err = capsys.readouterr().err
    assert "110,000 points (seeds included); a sweep may have 100,000" in err
    assert not (tmp_path / "s").exists()


def test_cli_zip_group_needs_equal_lengths(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    code = cli.main(
        [
            "sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1",
            "--zip", "scheduler.max_num_seqs=8,16",
            "--zip", "scheduler.max_num_batched_tokens=4096",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "zip group" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


# ---- rows equal single runs ---------------------------------------------------------------


def test_every_row_equals_a_run_of_that_point_alone():
    base = small()
    grid = {
        "scheduler.policy": ["static", "continuous"],
        "scheduler.max_num_seqs": "pow2:2..8",
        "workload.arrival": "{process: poisson, rate: 4},{process: constant, rate: 9}",
    }
    table = batchsim.sweep(base, grid, executor=INLINE)
    assert len(table) == 2 * 3 * 2
    assert list(table.columns[:4]) == [
        "scheduler.policy",
        "scheduler.max_num_seqs",
        "workload.arrival",
        "seed",
    ]
    assert (table["error"] == "").all()
    for _, row in table.iterrows():
        arrival = json.loads(row["workload.arrival"])
        alone = batchsim.run(
            base,
            **{
                "scheduler.policy": row["scheduler.policy"],
                "scheduler.max_num_seqs": int(row["scheduler.max_num_seqs"]),
                "workload.arrival": arrival,
            },
        ).summary
        for metric in ("output_throughput", "p99_ttft_ms", "mean_batch_size", "num_iterations"):
            assert row[metric] == alone[metric], (row["point"], metric)
    # the batch cap is the point's own: static at cap 2 never runs a batch above 2
    assert table[table["scheduler.max_num_seqs"] == 2]["mean_batch_size"].max() <= 2


def test_catalog_names_and_nested_keys_are_axes():
    table = batchsim.sweep(
        small(),
        {"hardware": "a100-80gb,h100-sxm", "workload.prompt_tokens.max": [64, 256]},
        executor=INLINE,
    )
    assert list(table["hardware"]) == ["a100-80gb"] * 2 + ["h100-sxm"] * 2
    assert list(table["workload.prompt_tokens.max"]) == [64, 256, 64, 256]
    # a faster GPU finishes the same requests sooner
    a100 = table[table["hardware"] == "a100-80gb"]["mean_e2el_ms"].to_numpy()
    h100 = table[table["hardware"] == "h100-sxm"]["mean_e2el_ms"].to_numpy()
    assert (h100 < a100).all()


def test_sweep_block_in_the_yaml_and_cli_axes_that_replace_it(tmp_path, capsys):
    exp = small()
    exp["sweep"] = {
        "grid": {"scheduler.max_num_seqs": "pow2:4..16"},
        "zip": [{"workload.num_requests": [10, 12], "seed": [5, 6]}],
    }
    path = write_exp(tmp_path / "e.yaml", exp)
    table = batchsim.sweep(path, executor=INLINE)
    assert list(table["scheduler.max_num_seqs"]) == [4, 4, 8, 8, 16, 16]
    assert list(table["seed"]) == [5, 6] * 3
    assert list(table["completed"]) == [10, 12] * 3
    out = tmp_path / "s"
    code = cli.main(
        ["sweep", str(path), "-o", str(out), "--workers", "1", "-q",
         "--grid", "scheduler.max_num_seqs=2"]
    )  # fmt: skip
    printed = capsys.readouterr()
    # -q drops the progress, not the table
    assert code == 0 and "batchsim sweep: 2 points" in printed.out
    assert "max_num_seqs" in printed.out and "batchsim: sweep" not in printed.err
    csv = pd.read_csv(out / "sweep.csv")
    assert list(csv["scheduler.max_num_seqs"]) == [2, 2]
    # batchsim run ignores the block and runs the base experiment
    assert cli.main(["run", str(path), "-o", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r/summary.json").read_text())["completed"] == 20


def test_a_bad_sweep_block_names_its_line(tmp_path, capsys):
    text = "\n".join(
        [
            "name: e",
            "hardware: a100-80gb",
            "model: llama-2-7b",
            "workload: {num_requests: 5, arrival: {process: all_at_once},",
            "  prompt_tokens: {dist: fixed, value: 8}, output_tokens: {dist: fixed, value: 4}}",
            "sweep:",
            "  grid:",
            "    scheduler.max_num_seqs: pow2:9..3",
        ]
    )
    path = tmp_path / "e.yaml"
    path.write_text(text + "\n", encoding="utf-8")
    assert cli.main(["sweep", str(path), "-o", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"batchsim: error: {path}:8: sweep.grid.scheduler.max_num_seqs: ")
    assert "below the lower bound" in err


# ---- output folder, resume, failures ------------------------------------------------------


def test_cli_sweep_writes_point_folders_and_tables(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = [
        "sweep",
        str(exp),
        "-o",
        str(out),
        "--workers",
        "1",
        "--grid",
        "scheduler.max_num_seqs=4,8",
    ]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "max_num_seqs=4" in captured.err  # plain progress lines off a terminal
    assert "scheduler.max_num_seqs" in captured.out and "output_throughput" in captured.out
    assert "prefix_cache_hit_rate" not in captured.out  # 0 at every point: no prefix cache
    table = pd.read_csv(out / "sweep.csv", keep_default_na=False)
    parquet = pd.read_parquet(out / "sweep.parquet")
    assert list(parquet.columns) == list(table.columns)
    assert list(table["point"]) == ["max_num_seqs=4", "max_num_seqs=8"]
    for name in table["point"]:
        folder = out / "points" / name
        assert {p.name for p in folder.iterdir()} == {
            "config.yaml", "summary.json", "requests.csv", "iterations.csv", "point.json",
        }  # fmt: skip
        summary = json.loads((folder / "summary.json").read_text())
        row = table[table["point"] == name].iloc[0]
        assert row["output_throughput"] == pytest.approx(summary["output_throughput"], rel=1e-12)
        # the point's config.yaml reruns it
        assert cli.main(["run", str(folder / "config.yaml"), "-o", str(tmp_path / name)]) == 0
        again = json.loads((tmp_path / name / "summary.json").read_text())
        assert again["output_throughput"] == summary["output_throughput"]
    marker = json.loads((out / "sweep.json").read_text())
    assert marker["kind"] == "sweep" and marker["varied_keys"] == ["scheduler.max_num_seqs"]


def test_the_printed_table_shows_the_prefix_cache_hit_rate_where_a_cache_is_on(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1"]
    assert cli.main([*argv, "--grid", "engine.enable_prefix_caching=false,true"]) == 0
    header = capsys.readouterr().out.splitlines()[1].split()
    assert header[0] == "engine.enable_prefix_caching" and "prefix_cache_hit_rate" in header


def test_summary_only_writes_no_per_iteration_files(tmp_path):
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "--workers", "1", "-q", "--summary-only"]
    assert cli.main([*argv, "--grid", "scheduler.max_num_seqs=4"]) == 0
    assert {p.name for p in (out / "points/max_num_seqs=4").iterdir()} == {
        "config.yaml", "summary.json", "point.json",
    }  # fmt: skip
    # asking for the per-iteration files later reruns the point to write them
    calls = count_runs(lambda: cli.main([*argv[:-1], "--grid", "scheduler.max_num_seqs=4"]))
    assert calls == 1 and (out / "points/max_num_seqs=4/iterations.csv").is_file()


def count_runs(action) -> int:
    calls = []
    original = runner_module.run_point

    def counting(task):
        calls.append(task)
        return original(task)

    runner_module.run_point = counting
    try:
        action()
    finally:
        runner_module.run_point = original
    return len(calls)


def test_rerun_skips_finished_points_and_reruns_changed_ones(tmp_path):
    traces = []
    for i, n in enumerate((12, 15)):
        path = tmp_path / f"trace{i}.csv"
        rows = ["arrival_time,prompt_tokens,output_tokens"]
        rows += [f"{0.1 * k:.1f},{32 + k},{8 + k % 5}" for k in range(n)]
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        traces.append(path)
    exp = small()
    exp["workload"] = {"trace": {"path": str(traces[0]), "format": "csv"}}
    path = write_exp(tmp_path / "e.yaml", exp)
    out = tmp_path / "s"
    base = ["sweep", str(path), "-o", str(out), "--workers", "1", "-q"]
    grid = ["--grid", f"workload.trace.path={traces[0]},{traces[1]}"]
    caps = ["--grid", "scheduler.max_num_seqs=4,8"]
    assert count_runs(lambda: cli.main([*base, *grid, *caps])) == 4
    first = pd.read_csv(out / "sweep.csv")
    assert count_runs(lambda: cli.main([*base, *grid, *caps])) == 0
    assert comparable(pd.read_csv(out / "sweep.csv")).equals(comparable(first))
    # a new value on an axis runs only the new points
    assert (
        count_runs(lambda: cli.main([*base, *grid, "--grid", "scheduler.max_num_seqs=4,8,16"])) == 2
    )
    # a trace file that changed reruns the points that read it, not the others
    text = traces[1].read_text()
    traces[1].write_text(text.replace("0.0,32,8", "0.0,40,8"), encoding="utf-8")
    assert count_runs(lambda: cli.main([*base, *grid, *caps])) == 2
    # changing a base key that every point uses reruns them all
    assert count_runs(lambda: cli.main([*base, *grid, *caps, "--set", "engine.block_size=32"])) == 4


def test_an_edited_builtin_profile_reruns_the_points_that_use_it(tmp_path, monkeypatch):
    """A catalog entry named by the config (not by path) is a file the point reads too."""
    import shutil

    import batchsim.catalog as catalog

    builtin = catalog.catalog_dir
    profiles = tmp_path / "hardware_profiles"
    shutil.copytree(builtin("hardware_profiles"), profiles)
    monkeypatch.setattr(
        catalog,
        "catalog_dir",
        lambda kind: profiles if kind == "hardware_profiles" else builtin(kind),
    )
    path = write_exp(tmp_path / "e.yaml", small())
    base = ["sweep", str(path), "-o", str(tmp_path / "s"), "--workers", "1", "-q"]
    grid = ["--grid", "hardware=a100-80gb,h100-sxm"]
    assert count_runs(lambda: cli.main([*base, *grid])) == 2
    assert count_runs(lambda: cli.main([*base, *grid])) == 0
    h100 = profiles / "h100-sxm.yaml"
    h100.write_text(h100.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert count_runs(lambda: cli.main([*base, *grid])) == 1  # the H100 point only


def test_an_interrupted_sweep_resumes_and_a_half_written_point_reruns(tmp_path, monkeypatch):
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "--workers", "1", "-q"]
    argv += ["--grid", "scheduler.max_num_seqs=2,4,8,16"]
    original = runner_module.run_point
    calls = []

    def interrupted(task):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(task)

    monkeypatch.setattr(runner_module, "run_point", interrupted)
    assert cli.main(argv) == 130
    monkeypatch.setattr(runner_module, "run_point", original)
    assert not (out / "sweep.csv").exists()
    finished = {p.parent.name for p in out.glob("points/*/point.json")}
    assert finished == {"max_num_seqs=2", "max_num_seqs=4"}
    # a point whose files were cut short (here: summary.json lost) does not count as finished
    (out / "points/max_num_seqs=4/summary.json").unlink()
    assert count_runs(lambda: cli.main(argv)) == 3
    assert len(pd.read_csv(out / "sweep.csv")) == 4


def test_a_failing_point_records_its_error_and_the_sweep_goes_on(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "--workers", "1", "-q"]
    grid = ["--grid", "scheduler.max_num_seqs=0,8", "--grid", "model=llama-2-7b,llama-2-70b"]
    assert cli.main(argv + grid) == 0
    err = capsys.readouterr().err
    assert "3 of 4 points failed" in err
    table = pd.read_csv(out / "sweep.csv", keep_default_na=False)
    errors = dict(zip(table["point"], table["error"]))
    assert errors["max_num_seqs=0,model=llama-2-7b"].startswith(
        "--grid scheduler.max_num_seqs=0: scheduler.max_num_seqs"
    )
    assert errors["max_num_seqs=8,model=llama-2-7b"] == ""
    assert "fit" in errors["max_num_seqs=8,model=llama-2-70b"]  # 140 GB of weights on 80 GB
    for name, error in errors.items():
        folder = out / "points" / name
        if error:
            assert (folder / "error.txt").read_text().strip() == error
            assert not (folder / "summary.json").exists()
    ok = table[table["error"] == ""]
    assert ok["output_throughput"].notna().all()
    assert table[table["error"] != ""]["output_throughput"].eq("").all()


def test_every_point_invalid_is_an_error_and_writes_nothing(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1"]
    assert cli.main([*argv, "--grid", "scheduler.max_num_seqz=1,2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_num_seqz" in err and "every point" in err
    assert not (tmp_path / "s").exists()


def test_every_point_failing_while_simulating_is_an_error_naming_its_grid_value(tmp_path, capsys):
    # unknown hardware names load (a name is only looked up when the run is built): the
    # points fail in the workers, each error names its --grid value, and a sweep none of
    # whose points ran is an error
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "--workers", "1", "-q"]
    assert cli.main([*argv, "--grid", "hardware=no-such-gpu,a100-80gb"]) == 0
    capsys.readouterr()
    table = pd.read_csv(out / "sweep.csv", keep_default_na=False)
    assert (
        table["error"]
        .iloc[0]
        .startswith(
            "--grid hardware=no-such-gpu: hardware: unknown name 'no-such-gpu'; built-in names: "
        )
    )
    assert table["error"].iloc[1] == ""
    again = tmp_path / "t"
    argv[3] = str(again)
    assert cli.main([*argv, "--grid", "hardware=no-such-gpu,nor-this-one"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        f"batchsim: error: every point failed (see {again}/sweep.csv); the first: "
        "--grid hardware=no-such-gpu: hardware: unknown name 'no-such-gpu'; built-in names: "
    )
    assert len(pd.read_csv(again / "sweep.csv")) == 2


def test_a_folder_that_is_not_a_sweep_is_refused(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("mine", encoding="utf-8")
    assert cli.main(["sweep", str(exp), "-o", str(target), "--workers", "1"]) == 2
    assert "holds no batchsim study" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]


def _die_at_cap_8(task: dict[str, Any]) -> dict[str, Any]:
    if task["config"]["scheduler"]["max_num_seqs"] == 8:
        os._exit(1)  # as the kernel's out-of-memory killer ends a worker
    return run_point(task)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers on Linux only")
def test_a_worker_that_dies_is_a_one_line_error_and_the_sweep_resumes(
    tmp_path, monkeypatch, capsys
):
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "--workers", "2", "-q"]
    argv += ["--grid", "scheduler.max_num_seqs=8,4"]
    monkeypatch.setattr(runner_module, "run_point", _die_at_cap_8)  # forked workers see it
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("batchsim: error: a worker process stopped abruptly (BrokenProcessPool")
    assert not (out / "points/max_num_seqs=8/point.json").exists()
    monkeypatch.setattr(runner_module, "run_point", run_point)
    assert cli.main(argv) == 0
    assert (pd.read_csv(out / "sweep.csv", keep_default_na=False)["error"] == "").all()


def test_internal_errors_in_a_point_are_recorded_and_exit_1(tmp_path, monkeypatch, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    import batchsim.simulation as simulation

    def broken(config, base_dir=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(simulation, "simulate", broken)
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1", "-q"]
    assert cli.main(argv) == 1
    table = pd.read_csv(tmp_path / "s/sweep.csv", keep_default_na=False)
    assert table["error"].iloc[0].startswith("internal error (RuntimeError at ")
    assert "boom" in table["error"].iloc[0]


# ---- seeds --------------------------------------------------------------------------------


def test_seeds_give_means_and_student_t_intervals():
    table = batchsim.sweep(
        small(seed=10), {"scheduler.max_num_seqs": [4, 16]}, seeds=3, executor=INLINE
    )
    assert list(table["seed"]) == [10, 11, 12, 10, 11, 12]
    stats = table.attrs["stats"]
    assert list(stats["scheduler.max_num_seqs"]) == [4, 16] and (stats["num_seeds"] == 3).all()
    t_975_2 = 4.302652729911275  # Student's t, 97.5th percentile, 2 degrees of freedom (tables)
    for cap in (4, 16):
        values = table[table["scheduler.max_num_seqs"] == cap]["mean_ttft_ms"].to_numpy()
        assert len(set(values)) == 3  # independent seeds, different samples
        mean = sum(values) / 3
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
        row = stats[stats["scheduler.max_num_seqs"] == cap].iloc[0]
        assert row["mean_ttft_ms"] == pytest.approx(mean, rel=1e-12)
        assert row["mean_ttft_ms_ci95"] == pytest.approx(t_975_2 * std / math.sqrt(3), rel=1e-9)
    # seed 11's row is the experiment run with seed 11
    alone = batchsim.run(small(seed=11), **{"scheduler.max_num_seqs": 16}).summary
    assert table.iloc[4]["mean_ttft_ms"] == alone["mean_ttft_ms"]


def test_cli_seeds_write_the_stats_table(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "--workers", "1", "--seeds", "2"]
    assert cli.main([*argv, "--grid", "scheduler.max_num_seqs=4", "--summary-only"]) == 0
    assert "±" in capsys.readouterr().out
    stats = pd.read_csv(out / "sweep_stats.csv")
    assert len(stats) == 1 and stats["num_seeds"].iloc[0] == 2
    assert {"output_throughput", "output_throughput_ci95"} <= set(stats.columns)
    assert sorted(p.name for p in (out / "points").iterdir()) == [
        "max_num_seqs=4,seed=0",
        "max_num_seqs=4,seed=1",
    ]


# ---- backends -----------------------------------------------------------------------------


def test_local_pool_threads_and_inline_give_identical_rows():
    base = small()
    grid = {"scheduler.policy": ["static", "continuous"], "scheduler.max_num_seqs": [4, 8]}
    inline = comparable(batchsim.sweep(base, grid, executor=INLINE))
    with ThreadPoolExecutor(2) as threads:
        threaded = comparable(batchsim.sweep(base, grid, executor=threads))
    with local_pool(2) as pool:
        pooled = comparable(batchsim.sweep(base, grid, executor=pool))
    pd.testing.assert_frame_equal(inline, threaded)
    pd.testing.assert_frame_equal(inline, pooled)
    assert (inline["error"] == "").all()


def _wait_in_worker(flag: str) -> None:
    Path(flag).write_text("running", encoding="utf-8")
    try:
        time.sleep(120)
    except BaseException:
        Path(flag).write_text("survived the signal", encoding="utf-8")
        raise


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers on Linux only")
def test_stopping_the_pool_ends_its_workers_even_under_the_clis_sigterm_handler(tmp_path):
    # batchsim's CLI turns SIGTERM into an exception for its clean-up; forked workers inherit
    # the handler, and the pool would catch that exception and keep a terminated worker alive
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        pool = local_pool(2)
        flags = [tmp_path / f"running{i}" for i in range(2)]
        for flag in flags:
            pool.submit(_wait_in_worker, str(flag))
        while not all(flag.exists() for flag in flags):  # both tasks are running
            time.sleep(0.01)
        backends.stop_now(pool)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert [flag.read_text(encoding="utf-8") for flag in flags] == ["running"] * 2


def test_run_point_takes_and_returns_plain_data():
    config = batchsim.load_experiment(small())
    reply = run_point({"config": config.model_dump()})
    assert reply["error"] == "" and reply["summary"]["completed"] == 20
    assert json.loads(json.dumps(reply, default=str))  # plain data, small
    assert len(json.dumps(reply, default=str)) < 20_000
    bad = run_point({"config": {**config.model_dump(), "model": "no-such-model"}})
    assert bad["summary"] is None and "no-such-model" in bad["error"] and not bad["internal"]


@pytest.mark.timeout(240)
@pytest.mark.timeout(120)  # ray.init retries an address nothing listens on for many minutes
def test_ray_backend_gives_the_same_rows(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    # without --address a local instance starts, even where the environment names a cluster
    # (as RAY_ADDRESS, or the file `ray start` leaves) that it would otherwise join
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{probe.getsockname()[1]}")
    exp = write_exp(tmp_path / "e.yaml", small())
    argv = ["sweep", str(exp), "--workers", "2", "-q", "--summary-only"]
    argv += ["--grid", "scheduler.policy=static,continuous", "--grid", "scheduler.max_num_seqs=4,8"]
    assert cli.main([*argv, "-o", str(tmp_path / "local")]) == 0
    assert cli.main([*argv, "-o", str(tmp_path / "ray"), "--backend", "ray"]) == 0
    local = comparable(pd.read_csv(tmp_path / "local/sweep.csv"))
    ray = comparable(pd.read_csv(tmp_path / "ray/sweep.csv"))
    pd.testing.assert_frame_equal(local, ray)
    assert len(ray) == 4 and ray["error"].isna().all()


@pytest.mark.timeout(60)  # ray.init retries an address nothing listens on for many minutes
def test_a_ray_address_nothing_listens_on_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("ray")
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exp = write_exp(tmp_path / "e.yaml", small())
    out = tmp_path / "s"
    argv = ["sweep", str(exp), "-o", str(out), "-q", "--backend", "ray"]
    assert cli.main([*argv, "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        f"batchsim: error: --address 127.0.0.1:{port}: no Ray cluster answers there ("
    )
    assert not out.exists()
    # an address that accepts connections passes the check (Ray then talks to it)
    with socket.create_server(("127.0.0.1", 0)) as server:
        backends.check_reachable(f"ray://127.0.0.1:{server.getsockname()[1]}")
    backends.check_reachable("auto")  # left to Ray


def test_ray_needs_ray_options_to_make_sense(tmp_path, capsys):
    exp = write_exp(tmp_path / "e.yaml", small())
    assert cli.main(["sweep", str(exp), "-o", str(tmp_path / "s"), "--address", "auto"]) == 2
    assert "--address is for --backend ray" in capsys.readouterr().err


def test_grid_items_parse_like_set_values():
    assert parse_grid_item("workload.arrival={process: constant, rate: 2}") == (
        "workload.arrival",
        [{"process": "constant", "rate": 2}],
    )
    with pytest.raises(ConfigError, match=r"expected KEY\.PATH=VALUES"):
        parse_grid_item("scheduler.max_num_seqs")


def test_no_global_random_state_is_used():
    state = np.random.get_state()[1].copy()
    batchsim.sweep(small(), {"scheduler.max_num_seqs": [4]}, seeds=2, executor=INLINE)
    assert (np.random.get_state()[1] == state).all()


@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_an_unwritable_study_folder_is_a_one_line_error(tmp_path, capsys, command):
    exp = write_exp(tmp_path / "e.yaml", small())
    target = "/proc/batchsim-cannot-write-here/study"  # the kernel refuses new entries
    argv = [command, str(exp), "-o", target, "--workers", "1", "-q"]
    if command == "capacity":
        argv += ["--slo", "p99_ttft_ms=1000"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("batchsim: error: cannot write /proc/") and "[Errno" in err
    assert len(err.splitlines()) == 1
