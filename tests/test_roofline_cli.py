"""Claims about ``batchsim roofline`` (batchsim.roofline through batchsim.cli.main)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from batchsim.catalog.model import load_model
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
    assert "ridge point 153 FLOP/B" in text
    marked = [line for line in text.splitlines() if "<- knee" in line]
    assert len(marked) == 1 and marked[0].split()[0] == "256"
    assert "qkv_proj" in text and "all_reduce" in text


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
