"""Claims about reading traces: the columnar reader (pyarrow) gives exactly what the row-by-row
reader gives, arrays bit for bit or the same one-line error, on the shipped samples and on
generated files; a workload with ``num_requests`` reads the file only up to the rows it uses.

The row-by-row reader is the reference (it reads every row with Python's csv and json modules,
as batchsim always did); the samples are also checked against a parse written here.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.workload import columnar, columnar_times, files, generate, parse_workload, traces
from batchsim.workload.traces import CsvColumns, TraceConfig, load_trace
from batchsim.yamlio import reading
from conftest import UNNAMED_THREADS

SAMPLES = [
    "azure_conv_sample.csv",
    "azure_code_sample.csv",
    "mooncake_synthetic_sample.jsonl",
    "burstgpt_synthetic_sample.csv",
]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
CSV_HEADER = "arrival_time,prompt_tokens,output_tokens"
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Outcome = tuple[Any, ...]


def outcome(read: Callable[[], traces._Trace]) -> Outcome:
    """What a reader gives: its arrays (times as raw bytes: compared bit for bit) or its error."""
    try:
        t = read()
    except ConfigError as exc:
        return ("error", str(exc))
    return (
        "ok",
        t.format,
        None if t.arrival_time is None else t.arrival_time.astype(np.float64).tobytes(),
        t.prompt_tokens.tolist(),
        t.output_tokens.tolist(),
        None if t.hash_ids is None else list(t.hash_ids),
        None if t.prefix_group is None else t.prefix_group.tolist(),
        None if t.prefix_tokens is None else t.prefix_tokens.tolist(),
        t.skipped,
    )


def read_both(
    data: bytes,
    name: str = "t.csv",
    fmt: str | None = None,
    columns: dict[str, Any] | None = None,
    time_unit: str | None = None,
    limit: int | None = None,
) -> tuple[Outcome, Outcome]:
    """(What load_trace's reader makes of ``data``, what the row-by-row reader makes of it)."""
    cols = CsvColumns(**columns) if columns is not None else CsvColumns()
    explicit = columns is not None or time_unit is not None
    unit = time_unit or "s"
    args = (data, name, fmt, explicit, cols, unit, name, limit)
    return outcome(lambda: traces._parse(*args)), outcome(lambda: traces._parse_rows(*args))


def columnar_reads(data: bytes, name: str) -> bool:
    """Whether the columnar reader (not the row-by-row one) reads ``data``."""
    if name.endswith(".jsonl"):
        return columnar.read_mooncake(data, name, None) is not None
    header = columnar.csv_header(data)
    if header is not None and "Timestamp" in header.names:
        return columnar.read_burstgpt(data, header, name, None) is not None
    return header is not None and columnar.read_azure(data, header, name, None) is not None


def sample(name: str) -> Path:
    return catalog_dir("workloads") / name


# ------------------------------------------------------------------------------ shipped samples


def reference(path: Path) -> Outcome:
    """The sample parsed here with the csv and json modules (and pandas for Azure times)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        ms = np.array([r["timestamp"] for r in rows], dtype=np.float64)
        return (
            "ok",
            "mooncake",
            ((ms - ms[0]) / 1000.0).tobytes(),
            [r["input_length"] for r in rows],
            [r["output_length"] for r in rows],
            [r.get("hash_ids", []) for r in rows],
            None,
            None,
            (),
        )
    header, *body = list(csv.reader(io.StringIO(text, newline="")))
    if header == BURSTGPT_HEADER.split(","):  # rows with a 0 count are left out and counted
        ts, req, resp = (
            header.index(k) for k in ("Timestamp", "Request tokens", "Response tokens")
        )
        kept = [r for r in body if int(r[req]) > 0 and int(r[resp]) > 0]
        t0 = float(kept[0][ts])
        return (
            "ok",
            "burstgpt",
            np.array([float(r[ts]) - t0 for r in kept], dtype=np.float64).tobytes(),
            [int(r[req]) for r in kept],
            [int(r[resp]) for r in kept],
            None,
            None,
            None,
            (
                (traces.SKIPPED_FAILED, sum(int(r[resp]) == 0 for r in body)),
                (traces.SKIPPED_NO_PROMPT, sum(int(r[req]) == 0 < int(r[resp]) for r in body)),
            ),
        )
    ts, ctx, gen = (header.index(k) for k in AZURE_HEADER.split(","))
    stamps = pd.to_datetime(pd.Series([r[ts] for r in body]), format="ISO8601")
    seconds = ((stamps - stamps.iloc[0]) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    prompt = [int(r[ctx]) for r in body]
    output = [int(r[gen]) for r in body]
    return ("ok", "azure", seconds.tobytes(), prompt, output, None, None, None, ())


@pytest.mark.parametrize("name", SAMPLES)
def test_samples_read_as_the_row_reader_and_a_plain_parse_read_them(name: str) -> None:
    data = sample(name).read_bytes()
    assert columnar_reads(data, name)
    fast, slow = read_both(data, name)
    assert fast == slow == reference(sample(name))
    assert outcome(lambda: load_trace(TraceConfig(path=name))) == fast


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("limit", [1, 2, 7, 100, 199, 200, 5000])
def test_the_first_rows_of_a_sample_are_the_start_of_the_whole(name: str, limit: int) -> None:
    whole = load_trace(TraceConfig(path=name))
    part = load_trace(TraceConfig(path=name), limit=limit)
    n = min(limit, len(whole))
    assert len(part) == n
    np.testing.assert_array_equal(part.prompt_tokens, whole.prompt_tokens[:n])
    np.testing.assert_array_equal(part.output_tokens, whole.output_tokens[:n])
    assert part.arrival_time is not None and whole.arrival_time is not None
    assert part.arrival_time.tobytes() == whole.arrival_time[:n].tobytes()
    if whole.hash_ids is not None:
        assert part.hash_ids is not None and list(part.hash_ids) == list(whole.hash_ids[:n])
    fast, slow = read_both(sample(name).read_bytes(), name, limit=limit)
    assert fast == slow


def test_reading_the_usual_traces_imports_no_pandas_and_starts_no_thread_pool() -> None:
    # Neither pandas nor pyarrow.compute is imported (start-up time). And pyarrow 14 aborted at
    # interpreter exit about once in 60 runs ("terminate called without an active exception")
    # when its CPU thread pool had run: the readers parse on the calling thread. pyarrow's CSV
    # reader starts one I/O thread; its CPU pool would start several (counted on Linux only).
    script = UNNAMED_THREADS + (
        "import sys\n"
        "from batchsim.workload import TraceConfig, load_trace\n"
        "import pyarrow\n"
        "linux = pathlib.Path('/proc/self/task').is_dir()\n"
        "threads = unnamed_threads() if linux else 0\n"
        "modules = {'pandas', 'pyarrow.compute'} & set(sys.modules)\n"
        f"for name in {SAMPLES!r}:\n"
        "    load_trace(TraceConfig(path=name))\n"
        "print(sorted(({'pandas', 'pyarrow.compute'} & set(sys.modules)) - modules))\n"
        "print(unnamed_threads() - threads if linux else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    modules, threads = out.stdout.splitlines()
    assert modules == "[]"
    assert int(threads) <= 1


# ------------------------------------------------------------------------------ generated files

AZURE_STAMPS = [
    "yesterday",
    "2023-02-29 00:00:00",
    "2024-02-29 00:00:00",
    "2023-11-16 24:00:00",
    "2023-11-16 23:59:60",
    "2023-11-16",
    "2023-11-16 18:15",
    "2023-11-16 18:15:51Z",
    "2023-11-16 18:15:51+01:00",
    " 2023-11-16 18:15:51",
    "2023-11-16 18:15:51 ",
    "2023-11-16 18:15:51.",
    "2023-11-16 18:15:51.1234567891",
    "1850-01-01 00:00:00",
    "2300-01-01 00:00:00",
    "2023-11-16t18:15:51",
    "2023-1-16 18:15:51",
    "20231116 181551",
    "2023-11-16 18:15:5a",
    "",
]
ODD_NUMBERS = [
    "",
    " ",
    "0",
    "-1",
    "-0",
    "+5",
    "0x10",
    "0X1F",
    "12.0",
    "1e3",
    " 12",
    "12 ",
    "\t7",
    "007",
    "١٢",
    "1_0",
    "nan",
    "inf",
    "99999999999999999999",
    "16777216",
    "16777217",
    '"12"',
    '"1,2"',
    'a"b',
    "x",
    "é",
]
ODD_LINES = ["", "   ", "\u3000", "\x0b", "\r", ",", ",,", '"1\n2",3,4', "a,b,c,d", "a,b"]


@st.composite
def stamps(draw: st.DrawFn, n: int) -> list[str]:
    """``n`` Azure-style timestamps, most non-decreasing, written with 0-9 fraction digits."""
    start = draw(st.integers(-(2**62), 2**62))  # ns since 1970: years 1824 to 2116
    gaps = draw(st.lists(st.integers(0, 10**13), min_size=n, max_size=n))
    ns = np.array(start, dtype=np.int64) + np.cumsum(np.array(gaps, dtype=np.int64))
    digits = draw(st.integers(0, 9))
    mixed = draw(st.booleans())
    out = []
    for i, text in enumerate(np.datetime_as_string(ns.astype("datetime64[ns]"), unit="ns")):
        d = draw(st.integers(0, 9)) if mixed else digits
        date, clock = text.split("T")
        clock = clock[: 8 + (d + 1 if d else 0)]
        sep = draw(st.sampled_from(" T")) if mixed else " "
        out.append(f"{date}{sep}{clock}")
        if draw(st.integers(0, 60)) == 0:
            out[i] = draw(st.sampled_from(AZURE_STAMPS))
    return out


def counts(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 40)) == 0:
        return draw(st.sampled_from(ODD_NUMBERS))
    value = draw(st.integers(1, 2**24) | st.integers(1, 5000))
    return f"{value:0{draw(st.integers(1, 4))}d}"


@st.composite
def csv_files(draw: st.DrawFn, header: list[str], field: Callable[[str, int], str]) -> bytes:
    """A CSV trace with ``header`` (shuffled, maybe an extra column) and rows of ``field``
    values, written in one of the ways files come: CRLF, blank lines, BOM, odd lines."""
    columns = draw(st.permutations(header))
    if draw(st.booleans()):
        columns.insert(draw(st.integers(0, len(columns))), "extra")
    n = draw(st.integers(1, 12))
    values = {name: [field(name, i) for i in range(n)] for name in columns if name != "extra"}
    lines = [",".join(columns)]
    for i in range(n):
        row = [values[c][i] if c != "extra" else draw(st.sampled_from("xy z")) for c in columns]
        lines.append(",".join(row))
        if draw(st.integers(0, 15)) == 0:
            lines.append(draw(st.sampled_from(ODD_LINES)))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(lines) + draw(st.sampled_from(["", newline, newline * 2]))
    if draw(st.integers(0, 10)) == 0:
        text = "\ufeff" + text
    return text.encode("utf-8")


@st.composite
def azure_files(draw: st.DrawFn) -> bytes:
    n = 12
    times = draw(stamps(n))

    def field(name: str, i: int) -> str:
        return times[i] if name == "TIMESTAMP" else counts(draw)

    return draw(csv_files(AZURE_HEADER.split(","), field))


@PROPERTY
@given(
    data=azure_files(), fmt=st.sampled_from([None, "azure"]), limit=st.sampled_from([None, 1, 5])
)
def test_any_azure_file_reads_as_the_row_reader_reads_it(
    data: bytes, fmt: str | None, limit: int | None
) -> None:
    fast, slow = read_both(data, "t.csv", fmt=fmt, limit=limit)
    assert fast == slow


@PROPERTY
@given(st.data())
def test_plainly_written_azure_files_are_read_by_the_columnar_reader(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 50))
    start = data.draw(st.integers(-(2**61), 2**61))
    gaps = data.draw(st.lists(st.integers(0, 10**12), min_size=n, max_size=n))
    digits = data.draw(st.integers(0, 9))
    ns = (np.array(start, dtype=np.int64) + np.cumsum(gaps)).astype("datetime64[ns]")
    rows = [AZURE_HEADER]
    for text in np.datetime_as_string(ns, unit="ns"):
        date, clock = text.split("T")
        clock = clock[: 8 + (digits + 1 if digits else 0)]
        prompt, output = data.draw(st.integers(1, 2**24)), data.draw(st.integers(1, 2**24))
        rows.append(f"{date} {clock},{prompt},{output}")
    body = ("\r\n".join(rows) + "\r\n").encode()
    assert columnar_reads(body, "t.csv")
    fast, slow = read_both(body)
    assert fast == slow


@st.composite
def burstgpt_files(draw: st.DrawFn) -> bytes:
    """BurstGPT-layout files: whole or fractional seconds (now and then an odd one), token
    counts that are often 0 (failed requests, empty prompts) or odd."""
    step = draw(st.sampled_from([0.0, 1.0, 7.5, 3600.0]))

    def field(name: str, i: int) -> str:
        if name == "Timestamp":
            if draw(st.integers(0, 30)) == 0:
                return draw(st.sampled_from(ODD_NUMBERS))
            return draw(st.sampled_from(["{:.0f}", "{!r}", "{:.1f}"])).format(5 + i * step)
        if name in ("Request tokens", "Response tokens"):
            return "0" if draw(st.integers(0, 4)) == 0 else counts(draw)
        return draw(st.sampled_from(["ChatGPT", "GPT-4", "Conversation log", "API log", "7"]))

    return draw(csv_files(BURSTGPT_HEADER.split(","), field))


@PROPERTY
@given(
    data=burstgpt_files(),
    fmt=st.sampled_from([None, "burstgpt"]),
    limit=st.sampled_from([None, 1, 3, 5]),
)
def test_any_burstgpt_file_reads_as_the_row_reader_reads_it(
    data: bytes, fmt: str | None, limit: int | None
) -> None:
    fast, slow = read_both(data, "t.csv", fmt=fmt, limit=limit)
    assert fast == slow


@PROPERTY
@given(st.data())
def test_burstgpt_rows_with_a_zero_count_are_skipped_and_counted(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    rows = [BURSTGPT_HEADER]
    kept: list[tuple[int, int, int]] = []
    failed = no_prompt = 0
    t = 0
    for _ in range(n):
        t += data.draw(st.integers(0, 100))
        req = data.draw(st.integers(1, 5000) | st.just(0))
        resp = data.draw(st.integers(1, 2000) | st.just(0))
        rows.append(f"{t},ChatGPT,{req},{resp},{req + resp},Conversation log")
        if resp == 0:
            failed += 1
        elif req == 0:
            no_prompt += 1
        else:
            kept.append((t, req, resp))
    body = ("\n".join(rows) + "\n").encode()
    fast, slow = read_both(body)
    assert fast == slow
    if not kept:
        assert fast[0] == "error" and "no request to replay" in fast[1]
        return
    assert columnar_reads(body, "t.csv")
    assert fast[1] == "burstgpt"
    assert np.frombuffer(fast[2]).tolist() == [float(k[0] - kept[0][0]) for k in kept]
    assert fast[3] == [k[1] for k in kept] and fast[4] == [k[2] for k in kept]
    assert fast[-1] == ((traces.SKIPPED_FAILED, failed), (traces.SKIPPED_NO_PROMPT, no_prompt))


def test_burstgpt_limit_counts_requests_replayed_not_rows_read(tmp_path: Path) -> None:
    rows = [BURSTGPT_HEADER]
    rows += [f"{i},GPT-4,{10 + i},{0 if i % 2 else 5},{10 + i},API log" for i in range(10)]
    rows.append("10,GPT-4,not a number,1,1,API log")  # after the 5th request: never read
    (tmp_path / "b.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = TraceConfig(path="b.csv")
    t = load_trace(cfg, tmp_path, limit=5)
    assert t.prompt_tokens.tolist() == [10, 12, 14, 16, 18]  # the even rows: 5 response tokens
    assert t.arrival_time is not None and t.arrival_time.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert dict(t.skipped) == {traces.SKIPPED_FAILED: 4, traces.SKIPPED_NO_PROMPT: 0}
    with pytest.raises(ConfigError, match=r"b.csv:12: Request tokens"):
        load_trace(cfg, tmp_path)


def test_burstgpt_is_recognised_by_its_header_and_takes_no_csv_keys(tmp_path: Path) -> None:
    text = f"Timestamp,Session ID,Elapsed time,{BURSTGPT_HEADER.split(',', 1)[1]}\n"
    text += "3,,1.5,ChatGPT,20,5,25,API log\n9,,2.5,GPT-4,30,0,30,API log\n"
    (tmp_path / "v3.csv").write_text(text, encoding="utf-8")  # BurstGPT_3's extra columns
    t = load_trace(TraceConfig(path="v3.csv"), tmp_path)
    assert (t.format, t.prompt_tokens.tolist(), t.output_tokens.tolist()) == ("burstgpt", [20], [5])
    note = traces.skipped_note(t, "v3.csv")
    assert note == (
        "workload.trace: v3.csv: skipped 1 row with 0 response tokens (failed requests); "
        "they are not replayed"
    )
    with pytest.raises(ConfigError, match="applies to format csv only, not burstgpt"):
        parse_workload({"trace": {"path": "v3.csv", "format": "burstgpt", "time_unit": "ms"}})


FLOATISH = st.text(alphabet="0123456789.eE+-_ xfinaINFA\t", max_size=10)


def arrival(draw: st.DrawFn, i: int, step: float) -> str:
    kind = draw(st.integers(0, 30))
    if kind == 0:
        return draw(st.sampled_from(ODD_NUMBERS))
    if kind == 1:
        return draw(FLOATISH)
    return draw(st.sampled_from(["{!r}", "{:.3f}", "{:e}", "{:.0f}", "{:g}"])).format(i * step)


PREFIX_GROUPS = ["a", "b", "7", "007", " a", "a ", "tenant-x", "é", "", "0x1", "1,2", '"q"']
PREFIX_COLUMNS = [
    {"prefix_group": "g", "prefix_tokens": "k"},
    {"prefix_group": "g", "prefix_tokens": "in"},  # the whole prompt is shared
    {"prefix_group": "in", "prefix_tokens": "k"},  # one column read as text and as counts
]


def prefix_tokens(draw: st.DrawFn) -> str:
    """Mostly small counts (often above a small prompt), some zeros and odd numbers."""
    kind = draw(st.integers(0, 20))
    if kind == 0:
        return draw(st.sampled_from(ODD_NUMBERS))
    if kind < 5:
        return "0"
    return str(draw(st.integers(0, 6000)))


@st.composite
def generic_files(draw: st.DrawFn) -> tuple[bytes, dict[str, Any] | None, str | None]:
    names = draw(
        st.sampled_from(
            [
                None,
                {"arrival_time": "t", "prompt_tokens": "in", "output_tokens": "out"},
                {"arrival_time": None, "prompt_tokens": "in", "output_tokens": "out"},
                {"arrival_time": "t", "prompt_tokens": "in", "output_tokens": "in"},
                {"arrival_time": "in", "prompt_tokens": "in", "output_tokens": "out"},
            ]
        )
    )
    if draw(st.booleans()):
        names = {**(names or {}), **draw(st.sampled_from(PREFIX_COLUMNS))}
    mapping = {**CsvColumns().model_dump(), **(names or {})}
    header = sorted({v for v in mapping.values() if v})
    step = draw(st.floats(0, 1e6, allow_nan=False))

    def field(name: str, i: int) -> str:
        counted = (mapping["prompt_tokens"], mapping["output_tokens"])
        if name == mapping["arrival_time"] and name not in counted:
            return arrival(draw, i, step)
        if name == mapping["prefix_group"] and name not in counted:
            return draw(st.sampled_from(PREFIX_GROUPS))
        if name == mapping["prefix_tokens"] and name not in counted:
            return prefix_tokens(draw)
        return counts(draw)

    return draw(csv_files(header, field)), names, draw(st.sampled_from([None, "s", "ms"]))


@PROPERTY
@given(case=generic_files(), limit=st.sampled_from([None, 1, 4]))
def test_any_generic_csv_reads_as_the_row_reader_reads_it(
    case: tuple[bytes, dict[str, Any] | None, str | None], limit: int | None
) -> None:
    data, columns, unit = case
    fast, slow = read_both(data, "t.csv", fmt="csv", columns=columns, time_unit=unit, limit=limit)
    assert fast == slow


@PROPERTY
@given(st.data())
def test_plainly_written_prefix_columns_are_read_by_the_columnar_reader(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(1, 40))
    rows = [f"{CSV_HEADER},group,shared"]
    groups, shared = [], []
    for i in range(n):
        prompt = data.draw(st.integers(1, 5000))
        group = data.draw(st.sampled_from(["a", "b", "tenant-x", "7", "007", "é", ""]))
        tokens = data.draw(st.integers(0, prompt)) if group else 0
        groups.append(group)
        shared.append(tokens)
        rows.append(f"{i * 0.5},{prompt},{data.draw(st.integers(1, 500))},{group},{tokens}")
    body = ("\n".join(rows) + "\n").encode()
    header = columnar.csv_header(body)
    assert header is not None
    names = ("arrival_time", "prompt_tokens", "output_tokens")
    fast = columnar.read_generic_csv(body, header, "t.csv", None, names, "s", ("group", "shared"))
    assert fast is not None
    ids = fast[3]
    assert ids is not None and fast[4] is not None
    assert fast[4].tolist() == shared
    used = [i for i in range(n) if shared[i] > 0]
    assert all(ids[i] == -1 for i in range(n) if shared[i] == 0)
    for i in used:  # equal ids exactly where the group texts are equal
        for j in used:
            assert (ids[i] == ids[j]) == (groups[i] == groups[j])
    first_seen = [int(ids[i]) for k, i in enumerate(used) if ids[i] not in ids[used[:k]]]
    assert first_seen == list(range(len(first_seen)))  # numbered in order of first appearance
    columns = {"prefix_group": "group", "prefix_tokens": "shared"}
    loaded, by_rows = read_both(body, fmt="csv", columns=columns)
    assert loaded == by_rows


@settings(max_examples=300, deadline=None)
@given(text=FLOATISH | st.from_regex(r"\A[-+]?[0-9]*\.?[0-9]*([eE][-+]?[0-9]+)?\Z"))
def test_a_number_pyarrow_reads_is_one_python_reads_the_same(text: str) -> None:
    data = f"{CSV_HEADER}\n{text},1,1\n".encode()
    fast, slow = read_both(data, fmt="csv")
    assert fast == slow


ODD_JSON_LINES = [
    "{not json",
    "[1, 2]",
    "{}",
    "5",
    '{"timestamp": 1}',
    '{"timestamp": 1, "timestamp": 2, "input_length": 3, "output_length": 4}',
    '{"timestamp": null, "input_length": 3, "output_length": 4}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": null}',
    '{"timestamp": 1, "input_length": 3.0, "output_length": 4}',
    '{"timestamp": 1.5, "input_length": 3, "output_length": 4}',
    '{"timestamp": 1, "input_length": "3", "output_length": 4}',
    '{"timestamp": true, "input_length": 3, "output_length": 4}',
    '{"timestamp": 1, "input_length": true, "output_length": 4}',
    '{"timestamp": NaN, "input_length": 3, "output_length": 4}',
    '{"timestamp": 1e400, "input_length": 3, "output_length": 4}',
    '{"timestamp": 123456789012345678901234, "input_length": 3, "output_length": 4}',
    '{"time\\u0073tamp": 1, "input_length": 3, "output_length": 4}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4} {"timestamp": 2, '
    '"input_length": 3, "output_length": 4}',
    '{"timestamp": 1,\n "input_length": 3, "output_length": 4}',
    '{"timestamp": 1,\r "input_length": 3, "output_length": 4}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [1, null]}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [1.5]}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [[1]]}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": "ab"}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [true]}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [99999999999999999999]}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "x": ' + "[" * 50 + "]" * 50 + "}",
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "x": {"y": "[{"}}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4, "x": "a\tb"}',
    '{"timestamp": 1, "input_length": 3, "output_length": 4,}',
    '{"timestamp": -1, "input_length": 3, "output_length": 4}',
    '{"timestamp": 1, "input_length": 0, "output_length": 4}',
    "",
    "   ",
    "\u3000",
    "\x0c",
    "\r",
]


@st.composite
def mooncake_files(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 12))
    with_hashes = draw(st.sampled_from(["all", "none", "some"]))
    time = draw(st.integers(0, 2**62))
    lines = []
    for _ in range(n):
        time += draw(st.integers(0, 10**6))
        row: dict[str, Any] = {
            "timestamp": time,
            "input_length": draw(st.integers(1, 2**24)),
            "output_length": draw(st.integers(1, 5000)),
        }
        if with_hashes == "all" or (with_hashes == "some" and draw(st.booleans())):
            row["hash_ids"] = draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5))
        if draw(st.integers(0, 5)) == 0:
            row["extra"] = draw(st.sampled_from(["x", 1.5, None, True, {"a": 1}, [1], "[]"]))
        keys = draw(st.permutations(list(row)))
        separators = draw(st.sampled_from([(", ", ": "), (",", ":")]))
        lines.append(json.dumps({k: row[k] for k in keys}, separators=separators))
        if draw(st.integers(0, 12)) == 0:
            lines.append(draw(st.sampled_from(ODD_JSON_LINES)))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(lines) + draw(st.sampled_from(["", newline, newline * 2]))
    if draw(st.integers(0, 10)) == 0:
        text = "\ufeff" + text
    return text.encode("utf-8")


@PROPERTY
@given(data=mooncake_files(), limit=st.sampled_from([None, 1, 5]))
def test_any_mooncake_file_reads_as_the_row_reader_reads_it(data: bytes, limit: int | None) -> None:
    fast, slow = read_both(data, "t.jsonl", limit=limit)
    assert fast == slow


def test_the_columnar_reader_reads_mooncake_rows_with_and_without_hash_ids() -> None:
    rows = [
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [7, 8]}',
        '{"timestamp": 10, "input_length": 6, "output_length": 2, "hash_ids": []}',
    ]
    for text in ("\n".join(rows), "\n".join(r.split(', "hash')[0] + "}" for r in rows)):
        data = text.encode()
        assert columnar_reads(data, "t.jsonl")
        fast, slow = read_both(data, "t.jsonl")
        assert fast == slow


# ------------------------------------------------------------------------------ timestamps


@settings(max_examples=300, deadline=None)
@given(
    when=st.lists(
        st.datetimes(min_value=pd.Timestamp("1900-01-01"), max_value=pd.Timestamp("2199-12-31")),
        min_size=1,
        max_size=8,
    ),
    nanos=st.integers(0, 999),
    digits=st.integers(0, 9),
    sep=st.sampled_from(" T"),
)
def test_timestamps_parse_to_the_nanoseconds_pandas_gives(
    when: list[Any], nanos: int, digits: int, sep: str
) -> None:
    texts = []
    for w in when:
        text = (pd.Timestamp(w) + pd.Timedelta(nanoseconds=nanos)).strftime("%Y-%m-%d %H:%M:%S")
        fraction = f"{pd.Timestamp(w).microsecond:06d}{nanos:03d}"[:digits]
        texts.append(text.replace(" ", sep) + (f".{fraction}" if digits else ""))
    ns = columnar_times._iso_ns(pa.array(texts, pa.string()))
    parsed = pd.to_datetime(pd.Series(texts), format="ISO8601")
    assert ns is not None
    assert ns.tolist() == parsed.astype("datetime64[ns]").astype("int64").tolist()
    seconds = columnar_times._azure_seconds(pa.chunked_array([pa.array(texts, pa.string())]))
    expected = files.seconds_since_first(texts)  # the row reader's (pandas)
    assert seconds is not None and expected is not None
    assert seconds.tobytes() == expected.tobytes()


@pytest.mark.parametrize("text", [*AZURE_STAMPS, "2023-11-16 18:15:51.1234567"])
def test_a_timestamp_the_fast_parser_reads_is_one_pandas_reads_the_same(text: str) -> None:
    ns = columnar_times._iso_ns(pa.array([text], pa.string()))
    parsed = pd.to_datetime(pd.Series([text]), format="ISO8601", errors="coerce")
    if ns is not None:  # else pandas decides
        assert not parsed.isna().any()
        assert ns.tolist() == parsed.astype("datetime64[ns]").astype("int64").tolist()


# ------------------------------------------------------------------------------ errors


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def azure_rows(n: int, first: int = 0) -> list[str]:
    base = pd.Timestamp("2023-11-16 18:15:46")
    return [
        f"{(base + pd.Timedelta(milliseconds=250 * i)).strftime('%Y-%m-%d %H:%M:%S.%f')}0,"
        f"{100 + i % 900},{1 + i % 300}"
        for i in range(first, first + n)
    ]


def load_error(path: Path, limit: int | None = None, **trace: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_trace(TraceConfig(path=str(path), **trace), limit=limit)
    return str(info.value)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("2023-11-16 18:15:40.0000000,10,10", "TIMESTAMP goes backwards"),
        ("2023-11-16 18:16:06.0000000,abc,12", "ContextTokens: expected a positive integer"),
        ("2023-11-16 18:16:06.0000000,12,0", "GeneratedTokens: expected a positive integer"),
        ("2023-11-16 18:16:06.0000000,12", "expected 3 fields, got 2"),
        ("yesterday,10,10", "TIMESTAMP: expected a date-time"),
    ],
)
def test_a_bad_row_deep_in_a_big_file_is_named_by_its_line(
    tmp_path: Path, row: str, expected: str
) -> None:
    lines = [AZURE_HEADER, *azure_rows(30_000)]
    lines[25_001] = row
    path = write(tmp_path / "big.csv", "\r\n".join(lines) + "\r\n")
    message = load_error(path)
    assert message.startswith(f"{path}:25002: {expected}"), message


@pytest.mark.parametrize("fast", [True, False])
def test_time_zones_mixed_in_a_trace_name_the_first_row_out_of_line(
    tmp_path: Path, fast: bool
) -> None:
    rows = [f"2023-11-16 18:15:{50 + i}+01:00,{i + 1},1" for i in range(6)]
    rows[3] = rows[3].replace("+01:00", "Z")
    if not fast:
        rows[0] = '"{}",{},{}'.format(*rows[0].split(","))
    path = write(tmp_path / "t.csv", "\n".join([AZURE_HEADER, *rows]))
    assert load_error(path) == (
        f"{path}:5: TIMESTAMP: expected a date-time like 2023-11-16 18:15:46.6805900 in the "
        "time zone of the rows before, got '2023-11-16 18:15:53Z'"
    )
    assert len(load_trace(TraceConfig(path=str(path)), limit=3)) == 3


def test_too_many_rows_names_the_first_line_over_in_either_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("batchsim.workload.files.MAX_REQUESTS", 3)
    rows = azure_rows(6)
    text = "\r\n".join([AZURE_HEADER, rows[0], "", rows[1], rows[2], "", rows[3], *rows[4:]])
    path = write(tmp_path / "t.csv", text)
    assert load_error(path) == (
        f"{path}:7: more than 3 data rows (the limit of one workload); cut the file"
    )
    fast, slow = read_both(text.encode(), str(path))
    assert fast == slow
    moon = [json.dumps({"timestamp": i, "input_length": 1, "output_length": 1}) for i in range(6)]
    text = "\n".join([moon[0], "", *moon[1:]])
    path = write(tmp_path / "t.jsonl", text)
    assert load_error(path) == (
        f"{path}:5: more than 3 data rows (the limit of one workload); cut the file"
    )
    fast, slow = read_both(text.encode(), str(path))
    assert fast == slow
    assert len(load_trace(TraceConfig(path=str(path)), limit=3)) == 3  # fine when cut


# ------------------------------------------------------------------------------ num_requests


class CountingFile:
    """A file whose reads are counted."""

    def __init__(self, f: Any, counter: list[int]):
        self._f = f
        self._counter = counter

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._counter.append(len(data))
        return data

    def fileno(self) -> int:
        return int(self._f.fileno())

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the reads made through batchsim.workload.files' ``open`` (partial reads)."""
    counter: list[int] = []

    def counting_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> CountingFile:
        return CountingFile(open(path, mode, *args, **kwargs), counter)

    monkeypatch.setattr(files, "open", counting_open, raising=False)
    return counter


@pytest.mark.parametrize("name", ["big.csv", "big.jsonl"])
def test_num_requests_reads_about_as_much_as_a_file_of_that_many_rows(
    tmp_path: Path, bytes_read: list[int], name: str
) -> None:
    if name.endswith(".csv"):
        text = "\r\n".join([AZURE_HEADER, *azure_rows(200_000)]) + "\r\n"
    else:
        row = '{"timestamp": %d, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}\n'
        text = "".join(row % i for i in range(200_000))
    path = write(tmp_path / name, text)
    workload = parse_workload({"trace": {"path": str(path)}, "num_requests": 1000})
    table = generate(workload, 0)
    assert len(table) == 1000
    assert sum(bytes_read) < 4 * len(text) // 200  # 1000 rows are 1/200 of the file
    whole = load_trace(TraceConfig(path=str(path)))
    np.testing.assert_array_equal(table.prompt_tokens, whole.prompt_tokens[:1000])
    assert whole.arrival_time is not None
    assert table.arrival_time.tobytes() == whole.arrival_time[:1000].tobytes()


@pytest.mark.parametrize("fast", [True, False])
def test_a_bad_row_after_num_requests_is_not_read_one_before_is_reported(
    tmp_path: Path, fast: bool
) -> None:
    rows = azure_rows(50)
    if not fast:  # a quote: the whole file is read, row by row
        rows[0] = '"{}",{},{}'.format(*rows[0].split(","))
    lines = [AZURE_HEADER, *rows[:10], "2023-11-16 18:16:06.0000000,abc,12", *rows[10:]]
    path = write(tmp_path / "t.csv", "\n".join(lines) + "\n")
    assert len(load_trace(TraceConfig(path=str(path)), limit=10)) == 10
    message = load_error(path, limit=11)
    assert message == (
        f"{path}:12: ContextTokens: expected a positive integer <= 16777216 (tokens), got 'abc'"
    )
    assert load_error(path).startswith(f"{path}:12: ContextTokens")


def test_bytes_after_num_requests_are_not_checked_those_before_are(tmp_path: Path) -> None:
    rows = azure_rows(20)
    for bad, expected in ((b"\xff", "not UTF-8 text"), (b"\x00", "NUL byte")):
        data = "\n".join([AZURE_HEADER, *rows[:5]]).encode() + b"\n" + bad + b"\n"
        data += "\n".join(rows[5:]).encode()
        path = write(tmp_path / "t.csv", data)
        assert len(load_trace(TraceConfig(path=str(path)), limit=5)) == 5
        assert load_error(path, limit=6) == load_error(path)
        assert load_error(path).startswith(f"{path}:7: {expected}")


def test_a_bad_mooncake_line_after_num_requests_is_not_read(tmp_path: Path) -> None:
    good = [json.dumps({"timestamp": i, "input_length": 1, "output_length": 1}) for i in range(9)]
    path = write(tmp_path / "t.jsonl", "\n".join([*good[:4], "{not json", *good[4:]]))
    assert len(load_trace(TraceConfig(path=str(path)), limit=4)) == 4
    assert load_error(path, limit=5).startswith(f"{path}:5: invalid JSON")


def test_blank_and_white_space_lines_do_not_count_as_rows(tmp_path: Path) -> None:
    rows = azure_rows(12)
    lines = [AZURE_HEADER, rows[0], "", " \t", "\u3000", "\u2028\x85", rows[1], "\r", *rows[2:]]
    data = ("\ufeff" + "\r\n".join(lines)).encode()
    path = write(tmp_path / "t.csv", data)
    whole = load_trace(TraceConfig(path=str(path)))
    assert len(whole) == 12
    for limit in (1, 2, 3, 12):
        part = load_trace(TraceConfig(path=str(path)), limit=limit)
        assert part.prompt_tokens.tolist() == whole.prompt_tokens[:limit].tolist()
        assert read_both(data, limit=limit)[0] == read_both(data, limit=limit)[1]


def test_a_quoted_field_across_lines_is_read_whole_before_num_requests(tmp_path: Path) -> None:
    text = f'{CSV_HEADER}\n0,"10\n",5\n1,20,6\n2,30,7\n'
    path = write(tmp_path / "t.csv", text)
    for limit in (1, 2, 3):
        part = load_trace(TraceConfig(path=str(path), format="csv"), limit=limit)
        assert part.prompt_tokens.tolist() == [10, 20, 30][:limit]


def test_num_requests_beyond_a_short_file_still_names_its_size(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "\n".join([AZURE_HEADER, *azure_rows(3)]))
    workload = parse_workload({"trace": {"path": str(path)}, "num_requests": 5})
    with pytest.raises(ConfigError, match="num_requests=5 exceeds the 3 requests"):
        generate(workload, 0)


def test_the_size_cap_holds_when_reading_part_of_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "MAX_DATA_BYTES", 4096)
    path = write(tmp_path / "t.csv", "\n".join([AZURE_HEADER, *azure_rows(200)]))
    assert "file is larger than 0 MiB" in load_error(path, limit=1)


# ------------------------------------------------------------------------------ hash ids


def test_hash_ids_index_slice_and_iterate_like_a_list_of_lists() -> None:
    lists = [[1, 2], [], [3], [4, 5, 6]]
    flat = np.array([x for ids in lists for x in ids], dtype=np.int64)
    offsets = np.cumsum([0] + [len(ids) for ids in lists])
    ids = columnar.HashIds(flat, offsets)
    assert list(ids) == lists and len(ids) == 4
    assert ids[1] == [] and ids[-1] == [4, 5, 6] and ids[0] == [1, 2]
    assert ids[1:3] == lists[1:3] and ids[::2] == lists[::2] and ids[3:1] == []
    assert list(ids.head(2)) == lists[:2]
    with pytest.raises(IndexError):
        ids[4]


def test_run_replays_a_burstgpt_trace_and_notes_the_skipped_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from batchsim import cli

    rows = [BURSTGPT_HEADER, "5,ChatGPT,40,3,43,API log", "6,GPT-4,30,0,30,API log"]
    rows += ["8,ChatGPT,0,0,0,API log", "9,ChatGPT,50,4,54,Conversation log"]
    (tmp_path / "b.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "exp.yaml").write_text(
        "name: b\nhardware: a100-80gb\nmodel: llama-2-7b\nworkload: {trace: {path: b.csv}}\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "exp.yaml", "-o", "out"]) == 0
    printed = capsys.readouterr()
    assert "2 completed" in printed.out
    assert len(printed.err.splitlines()) == 1
    assert printed.err.startswith("note: workload.trace: ")
    assert printed.err.strip().endswith(
        "b.csv: skipped 2 rows with 0 response tokens (failed requests); they are not replayed"
    )
