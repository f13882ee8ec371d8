"""The ``output:`` block: CSV or Parquet tables, all, none or a sample of the iterations, the
output-directory rules across formats, sweeps and figures reading Parquet, and the progress
line of ``batchsim run``."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import batchsim
from batchsim import cli, progress
from batchsim.config import load_experiment
from batchsim.errors import ConfigError
from batchsim.metrics import writers
from batchsim.metrics.columns import ChunkedColumns, _distinct
from batchsim.metrics.iterations import IterationLog, sample_rows
from batchsim.plots import PlotOptions, figure
from batchsim.plots.data import load
from batchsim.simulation import simulate
from batchsim.studies.backends import InlineExecutor
from conftest import UNNAMED_THREADS, tiny_experiment

# preemptions, rejections (prompts longer than max_model_len) and cancellations: every
# column of both tables holds something
EXPERIMENT = tiny_experiment(
    engine={"num_gpu_blocks": 40, "max_model_len": 240},
    workload={
        "num_requests": 60,
        "arrival": {"process": "poisson", "rate": 20.0},
        "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
        "output_tokens": {"dist": "uniform", "min": 4, "max": 48},
        "cancel_after_ms": {"dist": "exponential", "mean": 3000},
    },
    metrics={"record_slots": True},
)
TABLES = ("requests", "iterations", "slots")

# pandas < 3 parses CSV floats to within one ulp unless asked for round-trip precision (the
# default from pandas 3 on, which deprecates the argument)
EXACT_FLOATS: dict[str, Any] = (
    {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
)


def run(out: Path, **overrides: Any) -> batchsim.Result:
    return batchsim.run(EXPERIMENT, out, **overrides)


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def without_run_details(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what differs between two runs of one simulation."""
    return {k: v for k, v in summary.items() if k not in ("wall_time_s", "config")}


def same_summary(a: dict[str, Any], b: dict[str, Any]) -> bool:
    a, b = without_run_details(a), without_run_details(b)
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k]))
        for k in a
    )


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("output")
    csv = run(root / "csv")
    parquet = run(root / "parquet", **{"output.format": "parquet"})
    return {"root": root, "csv": csv, "parquet": parquet}


# ------------------------------------------------------------------------ CSV vs Parquet


def test_parquet_tables_have_the_columns_and_values_of_the_csv_tables(both):
    root = both["root"]
    assert names(root / "csv") == {"summary.json", "config.yaml"} | {f"{t}.csv" for t in TABLES}
    assert names(root / "parquet") == {"summary.json", "config.yaml"} | {
        f"{t}.parquet" for t in TABLES
    }
    result = both["csv"]
    assert result.summary["num_preemptions"] > 0
    assert result.summary["num_rejected"] > 0 and result.summary["num_cancelled"] > 0
    for table in TABLES:
        from_csv = pd.read_csv(root / "csv" / f"{table}.csv", keep_default_na=False, **EXACT_FLOATS)
        from_parquet = pd.read_parquet(root / "parquet" / f"{table}.parquet")
        assert list(from_parquet.columns) == list(from_csv.columns), table
        assert len(from_parquet) == len(from_csv) > 0, table
        for column in from_csv.columns:
            text, typed = from_csv[column], from_parquet[column]
            if typed.dtype.kind in "iuf":
                # the CSV's text, read as the column's own type, is the same number
                np.testing.assert_array_equal(
                    text.to_numpy().astype(typed.dtype), typed.to_numpy(), err_msg=column
                )
            else:  # text; an empty text is a null in Parquet
                assert typed.fillna("").astype(str).tolist() == text.astype(str).tolist(), column


def test_parquet_columns_keep_the_types_of_the_in_memory_tables(both):
    result, folder = both["parquet"], both["root"] / "parquet"
    frames = {"requests": result.requests, "iterations": result.iterations, "slots": result.slots}
    for table, frame in frames.items():
        typed = pd.read_parquet(folder / f"{table}.parquet")
        for column in frame.columns:
            if frame[column].dtype.kind in "iuf":
                assert typed[column].dtype == frame[column].dtype, (table, column)
    iterations = pd.read_parquet(folder / "iterations.parquet")
    assert iterations["kv_cache_usage"].dtype == np.float32
    assert iterations["num_seqs"].dtype == np.int32
    assert iterations["flops"].dtype == np.float64
    requests = pd.read_parquet(folder / "requests.parquet")
    reasons = requests["reject_reason"]
    assert reasons.isna().sum() == (requests["status"] != "rejected").sum()


def test_both_formats_give_the_same_summary_and_config_files_but_the_format(both):
    root = both["root"]
    csv, parquet = (json.loads((root / f / "summary.json").read_text()) for f in ("csv", "parquet"))
    assert same_summary(csv, parquet)
    assert csv["config"]["output"] == {"format": "csv", "iterations": "all"}
    assert parquet["config"]["output"] == {"format": "parquet", "iterations": "all"}


def test_run_format_option_writes_parquet_and_says_so(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps(tiny_experiment()), encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out), "--format", "parquet"]) == 0
    assert names(out) == {"summary.json", "requests.parquet", "iterations.parquet", "config.yaml"}
    printed = capsys.readouterr()
    assert "requests.parquet,iterations.parquet" in printed.out
    assert "\r" not in printed.err  # not a terminal: no progress line
    again = load_experiment(out / "config.yaml")  # the resolved config reruns as parquet
    assert again.output.format == "parquet"


def test_a_bad_format_option_is_a_usage_error(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps(tiny_experiment()), encoding="utf-8")
    assert cli.main(["run", str(exp), "--format", "xlsx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "xlsx" in err and "parquet" in err


# ----------------------------------------------------------------------- directory rules


def test_a_run_replacing_another_in_the_other_format_leaves_only_its_own_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n", encoding="utf-8")
    run(out)
    run(out, **{"output.format": "parquet"})
    assert names(out) == {"summary.json", "config.yaml", "notes.txt"} | {
        f"{t}.parquet" for t in TABLES
    }
    run(out, **{"output.format": "csv", "metrics.record_slots": False})
    assert names(out) == {"summary.json", "config.yaml", "notes.txt", "requests.csv"} | {
        "iterations.csv"
    }
    run(out, **{"output.iterations": "none", "metrics.record_slots": False})
    assert names(out) == {"summary.json", "config.yaml", "notes.txt", "requests.csv"}
    assert not [p for p in tmp_path.rglob(".batchsim-tmp-*")]


@pytest.mark.parametrize("name", ["requests.parquet", "iterations.parquet", "slots.csv"])
def test_a_table_of_either_format_batchsim_did_not_write_is_never_replaced(name, tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps(tiny_experiment()), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("my data\n", encoding="utf-8")
    assert cli.main(["run", str(exp), "-o", str(out), "--format", "parquet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and name in err and "-o DIR" in err
    assert names(out) == {name}


def test_a_failed_parquet_write_keeps_the_previous_csv_run(tmp_path, monkeypatch):
    out = tmp_path / "out"
    run(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(tables: Any, columns: list[str], path: Path) -> None:
        path.write_bytes(b"PAR1")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("batchsim.simulation.write_parquet", disk_full)
    with pytest.raises(ConfigError, match="No space left"):
        run(out, **{"output.format": "parquet"})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.rglob(".batchsim-tmp-*")]


# --------------------------------------------------------------- iterations: none | sample


def test_iterations_none_writes_no_iterations_table_and_the_same_summary(both, tmp_path):
    result = run(tmp_path / "none", **{"output.iterations": "none"})
    assert names(tmp_path / "none") == {"summary.json", "config.yaml", "requests.csv", "slots.csv"}
    assert same_summary(result.summary, both["csv"].summary)
    assert result.summary["num_iterations"] == len(both["csv"].iterations)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_iteration_sample_is_evenly_spaced_rows_of_the_full_table(both, tmp_path, fmt):
    full = both["csv"].iterations
    n = 25
    result = run(tmp_path / "sample", **{"output.iterations": {"sample": n}, "output.format": fmt})
    assert same_summary(result.summary, both["csv"].summary)
    path = tmp_path / "sample" / f"iterations.{fmt}"
    sample = pd.read_csv(path, **EXACT_FLOATS) if fmt == "csv" else pd.read_parquet(path)
    total = len(full)
    expected = [k * (total - 1) // (n - 1) for k in range(n)]
    assert sample["iteration"].tolist() == expected
    assert expected[0] == 0 and expected[-1] == total - 1
    reference = full.iloc[expected].reset_index(drop=True)
    if fmt == "csv":
        reference = pd.read_csv(both["root"] / "csv" / "iterations.csv", **EXACT_FLOATS).iloc[
            expected
        ]
        reference = reference.reset_index(drop=True)
    pd.testing.assert_frame_equal(sample, reference, check_exact=True)


def test_a_sample_larger_than_the_run_writes_every_iteration(both, tmp_path):
    run(tmp_path / "big", **{"output.iterations": {"sample": 10**6}})
    a = (tmp_path / "big" / "iterations.csv").read_bytes()
    assert a == (both["root"] / "csv" / "iterations.csv").read_bytes()


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 5000), n=st.integers(2, 6000))
def test_sample_rows_are_distinct_evenly_spaced_and_keep_the_ends(total, n):
    rows = sample_rows(total, n)
    assert len(rows) == min(n, total)
    assert np.all(np.diff(rows) >= 1)
    if total:
        assert rows[0] == 0 and rows[-1] == total - 1
    if 2 <= n < total:
        gaps = np.diff(rows)
        assert gaps.max() - gaps.min() <= 1


def test_the_log_reads_a_sample_in_windows_as_the_rows_of_the_whole_table(both):
    log = both["csv"].iteration_log
    whole = both["csv"].iteration_columns
    rows = sample_rows(log.num_rows, 37)
    parts = list(log.windows(max_rows=16, rows=rows))
    assert len(parts) > 2
    for key, column in whole.items():
        got = [p["bound"].strings() if key == "bound" else p[key] for p in parts]
        np.testing.assert_array_equal(np.concatenate(got), column[rows], err_msg=key)


# ----------------------------------------------------------------------------- validation

BAD_OUTPUT = [
    ({"format": "xlsx"}, "output.format must be one of 'csv' or 'parquet'; got 'xlsx'"),
    ({"iterations": "some"}, "output.iterations must be all, none or {sample: N}"),
    ({"iterations": {"sample": 1}}, "output.iterations.sample must be >= 2, got 1"),
    ({"iterations": {"sample": 1.5}}, "output.iterations.sample must be an integer, got 1.5"),
    ({"iterations": {"sample": True}}, "output.iterations.sample must be an integer, got true"),
    ({"iterations": {"sample": 10, "every": 2}}, "output.iterations must be all, none or"),
    ({"iterations": 100}, "output.iterations must be all, none or {sample: N}"),
    ({"rows": "all"}, "output.rows: unknown key; allowed keys: format, iterations"),
    ("parquet", "output must be a mapping"),
]


@pytest.mark.parametrize(("output", "message"), BAD_OUTPUT)
def test_bad_output_blocks_are_one_line_errors_naming_the_key_and_the_choices(output, message):
    with pytest.raises(ConfigError) as info:
        load_experiment({**tiny_experiment(), "output": output})
    text = str(info.value)
    assert message in text and "\n" not in text


def test_an_output_error_in_a_file_points_at_its_line(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    text = json.dumps(tiny_experiment(), indent=1)[:-2] + ',\n "output": {"format": "xls"}\n}\n'
    exp.write_text(text, encoding="utf-8")
    assert cli.main(["run", str(exp), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    line = text.splitlines().index(' "output": {"format": "xls"}') + 1
    assert f"exp.yaml:{line}" in err and "output.format must be one of" in err
    assert not (tmp_path / "out").exists()


def test_the_sample_form_reads_from_yaml_and_round_trips(tmp_path):
    exp = tmp_path / "exp.yaml"
    text = json.dumps(tiny_experiment())[:-1] + ', "output": {"iterations": {"sample": 500}}}'
    exp.write_text(text, encoding="utf-8")
    config = load_experiment(exp)
    assert config.output.iteration_sample == 500 and config.output.format == "csv"
    assert config.model_dump(mode="json")["output"] == {
        "format": "csv",
        "iterations": {"sample": 500},
    }
    assert load_experiment(config.model_dump(mode="json")).output == config.output


# ---------------------------------------------------------------------------------- sweeps


def test_a_sweep_writes_parquet_points_resumes_them_and_draws_them(tmp_path):
    from test_sweep import count_runs

    small = tiny_experiment(workload={"num_requests": 20}, output={"format": "parquet"})
    grid = {"scheduler.policy": ["static", "continuous"]}
    out = tmp_path / "sweep"

    def sweep() -> Any:
        return batchsim.sweep(small, grid, executor=InlineExecutor(), out_dir=out)

    result = sweep()
    for label in result["point"]:
        assert names(out / "points" / label) == {
            "config.yaml",
            "summary.json",
            "point.json",
            "requests.parquet",
            "iterations.parquet",
        }
    assert count_runs(sweep) == 0  # finished points are found in their format
    fig = figure("cdf", [out], PlotOptions())
    assert len(fig.axes[0].get_lines()) >= 2
    switched = {**small, "output": {"format": "csv"}}
    assert (
        count_runs(lambda: batchsim.sweep(switched, grid, executor=InlineExecutor(), out_dir=out))
        == 2
    )
    for label in result["point"]:
        point = names(out / "points" / label)
        assert "requests.csv" in point and "requests.parquet" not in point


# --------------------------------------------------------------------------------- figures


@pytest.fixture(scope="module")
def figure_runs(both, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("figures")
    out = {"parquet": both["root"] / "parquet", "csv": both["root"] / "csv"}
    for name, overrides in {
        "sampled": {"output.format": "parquet", "output.iterations": {"sample": 20}},
        "none": {"output.iterations": "none"},
    }.items():
        run(root / name, **overrides)
        out[name] = root / name
    return out


@pytest.mark.parametrize("kind", ["cdf", "kv", "roofline", "timeline"])
def test_figures_read_parquet_runs_as_csv_runs(figure_runs, kind):
    from_csv = figure(kind, [figure_runs["csv"]], PlotOptions())
    from_parquet = figure(kind, [figure_runs["parquet"]], PlotOptions())
    for a, b in zip(from_csv.axes, from_parquet.axes):
        lines_a = [line.get_xydata() for line in a.get_lines()]
        lines_b = [line.get_xydata() for line in b.get_lines()]
        assert len(lines_a) == len(lines_b)
        for x, y in zip(lines_a, lines_b):
            np.testing.assert_allclose(x, y, rtol=1e-6)


def test_the_run_reader_gives_the_same_frames_for_both_formats(figure_runs):
    csv, parquet = load(figure_runs["csv"]), load(figure_runs["parquet"])
    for table in ("requests", "iterations", "slots"):
        a, b = getattr(csv, table), getattr(parquet, table)
        pd.testing.assert_frame_equal(a, b, check_dtype=False, rtol=1e-6)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_writing_and_reading_parquet_results_starts_no_pyarrow_thread_pool(tmp_path):
    # pyarrow 14 could abort at interpreter exit ("terminate called without an active
    # exception") once its thread pools had run: a run's Parquet tables are written and read
    # on the calling thread, and read from memory (reading a file starts pyarrow's I/O pool).
    script = UNNAMED_THREADS + (
        "import io, contextlib, sys\n"
        "import pandas, pyarrow.parquet\n"
        "from batchsim import cli\n"
        "from batchsim.plots.data import load\n"
        "before = unnamed_threads()\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['run', sys.argv[2], '--format', 'parquet', '-o', str(out)])\n"
        "run = load(out)\n"
        "assert len(run.requests) == 60 and len(run.iterations) > 0\n"
        "print(unnamed_threads() - before)\n"
    )
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(yaml.safe_dump(EXPERIMENT), encoding="utf-8")
    args = [sys.executable, "-c", script, str(tmp_path / "run"), str(experiment)]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0


def test_figures_say_when_the_iterations_are_a_sample(figure_runs):
    run = load(figure_runs["sampled"])
    total = run.summary["num_iterations"]
    note = f"a sample of 20 of {total:,}"
    assert note in figure("kv", [figure_runs["sampled"]], PlotOptions())._suptitle.get_text()
    roof = figure("roofline", [figure_runs["sampled"]], PlotOptions())
    assert note in roof.axes[0].get_title()
    with pytest.raises(ConfigError) as info:
        figure("timeline", [figure_runs["sampled"]], PlotOptions())
    text = str(info.value)
    assert "\n" not in text and note in text and "output.iterations=all" in text
    cdf = figure("cdf", [figure_runs["sampled"]], PlotOptions())  # ITL from the summary
    assert any("output.iterations=all" in ax.get_title() for ax in cdf.axes)


@pytest.mark.parametrize("kind", ["kv", "roofline", "timeline"])
def test_figures_needing_iterations_say_the_run_wrote_none(figure_runs, kind):
    with pytest.raises(ConfigError) as info:
        figure(kind, [figure_runs["none"]], PlotOptions())
    text = str(info.value)
    assert "\n" not in text and "output.iterations: none" in text


# ------------------------------------------------------------------------- progress line


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_progress_line_unless_stderr_is_a_terminal():
    assert progress.RunProgress.for_terminal(io.StringIO()) is None
    assert progress.RunProgress.for_terminal(FakeTerminal()) is not None


def test_the_progress_line_is_rewritten_in_place_and_cleared(monkeypatch):
    monkeypatch.setattr(progress, "CHECK_EVERY", 1)
    monkeypatch.setattr(progress, "REFRESH_S", 0.0)
    terminal = FakeTerminal()
    line = progress.RunProgress(terminal, show_after_s=0.0)
    config = load_experiment(tiny_experiment())
    result = simulate(config, progress=line)
    shown = terminal.getvalue()
    assert shown.startswith("\r\x1b[K") and "\n" not in shown
    last = shown.split("\r\x1b[K")[-1]
    assert last == "summarizing ..."
    updates = [text for text in shown.split("\r\x1b[K") if text.startswith("simulated ")]
    assert updates and f"/{result.summary['num_requests']:,} requests done" in updates[-1]
    assert "it/s" in updates[-1]
    line.close()
    assert terminal.getvalue().endswith("\r\x1b[K")
    unobserved = simulate(config)
    assert same_summary(result.summary, unobserved.summary)


def test_the_progress_line_shows_simulated_time_moving_on_in_an_offline_run(monkeypatch):
    # Every request arrives at t=0: after that no arrival is due, so the engine never sleeps
    # on SimPy's clock; the line shows the engine's own time, from 0 to the last end.
    monkeypatch.setattr(progress, "CHECK_EVERY", 1)
    monkeypatch.setattr(progress, "REFRESH_S", 0.0)
    terminal = FakeTerminal()
    line = progress.RunProgress(terminal, show_after_s=0.0)
    workload = {
        "num_requests": 8,
        "arrival": {"process": "all_at_once"},
        "prompt_tokens": {"dist": "fixed", "value": 64},
        "output_tokens": {"dist": "fixed", "value": 2000},
    }
    config = load_experiment(tiny_experiment(workload=workload))
    result = simulate(config, progress=line)
    line.close()
    shown = [
        float(text.split()[1].replace(",", ""))
        for text in terminal.getvalue().split("\r\x1b[K")
        if text.startswith("simulated ")
    ]
    end = float(result.requests["finish_time_s"].max())
    assert end > 10  # long enough for whole seconds to show the clock moving
    assert shown == sorted(shown) and shown[0] == 0 and shown[-1] >= end - 1


def test_a_short_run_shows_nothing():
    terminal = FakeTerminal()
    line = progress.RunProgress(terminal, show_after_s=3600.0)
    simulate(load_experiment(tiny_experiment()), progress=line)
    line.close()
    assert terminal.getvalue() == ""


# ------------------------------------------------------------------- compact storage


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from(["constant", "small", "few", "many", "special"]),
    dtype=st.sampled_from(["f8", "f4", "i8", "i4", "i1"]),
    n=st.integers(1, 3 * 64 + 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_stored_columns_read_back_bit_for_bit(kind, dtype, n, seed):
    # several full (packed) chunks and an open one
    with mock.patch("batchsim.metrics.columns._CHUNK", 64):
        check_stored_column(kind, dtype, n, seed)


def check_stored_column(kind: str, dtype: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    if kind == "constant":
        values = np.full(n, rng.integers(-100, 100)).astype(dtype)
    elif kind == "small":
        values = rng.integers(-100, 100, n).astype(dtype)
    elif kind == "few":
        values = rng.choice(rng.normal(size=5) * 1e6, n).astype(dtype)
    elif kind == "many" and dtype.startswith("f"):
        values = (rng.normal(size=n) * 1e9).astype(dtype)
    elif kind == "many":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype)
    elif dtype.startswith("f"):  # signed zeros, NaN and infinities keep their bits
        values = rng.choice(np.array([0.0, -0.0, np.nan, np.inf, -1.5]), n).astype(dtype)
    else:  # the extremes of the type
        info = np.iinfo(dtype)
        values = rng.choice(np.array([info.min, info.max, 0, -1]), n).astype(dtype)
    store = ChunkedColumns({"x": values.dtype.str[1:]})
    half = n // 2
    for v in values[:half]:
        store.append((v,))
    store.extend((values[half:],), n - half)
    got = store.column("x")
    assert got.dtype == values.dtype
    bits = f"u{values.dtype.itemsize}"
    np.testing.assert_array_equal(got.view(bits), values.view(bits))
    lo, hi = sorted(int(i) for i in rng.integers(0, n + 1, 2))
    np.testing.assert_array_equal(store.column("x", lo, hi).view(bits), values[lo:hi].view(bits))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40))
def test_distinct_counts_values_as_numpy_unique_does(values):
    bits = np.array(values, dtype=np.uint64)
    assert _distinct(bits) == len(np.unique(bits))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_run_writes_the_iterations_while_it_runs_into_the_same_file_as_afterwards(
    fmt, tmp_path, monkeypatch
):
    # batchsim run hands the iterations table on while the engine logs it: tables of about
    # 8 rows here (cut between runs of iterations, the last ones at the end), formatted and
    # written in a background thread; Result.write of the same run writes it all at once
    monkeypatch.setattr(writers, "_CSV_ROWS", 4)
    monkeypatch.setattr(writers, "_BATCH_ROWS", 8)
    handed: list[int] = []
    real_add = writers.TableStream.add

    def add(stream: writers.TableStream, columns: dict[str, Any]) -> None:
        handed.append(len(columns["iteration"]))
        real_add(stream, columns)

    monkeypatch.setattr(writers.TableStream, "add", add)
    during: list[int] = []
    real_end = IterationLog.end_stream
    monkeypatch.setattr(
        IterationLog, "end_stream", lambda log: during.append(len(handed)) or real_end(log)
    )
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(yaml.safe_dump(EXPERIMENT), encoding="utf-8")
    streamed = tmp_path / "streamed"
    with mock.patch("sys.stdout", io.StringIO()):
        assert cli.main(["run", str(experiment), "-o", str(streamed), "--format", fmt]) == 0
    at_once = tmp_path / "at-once"
    result = simulate(load_experiment(experiment, {"output.format": fmt}))
    assert result.staged is None
    result.write(at_once)
    rows = result.summary["num_iterations"]
    assert sum(handed) == rows and during[0] > 10  # most of them during the run
    assert (
        names(streamed)
        == names(at_once)
        == {
            "summary.json",
            f"requests.{fmt}",
            f"iterations.{fmt}",
            "slots." + fmt,
            "config.yaml",
        }
    )
    assert names(tmp_path) == {"exp.yaml", "streamed", "at-once"}  # no temporary folder left
    for table in ("iterations", "requests"):
        a, b = (d / f"{table}.{fmt}" for d in (streamed, at_once))
        if fmt == "csv":
            assert a.read_bytes() == b.read_bytes()
        else:
            frames = [pq.read_table(path).to_pandas() for path in (a, b)]
            pd.testing.assert_frame_equal(*frames, check_exact=True)


def test_the_summary_is_the_same_when_the_log_hands_its_token_runs_over(monkeypatch):
    from batchsim import simulation
    from batchsim.metrics.summary import summarize

    logs_seen = []

    def both_ways(request_log: Any, iterations: Any, **kwargs: Any) -> Any:
        assert kwargs["hand_over"]  # simulate() hands the token runs over
        copied = summarize(request_log, iterations, **{**kwargs, "hand_over": False})
        handed = summarize(request_log, iterations, **kwargs)
        assert same_summary(copied, handed)
        logs_seen.append(request_log)
        return handed

    monkeypatch.setattr(simulation, "summarize", both_ways)
    simulate(load_experiment(EXPERIMENT))
    (log,) = logs_seen
    with pytest.raises(RuntimeError, match="handed over"):
        log.token_runs(np.ones(log.num_rows, dtype=bool))


def test_a_points_key_changes_with_its_output_block_only_when_it_is_not_the_default():
    import hashlib

    from batchsim import __version__
    from batchsim.catalog import catalog_dir
    from batchsim.studies.store import FileDigests

    config = load_experiment(tiny_experiment())
    data = config.model_dump()
    del data["output"]  # a point's key as it was before the output: block existed
    files = {  # the built-in catalog entries the config names
        f"{kind}/{name}.yaml": hashlib.sha256(
            (catalog_dir(kind) / f"{name}.yaml").read_bytes()
        ).hexdigest()
        for kind, name in (
            ("hardware_profiles", "a100-80gb"),
            ("models", "llama-2-7b"),
            ("frameworks", "vllm-v1"),  # the default serving engine
        )
    }
    blob = json.dumps(
        {"config": data, "files": files, "version": __version__}, sort_keys=True, default=str
    )
    assert FileDigests().key(config) == hashlib.sha256(blob.encode()).hexdigest()
    parquet = load_experiment(tiny_experiment(output={"format": "parquet"}))
    assert FileDigests().key(parquet) != FileDigests().key(config)
