"""Bad input of every kind exits 2 with one line on stderr naming the file (and line) and the
key, writes nothing, and never hangs or crashes; ``validate`` rejects it with the same line.

Covers numbers (finite, in range), files (encoding, size, nesting, alias bombs), strict
YAML/JSON (duplicate keys, no coercion, YAML 1.2 numbers), token and request caps, traces,
and ``scheduler.policy`` strings. Tests that would hang in C code or exhaust memory on a
regression run the CLI in a subprocess with a timeout and a memory limit; every other test
runs in-process under a SIGALRM deadline.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim import cli, yamlio
from batchsim.catalog import catalog_dir
from batchsim.config import validate_experiment
from batchsim.errors import ConfigError
from batchsim.scheduler.config import SchedulerConfig
from batchsim.validation import format_value
from batchsim.workload import generate
from batchsim.workload.config import parse_workload
from batchsim.yamlio import plain, reading
from conftest import tiny_experiment

BASE: dict[str, Any] = tiny_experiment(
    name="inputs",
    seed=1,
    scheduler={"max_num_seqs": 8},
    workload={
        "num_requests": 12,
        "arrival": {"process": "poisson", "rate": 10.0},
        "prompt_tokens": {"dist": "uniform", "min": 16, "max": 64},
        "output_tokens": {"dist": "uniform", "min": 2, "max": 8},
    },
)
EXPERIMENT = yaml.safe_dump(BASE, sort_keys=False)
TRACE_EXPERIMENT = """\
name: inputs-trace
hardware: a100-80gb
model: llama-2-7b
workload:
  trace: {path: TRACE}
"""
CSV_HEADER = "arrival_time,prompt_tokens,output_tokens\n"
MAX_TOKENS = 2**24  # the documented limits (README, "Experiment YAML")
MAX_REQUESTS = 10_000_000
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"


# ------------------------------------------------------------------------------------ helpers


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """No test here may take longer than 20 s: a hang fails instead of blocking the suite."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError("no answer within 20 s: batchsim hangs on this input")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with dotted-key ``changes`` applied (a copy)."""
    out = json.loads(json.dumps(base))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def experiment(tmp_path: Path, text: str | bytes | None = None, **changes: Any) -> Path:
    """Write ``exp.yaml``: ``text`` as is, or the base experiment with dotted ``changes``
    (``experiment(tmp_path, **{"engine.cpu_overhead_ms": math.inf})``)."""
    if text is None:
        text = yaml.safe_dump(merged(BASE, changes), sort_keys=False)
    return write(tmp_path / "exp.yaml", text)


def catalog_copy(kind: str, name: str, changes: dict[str, Any]) -> str:
    """A built-in hardware profile or model with dotted ``changes``, as YAML text."""
    raw, _ = yamlio.read_mapping(catalog_dir(kind) / f"{name}.yaml")
    return yaml.safe_dump(merged(raw, changes), sort_keys=False)


def bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], exp: Path, *expected: str) -> str:
    """``run`` and ``validate`` both exit 2 with the same one line (no traceback) containing
    every ``expected`` text, and nothing is written. Returns the line."""
    before = sorted(p.name for p in tmp_path.iterdir())
    lines = []
    for command in (["run", str(exp), "-o", str(tmp_path / "out")], ["validate", str(exp)]):
        start = time.perf_counter()
        code = cli.main(command)
        err = capsys.readouterr().err
        assert time.perf_counter() - start < 5, f"{command[0]} took too long"
        assert "Traceback" not in err, err
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        line = err.strip()
        for text in expected:
            assert text in line, line
        lines.append(line)
    assert lines[0] == lines[1], "validate and run disagree"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"
    return lines[0]


def laughs(indent: str = "", levels: int = 9) -> str:
    """A "billion laughs" YAML fragment: ``l{levels}`` expands to 10**(levels + 1) strings."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * 10)}]"]
    for i in range(1, levels + 1):
        lines.append(f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ 1. numbers

HARDWARE_NUMBER_CASES = [
    ("efficiency.min_kernel_time_us", math.nan, "must be a finite number, got nan"),
    ("memory_gb", math.inf, "must be a finite number, got inf"),
    ("memory_bandwidth_tb_s", math.inf, "must be a finite number"),
    ("interconnect_bandwidth_gb_s", math.inf, "must be a finite number"),
    ("host_bandwidth_gb_s", math.inf, "must be a finite number"),
    ("peak_tflops.bf16", -math.inf, "must be a finite number"),
    ("cpu_overhead.base_ms", 1e308, "must be <= 1000"),
    ("efficiency.attention_sm_bandwidth", 0, "must be >= 0.01"),
    ("efficiency.transition_exponent", 1e300, "must be <= 100"),
]


@pytest.mark.parametrize(("key", "value", "rule"), HARDWARE_NUMBER_CASES)
def test_non_finite_or_unphysical_hardware_number_exits_2_naming_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: float, rule: str
) -> None:
    write(tmp_path / "hw.yaml", catalog_copy("hardware_profiles", "a100-80gb", {key: value}))
    exp = experiment(tmp_path, hardware="hw.yaml")
    line = bad_input(tmp_path, capsys, exp, "hw.yaml:", f"{key} {rule}")
    assert line.split("hw.yaml:", 1)[1].split(":", 1)[0].isdigit()  # names the line


EXPERIMENT_NUMBER_CASES = [
    ("engine.cpu_overhead_ms", math.inf, "must be a finite number, got inf"),
    ("engine.cpu_overhead_ms", 1e308, "must be <= 1000, got 1e+308"),
    ("engine.cpu_overhead_per_seq_ms", math.nan, "must be a finite number"),
    ("engine.activation_reserve_gb", math.inf, "must be a finite number"),
    ("engine.swap_space_gib", math.inf, "must be a finite number"),
    ("engine.swap_space_gib", 1e300, "must be <= 1000000"),
    ("engine.gpu_memory_utilization", math.nan, "must be a finite number"),
    ("slo.ttft_ms", math.nan, "must be a finite number"),
    ("slo.tpot_ms", 1e300, "must be <= "),
    ("metrics.warmup_s", math.inf, "must be a finite number"),
    ("scheduler.max_wait_ms", math.inf, "must be a finite number"),
    ("workload.arrival.rate", math.inf, "must be a finite number"),
    ("workload.arrival.rate", 1e300, "must be <= 1000000"),
    ("workload.prompt_tokens", {"dist": "normal", "mean": math.nan, "std": 1}, "finite"),
    ("workload.output_tokens", {"dist": "lognormal", "mean": 1e300, "sigma": 1}, "<= 16777216"),
]


@pytest.mark.parametrize(("key", "value", "rule"), EXPERIMENT_NUMBER_CASES)
def test_non_finite_or_unphysical_experiment_number_exits_2_naming_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any, rule: str
) -> None:
    exp = experiment(tmp_path, **{key: value})
    line = bad_input(tmp_path, capsys, exp, "exp.yaml:", key, rule)
    assert line.startswith(f"batchsim: error: {exp}:")


def test_non_finite_model_number_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    write(tmp_path / "m.yaml", catalog_copy("models", "llama-2-7b", {"official_num_params": 1e400}))
    exp = experiment(tmp_path, model="m.yaml")
    bad_input(tmp_path, capsys, exp, "m.yaml:", "official_num_params must be a finite number")


def test_time_scale_of_a_trace_must_be_finite(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    write(tmp_path / "t.csv", CSV_HEADER + "0,10,5\n1,10,5\n")
    text = TRACE_EXPERIMENT.replace("{path: TRACE}", "{path: t.csv, time_scale: .inf}")
    bad_input(tmp_path, capsys, experiment(tmp_path, text), "workload.trace.time_scale", "finite")


EXPERIMENT_FLOAT_KEYS = [
    "engine.gpu_memory_utilization",
    "engine.activation_reserve_gb",
    "engine.cpu_overhead_ms",
    "engine.cpu_overhead_per_seq_ms",
    "engine.swap_space_gib",
    "scheduler.max_wait_ms",
    "slo.ttft_ms",
    "slo.tpot_ms",
    "slo.e2el_ms",
    "metrics.warmup_s",
    "metrics.cooldown_s",
    "workload.arrival.rate",
    "workload.cancel_after_ms.mean",
]
UNPHYSICAL = (
    st.sampled_from([math.nan, math.inf, -math.inf])
    | st.floats(min_value=1e13, max_value=1e308)
    | st.floats(min_value=-1e308, max_value=-1e-300)
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(EXPERIMENT_FLOAT_KEYS), value=UNPHYSICAL)
def test_any_non_finite_or_out_of_range_experiment_number_is_rejected_naming_its_key(key, value):
    data = merged(BASE, {"workload.cancel_after_ms": {"dist": "exponential", "mean": 1000.0}})
    with pytest.raises(ConfigError) as info:
        validate_experiment(merged(data, {key: value}))
    assert key in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------ 2. bombs


def test_format_value_does_bounded_work_on_huge_shared_structures() -> None:
    node: Any = list(range(10))
    for _ in range(6):
        node = [node] * 10  # 10^7 leaves, shared
    start = time.perf_counter()
    text = format_value({"x": node, "y": "z" * 10_000})
    assert time.perf_counter() - start < 0.05
    assert len(text) <= 60 and "\n" not in text


def test_scheduler_options_from_the_python_api_are_bounded_plain_data(monkeypatch) -> None:
    monkeypatch.setattr(plain, "MAX_NODES", 100_000)  # the same rule, checked sooner
    node: Any = ["lol"] * 10
    for _ in range(9):
        node = [node] * 10
    cases = [
        ({"x": node}, "more than 100,000 values"),
        ({"x": {"y": math.nan}}, "scheduler.options.x.y must be a finite number"),
        ({"x": object()}, "scheduler.options.x: must hold only strings"),
        ({"x": {1: 2}}, "mapping keys must be strings"),
    ]
    for options, expected in cases:
        with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
            validate_experiment(merged(BASE, {"scheduler.options": options}))
    assert SchedulerConfig(options={"a": [1, 2.5, "x", None, True, {"b": []}]}).options


def test_recursive_alias_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    text = EXPERIMENT.replace("  max_num_seqs: 8\n", "  max_num_seqs: 8\n  options: &o {a: *o}\n")
    bad_input(tmp_path, capsys, experiment(tmp_path, text), "exp.yaml:", "recursive alias *o")


# ------------------------------------------------------------------------------------ 3. caps


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("workload.output_tokens", {"dist": "fixed", "value": 10**20}, "value must be <= 16777216"),
        ("workload.output_tokens", 1e20, "value must be <= 16777216"),
        ("workload.prompt_tokens", {"dist": "uniform", "min": 1, "max": 10**19}, "max must be <="),
        ("workload.prompt_tokens", {"dist": "lognormal", "mean": 1e300, "sigma": 1}, "mean must"),
        ("workload.prompt_tokens", {"dist": "lognormal", "mean": 512, "sigma": 50}, "sigma must"),
        ("workload.prompt_tokens", {"dist": "exponential", "mean": 1e30}, "mean must be <="),
        ("workload.prompt_tokens", {"dist": "empirical", "values": [5, 10**30]}, "values[1] must"),
        ("workload.arrival", {"process": "gamma", "rate": 1, "cv": 1e-200}, "cv must be >="),
        ("workload.think_time_ms", {"dist": "normal", "mean": 1e300, "std": 1}, "mean must be"),
        ("scheduler.max_num_seqs", 10**30, "must be <= 10000000"),
        ("engine.block_size", 10**30, "must be <= 16777216"),
        ("parallel.tensor_parallel_size", 10**30, "must be <="),
    ],
)
def test_overflowing_sizes_are_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any, expected: str
) -> None:
    changes: dict[str, Any] = {key: value}
    if key == "workload.think_time_ms":
        changes = {"workload.arrival": None, "workload.concurrency": 2, key: value}
    bad_input(tmp_path, capsys, experiment(tmp_path, **changes), "exp.yaml:", key, expected)


def test_a_drawn_token_count_above_the_limit_is_an_error_not_a_clip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = {"dist": "normal", "mean": MAX_TOKENS, "std": 1e6}  # no max: half the draws are over
    exp = experiment(tmp_path, **{"workload.prompt_tokens": dist})
    bad_input(tmp_path, capsys, exp, "workload.prompt_tokens: a drawn value", "set a lower max")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("t.csv", CSV_HEADER + "0,10,5\n1,1e23,5\n", ["t.csv:3:", "prompt_tokens", "16777216"]),
        ("t.csv", CSV_HEADER + "0,10,5\n1,10,99999999999999999999\n", ["t.csv:3:"]),
        ("t.csv", CSV_HEADER + "0,10,5\n1e300,10,5\n", ["t.csv:3:", "arrival_time", "limit"]),
        ("t.csv", CSV_HEADER + "0,10,5\nnan,10,5\n", ["t.csv:3:", "arrival_time", "finite"]),
        (
            "t.jsonl",
            '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
            '{"timestamp": 1, "input_length": 1e23, "output_length": 5}\n',
            ["t.jsonl:2:", "input_length"],
        ),
        (
            "t.jsonl",
            '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1.5]}\n',
            ["t.jsonl:1:", "hash_ids"],
        ),
        ("t.jsonl", "[" * 5000 + "]" * 5000 + "\n", ["t.jsonl:1:"]),
        ("t.csv", CSV_HEADER, ["t.csv", "empty trace"]),
    ],
)
def test_bad_trace_values_name_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str, expected: list
) -> None:
    write(tmp_path / name, content)
    exp = experiment(tmp_path, TRACE_EXPERIMENT.replace("TRACE", name))
    bad_input(tmp_path, capsys, exp, *expected)


def test_time_scale_that_pushes_arrivals_past_the_limit_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "t.csv", CSV_HEADER + "0,10,5\n500000000,10,5\n")
    text = TRACE_EXPERIMENT.replace("{path: TRACE}", "{path: t.csv, time_scale: 1000}")
    bad_input(tmp_path, capsys, experiment(tmp_path, text), "workload.trace.time_scale", "limit")


def test_trace_with_too_many_rows_is_an_error(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("batchsim.workload.files.MAX_REQUESTS", 3)
    write(tmp_path / "t.csv", CSV_HEADER + "".join(f"{i},10,5\n" for i in range(5)))
    exp = experiment(tmp_path, TRACE_EXPERIMENT.replace("TRACE", "t.csv"))
    bad_input(tmp_path, capsys, exp, "t.csv:5:", "more than 3 data rows")


def test_the_limits_admit_their_own_boundaries() -> None:
    # The caps are inclusive: the largest allowed values validate.
    from batchsim import validation

    assert (validation.MAX_TOKENS, validation.MAX_REQUESTS) == (MAX_TOKENS, MAX_REQUESTS)
    workload = parse_workload(
        {
            "num_requests": MAX_REQUESTS,
            "arrival": {"process": "constant", "rate": 1e6},
            "prompt_tokens": {"dist": "fixed", "value": MAX_TOKENS},
            "output_tokens": 1,
        }
    )
    assert workload.num_requests == MAX_REQUESTS
    small = parse_workload({**workload.model_dump(exclude_none=True), "num_requests": 3})
    assert generate(small, 0).prompt_tokens.tolist() == [MAX_TOKENS] * 3


# ------------------------------------------------------------------------------------ prefix

SHARED = {"count": 3, "tokens": 100}
PREFIX_CASES = [
    (
        {"workload.shared_prefix": {**SHARED, "popularity": "zipfian"}},
        ["workload.shared_prefix.popularity must be uniform, {zipf: s} or a list of weights"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": {"zipf": 1, "s": 2}}},
        ["workload.shared_prefix.popularity must be uniform", "got {'s': 2, 'zipf': 1}"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": {"zipf": -1}}},
        ["workload.shared_prefix.popularity.zipf must be >= 0, got -1"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": {"zipf": math.nan}}},
        ["workload.shared_prefix.popularity.zipf must be a finite number, got nan"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": [1, -2, 3]}},
        ["workload.shared_prefix.popularity[1] must be >= 0, got -2"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": [1, "a", 3]}},
        ["workload.shared_prefix.popularity[1] must be a number, got 'a'"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": [1, 2]}},
        ["workload.shared_prefix.popularity must list one weight per prefix (count = 3), got 2"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "popularity": [0, 0, 0]}},
        ["workload.shared_prefix.popularity must hold a weight > 0"],
    ),
    (
        {"workload.shared_prefix": {**SHARED, "fraction": 1.5}},
        ["workload.shared_prefix.fraction must be <= 1, got 1.5"],
    ),
    ({"workload.shared_prefix": {**SHARED, "count": 0}}, ["shared_prefix.count must be >= 1"]),
    (
        {"workload.shared_prefix": {**SHARED, "tokens": {"dist": "fixed", "value": 0}}},
        ["workload.shared_prefix.tokens.value must be >= 1, got 0"],
    ),
    ({"workload.shared_prefix": {"count": 3}}, ["workload.shared_prefix.tokens is required"]),
    (
        {"workload.shared_prefix": {**SHARED, "share": 1}},
        ["workload.shared_prefix.share: unknown key; allowed keys: count, tokens, popularity"],
    ),
    (
        {
            "workload.shared_prefix": {
                "count": 40,  # half the draws are over the limit
                "tokens": {"dist": "normal", "mean": 2**24, "std": 1e6},
            }
        },
        ["workload.shared_prefix.tokens: a drawn value", "set a lower max"],
    ),
    (
        {
            "workload.shared_prefix": SHARED,
            "workload.prompt_tokens": {"dist": "fixed", "value": MAX_TOKENS},
        },
        ["workload.shared_prefix: a prompt has 16,777,316 tokens", "limit of 16,777,216"],
    ),
    ({"workload.conversation": {}}, ["workload.conversation.turns is required"]),
    (
        {"workload.conversation": {"turns": 0}},
        ["workload.conversation.turns.value must be >= 1, got 0"],
    ),
    (
        {"workload.conversation": {"turns": {"dist": "zipf", "theta": 1}}},
        ["workload.conversation.turns.max is required"],
    ),
    (
        {"workload.conversation": {"turns": 3}, "workload.duration_s": 10.0},
        ["workload.duration_s is not supported with conversation; use num_requests"],
    ),
    (
        {"workload.think_time_ms": 100},
        ["workload.think_time_ms applies to closed loop (set concurrency) or conversation only"],
    ),
    (
        {
            "workload.conversation": {"turns": 3},
            "workload.prompt_tokens": {"dist": "fixed", "value": 2**23},
            "workload.output_tokens": {"dist": "fixed", "value": 2**22},
        },
        ["workload.conversation: a prompt has 33,554,432 tokens (the conversation so far)"],
    ),
]


@pytest.mark.parametrize(("changes", "expected"), PREFIX_CASES)
def test_bad_shared_prefix_or_conversation_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, expected: list
) -> None:
    bad_input(tmp_path, capsys, experiment(tmp_path, **changes), *expected)


PREFIX_HEADER = "arrival_time,prompt_tokens,output_tokens,g,k\n"


@pytest.mark.parametrize(
    ("trace", "content", "expected"),
    [
        (
            "{path: t.csv, columns: {prefix_group: g}}",
            PREFIX_HEADER + "0,10,5,a,3\n",
            ["workload.trace.columns.prefix_tokens is required with prefix_group"],
        ),
        (
            "{path: t.csv, columns: {prefix_tokens: k}}",
            PREFIX_HEADER + "0,10,5,a,3\n",
            ["workload.trace.columns.prefix_group is required with prefix_tokens"],
        ),
        (
            "{path: t.csv, format: azure, columns: {prefix_group: g, prefix_tokens: k}}",
            PREFIX_HEADER + "0,10,5,a,3\n",
            ["workload.trace.columns applies to format csv only"],
        ),
        (
            "{path: t.csv, columns: {prefix_group: g, prefix_tokens: k}}",
            PREFIX_HEADER + "0,10,5,a,3\n1,10,5,a,11\n",
            ["t.csv:3:", "k: 11 tokens, more than the row's 10 prompt tokens"],
        ),
        (
            "{path: t.csv, columns: {prefix_group: g, prefix_tokens: k}}",
            PREFIX_HEADER + "0,10,5,a,3\n1,10,5,,4\n",
            ["t.csv:3:", "g: empty, but k is 4"],
        ),
        (
            "{path: t.csv, columns: {prefix_group: g, prefix_tokens: k}}",
            PREFIX_HEADER + "0,10,5,a,1.5\n",
            ["t.csv:2:", "k: expected an integer from 0 to 16777216 (tokens), got '1.5'"],
        ),
        (
            "{path: t.csv, columns: {prefix_group: group, prefix_tokens: k}}",
            PREFIX_HEADER + "0,10,5,a,3\n",
            ["t.csv:1:", "missing column 'group'"],
        ),
    ],
)
def test_bad_csv_prefix_columns_exit_2_naming_the_key_or_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: str, content: str, expected: list
) -> None:
    write(tmp_path / "t.csv", content)
    exp = experiment(tmp_path, TRACE_EXPERIMENT.replace("{path: TRACE}", trace))
    bad_input(tmp_path, capsys, exp, *expected)


@pytest.mark.parametrize(
    ("key", "value"),
    [("shared_prefix", {"count": 2, "tokens": 10}), ("conversation", {"turns": 2})],
)
def test_shared_prefix_and_conversation_do_not_combine_with_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: dict
) -> None:
    write(tmp_path / "t.csv", CSV_HEADER + "0,10,5\n")
    text = TRACE_EXPERIMENT.replace("TRACE", "t.csv") + f"  {key}: {json.dumps(value)}\n"
    bad_input(tmp_path, capsys, experiment(tmp_path, text), f"workload.{key} cannot be combined")


# ------------------------------------------------------------------------------------ 4. files

BAD_FILE_CONTENTS: dict[str, tuple[bytes, str]] = {
    "latin-1": (b"name: caf\xe9\n", "not UTF-8 text: byte 0xe9"),
    "utf-16 with BOM": ("name: x\n".encode("utf-16"), "UTF-16 text (byte-order mark)"),
    "utf-16 without BOM": ("name: x\n".encode("utf-16-le"), "NUL byte"),
    "utf-32 with BOM": ("name: x\n".encode("utf-32"), "UTF-32 text"),
    "png": (PNG, "NUL byte"),
    "empty": (b"", "empty file"),
    "blank": (b"  \n\n", "empty file"),
    "deep list": (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nesting deeper than 100 levels"),
    "deep mapping": (b"{a: " * 5000 + b"1" + b"}" * 5000 + b"\n", "nesting deeper than 100 lev"),
}
JSON_CONTENTS: dict[str, tuple[bytes, str]] = {
    **{k: v for k, v in BAD_FILE_CONTENTS.items() if not k.startswith("deep")},
    "deep list": (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nesting deeper than 100"),
    "deep object": (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "nesting deeper than 100 levels"),
}


def corrupt_target(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """(The file of ``kind`` to corrupt, the experiment that reads it)."""
    base = yaml.safe_dump(BASE, sort_keys=False)
    uniform = "dist: uniform\n    min: 16\n    max: 64"
    experiments = {
        "experiment": ("exp.yaml", None),
        "hardware": ("hw.yaml", base.replace("hardware: a100-80gb", "hardware: hw.yaml")),
        "model yaml": ("m.yaml", base.replace("model: llama-2-7b", "model: m.yaml")),
        "model config.json": (
            "hf/config.json",
            base.replace("model: llama-2-7b", "model: hf/config.json"),
        ),
        "workload": ("w.yaml", base.split("workload:")[0] + "workload: w.yaml\n"),
        "trace csv": ("t.csv", TRACE_EXPERIMENT.replace("TRACE", "t.csv")),
        "trace jsonl": ("t.jsonl", TRACE_EXPERIMENT.replace("TRACE", "t.jsonl")),
        "empirical data": ("n.txt", base.replace(uniform, "dist: empirical\n    path: n.txt")),
    }
    target, text = experiments[kind]
    assert text is None or text != base
    exp = tmp_path / "exp.yaml" if text is None else write(tmp_path / "e.yaml", text)
    return tmp_path / target, exp


FILE_KINDS = [
    "experiment",
    "hardware",
    "model yaml",
    "model config.json",
    "workload",
    "trace csv",
    "trace jsonl",
    "empirical data",
]
FILE_CASES = [
    (kind, content)
    for kind in FILE_KINDS
    for content in (JSON_CONTENTS if kind.endswith(("json", "jsonl")) else BAD_FILE_CONTENTS)
    if not (content.startswith("deep") and kind in ("trace csv", "empirical data"))
]


@pytest.mark.parametrize(("kind", "content"), FILE_CASES, ids=[f"{k}-{c}" for k, c in FILE_CASES])
def test_unreadable_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, content: str
) -> None:
    target, exp = corrupt_target(tmp_path, kind)
    data, expected = (JSON_CONTENTS if kind.endswith(("json", "jsonl")) else BAD_FILE_CONTENTS)[
        content
    ]
    if kind == "trace jsonl" and content.startswith("deep"):  # a JSON object per line
        expected = "t.jsonl:1: invalid JSON: nested too deeply"
    write(target, data)
    bad_input(tmp_path, capsys, exp, target.name, expected)


def test_experiment_larger_than_64_mib_is_refused_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = experiment(tmp_path, b"#" * (64 * 2**20 + 1))
    bad_input(tmp_path, capsys, exp, "exp.yaml", "larger than 64 MiB")


@pytest.mark.parametrize("kind", FILE_KINDS[1:])
def test_every_file_kind_has_a_size_cap(tmp_path, capsys, monkeypatch, kind: str) -> None:
    monkeypatch.setattr(reading, "MAX_CONFIG_BYTES", 4096)
    monkeypatch.setattr(reading, "MAX_DATA_BYTES", 4096)
    target, exp = corrupt_target(tmp_path, kind)
    write(target, b"#" * 5000)
    bad_input(tmp_path, capsys, exp, target.name, "larger than 0 MiB")


def test_utf8_byte_order_mark_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    exp = experiment(tmp_path, b"\xef\xbb\xbf" + EXPERIMENT.encode())
    assert cli.main(["validate", str(exp)]) == 0


# ------------------------------------------------------------------------------------ 5. strict


def test_duplicate_yaml_key_names_key_and_line(tmp_path, capsys) -> None:
    text = EXPERIMENT.replace("  max_num_seqs: 8\n", "  max_num_seqs: 8\n  max_num_seqs: 64\n")
    line = text.splitlines().index("  max_num_seqs: 64") + 1
    exp = experiment(tmp_path, text)
    bad_input(tmp_path, capsys, exp, f"exp.yaml:{line}:", "scheduler.max_num_seqs: duplicate key")


def test_duplicate_top_level_key(tmp_path, capsys) -> None:
    exp = experiment(tmp_path, EXPERIMENT + "seed: 2\n")
    bad_input(tmp_path, capsys, exp, "seed: duplicate key")


def test_duplicate_json_key_names_key_and_line(tmp_path, capsys) -> None:
    raw, _ = yamlio.read_mapping(catalog_dir("models") / "llama-2-7b.yaml")
    text = json.dumps({k: v for k, v in raw.items() if k != "sources"}, indent=1)
    text = text.replace('"vocab_size": 32000,', '"vocab_size": 32000,\n "vocab_size": 32001,')
    line = text.splitlines().index(' "vocab_size": 32001,') + 1
    write(tmp_path / "hf" / "config.json", text)
    exp = experiment(tmp_path, model="hf/config.json")
    bad_input(tmp_path, capsys, exp, f"config.json:{line}:", "duplicate key 'vocab_size'")


def test_duplicate_key_in_a_hardware_profile(tmp_path, capsys) -> None:
    profile = catalog_copy("hardware_profiles", "a100-80gb", {})
    write(tmp_path / "hw.yaml", profile + "memory_gb: 40\n")
    exp = experiment(tmp_path, hardware="hw.yaml")
    bad_input(tmp_path, capsys, exp, "hw.yaml:", "memory_gb: duplicate key")


@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("max_num_seqs", "true", "scheduler.max_num_seqs must be an integer, got true"),
        ("max_num_seqs", "'yes'", "scheduler.max_num_seqs must be an integer, got 'yes'"),
        ("max_num_seqs", "'8'", "scheduler.max_num_seqs must be an integer, got '8'"),
        ("max_num_seqs", "8.5", "scheduler.max_num_seqs must be an integer, got 8.5"),
        ("padding", "'yes'", "scheduler.padding must be true or false, got 'yes'"),
        ("padding", "yes", "scheduler.padding must be true or false, got 'yes'"),
        ("padding", "on", "scheduler.padding must be true or false, got 'on'"),
        ("padding", "1", "scheduler.padding must be true or false, got 1"),
        ("max_wait_ms", "true", "scheduler.max_wait_ms must be a number, got true"),
        ("max_wait_ms", "'50'", "scheduler.max_wait_ms must be a number, got '50'"),
    ],
)
def test_values_are_not_coerced(tmp_path, capsys, key: str, text: str, expected: str) -> None:
    exp = experiment(
        tmp_path, EXPERIMENT.replace("  max_num_seqs: 8\n", f"  max_num_seqs: 8\n  {key}: {text}\n")
        if key != "max_num_seqs" else EXPERIMENT.replace("max_num_seqs: 8", f"max_num_seqs: {text}")
    )  # fmt: skip
    bad_input(tmp_path, capsys, exp, "exp.yaml:", expected)


def test_engine_bools_are_strict(tmp_path, capsys) -> None:
    exp = experiment(tmp_path, EXPERIMENT + "engine: {async_scheduling: 'true'}\n")
    bad_input(tmp_path, capsys, exp, "engine.async_scheduling must be true or false")


def test_exponent_numbers_are_numbers_everywhere(tmp_path, capsys) -> None:
    profile = catalog_copy("hardware_profiles", "a100-80gb", {}).replace(
        "memory_gb: 80", "memory_gb: 8e1"
    )
    write(tmp_path / "hw.yaml", profile)
    text = (
        EXPERIMENT.replace("hardware: a100-80gb", "hardware: hw.yaml")
        .replace("rate: 10.0", "rate: 1e1")
        .replace("num_requests: 12", "num_requests: 1.2e1")
        + "slo: {ttft_ms: 1e3, tpot_ms: .5e+2}\nengine: {gpu_memory_utilization: 9e-1}\n"
    )
    exp = experiment(tmp_path, text)
    assert cli.main(["validate", str(exp)]) == 0, capsys.readouterr().err
    assert "6,901 blocks" in capsys.readouterr().out  # the same KV cache as memory_gb: 80
    config = validate_experiment(yamlio.read_mapping(exp)[0], base_dir=tmp_path)
    assert config.slo is not None and (config.slo.ttft_ms, config.slo.tpot_ms) == (1000.0, 50.0)
    assert config.workload.num_requests == 12 and isinstance(config.workload.num_requests, int)
    assert config.engine.gpu_memory_utilization == 0.9


def test_yaml_scalars_follow_the_core_schema() -> None:
    doc = "a: 8e1\nb: .5e-1\nc: 012\nd: 0x1f\ne: 1:30\nf: yes\ng: 2024-01-01\nh: ~\ni: TRUE\n"
    assert yamlio.loads(doc) == {
        "a": 80.0,
        "b": 0.05,
        "c": 12,
        "d": 31,
        "e": "1:30",  # YAML 1.1 read 90 (sexagesimal)
        "f": "yes",
        "g": "2024-01-01",
        "h": None,
        "i": True,
    }
    for bad, expected in [
        ("a: !!set {x}", "unsupported YAML tag !!set"),
        ("a: !!binary aGk=", "unsupported YAML tag !!binary"),
        ("a: !!int x", "is not an integer"),
        ("a: !!python/object:os.system {}", "unsupported YAML tag"),
        ("1: a", "mapping keys must be strings, got 1"),
        ("? [a]\n: 1", "mapping keys must be strings"),
        ("a: 1e400", "a must be a finite number, got inf"),
        ("a: [-.inf]", "a[0] must be a finite number, got -inf"),
        ("e: 1_000", "e: '1_000': digit separators (_) are YAML 1.1"),
        ("e: 1_0.5", "digit separators (_) are YAML 1.1"),
        ("a: &x {b: 1}\nc:\n  <<: *x", "c: merge keys (<<) are YAML 1.1"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(expected)):
            yamlio.loads(bad)


# ------------------------------------------------------------------------------------ 6. validate


def test_validate_rejects_an_empty_trace_like_run(tmp_path, capsys) -> None:
    write(tmp_path / "t.csv", CSV_HEADER)
    exp = experiment(tmp_path, TRACE_EXPERIMENT.replace("TRACE", "t.csv"))
    bad_input(tmp_path, capsys, exp, "t.csv", "empty trace")


def test_validate_rejects_a_trace_shorter_than_num_requests_like_run(tmp_path, capsys) -> None:
    write(tmp_path / "t.csv", CSV_HEADER + "0,10,5\n")
    text = TRACE_EXPERIMENT.replace("{path: TRACE}", "{path: t.csv}\n  num_requests: 5")
    bad_input(tmp_path, capsys, experiment(tmp_path, text), "workload.num_requests=5 exceeds")


def test_validate_rejects_a_duration_with_no_arrival_like_run(tmp_path, capsys) -> None:
    changes = {"workload.num_requests": None, "workload.duration_s": 1e-6}
    bad_input(tmp_path, capsys, experiment(tmp_path, **changes), "no request arrives")


# ------------------------------------------------------------------------------------ 7. policies


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (":", "is not a built-in policy or package.module:Class"),
        ("x:", "is not a built-in policy or package.module:Class"),
        (":Y", "is not a built-in policy or package.module:Class"),
        (".relative:Y", "is not a built-in policy or package.module:Class"),
        ("a b:C", "is not a built-in policy or package.module:Class"),
        ("a.b:C.D", "cannot import module 'a.b'"),
        ("batchsim.scheduler:Nope", "module 'batchsim.scheduler' has no attribute 'Nope'"),
        ("os.path:join", "is not a batchsim.scheduler.Scheduler subclass"),
        ("batchsim.scheduler:Scheduler", "is abstract (it does not implement schedule)"),
        ("raising_policy_mod:P", "importing module 'raising_policy_mod' failed with Zero"),
        ("exiting_policy_mod:P", "importing module 'exiting_policy_mod' failed with SystemExit"),
        ("broken_syntax_policy_mod:P", "failed with SyntaxError"),
        ("plain_class_policy_mod:P", "is not a batchsim.scheduler.Scheduler subclass"),
        ("abstract_policy_mod:P", "is abstract (it does not implement schedule)"),
    ],
)
def test_bad_policy_string_exits_2_with_one_line(
    tmp_path: Path, capsys, monkeypatch, policy: str, expected: str
) -> None:
    modules = tmp_path / "mods"
    write(modules / "raising_policy_mod.py", "x = 1 / 0\n")
    write(modules / "exiting_policy_mod.py", "import sys\nsys.exit(3)\n")
    write(modules / "broken_syntax_policy_mod.py", "def f(:\n")
    write(modules / "plain_class_policy_mod.py", "class P:\n    pass\n")
    write(
        modules / "abstract_policy_mod.py",
        "from batchsim.scheduler import Scheduler\n\nclass P(Scheduler):\n    pass\n",
    )
    monkeypatch.syspath_prepend(str(modules))
    for name in list(sys.modules):
        if name.endswith("_policy_mod"):
            monkeypatch.delitem(sys.modules, name)
    exp = experiment(tmp_path, **{"scheduler.policy": policy})
    bad_input(tmp_path, capsys, exp, "exp.yaml:", "scheduler.policy: ", expected)


# ------------------------------------------------------------------------------------ isolated
# Inputs that hung in C code (repr or serialisation of an alias bomb) or allocated without
# bound: each runs `run` then `validate` in its own subprocess, all in parallel, with a timeout
# and an address-space limit, so a regression fails here instead of hanging or swapping.


def _options_bomb(directory: Path) -> tuple[Path, list[str]]:
    # scheduler.options is free-form, so this is a valid config: it hung writing summary.json.
    text = EXPERIMENT.replace(
        "  max_num_seqs: 8\n", "  max_num_seqs: 8\n  options:\n" + laughs("    ")
    )
    return write(directory / "exp.yaml", text), ["exp.yaml:", "more than 1,000,000 values"]


def _bad_value_bomb(directory: Path) -> tuple[Path, list[str]]:
    # An invalid value made of aliases: its error message used to repr all of it.
    text = laughs() + EXPERIMENT.replace("num_requests: 12", "num_requests: *l9")
    return write(directory / "exp.yaml", text), ["exp.yaml:", "after expanding aliases"]


def _hardware_bomb(directory: Path) -> tuple[Path, list[str]]:
    profile = catalog_copy("hardware_profiles", "a100-80gb", {})
    write(directory / "hw.yaml", laughs() + profile.replace("description: ", "description: *l9\n#"))
    exp = write(directory / "exp.yaml", EXPERIMENT.replace("a100-80gb", "hw.yaml"))
    return exp, ["hw.yaml:", "after expanding aliases"]


def _too_many_requests(directory: Path) -> tuple[Path, list[str]]:
    text = EXPERIMENT.replace("num_requests: 12", "num_requests: 1000000000")
    return write(directory / "exp.yaml", text), ["workload.num_requests must be <= 10000000"]


def _rate_times_duration(directory: Path) -> tuple[Path, list[str]]:
    text = EXPERIMENT.replace("num_requests: 12", "duration_s: 1.0e+8")
    return write(directory / "exp.yaml", text), ["workload.duration_s", "10,000,000 requests"]


ISOLATED = {
    "alias bomb in scheduler.options": _options_bomb,
    "alias bomb as a bad value": _bad_value_bomb,
    "alias bomb in a hardware profile": _hardware_bomb,
    "num_requests: 1000000000": _too_many_requests,
    "duration_s x rate over the cap": _rate_times_duration,
}
ISOLATED_GROUPS = [list(ISOLATED)[:3], list(ISOLATED)[3:]]  # one subprocess each, in parallel
_CLI_SCRIPT = """
import contextlib, io, json, sys
from batchsim.cli import main
for case, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    print(json.dumps([case, code, err.getvalue()]), flush=True)
"""


def _limit_memory() -> None:
    size = 2 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (size, size))


@pytest.fixture(scope="module")
def isolated_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Case -> (directory, expected texts, [(code, stderr) of run, of validate])."""
    setups: dict[str, tuple[Path, list[str]]] = {}
    procs = []
    for group in ISOLATED_GROUPS:
        commands = []
        for case in group:
            directory = tmp_path_factory.mktemp("isolated")
            exp, expected = ISOLATED[case](directory)
            setups[case] = (directory, expected)
            commands.append((case, ["run", str(exp), "-o", str(directory / "out")]))
            commands.append((case, ["validate", str(exp)]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _CLI_SCRIPT, json.dumps(commands)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_limit_memory,
            )
        )
    deadline = time.monotonic() + 30
    outcomes: dict[str, list[tuple[int, str]]] = {case: [] for case in ISOLATED}
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # a hang: the cases it finished still count
            proc.kill()
            out, _ = proc.communicate()
        for line in out.splitlines():
            case, code, err = json.loads(line)
            outcomes[case].append((code, err))
    return {case: (*setups[case], outcomes[case]) for case in ISOLATED}


@pytest.mark.parametrize("case", list(ISOLATED))
def test_input_that_used_to_hang_or_exhaust_memory_exits_2(isolated_results, case: str) -> None:
    directory, expected, outcome = isolated_results[case]
    assert len(outcome) == 2, "did not finish within 30 s (a hang, or out of memory)"
    for code, err in outcome:
        assert "Traceback" not in err, err[-2000:]
        assert code == 2, err[-2000:]
        assert len(err.strip().splitlines()) == 1, err
        for text in expected:
            assert text in err, err
    assert outcome[0][1] == outcome[1][1], "validate and run disagree"
    assert not (directory / "out").exists()


# ------------------------------------------------------------------------------------ readers


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_json_and_yaml_readers_agree_on_plain_data(data: Any) -> None:
    # The one reader gives the same data for a document written as JSON or as YAML, and
    # rejects the same non-finite numbers in both.
    document = {"k": data}
    as_json = json.dumps(document)
    if yamlio.data_problem(document) is not None:
        for text, is_json in ((as_json, True), (yamlio.dump(document), False)):
            with pytest.raises(ConfigError, match=r"^k(\[\d+\]|\.\S*)? ?.*must be a finite"):
                yamlio.loads(text, is_json=is_json)
        return
    assert yamlio.loads(as_json, is_json=True) == document
    assert yamlio.loads(yamlio.dump(document)) == document


def test_line_of_never_raises() -> None:
    for text in ["a: [", "[" * 5000, laughs(), "a: \x00", '{"a": 1}', "a: 1\na: 2"]:
        line = yamlio.line_of(text, ["a"])
        assert line is None or line >= 1


def test_the_pure_python_yaml_parser_follows_the_same_rules(monkeypatch) -> None:
    # Without libyaml, PyYAML's own parser feeds the same limited composer.
    monkeypatch.setitem(sys.modules, "yaml._yaml", None)
    spec = importlib.util.spec_from_file_location("yamlio_without_libyaml", reading.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._EventSource.__module__ == "yamlio_without_libyaml"
    assert module.loads("a: 8e1\nb: yes") == {"a": 80.0, "b": "yes"}
    for text, expected in [
        ("a: " + "[" * 5000 + "]" * 5000, "nesting deeper than 100 levels"),
        (laughs(), "after expanding aliases"),
        ("a: 1\na: 2", "a: duplicate key"),
        ("a: .nan", "a must be a finite number"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(expected)):
            module.loads(text)


def test_integer_literals_too_long_for_python_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^a: an integer of 5000 characters is too long"):
        yamlio.loads("a: " + "1" * 5000)
    with pytest.raises(ConfigError, match=r"^malformed JSON: Exceeds the limit"):
        yamlio.loads('{"a": ' + "1" * 5000 + "}", is_json=True)
