"""The ``batchsim`` command line (architecture.md sections 5-6), through ``cli.main(argv)``.

Exit codes: 0 ok, 2 bad input (exactly one line on stderr naming the key or file, no
traceback, nothing written), 1 internal error.
"""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsim import cli
from batchsim.catalog import catalog_names
from batchsim.cli.tables import _fmt
from batchsim.metrics.iterations import IterationLog
from batchsim.scheduler.registry import POLICIES
from conftest import SUMMARY_KEYS

OUTPUT_FILES = {"summary.json", "requests.csv", "iterations.csv", "config.yaml"}
REQUEST_COLUMNS = {
    "request_id",
    "arrival_time_s",
    "first_scheduled_time_s",
    "first_token_time_s",
    "finish_time_s",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "queue_delay_ms",
    "num_preemptions",
    "status",
}
ITERATION_COLUMNS = {
    "start_time_s",
    "duration_ms",
    "num_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_padding_tokens",
    "flops",
    "weight_bytes",
    "kv_bytes",
    "bound",
    "kv_cache_usage",
}
EXPERIMENT = """\
name: cli-test
seed: 3
hardware: a100-80gb
model: llama-2-7b
scheduler:
  policy: continuous
  max_num_seqs: 8
workload:
  num_requests: 30
  arrival: {process: poisson, rate: 10.0}
  prompt_tokens: {dist: uniform, min: 32, max: 256}
  output_tokens: {dist: uniform, min: 4, max: 32}
slo: {ttft_ms: 500, tpot_ms: 50}
"""
LINE = {
    key: number
    for number, text in enumerate(EXPERIMENT.splitlines(), start=1)
    for key in ("policy", "max_num_seqs", "arrival", "scheduler")
    if text.strip().startswith(f"{key}:")
}

TRACE_EXPERIMENT = """\
name: cli-trace
hardware: a100-80gb
model: llama-2-7b
workload:
  trace: {path: trace.csv, format: csv}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def read_csv_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f))


def read_summary(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "summary.json").read_text(encoding="utf-8"))


def without_wall_time(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "wall_time_s"}


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    return write(tmp_path / "exp.yaml", EXPERIMENT)


# ----------------------------------------------------------------------------- run


def test_run_writes_exactly_the_four_output_files_with_contract_columns(tmp_path, exp, capsys):
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == OUTPUT_FILES
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml", "out"}  # no temp dir left
    assert set(read_csv_header(out / "requests.csv")) >= REQUEST_COLUMNS
    assert set(read_csv_header(out / "iterations.csv")) >= ITERATION_COLUMNS
    summary = read_summary(out)
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["completed"] == 30
    with open(out / "requests.csv", newline="", encoding="utf-8") as f:
        assert sum(1 for _ in csv.DictReader(f)) == 30
    with open(out / "iterations.csv", newline="", encoding="utf-8") as f:
        bounds = {row["bound"] for row in csv.DictReader(f)}
    assert bounds <= {"compute", "memory"}
    config = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert config["scheduler"]["max_num_seqs"] == 8
    assert "Traceback" not in capsys.readouterr().err


def test_run_prints_a_summary_table_to_stdout(tmp_path, exp, capsys):
    assert cli.main(["run", str(exp), "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out  # sys.stdout at call time (capsys, redirect_stdout)
    assert "30 completed" in printed
    for label in ("TTFT", "TPOT", "ITL", "E2EL", "throughput", "queue delay", "KV cache"):
        assert label in printed


def test_set_overrides_keys_of_the_experiment(tmp_path, exp):
    out = tmp_path / "out"
    argv = ["run", str(exp), "-o", str(out), "--set", "scheduler.max_num_seqs=2"]
    argv += ["--set", "workload.num_requests=12", "--set", "scheduler.policy=chunked_prefill"]
    assert cli.main(argv) == 0
    summary = read_summary(out)
    assert summary["completed"] == 12
    assert summary["config"]["scheduler"]["max_num_seqs"] == 2
    assert summary["config"]["scheduler"]["policy"] == "chunked_prefill"
    with open(out / "iterations.csv", newline="", encoding="utf-8") as f:
        assert max(int(row["num_seqs"]) for row in csv.DictReader(f)) <= 2
    config = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert config["scheduler"]["max_num_seqs"] == 2


def test_written_config_reruns_to_an_identical_summary_from_anywhere(tmp_path, monkeypatch):
    # A relative trace path must survive: config.yaml has to rerun from another directory.
    src = tmp_path / "src"
    src.mkdir()
    rows = [f"{0.05 * i!r},{32 + 7 * i},{3 + i % 5}" for i in range(25)]
    write(src / "trace.csv", "arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows))
    exp = write(src / "exp.yaml", TRACE_EXPERIMENT)
    monkeypatch.chdir(src)
    assert cli.main(["run", "exp.yaml", "-o", str(tmp_path / "first")]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = tmp_path / "first" / "config.yaml"
    assert cli.main(["run", str(config), "-o", str(tmp_path / "second")]) == 0
    first, second = read_summary(tmp_path / "first"), read_summary(tmp_path / "second")
    assert without_wall_time(first) == without_wall_time(second)
    assert first["completed"] == 25
    assert exp.is_file()


def test_validate_reports_ok_and_writes_nothing(tmp_path, exp, capsys):
    assert cli.main(["validate", str(exp)]) == 0
    printed = capsys.readouterr()
    assert "ok" in printed.out
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml"}


def test_validate_reports_the_host_swap_space_in_swap_mode(exp, capsys):
    argv = ["validate", str(exp), "--set", "scheduler.preemption_mode=swap"]
    assert cli.main([*argv, "--set", "engine.swap_space_gib=2"]) == 0
    # Llama-2-7B: 16 tokens x 512 KiB = 8 MiB per block, so 2 GiB hold 256 blocks; one block
    # crosses the A100's 32 GB/s PCIe link at 80 % in 8 MiB / 25.6 GB/s = 0.328 ms.
    assert "host swap space 256 blocks (0.328 ms per block" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        ("hardware", catalog_names("hardware_profiles")),
        ("models", catalog_names("models")),
        ("policies", list(POLICIES)),
        ("workloads", catalog_names("workloads")),
    ],
)
def test_list_prints_every_built_in_name_from_any_directory(
    kind, names, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert names
    assert cli.main(["list", kind]) == 0
    printed = capsys.readouterr().out
    for name in names:
        assert name in printed


def test_list_policies_says_what_each_policy_is_on_either_build(capsys):
    # The first line of each policy module's docstring, read here from the source file. A
    # module the compiled build compiled has no __doc__ at run time, so the listing must not
    # depend on it.
    import ast

    assert cli.main(["list", "policies"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    package = Path(cli.__file__).parents[1] / "scheduler"
    for name, cls in POLICIES.items():
        source = package / (cls.__module__.rpartition(".")[2] + ".py")
        doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8")))
        assert doc
        assert lines[name].endswith(doc.splitlines()[0]), lines[name]


def test_built_in_catalogs_work_from_another_directory(tmp_path, monkeypatch):
    # Built-in hardware, model, workload file and trace sample, referenced by name only.
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path / "exp.yaml",
        "name: builtin\nhardware: h100-sxm\nmodel: llama-3-8b\n"
        "workload:\n  trace: {path: azure_conv_sample.csv}\n  num_requests: 20\n",
    )
    assert cli.main(["run", "exp.yaml"]) == 0  # default output: runs/<name>
    assert {p.name for p in (tmp_path / "runs" / "builtin").iterdir()} == OUTPUT_FILES
    argv = ["run", "quickstart", "-o", "quick", "--set", "workload.num_requests=20"]
    assert cli.main(argv) == 0
    assert read_summary(tmp_path / "quick")["completed"] == 20
    write(
        tmp_path / "named.yaml",
        "hardware: a100-80gb\nmodel: llama-2-7b\nworkload: sharegpt-like\n",
    )
    argv = ["run", "named.yaml", "-o", "named", "--set", "workload.num_requests=10"]
    assert cli.main(argv) == 0
    named = read_summary(tmp_path / "named")
    assert named["completed"] + named["num_rejected"] == 10  # long prompts: > 4k context


def test_prompt_longer_than_any_kv_capacity_is_not_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "trace.csv", "arrival_time,prompt_tokens,output_tokens\n0,64,4\n0.1,900,4\n")
    write(tmp_path / "exp.yaml", TRACE_EXPERIMENT + "engine: {num_gpu_blocks: 16}\n")
    assert cli.main(["run", "exp.yaml", "-o", "out"]) == 0
    summary = read_summary(tmp_path / "out")
    assert summary["num_rejected"] == 1 and summary["completed"] == 1
    with open(tmp_path / "out" / "requests.csv", newline="", encoding="utf-8") as f:
        rejected = [row for row in csv.DictReader(f) if row["status"] == "rejected"]
    assert len(rejected) == 1 and "KV" in rejected[0]["reject_reason"]
    assert "Traceback" not in capsys.readouterr().err


def test_run_where_every_request_is_rejected_writes_header_only_iterations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "trace.csv", "arrival_time,prompt_tokens,output_tokens\n0,900,4\n")
    write(tmp_path / "exp.yaml", TRACE_EXPERIMENT + "engine: {num_gpu_blocks: 16}\n")
    assert cli.main(["run", "exp.yaml", "-o", "out"]) == 0
    summary = read_summary(tmp_path / "out")
    assert summary["num_rejected"] == 1 and summary["num_iterations"] == 0
    with open(tmp_path / "out" / "iterations.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 1 and set(rows[0]) >= ITERATION_COLUMNS


# ----------------------------------------------------------------------------- bad input


def _replace(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text
        return text.replace(old, new)

    return edit


BAD_EXPERIMENTS = {
    "unknown policy": (
        _replace("policy: continuous", "policy: fastest"),
        [f"exp.yaml:{LINE['policy']}:", "scheduler.policy", "fastest", "static", "chunked_prefill"],
    ),
    "negative rate": (
        _replace("rate: 10.0", "rate: -2"),
        [f"exp.yaml:{LINE['arrival']}:", "workload.arrival.rate", "-2"],
    ),
    "max_num_seqs 0": (
        _replace("max_num_seqs: 8", "max_num_seqs: 0"),
        [f"exp.yaml:{LINE['max_num_seqs']}:", "scheduler.max_num_seqs", "0"],
    ),
    "unknown key": (
        _replace("max_num_seqs: 8", "max_num_seqs: 8\n  max_num_seq: 4"),
        [f"exp.yaml:{LINE['max_num_seqs'] + 1}:", "scheduler.max_num_seq", "unknown key"],
    ),
    "malformed yaml": (
        _replace("max_num_seqs: 8", "max_num_seqs: [8"),
        ["exp.yaml:", "malformed YAML"],
    ),
}


def assert_bad_input(code: int, capsys, expected: list[str]) -> str:
    printed = capsys.readouterr()
    assert code == 2
    lines = printed.err.strip().splitlines()
    assert len(lines) == 1, printed.err
    assert "Traceback" not in printed.err
    for part in expected:
        assert part in lines[0]
    return lines[0]


@pytest.mark.parametrize("case", list(BAD_EXPERIMENTS))
def test_bad_experiment_exits_2_with_one_line_and_writes_nothing(case, tmp_path, capsys):
    edit, expected = BAD_EXPERIMENTS[case]
    exp = write(tmp_path / "exp.yaml", edit(EXPERIMENT))
    out = tmp_path / "out"
    assert_bad_input(cli.main(["run", str(exp), "-o", str(out)]), capsys, expected)
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml"}


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("scheduler.policy=fastest", ["scheduler.policy", "static", "chunked_prefill"]),
        ("workload.arrival.rate=-1", ["workload.arrival.rate"]),
        ("scheduler.max_num_seqs=0", ["scheduler.max_num_seqs"]),
        ("scheduler.nope=1", ["scheduler.nope"]),
        ("no-equals-sign", ["--set"]),
    ],
)
def test_bad_set_override_exits_2_and_writes_nothing(setting, expected, tmp_path, exp, capsys):
    code = cli.main(["run", str(exp), "-o", str(tmp_path / "out"), "--set", setting])
    assert_bad_input(code, capsys, expected)
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml"}


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        (None, ["workload.trace.path", "trace.csv"]),
        ("arrival_time,prompt_tokens,output_tokens\n0,10,5\n0.5,ten,5\n", ["trace.csv:3:"]),
        ("arrival_time,prompt_tokens,output_tokens\n0,10,5\n0.5,10\n", ["trace.csv:3:"]),
        ("arrival_time,prompt_tokens,output_tokens\n1,10,5\n0.5,10,5\n", ["trace.csv:3:"]),
    ],
    ids=["missing trace file", "non-integer tokens", "short row", "time going backwards"],
)
def test_bad_trace_exits_2_naming_file_and_line(trace, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "exp.yaml", TRACE_EXPERIMENT)
    if trace is not None:
        write(tmp_path / "trace.csv", trace)
    before = {p.name for p in tmp_path.iterdir()}
    assert_bad_input(cli.main(["run", "exp.yaml", "-o", "out"]), capsys, expected)
    assert {p.name for p in tmp_path.iterdir()} == before


def test_missing_experiment_file_exits_2(tmp_path, capsys):
    code = cli.main(["run", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "out")])
    assert_bad_input(code, capsys, ["nope.yaml"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["run"], ["list", "gpus"], ["frobnicate"]])
def test_command_line_usage_errors_exit_2_with_one_line(argv, capsys):
    assert_bad_input(cli.main(argv), capsys, ["batchsim"])


def test_validate_rejects_bad_input_like_run(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("max_num_seqs: 8", "max_num_seqs: 0"))
    assert_bad_input(cli.main(["validate", str(exp)]), capsys, ["scheduler.max_num_seqs"])


@pytest.mark.parametrize("command", ["validate", "run"])
def test_token_budget_below_the_batch_cap_is_refused_by_validate_and_run_alike(
    tmp_path, capsys, command
):
    text = EXPERIMENT.replace("max_num_seqs: 8", "max_num_seqs: 8\n  max_num_batched_tokens: 4")
    exp = write(tmp_path / "exp.yaml", text)
    out = tmp_path / "out"
    line = assert_bad_input(
        cli.main([command, str(exp), "-o", str(out)] if command == "run" else [command, str(exp)]),
        capsys,
        [f"exp.yaml:{LINE['max_num_seqs'] + 1}:", "max_num_batched_tokens must be >= "],
    )
    assert "(8)" in line and not out.exists()


def test_set_values_follow_the_rules_of_experiment_files(tmp_path, exp, capsys):
    # YAML 1.2 core schema: 8e1 is a number, yes is a string (not true); non-finite is refused.
    out = tmp_path / "out"
    args = ["run", str(exp), "-o", str(out)]
    assert cli.main([*args, "--set", "engine.swap_space_gib=8e1"]) == 0
    assert read_summary(out)["config"]["engine"]["swap_space_gib"] == 80.0
    capsys.readouterr()
    line = assert_bad_input(
        cli.main(["validate", str(exp), "--set", "scheduler.padding=yes"]),
        capsys,
        ["scheduler.padding", "true or false"],
    )
    assert "--set scheduler.padding=yes" in line
    assert_bad_input(
        cli.main(["validate", str(exp), "--set", "engine.cpu_overhead_ms=.nan"]),
        capsys,
        ["engine.cpu_overhead_ms"],
    )


def test_written_config_quotes_strings_that_look_like_numbers(tmp_path, exp):
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out), "--set", "name='1e3'"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["name"] == "1e3"
    assert cli.main(["run", str(out / "config.yaml"), "-o", str(tmp_path / "again")]) == 0


def test_an_endlessly_nested_python_mapping_is_bad_input():
    import batchsim

    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(batchsim.ConfigError, match="nesting"):
        batchsim.run({"hardware": "a100-80gb", "model": "llama-2-7b", "workload": deep})


def test_internal_error_exits_1_with_a_traceback(tmp_path, exp, monkeypatch, capsys):
    def broken(*args: Any, **kwargs: Any):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr("batchsim.simulation.simulate", broken)
    assert cli.main(["run", str(exp), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "simulated bug" in err
    assert not (tmp_path / "out").exists()


def test_summary_json_is_strict_json_with_null_for_undefined_values(tmp_path, exp):
    # One-token outputs have no TPOT: NaN must be written as null, not as bare NaN.
    out = tmp_path / "out"
    argv = ["run", str(exp), "-o", str(out), "--set", "workload.output_tokens=1"]
    assert cli.main(argv) == 0
    text = (out / "summary.json").read_text(encoding="utf-8")
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert summary["mean_tpot_ms"] is None
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in summary.values())


# ----------------------------------------------------------------------------- experiment name


@pytest.mark.parametrize(
    "name",
    ["../../escaped", "ABSOLUTE", "sub/dir", ".hidden", "a b", "x" * 101, ""],
    ids=["parent", "absolute", "slash", "dot-first", "space", "101-chars", "empty"],
)
def test_unsafe_experiment_name_exits_2_and_writes_nothing(name, tmp_path, monkeypatch, capsys):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    name = str(tmp_path / "absolute-name") if name == "ABSOLUTE" else name
    write(work / "exp.yaml", EXPERIMENT.replace("name: cli-test", f"name: {json.dumps(name)}"))
    line = assert_bad_input(cli.main(["run", "exp.yaml"]), capsys, ["exp.yaml:1:", "name"])
    for rule in ("letters", "digits", "100"):
        assert rule in line
    assert {p.name for p in tmp_path.rglob("*")} == {"a", "b", "exp.yaml"}


@pytest.mark.parametrize("name", ["run_1.b-2", "Q" * 100, "7"])
def test_safe_experiment_names_are_accepted(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "exp.yaml", EXPERIMENT.replace("name: cli-test", f"name: '{name}'"))
    assert cli.main(["run", "exp.yaml", "--set", "workload.num_requests=3"]) == 0
    assert (tmp_path / "runs" / name / "summary.json").is_file()


# ----------------------------------------------------------------------------- --set


def read_requests(directory: Path) -> list[dict[str, str]]:
    with open(directory / "requests.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_set_mapping_replaces_the_whole_block(tmp_path, exp, capsys):
    out = tmp_path / "out"
    argv = ["run", str(exp), "-o", str(out), "--set", "workload.arrival={process: all_at_once}"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert {float(r["arrival_time_s"]) for r in read_requests(out)} == {0.0}
    config = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert config["workload"]["arrival"] == {"process": "all_at_once"}


def test_set_top_level_block_mapping_replaces_the_block(tmp_path, exp):
    # The file sets max_num_seqs: 8; the replaced block falls back to the documented 256.
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out), "--set", "scheduler={policy: static}"]) == 0
    config = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert config["scheduler"]["policy"] == "static"
    assert config["scheduler"]["max_num_seqs"] == 256


def test_python_block_keyword_merges_into_the_block(exp):
    import batchsim

    result = batchsim.run(exp, workload={"num_requests": 12})
    assert result.summary["completed"] == 12
    assert result.config.workload.arrival is not None
    assert result.config.workload.arrival.model_dump()["rate"] == 10.0  # kept from the file
    result = batchsim.run(exp, **{"workload.arrival": {"process": "all_at_once"}})
    assert set(result.requests["arrival_time_s"]) == {0.0}  # a dotted key replaces


def test_set_named_workload_then_a_key_inside_it(tmp_path, exp, capsys):
    out = tmp_path / "out"
    argv = ["run", str(exp), "-o", str(out), "--set", "workload=sharegpt-like"]
    assert cli.main([*argv, "--set", "workload.num_requests=20"]) == 0, capsys.readouterr().err
    summary = read_summary(out)
    assert summary["completed"] + summary["num_rejected"] == 20
    assert summary["config"]["workload"]["prompt_tokens"]["mean"] == 2460  # workloads/ file


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (
            "workload.prompt_tokens.dist=fixed",
            ["--set workload.prompt_tokens.dist=fixed:", "workload.prompt_tokens.value"],
        ),
        (
            "workload.arrival.process=gamma",
            ["--set workload.arrival.process=gamma:", "workload.arrival"],
        ),
        ("workload=no-such-workload", ["--set workload=no-such-workload:", "no-such-workload"]),
        ("hardware=no-such-gpu", ["--set hardware=no-such-gpu:", "a100-80gb"]),
        ("model=no-such-model", ["--set model=no-such-model:", "llama-2-7b"]),
        ("workload.trace.path=missing.csv", ["--set workload.trace.path=missing.csv:"]),
        ("scheduler.max_num_seqs=0", ["--set scheduler.max_num_seqs=0:", "must be >= 1"]),
        ("scheduler.policy.x=1", ["--set scheduler.policy.x=1:", "not a mapping"]),
    ],
)
def test_errors_caused_by_a_set_value_name_the_set_item_not_the_file(
    setting, expected, tmp_path, exp, capsys
):
    code = cli.main(["run", str(exp), "-o", str(tmp_path / "out"), "--set", setting])
    line = assert_bad_input(code, capsys, expected)
    assert "exp.yaml" not in line
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml"}


def test_validate_names_the_set_item_of_an_unknown_hardware(exp, capsys):
    code = cli.main(["validate", str(exp), "--set", "hardware=no-such-gpu"])
    assert_bad_input(code, capsys, ["--set hardware=no-such-gpu: hardware: unknown name"])


def test_error_in_the_file_still_names_the_file_line_with_unrelated_set(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("max_num_seqs: 8", "max_num_seqs: 0"))
    argv = ["run", str(exp), "-o", str(tmp_path / "out"), "--set", "workload.num_requests=5"]
    line = assert_bad_input(cli.main(argv), capsys, [f"exp.yaml:{LINE['max_num_seqs']}:"])
    assert "--set" not in line


def test_set_file_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    exp = write(tmp_path / "elsewhere" / "exp.yaml", EXPERIMENT)
    monkeypatch.chdir(tmp_path)
    rows = [f"{0.1 * i!r},{40 + i},{2 + i % 3}" for i in range(7)]
    write(tmp_path / "mine.csv", "arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows))
    argv = ["run", str(exp), "-o", "out", "--set", "workload={trace: {path: mine.csv}}"]
    assert cli.main(argv) == 0
    assert read_summary(tmp_path / "out")["completed"] == 7
    config = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text(encoding="utf-8"))
    assert config["workload"]["trace"]["path"] == str(tmp_path / "mine.csv")


# ----------------------------------------------------------------------------- policies from cwd


def test_policy_module_in_the_working_directory_loads_without_pythonpath(
    tmp_path, monkeypatch, capsys
):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    policy_code = readme.split("## Writing a policy", 1)[1].split("```python\n", 1)[1]
    policy_code = policy_code.split("```", 1)[0]
    write(tmp_path / "cwd_policies_for_cli.py", policy_code)
    monkeypatch.chdir(tmp_path)
    path = [p for p in sys.path if p not in ("", ".", os.getcwd())]
    monkeypatch.setattr(sys, "path", path)
    policy = "policy: cwd_policies_for_cli:ShortestPromptFirst"
    write(tmp_path / "exp.yaml", EXPERIMENT.replace("policy: continuous", policy))
    try:
        assert cli.main(["run", "exp.yaml", "-o", "out"]) == 0, capsys.readouterr().err
        assert cli.main(["validate", "exp.yaml"]) == 0
    finally:
        sys.modules.pop("cwd_policies_for_cli", None)
    assert read_summary(tmp_path / "out")["completed"] == 30
    assert sys.path == path  # the search path is left as it was


# ----------------------------------------------------------------------------- resolved config


def _readme_experiment() -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Experiment YAML", 1)[1].split("```yaml\n", 1)[1]
    return block.split("```", 1)[0]


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _dotted_keys(value, f"{prefix}{key}.")
    return keys


def test_resolved_config_holds_every_key_of_the_readme_example_and_reruns_quietly(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    readme_yaml = _readme_experiment()
    write(tmp_path / "exp.yaml", readme_yaml)
    small = ["--set", "workload.num_requests=20"]
    assert cli.main(["run", "exp.yaml", "-o", "first", *small]) == 0
    assert "note:" not in capsys.readouterr().err  # every scheduler key left at its default
    resolved = yaml.safe_load((tmp_path / "first" / "config.yaml").read_text(encoding="utf-8"))
    documented = _dotted_keys(yaml.safe_load(readme_yaml))
    assert documented <= _dotted_keys(resolved)
    assert resolved["engine"]["max_model_len"] is None
    assert cli.main(["run", "first/config.yaml", "-o", "second"]) == 0
    assert "note:" not in capsys.readouterr().err
    first, second = read_summary(tmp_path / "first"), read_summary(tmp_path / "second")
    assert without_wall_time(first) == without_wall_time(second)


def test_note_names_only_unused_scheduler_keys_changed_from_the_default(tmp_path, exp, capsys):
    argv = ["run", str(exp), "-o", str(tmp_path / "out"), "--set", "scheduler.max_wait_ms=10"]
    assert cli.main([*argv, "--set", "scheduler.padding=true"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: scheduler.max_wait_ms is not used by policy continuous"]
    assert cli.main(["run", str(tmp_path / "out" / "config.yaml"), "-o", str(tmp_path / "2")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: scheduler.max_wait_ms is not used by policy continuous"]


def _field_paths(model: Any, prefix: str = "") -> set[str]:
    from pydantic import BaseModel

    paths = set()
    for name in type(model).model_fields:
        value = getattr(model, name)
        paths.add(prefix + name)
        if isinstance(value, BaseModel):
            paths |= _field_paths(value, f"{prefix}{name}.")
    return paths


CLOSED_LOOP = """\
name: closed-loop
hardware: a100-80gb
model: llama-2-7b
workload:
  num_requests: 20
  concurrency: 4
  think_time_ms: {dist: exponential, mean: 100}
  cancel_after_ms: {dist: exponential, mean: 5000}
  prompt_tokens: {dist: fixed, value: 64}
  output_tokens: {dist: fixed, value: 8}
"""


@pytest.mark.parametrize("experiment", [*catalog_names("experiments"), "closed-loop"])
def test_resolved_config_spells_out_every_field_and_loads_back_equal(experiment, tmp_path):
    from batchsim.config import dump_config, load_experiment

    source = write(tmp_path / "closed.yaml", CLOSED_LOOP) if experiment == "closed-loop" else None
    config = load_experiment(source or experiment)
    dumped = write(tmp_path / "config.yaml", dump_config(config))
    # cluster: is left out when absent, so a run without replicas dumps as before it existed
    fields = _field_paths(config) - ({"cluster"} if config.cluster is None else set())
    assert fields <= _dotted_keys(yaml.safe_load(dumped.read_text("utf-8")))
    assert load_experiment(dumped) == config


# ----------------------------------------------------------------------------- output directory


def hidden_leftovers(*directories: Path) -> list[str]:
    return [p.name for d in directories if d.is_dir() for p in d.iterdir() if p.name[0] == "."]


def test_output_path_that_is_a_file_exits_2_and_leaves_it_alone(tmp_path, exp, capsys):
    target = write(tmp_path / "taken", "mine\n")
    code = cli.main(["run", str(exp), "-o", str(target)])
    assert_bad_input(code, capsys, [f"cannot write {target}", "not a directory"])
    assert target.read_text(encoding="utf-8") == "mine\n"
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml", "taken"}


def test_output_path_under_a_file_exits_2(tmp_path, exp, capsys):
    write(tmp_path / "taken", "mine\n")
    target = tmp_path / "taken" / "sub" / "out"
    code = cli.main(["run", str(exp), "-o", str(target)])
    assert_bad_input(code, capsys, [f"cannot write {target}", "not a directory"])
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml", "taken"}


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null on this system")
def test_output_path_dev_null_exits_2_and_writes_nothing_next_to_it(exp, capsys):
    before = set(hidden_leftovers(Path("/dev")))
    assert_bad_input(cli.main(["run", str(exp), "-o", "/dev/null"]), capsys, ["/dev/null"])
    assert set(hidden_leftovers(Path("/dev"))) == before


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0,
    reason="root ignores permission bits; the EACCES and /sys tests cover this path",
)
def test_read_only_directory_exits_2_with_the_os_reason(tmp_path, exp, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code = cli.main(["run", str(exp), "-o", str(locked / "out")])
        assert_bad_input(code, capsys, [f"cannot write {locked / 'out'}", "Permission denied"])
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_permission_denied_by_the_os_exits_2_with_the_reason(tmp_path, exp, monkeypatch, capsys):
    real_mkdir = os.mkdir

    def denied(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).parent == tmp_path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", denied)
    code = cli.main(["run", str(exp), "-o", str(tmp_path / "out")])
    line = assert_bad_input(code, capsys, [f"cannot write {tmp_path / 'out'}:"])
    assert line.endswith("[Errno 13] Permission denied")
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml"}


@pytest.mark.skipif(not os.path.ismount("/sys"), reason="needs Linux sysfs at /sys")
def test_directory_even_root_cannot_create_exits_2(exp, capsys):
    # sysfs refuses new directories to everyone, root included.
    target = Path("/sys/batchsim-test-output")
    assert_bad_input(cli.main(["run", str(exp), "-o", str(target)]), capsys, [f"{target}: [Errno"])
    assert not target.exists()


def test_disk_full_while_writing_exits_2_and_keeps_the_previous_run(
    tmp_path, exp, monkeypatch, capsys
):
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out)]) == 0
    previous = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()

    def disk_full(tables: Any, names: list[str], path: Path) -> None:
        path.write_text("request_id,arr", encoding="utf-8")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("batchsim.simulation.write_csv", disk_full)
    argv = ["run", str(exp), "-o", str(out), "--set", "workload.num_requests=5"]
    line = assert_bad_input(cli.main(argv), capsys, [])
    assert line == f"batchsim: error: cannot write {out}: [Errno 28] No space left on device"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == previous
    assert hidden_leftovers(tmp_path, out) == []
    new = tmp_path / "new" / "deeper"
    assert_bad_input(cli.main([*argv[:3], str(new)]), capsys, ["No space left on device"])
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml", "out"}


@pytest.mark.parametrize("when", ["during the run", "at its end"])
def test_disk_full_while_streaming_the_iterations_exits_2_and_keeps_the_previous_run(
    when, tmp_path, exp, monkeypatch, capsys
):
    # batchsim run writes iterations.csv while the engine runs, in a background thread
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out)]) == 0
    previous = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    from batchsim.metrics import writers

    if when == "during the run":  # tables of 8 rows: the first write fails mid-run
        monkeypatch.setattr(writers, "_CSV_ROWS", 4)
    ended = []
    real_end = IterationLog.end_stream
    monkeypatch.setattr(IterationLog, "end_stream", lambda log: ended.append(1) or real_end(log))

    def disk_full(batch: Any, header: bool) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writers, "_csv_text", disk_full)
    line = assert_bad_input(cli.main(["run", str(exp), "-o", str(out)]), capsys, [])
    assert line == f"batchsim: error: cannot write {out}: [Errno 28] No space left on device"
    assert ended == ([] if when == "during the run" else [1])  # the run stopped at once
    assert {p.name: p.read_bytes() for p in out.iterdir()} == previous
    assert hidden_leftovers(tmp_path, out) == []


USER_FILES = {"config.yaml": "my own notes\n", "summary.json": '{"completed": 3}\n'}


@pytest.mark.parametrize("name", list(USER_FILES))
def test_directory_with_a_users_file_of_an_output_name_is_refused(
    name, tmp_path, exp, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / name, USER_FILES[name])

    def must_not_run(*args: Any, **kwargs: Any):
        raise AssertionError("simulated before checking the output directory")

    monkeypatch.setattr("batchsim.simulation.simulate", must_not_run)
    line = assert_bad_input(cli.main(["run", "exp.yaml", "-o", "."]), capsys, [name, "-o DIR"])
    assert "cannot write ." in line
    assert (tmp_path / name).read_text(encoding="utf-8") == USER_FILES[name]
    assert {p.name for p in tmp_path.iterdir()} == {"exp.yaml", name}


def test_output_into_a_previous_run_an_empty_or_an_unrelated_directory(tmp_path, exp):
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out)]) == 0
    argv = ["run", str(exp), "-o", str(out), "--set", "workload.num_requests=7"]
    assert cli.main(argv) == 0  # a previous run is replaced
    assert read_summary(out)["completed"] == 7
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["run", str(exp), "-o", str(empty)]) == 0
    assert {p.name for p in empty.iterdir()} == OUTPUT_FILES
    notes = tmp_path / "notes"
    notes.mkdir()
    write(notes / "README.txt", "mine\n")
    assert cli.main(["run", str(exp), "-o", str(notes)]) == 0
    assert {p.name for p in notes.iterdir()} == OUTPUT_FILES | {"README.txt"}
    assert hidden_leftovers(tmp_path, out, empty, notes) == []


# ----------------------------------------------------------------------------- signals

WRITE_SLOWLY = r"""
import signal, sys, time
from pathlib import Path

import batchsim.simulation as simulation
from batchsim import cli
from batchsim.cli.tables import _fmt

real_write_csv = simulation.write_csv


def write_then_wait(tables, names, path):
    real_write_csv(tables, names, path)
    Path(sys.argv[1]).write_text("writing", encoding="utf-8")
    time.sleep(60)


simulation.write_csv = write_then_wait
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may ignore SIGINT
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 128 + 15), (signal.SIGINT, 128 + 2)], ids=["TERM", "INT"]
)
def test_signal_while_writing_exits_128_plus_signal_and_removes_the_temporary_folder(
    signum, code, tmp_path, exp
):
    marker = tmp_path / "writing"
    out = tmp_path / "out"
    argv = [sys.executable, "-c", WRITE_SLOWLY, str(marker), "run", str(exp), "-o", str(out)]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.02)
        assert hidden_leftovers(tmp_path)  # the temporary folder is there while writing
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert b"Traceback" not in err
    assert hidden_leftovers(tmp_path) == []
    assert not out.exists()


def test_main_restores_the_callers_sigterm_handler(capsys):
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["list", "policies"]) == 0
    assert signal.getsignal(signal.SIGTERM) == before


# ----------------------------------------------------------------------------- usage and help

COMMANDS = ("run", "validate", "roofline", "list")


def test_bare_batchsim_prints_usage_and_one_error_line(capsys):
    assert cli.main([]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    lines = printed.err.strip().splitlines()
    assert lines[0].startswith("usage: batchsim")
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1 and lines[-1] == errors[0]
    assert errors[0].startswith("batchsim: error: ")
    assert errors[0].count("batchsim:") == 1
    for command in COMMANDS:
        assert command in errors[0]


@pytest.mark.parametrize("argv", [["run"], ["list", "gpus"], ["frobnicate"], ["run", "--nope"]])
def test_usage_error_line_has_a_single_prefix(argv, capsys):
    line = assert_bad_input(cli.main(argv), capsys, ["batchsim: error: "])
    assert "error: batchsim" not in line


def _subparsers() -> dict[str, Any]:
    import argparse

    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_text_and_exits_0(command, capsys):
    argv = ["--help"] if command is None else [command, "--help"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: batchsim")
    for markup in ("``", ":class:", ":func:", ":meth:", ":data:", ":mod:"):
        assert markup not in text


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_of_every_command_has_help(command):
    parser = _subparsers()[command]
    assert parser.description
    for action in parser._actions:
        assert action.help, f"batchsim {command} {action.dest}: no help text"


def test_python_dash_m_batchsim_is_the_batchsim_command(tmp_path, capsys):
    assert cli.main(["list", "policies"]) == 0
    expected = capsys.readouterr().out
    run = [sys.executable, "-m", "batchsim"]
    proc = subprocess.run([*run, "list", "policies"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == expected
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: batchsim")


def test_summary_config_is_the_written_config_yaml(tmp_path, exp):
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out)]) == 0
    written = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert read_summary(out)["config"] == written
    assert written["engine"]["max_model_len"] is None  # nulls included in both


def test_printed_numbers_keep_one_style_from_thousands_to_millions():
    # a sweep table mixed "585,190.63" with "1.17e+06" in one column
    assert _fmt(585_190.634) == "585,190.63"
    assert _fmt(1_170_043.4, " ms") == "1,170,043 ms"
    assert _fmt(-2.5e13) == "-2.5e+13"
    assert _fmt(float("nan")) == "-"
    # a small number keeps two significant digits (the lmdeploy preset's 0.025 ms per request
    # printed as 0.03)
    assert _fmt(0.025) == "0.025"
    assert _fmt(-0.0423, " s") == "-0.042 s"
    assert _fmt(0.0) == "0.00"
    assert _fmt(0.5) == "0.50"


def test_list_frameworks_prints_each_presets_cpu_time_as_its_file_says(capsys):
    assert cli.main(["list", "frameworks"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    root = Path(__file__).resolve().parent.parent / "frameworks"
    for name in ("lmdeploy", "vllm-v0"):
        engine = yaml.safe_load((root / f"{name}.yaml").read_text(encoding="utf-8"))["engine"]
        assert float(lines[name][2]) == engine["cpu_overhead_per_seq_ms"]


# ------------------------------------------------------------------- what the summary says


def tiny_yaml(path: Path, **overrides: Any) -> Path:
    from conftest import tiny_experiment

    return write(path, yaml.safe_dump(tiny_experiment(**overrides)))


def test_an_overloaded_run_warns_that_its_queue_grows_by_the_ratio_of_the_rates(tmp_path, capsys):
    # 400 req/s of 8-request batches: arrivals far outpace service
    exp = tiny_yaml(
        tmp_path / "e.yaml",
        scheduler={"policy": "continuous", "max_num_seqs": 8},
        workload={"num_requests": 200, "arrival": {"process": "poisson", "rate": 400.0}},
    )
    assert cli.main(["run", str(exp), "-o", str(tmp_path / "out")]) == 0
    growth = read_summary(tmp_path / "out")["queue_delay_growth"]
    assert growth > 0.5
    # a FIFO queue fed rho times faster than it is served: delay grows rho - 1 s per s
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "warning" in ln)
    assert f"queue grows: arrivals ≈ {1 + growth:.2f}× what the engine serves" in line
    assert f"queue_delay_growth {growth:.2f} s/s" in line


def test_a_run_that_keeps_up_prints_no_queue_warning(tmp_path, capsys):
    exp = tiny_yaml(tmp_path / "e.yaml")
    assert cli.main(["run", str(exp), "-o", str(tmp_path / "out")]) == 0
    assert read_summary(tmp_path / "out")["queue_delay_growth"] < 0.05
    assert "queue grows" not in capsys.readouterr().out


def test_the_summary_says_why_requests_were_rejected_with_their_counts(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    rows = "0,64,4\n0.1,900,4\n0.2,700,4\n0.3,800,4\n"
    write(tmp_path / "trace.csv", "arrival_time,prompt_tokens,output_tokens\n" + rows)
    write(tmp_path / "exp.yaml", TRACE_EXPERIMENT + "engine: {num_gpu_blocks: 16}\n")
    assert cli.main(["run", "exp.yaml", "-o", "out"]) == 0
    with open(tmp_path / "out" / "requests.csv", newline="", encoding="utf-8") as f:
        rejected = [row for row in csv.DictReader(f) if row["status"] == "rejected"]
    assert len(rejected) == 3
    printed = capsys.readouterr().out
    assert "3 rejected" in printed
    lines = [
        ln.split(None, 1)[1] for ln in printed.splitlines() if ln.strip().startswith("rejected")
    ]
    # one line for the three: their block counts as a range, the cache's capacity once
    assert len(lines) == 1 and lines[0].startswith("3 × needs ")
    needs = sorted(int(r["reject_reason"].split()[1]) for r in rejected)
    assert f"needs {needs[0]}-{needs[-1]} KV blocks > KV cache capacity" in lines[0]


def test_reject_reasons_group_by_reason_most_first():
    from batchsim.cli.run import reject_reasons

    columns = {
        "status": ["rejected", "finished", "rejected", "rejected", "rejected"],
        "reject_reason": [
            "needs 40 KV blocks > KV cache capacity 30",
            "",
            "prompt+output 5000 tokens > engine.max_model_len 4096",
            "needs 35 KV blocks > KV cache capacity 30",
            "needs 40 KV blocks > KV cache capacity 30",
        ],
    }
    assert reject_reasons(columns) == [
        ("needs 35-40 KV blocks > KV cache capacity 30", 3),
        ("prompt+output 5000 tokens > engine.max_model_len 4096", 1),
    ]


def test_latencies_of_10_s_and_more_print_in_seconds(tmp_path, capsys):
    exp = tiny_yaml(
        tmp_path / "e.yaml",
        scheduler={"policy": "continuous", "max_num_seqs": 1},
        workload={"num_requests": 200, "arrival": {"process": "all_at_once"}},
    )
    assert cli.main(["run", str(exp), "-o", str(tmp_path / "out")]) == 0
    summary = read_summary(tmp_path / "out")
    assert summary["p99_ttft_ms"] > 10_000 and summary["p99_tpot_ms"] < 10_000
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    assert rows["TTFT"].endswith(" s") and f"{summary['p99_ttft_ms'] / 1e3:,.2f}" in rows["TTFT"]
    assert rows["TPOT"].endswith(" ms")
    assert all(len(cell.strip().replace(",", "").split(".")[0]) <= 4 for cell in
               rows["TTFT"].split(None, 1)[1].removesuffix(" s").split("/"))  # fmt: skip
    # one unit per line: the queue delay's mean is in s like its p99 (over 10 s)
    assert summary["p99_queue_delay_ms"] > 10_000
    queue = next(ln for ln in rows.values() if ln.strip().startswith("queue delay"))
    mean_s = summary["mean_queue_delay_ms"] / 1e3
    assert f"mean {mean_s:,.2f} s" in queue or f"mean {mean_s:,.3f} s" in queue, queue
    assert " ms" not in queue


def test_capacity_progress_counts_the_rates_of_a_search_without_a_total(tmp_path, capsys):
    exp = tiny_yaml(tmp_path / "e.yaml", workload={"num_requests": 24})
    argv = ["capacity", str(exp), "-o", str(tmp_path / "c"), "--workers", "1"]
    assert cli.main([*argv, "--slo", "p99_ttft_ms=2000"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("batchsim:")]
    assert len(lines) >= 3
    for count, line in enumerate(lines, 1):
        assert line.startswith(f"batchsim: capacity search, rates simulated: {count} so far; ")


def test_list_experiments_shows_every_shipped_experiment_with_its_purpose(capsys):
    from batchsim.catalog import catalog_dir

    assert cli.main(["list", "experiments"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["experiment", "command", "what", "it", "shows"]
    rows = {line.split()[0]: line.split(None, 2) for line in printed[1:] if line.strip()}
    for path in sorted(catalog_dir("experiments").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert data.get("description"), f"{path.name}: no description: line"
        _, command, what = rows[path.stem]
        assert what == data["description"]
        assert command in (("run",) if "sweep" not in data else ("sweep", "capacity"))
    assert rows["quickstart"][1] == "run" and rows["knee-llama2-7b-a100"][1] == "sweep"
    assert rows["capacity-policies"][1] == "capacity"
