"""The hostile battery: bad input of every class that once slipped through, through
``cli.main(argv)``.

Each refused case must exit 2 with exactly one line on stderr (``batchsim: error: ...``)
naming the key, file or line, with no traceback and nothing written. The cases that must
run (a workload spread over 1e8 s and more) check what they give, not how long they take.
Each case is small: the battery runs in seconds.
"""

from __future__ import annotations

import json
import signal
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from batchsim import cli
from batchsim.studies import backends

MODELS = Path(__file__).resolve().parents[1] / "models"
CALIBRATION_SAMPLE = Path(__file__).parent / "data" / "vidur_a100_sample"


def experiment_text(workload: str, extra: str = "", policy: str = "continuous") -> str:
    """A small experiment; ``workload`` is the body of its ``workload:`` block."""
    body = textwrap.indent(textwrap.dedent(workload).strip("\n"), "  ")
    return (
        "name: hostile\nseed: 1\nhardware: a100-80gb\nmodel: llama-2-7b\n"
        f"scheduler: {{policy: {policy}, max_num_seqs: 8}}\n"
        f"workload:\n{body}\n{textwrap.dedent(extra)}"
    )


SMALL = """\
num_requests: 6
arrival: {process: poisson, rate: 20.0}
prompt_tokens: {dist: fixed, value: 32}
output_tokens: {dist: fixed, value: 4}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], root: Path, *says: str) -> str:
    """Run ``argv``: exit 2, one line on stderr holding every ``says``, no traceback, and no
    file created or removed under ``root``. Returns the line."""
    before = files_under(root)
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("batchsim: error: "), err
    assert "Traceback" not in err and "Warning" not in err, err
    for text in says:
        assert text in lines[0], lines[0]
    assert files_under(root) == before, "nothing is written"
    return lines[0]


def ran(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and "Warning" not in err, err
    return out, err


# ------------------------------------------------------------------ memory and the time bound


def test_twenty_requests_over_2e8_s_run_in_little_memory(tmp_path, capsys):
    # 20 arrivals at 1e-7 req/s span about 2e8 s (inside the 1e9 s bound): one cell per
    # simulated second would be 1.6 GB per peak array
    exp = write(
        tmp_path / "e.yaml",
        experiment_text(SMALL.replace("6", "20", 1).replace("rate: 20.0", "rate: 1.0e-7")),
    )
    out = tmp_path / "out"
    tracemalloc.start()
    try:
        ran(["run", str(exp), "-o", str(out)], capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"{peak / 2**20:.0f} MiB traced"
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["completed"] == 20
    # requests millions of seconds apart are served alone, each in well under a second
    assert summary["max_concurrent_requests"] == 1
    assert summary["max_output_tokens_per_s"] == 4.0


def test_a_two_row_trace_9e8_s_apart_has_the_peaks_of_one_request(tmp_path, capsys):
    trace = write(
        tmp_path / "t.csv", "arrival_time,prompt_tokens,output_tokens\n0,32,4\n9e8,32,4\n"
    )
    workload = f"trace: {{path: {trace.name}}}\n"
    exp = write(tmp_path / "e.yaml", experiment_text(workload))
    out = tmp_path / "out"
    ran(["run", str(exp), "-o", str(out)], capsys)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["completed"] == 2
    assert summary["max_concurrent_requests"] == 1
    assert summary["max_output_tokens_per_s"] == 4.0  # all 4 tokens of one request


@pytest.mark.parametrize(
    "arrival",
    [
        "{process: poisson, rate: 1.0e-9}",
        "{process: gamma, rate: 1.0e-9, cv: 2.0}",
        "{process: constant, rate: 1.0e-8}",
    ],
    ids=["poisson", "gamma", "constant"],
)
def test_synthetic_arrivals_past_1e9_s_are_refused_before_the_run(arrival, tmp_path, capsys):
    workload = SMALL.replace("6", "20", 1).replace("{process: poisson, rate: 20.0}", arrival)
    exp = write(tmp_path / "e.yaml", experiment_text(workload))
    refused(
        ["run", str(exp), "-o", str(tmp_path / "out")],
        capsys,
        tmp_path,
        "workload.arrival: ",
        "more than the limit of 1e+09 s",
    )


def test_closed_loop_think_times_past_1e9_s_are_refused_before_the_run(tmp_path, capsys):
    # one user thinking 1e8 s before each of 19 requests: 1.9e9 s
    workload = """\
    num_requests: 20
    concurrency: 1
    think_time_ms: {dist: fixed, value: 1.0e11}
    prompt_tokens: {dist: fixed, value: 32}
    output_tokens: {dist: fixed, value: 4}
    """
    exp = write(tmp_path / "e.yaml", experiment_text(workload))
    refused(
        ["run", str(exp), "-o", str(tmp_path / "out")],
        capsys,
        tmp_path,
        "workload.think_time_ms: ",
        "more than the limit of 1e+09 s",
    )


def test_a_closed_loop_that_passes_1e9_s_by_its_service_times_stops_naming_the_key(
    tmp_path, capsys
):
    # ten think times of 1e8 s add up to the bound exactly (allowed before the run); the
    # service of the requests before the last one pushes its arrival past it
    workload = """\
    num_requests: 11
    concurrency: 1
    think_time_ms: {dist: fixed, value: 1.0e11}
    prompt_tokens: {dist: fixed, value: 32}
    output_tokens: {dist: fixed, value: 4}
    """
    exp = write(tmp_path / "e.yaml", experiment_text(workload))
    line = refused(
        ["run", str(exp), "-o", str(tmp_path / "out")],
        capsys,
        tmp_path,
        "workload.think_time_ms: request 10 would arrive at 1000000000",
    )
    assert "more than the limit of 1e+09 s" in line


def test_capacity_halving_into_the_time_bound_ends_its_search_saying_why(tmp_path, capsys):
    # 20 requests at 1e-7 req/s miss an SLO no rate meets; halving reaches rates whose
    # arrivals would pass 1e9 s (below 2e-8 req/s): the search ends there, no crash
    workload = SMALL.replace("6", "20", 1).replace("rate: 20.0", "rate: 1.0e-7")
    exp = write(tmp_path / "e.yaml", experiment_text(workload))
    out = tmp_path / "cap"
    argv = ["capacity", str(exp), "-o", str(out), "--workers", "1", "-q"]
    ran([*argv, "--slo", "p99_ttft_ms=0.001"], capsys)
    table = pd.read_csv(out / "capacity.csv", keep_default_na=False)
    assert "too low to simulate" in table["limited_by"].iloc[0]
    assert "1e+09 s" in table["limited_by"].iloc[0]


# ------------------------------------------------------------------------------ process counts


def test_workers_are_capped_at_the_points_to_run_and_it_says_so_once(tmp_path, capsys, monkeypatch):
    pools: list[int] = []

    def recording_pool(workers: int) -> Any:
        pools.append(workers)
        return backends.InlineExecutor()

    monkeypatch.setattr(backends, "local_pool", recording_pool)
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL))
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1000", "-q"]
    _, err = ran([*argv, "--grid", "scheduler.max_num_seqs=2,4"], capsys)
    assert pools == [2]
    assert err.count("--workers 1000 capped at 2, the points to run") == 1, err


def test_capacity_workers_are_capped_at_the_configurations(tmp_path, capsys, monkeypatch):
    pools: list[int] = []

    def recording_pool(workers: int) -> Any:
        pools.append(workers)
        return backends.InlineExecutor()

    monkeypatch.setattr(backends, "local_pool", recording_pool)
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL))
    argv = ["capacity", str(exp), "-o", str(tmp_path / "c"), "--workers", "50", "-q"]
    argv += ["--slo", "p99_ttft_ms=100000", "--rtol", "0.5"]
    _, err = ran([*argv, "--grid", "scheduler.max_num_seqs=2,4,8"], capsys)
    assert pools == [3]
    assert err.count("--workers 50 capped at 3, the configurations to search") == 1, err


# -------------------------------------------------------------------------------------- sweeps


@pytest.mark.parametrize(
    ("grid", "says"),
    [
        (["scheduler.max_num_seqs=pow2:1..1e30"], "beyond the integers a table holds"),
        (["scheduler.max_num_seqs=pow2:1..1e300"], "pow2:1..1e300"),
        (["scheduler.max_num_seqs=2,4,2"], "the value 2 is given twice"),
        (["scheduler.max_num_seqs=2,4", "scheduler.max_num_seqs=8"], "is given twice"),
        (["workload.arrival={process: poisson, rate: 1},{process: poisson, rate: 1}"], "twice"),
    ],
    ids=["pow2-overflow", "pow2-huge", "repeated-value", "repeated-grid", "repeated-block"],
)
def test_bad_sweep_axes_are_refused_before_any_point_runs(grid, says, tmp_path, capsys):
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL))
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1"]
    for item in grid:
        argv += ["--grid", item]
    refused(argv, capsys, tmp_path, "--grid ", says)


def test_a_repeated_value_in_the_sweep_block_names_the_file_and_line(tmp_path, capsys):
    extra = "sweep:\n  grid: {scheduler.max_num_seqs: [4, 8, 4]}\n"
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL, extra))
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1"]
    refused(argv, capsys, tmp_path, f"{exp}:", "the value 4 is given twice")


def test_a_repeated_pair_of_a_zip_group_is_refused(tmp_path, capsys):
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL))
    argv = ["sweep", str(exp), "-o", str(tmp_path / "s"), "--workers", "1"]
    argv += ["--zip", "scheduler.max_num_seqs=4,4", "--zip", "workload.num_requests=6,6"]
    refused(argv, capsys, tmp_path, "--zip", "given twice")


# ------------------------------------------------------------------------------------ policies

POLICIES = '''
from batchsim.scheduler.continuous import ContinuousScheduler
from batchsim.scheduler.fast_forward import fast_forward


class ExitsZero(ContinuousScheduler):
    def schedule(self, now):
        raise SystemExit(0)


class Interrupts(ContinuousScheduler):
    def schedule(self, now):
        raise KeyboardInterrupt


class ClosesItself(ContinuousScheduler):
    def schedule(self, now):
        raise GeneratorExit


class ExitsWhenMade(ContinuousScheduler):
    def __init__(self, *args, **kwargs):
        raise SystemExit(3)


class InterruptsOnArrival(ContinuousScheduler):
    def add_request(self, request):
        raise KeyboardInterrupt("not the user")


@fast_forward(decode_stretches=True)
class NegativeRepeat(ContinuousScheduler):
    def policy_max_repeat(self, output):
        return -1


@fast_forward(decode_stretches=True)
class ZeroRepeat(ContinuousScheduler):
    def policy_max_repeat(self, output):
        return 0


@fast_forward(decode_stretches=True)
class RepeatRaisesExit(ContinuousScheduler):
    def policy_max_repeat(self, output):
        raise SystemExit(0)


class UserPressesCtrlC(ContinuousScheduler):
    """The user's Ctrl-C arrives while the policy runs."""

    def schedule(self, now):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        return super().schedule(now)
'''


@pytest.fixture
def policies(tmp_path, monkeypatch):
    import sys

    write(tmp_path / "hostile_policies.py", POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hostile_policies"
    sys.modules.pop("hostile_policies", None)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("ExitsZero", "schedule() raised SystemExit: 0"),
        ("Interrupts", "schedule() raised KeyboardInterrupt"),
        ("ClosesItself", "schedule() raised GeneratorExit"),
        ("ExitsWhenMade", "__init__() raised SystemExit: 3"),
        ("InterruptsOnArrival", "add_request() raised KeyboardInterrupt: not the user"),
        ("NegativeRepeat", "policy_max_repeat() returned -1; it must return an integer >= 1"),
        ("ZeroRepeat", "policy_max_repeat() returned 0; it must return an integer >= 1"),
        ("RepeatRaisesExit", "policy_max_repeat() raised SystemExit: 0"),
    ],
)
def test_anything_a_policy_raises_is_its_error(policies, name, says, tmp_path, capsys):
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL, policy=f"{policies}:{name}"))
    refused(
        ["run", str(exp), "-o", str(tmp_path / "out")],
        capsys,
        tmp_path,
        f"scheduler.policy {policies}:{name}: ",
        says,
    )


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs SIGINT")
def test_the_users_ctrl_c_inside_a_policy_is_still_an_interrupt(policies, tmp_path, capsys):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL, policy=f"{policies}:UserPressesCtrlC"))
    code = cli.main(["run", str(exp), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGINT, err
    assert "Traceback" not in err and "error" not in err, err
    assert not (tmp_path / "out").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


# --------------------------------------------------------------------------------------- files


@pytest.fixture
def cut_run(tmp_path, capsys):
    """A run whose requests.csv and iterations.csv were cut in the middle of a row."""
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL))
    run = tmp_path / "run"
    ran(["run", str(exp), "-o", str(run)], capsys)
    for table in ("requests", "iterations"):
        path = run / f"{table}.csv"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 7])  # the last row loses its end
    return run


@pytest.mark.parametrize("kind", ["cdf", "kv"])
def test_plot_of_a_table_cut_mid_row_names_the_file_and_line(cut_run, kind, tmp_path, capsys):
    line = refused(
        ["plot", kind, str(cut_run), "-o", str(tmp_path / "f.png")], capsys, tmp_path, ".csv:"
    )
    assert "the table ends in the middle of a row" in line
    table = "requests" if kind == "cdf" else "iterations"  # what each kind reads first
    rows = (cut_run / f"{table}.csv").read_text(encoding="utf-8").count("\n")
    assert f"{table}.csv:{rows + 1}: " in line  # the header is line 1; the cut row follows


def test_report_of_a_table_cut_mid_row_is_an_error_not_a_note(cut_run, tmp_path, capsys):
    refused(
        ["report", str(cut_run), "-o", str(tmp_path / "r.html")],
        capsys,
        tmp_path,
        ".csv:",
        "the table ends in the middle of a row",
    )


def test_calibrate_refuses_an_implausible_measured_latency(tmp_path, capsys):
    write(tmp_path / "r.json", json.dumps({"avg_latency": 1e308}))
    argv = ["calibrate", "--hardware", "a100-80gb", "--e2e", str(tmp_path / "r.json")]
    argv += ["--model", "llama-2-7b", "--batch-size", "1", "--input-len", "16"]
    argv += ["--output-len", "4", "-o", str(tmp_path / "p.yaml")]
    before = files_under(tmp_path)
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "r.json: avg_latency 1e+308 s is over 1e300 times what" in err[0]
    assert files_under(tmp_path) == before


def test_calibrate_refuses_more_folds_than_rows(tmp_path, capsys):
    argv = ["calibrate", "--hardware", "a100-80gb", "--ops", str(CALIBRATION_SAMPLE)]
    argv += ["--folds", "10000000", "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, tmp_path, "--folds 10000000: more folds than the ", "measured rows")


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("scheduler: {policy: continuous, max_num_seqs: 1_6}\n", 5, "digit separators (_)"),
        (
            "defaults: &d {policy: continuous}\nscheduler:\n  <<: *d\n  max_num_seqs: 8\n",
            7,
            "merge keys (<<) are YAML 1.1",
        ),
    ],
    ids=["digit-separator", "merge-key"],
)
def test_yaml_1_1_features_are_errors_naming_the_file_and_line(text, line, says, tmp_path, capsys):
    head = "name: hostile\nseed: 1\nhardware: a100-80gb\nmodel: llama-2-7b\n"
    exp = write(tmp_path / "e.yaml", head + text + "workload:\n" + textwrap.indent(SMALL, "  "))
    refused(
        ["run", str(exp), "-o", str(tmp_path / "out")], capsys, tmp_path, f"{exp}:{line}:", says
    )


def test_sexagesimal_and_yes_are_strings_and_refused_where_numbers_and_booleans_go(
    tmp_path, capsys
):
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL, "metrics: {warmup_s: 1:30}\n"))
    refused(["run", str(exp), "-o", str(tmp_path / "out")], capsys, tmp_path, "warmup_s")
    exp = write(
        tmp_path / "e.yaml", experiment_text(SMALL, "engine: {enable_prefix_caching: yes}\n")
    )
    refused(
        ["run", str(exp), "-o", str(tmp_path / "out")], capsys, tmp_path, "enable_prefix_caching"
    )


@pytest.mark.parametrize("value", ['"abc"', "[1, 2]", "true"])
def test_a_string_where_a_model_file_holds_a_number_is_refused_like_nan(value, tmp_path, capsys):
    text = (MODELS / "llama-2-7b.yaml").read_text(encoding="utf-8")
    assert "rope_theta: 10000.0\n" in text
    model = write(
        tmp_path / "m.yaml", text.replace("rope_theta: 10000.0\n", f"rope_theta: {value}\n")
    )
    line = 1 + text[: text.index("rope_theta: 10000.0")].count("\n")
    exp = write(
        tmp_path / "e.yaml", experiment_text(SMALL).replace("model: llama-2-7b", f"model: {model}")
    )
    refused(
        ["run", str(exp), "-o", str(tmp_path / "out")],
        capsys,
        tmp_path,
        f"{model}:{line}: rope_theta must be a number",
    )


def test_a_trace_with_an_arrival_block_says_its_times_are_not_used(tmp_path, capsys):
    trace = write(tmp_path / "t.csv", "arrival_time,prompt_tokens,output_tokens\n0,32,4\n1,32,4\n")
    workload = f"trace: {{path: {trace.name}}}\narrival: {{process: poisson, rate: 5.0}}\n"
    exp = write(tmp_path / "e.yaml", experiment_text(workload))
    _, err = ran(["run", str(exp), "-o", str(tmp_path / "out")], capsys)
    assert "note: the arrival times of trace " in err
    assert "t.csv are not used: workload.arrival (poisson(rate=5)) draws them" in err


@pytest.mark.parametrize("command", ["run", "sweep", "plot", "report"])
def test_an_empty_output_path_is_an_error(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = write(tmp_path / "e.yaml", experiment_text(SMALL))
    argv = {
        "run": ["run", str(exp)],
        "sweep": ["sweep", str(exp), "--grid", "scheduler.max_num_seqs=2,4"],
        "plot": ["plot", "cdf", str(tmp_path)],
        "report": ["report", str(tmp_path)],
    }[command]
    refused([*argv, "-o", ""], capsys, tmp_path, "-o/--output", "empty")
    assert not (tmp_path / "runs").exists()
