"""Claims about ``batchsim roofline`` (batchsim.roofline through batchsim.cli.main)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from batchsim.catalog.model_files import load_model
from batchsim.cli import main
from batchsim.cost import OP_NAMES

BASE = ["roofline", "--model", "llama-2-7b", "--hardware", "a100-80gb"]


def run_json(capsys, *args: str) -> dict:
    assert main([*BASE, *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_ridge_point_knee_and_one_row_per_shape_with_all_eight_ops(capsys):
    out = run_json(capsys, "--batch", "1,8,64", "--context", "512")
    assert out["model"] == "llama-2-7b" and out["hardware"] == "a100-80gb"
    assert out["ridge_point"] > 100
    assert "knee_batch_size" in out
    assert [r["batch_size"] for r in out["rows"]] == [1, 8, 64]
    for row in out["rows"]:
        assert row["context_len"] == 512
        assert row["num_tokens"] == row["batch_size"]
        assert set(row) >= {"time_ms", "flops", "bytes", "intensity", "bound", "ops"}
        assert list(row["ops"]) == list(OP_NAMES)
        assert row["time_ms"] == pytest.approx(sum(row["ops"].values()))
        assert row["bound"] in ("memory", "compute")


def test_ideal_b1_decode_time_is_weight_bytes_over_datasheet_bandwidth_plus_kv(capsys):
    out = run_json(capsys, "--batch", "1", "--context", "1024", "--ideal")
    model = load_model("llama-2-7b")
    weights = (model.num_params - model.embedding_params) * 2.0
    kv = model.kv_bytes_per_token("bf16") * 1025
    expected_ms = (weights + kv) / 2.039e12 * 1e3
    assert out["rows"][0]["time_ms"] == pytest.approx(expected_ms, rel=0.01)
    assert out["rows"][0]["ops"]["overhead"] == 0.0
    assert out["ridge_point"] == pytest.approx(312 / 2.039)


def test_ideal_4096_token_prefill_is_compute_bound(capsys):
    out = run_json(capsys, "--tokens", "1,4096", "--ideal")
    small, big = out["rows"]
    assert small["bound"] == "memory" and big["bound"] == "compute"
    assert big["time_ms"] == pytest.approx(big["flops"] / 312e12 * 1e3, rel=0.08)
    assert big["intensity"] > out["ridge_point"] > small["intensity"]


def test_bound_flips_at_the_reported_knee_batch_size(capsys):
    out = run_json(capsys, "--batch", "1", "--context", "1", "--ideal")
    knee = out["knee_batch_size"]
    assert out["ridge_point"] <= knee <= 1.3 * out["ridge_point"]
    rows = run_json(capsys, "--batch", f"{knee - 1},{knee}", "--context", "1", "--ideal")["rows"]
    assert [r["bound"] for r in rows] == ["memory", "compute"]


def test_long_context_decode_reports_no_knee(capsys):
    out = run_json(capsys, "--batch", "1,256", "--context", "4096")
    assert out["knee_batch_size"] is None
    assert all(r["bound"] == "memory" for r in out["rows"])


def test_tp2_adds_all_reduce_time(capsys):
    tp1 = run_json(capsys, "--batch", "32", "--context", "512")["rows"][0]
    tp2 = run_json(capsys, "--batch", "32", "--context", "512", "--tp", "2")["rows"][0]
    assert tp1["ops"]["all_reduce"] == 0.0 < tp2["ops"]["all_reduce"]
    assert tp2["ops"]["mlp"] < 0.6 * tp1["ops"]["mlp"]


def test_table_marks_the_first_compute_bound_decode_row_as_the_knee(capsys):
    assert main([*BASE, "--batch", "1,64,256,1024", "--context", "1", "--ideal"]) == 0
    text = capsys.readouterr().out
    assert "ridge point 153 FLOP/B (datasheet)" in text  # 312 TFLOP/s / 2.039 TB/s
    marked = [line for line in text.splitlines() if "<- knee" in line]
    assert len(marked) == 1 and marked[0].split()[0] == "256"
    assert "qkv_proj" in text and "all_reduce" in text


def test_calibrated_header_names_both_ridge_points(capsys):
    # the calibrated ridge point differs from the datasheet one `batchsim list hardware`
    # shows (312 / 2.039 = 153 FLOP/B): the header gives both, each named
    assert main([*BASE, "--batch", "1", "--context", "1"]) == 0
    header = capsys.readouterr().out
    out = run_json(capsys, "--batch", "1", "--context", "1")
    assert out["ridge_point_datasheet"] == pytest.approx(312 / 2.039)
    assert out["ridge_point"] != pytest.approx(out["ridge_point_datasheet"])
    assert f"ridge point {out['ridge_point']:.0f} FLOP/B (achievable" in header
    assert "datasheet 153)" in header


def test_csv_has_a_header_and_one_line_per_shape(capsys):
    assert main([*BASE, "--tokens", "1,512,2048", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["num_tokens"] for r in rows] == ["1", "512", "2048"]
    assert {f"{name}_ms" for name in OP_NAMES} <= set(rows[0])
    assert rows[2]["bound"] == "compute"


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--batch", "0"], "--batch"),
        (["--batch", "-4"], "--batch"),
        (["--batch", "1,x,8"], "--batch"),
        (["--tokens", "1.5"], "--tokens"),
        (["--batch", "8", "--tokens", "8"], "--batch"),
        ([], "--tokens"),
        (["--batch", "8", "--dtype", "fp4"], "bf16, fp16, fp8, int8, int4"),
        (["--batch", "8", "--kv-dtype", "int2"], "--kv-dtype"),
        (["--batch", "8", "--format", "xml"], "table, csv, json"),
        (["--batch", "8", "--tp", "0"], "--tp"),
        (["--batch", "8", "--tp", "3"], "--tp"),
        (["--batch", "8", "--context", "-1"], "--context"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_option(capsys, args, names):
    assert main([*BASE, *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and names in lines[0]


def test_unknown_model_exits_2_naming_the_option(capsys):
    assert main(["roofline", "--model", "llama-9", "--hardware", "a100-80gb", "--batch", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model" in err[0]


# ----------------------------------------------------------------------------- columns

# Each column of the table and its name in --format csv (and in each json row).
TABLE_COLUMNS = {
    "batch": "batch_size",
    "context": "context_len",
    "tokens": "num_tokens",
    "time ms": "time_ms",
    "tok/s": "tokens_per_s",
    "FLOPs": "flops",
    "bytes": "bytes",
    "weight bytes": "weight_bytes",
    "KV bytes": "kv_bytes",
    "FLOP/B": "intensity",
    "bound": "bound",
    **{name: f"{name}_ms" for name in OP_NAMES},
}


def table_header(text: str) -> list[str]:
    lines = text.splitlines()
    header = lines[lines.index("op columns: time in ms per operator group") + 1]
    return re.split(r"\s{2,}", header.strip())


def test_weight_bytes_stay_flat_while_kv_bytes_grow_with_batch_and_context(capsys):
    model = load_model("llama-2-7b")
    kv_per_token = model.kv_bytes_per_token("bf16")
    short = run_json(capsys, "--batch", "1,8,64", "--context", "512")["rows"]
    long = run_json(capsys, "--batch", "1,8,64", "--context", "1024")["rows"]
    assert len({r["weight_bytes"] for r in short + long}) == 1
    assert short[0]["weight_bytes"] == pytest.approx(model.num_params * 2.0, rel=0.02)
    for s, g in zip(short, long):
        assert g["kv_bytes"] - s["kv_bytes"] == pytest.approx(s["batch_size"] * 512 * kv_per_token)
        assert s["kv_bytes"] == pytest.approx(short[0]["kv_bytes"] * s["batch_size"])


def test_csv_and_json_carry_every_column_of_the_table(capsys):
    args = ["--batch", "1,64,256", "--context", "128"]
    assert main([*BASE, *args]) == 0
    text = capsys.readouterr().out
    assert table_header(text) == list(TABLE_COLUMNS)
    assert main([*BASE, *args, "--format", "csv"]) == 0
    csv_rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    json_rows = run_json(capsys, *args)["rows"]
    assert len(csv_rows) == len(json_rows) == 3
    for c, j in zip(csv_rows, json_rows):
        assert set(TABLE_COLUMNS.values()) <= set(c)
        flat = {**j, **{f"{name}_ms": t for name, t in j["ops"].items()}}
        for column in TABLE_COLUMNS.values():
            expected = flat[column]
            if isinstance(expected, str):
                assert c[column] == expected
            else:
                assert float(c[column]) == pytest.approx(expected, rel=1e-5)
        assert j["tokens_per_s"] == pytest.approx(j["num_tokens"] / (j["time_ms"] / 1e3))


# ----------------------------------------------------------------------------- the knee


def knee_marks(text: str) -> dict[int, str]:
    marks = {}
    for line in text.splitlines():
        if "<- knee" in line:
            marks[int(line.split()[0])] = line[line.index("<- knee") :]
    return marks


def test_table_marker_points_at_the_headers_knee_when_it_lies_between_rows(capsys):
    # README's example: the knee (129) is not one of the batch sizes asked for.
    args = ["--model", "llama-3-8b", "--hardware", "a100-80gb", "--context", "128"]
    args += ["--batch", "1,16,64,128,256,512,1024"]
    knee = run_json_args(capsys, args)["knee_batch_size"]
    assert 128 < knee < 256
    assert main(["roofline", *args]) == 0
    text = capsys.readouterr().out
    assert f"compute-bound at B = {knee}" in text
    marks = knee_marks(text)
    assert list(marks) == [256] and str(knee) in marks[256]


def test_table_marker_agrees_with_the_header_when_a_smaller_batch_is_compute_bound(capsys):
    # Tile quantization makes B = 449 compute-bound for one batch size; the knee is later.
    args = [*BASE[1:], "--context", "128", "--batch", "1,449,512,1024"]
    out = run_json_args(capsys, args)
    knee = out["knee_batch_size"]
    rows = {r["batch_size"]: r for r in out["rows"]}
    assert rows[449]["bound"] == "compute" and knee > 512
    assert main(["roofline", *args]) == 0
    text = capsys.readouterr().out
    assert f"compute-bound at B = {knee}" in text
    assert list(knee_marks(text)) == [1024]
    assert [r["knee"] for r in out["rows"]] == [False, False, False, True]
    assert main(["roofline", *args, "--format", "csv"]) == 0
    csv_rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["knee"] for r in csv_rows] == ["false", "false", "false", "true"]
    assert {r["knee_batch_size"] for r in csv_rows} == {str(knee)}


def run_json_args(capsys, args: list[str]) -> dict:
    assert main(["roofline", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_quantized_checkpoint_is_priced_in_its_precision_unless_dtype_is_given(capsys):
    # gpt-oss-20b is released in MXFP4 (its quantization_config): the default is nvfp4 weights
    # beside a bf16 KV cache, and --dtype still chooses
    args = ["roofline", "--model", "gpt-oss-20b", "--hardware", "h100-sxm", "--batch", "1,64"]
    outputs = []
    for extra in ([], ["--dtype", "nvfp4", "--kv-dtype", "bf16"], ["--dtype", "bf16"]):
        assert main([*args, *extra, "--format", "json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["rows"])
    default, explicit, bf16 = outputs
    assert default == explicit
    assert default[0]["bytes"] < 0.5 * bf16[0]["bytes"]  # 4.5-bit against 16-bit weights
