"""benchmarks/validate_silicon.py: how a silicon row becomes an experiment, which rows it
skips and why, and its error arithmetic (the full benchmark is not run here)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from batchsim.config import validate_experiment

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def vs() -> ModuleType:
    path = ROOT / "benchmarks" / "validate_silicon.py"
    spec = importlib.util.spec_from_file_location("validate_silicon", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate_silicon"] = module
    spec.loader.exec_module(module)
    return module


def row(**changes: str) -> dict[str, str]:
    base = {
        "row": "7",
        "backend": "vllm",
        "backend_version": "0.19.0",
        "image": "vllm/vllm-openai:v0.19.0",
        "model_path": "Qwen/Qwen3-32B",
        "system": "h100_sxm",
        "mode": "agg",
        "isl": "4000",
        "osl": "500",
        "gemm_quant_mode": "",
        "moe_quant_mode": "",
        "concurrency": "16",
        "tp_size": "2",
        "pp_size": "1",
        "attention_dp_size": "1",
        "moe_tp_size": "",
        "moe_ep_size": "",
        "silicon_ttft_ms": "500",
        "silicon_tpot_ms": "20",
    }
    base.update(changes)
    return base


def test_an_aggregated_row_is_a_closed_loop_of_its_clients(vs: ModuleType) -> None:
    config = vs.experiment(row())
    assert config["hardware"] == "h100-sxm" and config["model"] == "qwen3-32b"
    assert config["engine"]["framework"] == "vllm-v1" and config["engine"]["dtype"] == "bf16"
    assert config["parallel"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1}
    w = config["workload"]
    assert w["concurrency"] == 16 and w["num_requests"] == 20 * 16  # aiperf profiling: 20N
    assert w["prompt_tokens"] == {"dist": "fixed", "value": 4000}
    assert w["output_tokens"] == {"dist": "fixed", "value": 500}
    validate_experiment(config)  # batchsim accepts it
    fp8 = vs.experiment(row(gemm_quant_mode="fp8", backend="trtllm"))
    assert fp8["engine"]["dtype"] == "fp8" and fp8["engine"]["framework"] == "tensorrt-llm"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"system": "mi355x"}, "no GPU profile: mi355x"),
        ({"model_path": "zai-org/GLM-5"}, "no catalog model: zai-org/GLM-5"),
        ({"concurrency": ""}, "number of clients not given"),
        ({"mode": "disagg"}, "disaggregated: worker counts not given"),
    ],
)
def test_rows_batchsim_cannot_express_are_skipped_with_the_reason(
    vs: ModuleType, changes: dict[str, str], reason: str
) -> None:
    with pytest.raises(vs.Unsupported, match=reason):
        vs.experiment(row(**changes))


def test_expert_parallel_rows_are_skipped(vs: ModuleType) -> None:
    moe = row(model_path="deepseek-ai/DeepSeek-V3", tp_size="8", moe_tp_size="1", moe_ep_size="8")
    with pytest.raises(vs.Unsupported) as err:
        vs.experiment(moe)
    assert "expert" in str(err.value).lower()


def test_error_statistics_by_hand(vs: ModuleType) -> None:
    assert vs.error(120.0, 100.0) == pytest.approx(0.2)
    stats = vs.error_stats([0.05, -0.15, 0.30, -0.50])
    assert stats.rows == 4
    assert stats.median_signed == pytest.approx((-0.15 + 0.05) / 2)
    assert stats.mean_signed == pytest.approx(-0.075)
    assert stats.median_abs == pytest.approx((0.15 + 0.30) / 2)
    assert stats.within_10 == pytest.approx(0.25) and stats.within_20 == pytest.approx(0.5)
    assert math.isnan(vs.error_stats([]).median_abs)


def test_held_out_rows_stay_out_of_the_overall_line(vs: ModuleType) -> None:
    pred = vs.Prediction(**{f: 1.0 for f in vs.Prediction.__dataclass_fields__})
    results = [vs.Result(row(system=s), pred) for s in ("h100_sxm", "h200_sxm", "b200_sxm")]
    lines = vs.groups(results)
    overall = lines["overall (not held out)"]
    assert {r.row["system"] for r in overall} == {"h100_sxm", "b200_sxm"}
    assert [r.row["system"] for r in lines["h200_sxm all (held out)"]] == ["h200_sxm"]


def test_shipped_rows_load_and_name_their_source(vs: ModuleType) -> None:
    rows = vs.load_rows()
    assert len(rows) > 1000 and {"silicon_ttft_ms", "silicon_tpot_ms"} <= set(rows[0])
    readme = (ROOT / "benchmarks" / "data" / "README.md").read_text()
    assert "095f58a51c4ca8e61b66ec108d86f223f8d559ce" in readme and "Apache" in readme
