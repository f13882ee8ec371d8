"""A checkpoint's ``quantization_config`` sets the precision it is served in, unless the
experiment's ``engine`` block says otherwise (:mod:`batchsim.catalog.quantization`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsim import cli
from batchsim.catalog.quantization import checkpoint_precision
from batchsim.errors import ConfigError

LLAMA_3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# The quantization_config blocks as the published checkpoints write them (their config.json,
# or for ModelOpt its hf_quant_config.json form), and what vLLM serves them in.
PUBLISHED = [
    (  # deepseek-ai/DeepSeek-V3
        {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
        ("fp8", None),
    ),
    (  # openai/gpt-oss-20b: MXFP4 experts (priced as nvfp4)
        {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        },
        ("nvfp4", None),
    ),
    (  # nvidia/Llama-3.1-8B-Instruct-FP4 (ModelOpt)
        {
            "quant_method": "modelopt",
            "quantization": {
                "quant_algo": "NVFP4",
                "kv_cache_quant_algo": "FP8",
                "group_size": 16,
            },
        },
        ("nvfp4", "fp8"),
    ),
    (  # nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt, flat form)
        {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None},
        ("fp8", None),
    ),
    (  # hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4
        {
            "bits": 4,
            "group_size": 128,
            "quant_method": "awq",
            "version": "gemm",
            "zero_point": True,
        },
        ("int4", None),
    ),
    (  # TheBloke-style AutoAWQ field name
        {"w_bit": 4, "q_group_size": 128, "quant_method": "awq", "zero_point": True},
        ("int4", None),
    ),
    (  # a GPTQ 8-bit checkpoint
        {"bits": 8, "group_size": 128, "desc_act": False, "quant_method": "gptq"},
        ("int8", None),
    ),
    (  # neuralmagic/Meta-Llama-3-8B-Instruct-FP8-KV (llm-compressor)
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                    "input_activations": {"num_bits": 8, "type": "float"},
                }
            },
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"},
        },
        ("fp8", "fp8"),
    ),
    (  # a W4A16 llm-compressor checkpoint
        {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}},
        },
        ("int4", None),
    ),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False}, ("int4", None)),
]


def _error(key: str, message: str) -> ConfigError:
    return ConfigError(f"quantization_config.{key} {message}")


@pytest.mark.parametrize(("config", "expected"), PUBLISHED)
def test_published_quantization_configs_map_to_the_precision_they_are_served_in(
    config: dict[str, Any], expected: tuple[str, str | None]
):
    assert checkpoint_precision(config, _error) == expected


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"quant_method": "hqq"}, "quant_method"),
        ({"bits": 3, "quant_method": "gptq"}, "bits"),
        ({"quant_method": "modelopt", "quant_algo": "INT8_SQ"}, "quant_algo"),
        ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "INT8"}, "kv"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "a": {"weights": {"num_bits": 8, "type": "float"}},
                    "b": {"weights": {"num_bits": 4, "type": "int"}},
                },
            },
            "mixes",
        ),
        ({"quant_method": "bitsandbytes"}, "load_in_4bit"),
        ("fp8", "mapping"),
    ],
)
def test_unsupported_quantization_configs_are_errors_naming_the_key(config: Any, key: str):
    with pytest.raises(ConfigError, match=key):
        checkpoint_precision(config, _error)


def _checkpoint(tmp_path: Path, quantization: dict[str, Any] | None, name: str = "ckpt") -> str:
    folder = tmp_path / name
    folder.mkdir()
    config = dict(LLAMA_3_8B)
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return str(folder / "config.json")


def _run(tmp_path: Path, name: str, model: str, engine: dict[str, Any]) -> dict[str, Any]:
    exp = {
        "name": name,
        "hardware": "h100-sxm",
        "model": model,
        "engine": engine,
        "workload": {
            "num_requests": 40,
            "arrival": {"process": "poisson", "rate": 20.0},
            "prompt_tokens": {"dist": "fixed", "value": 600},
            "output_tokens": {"dist": "fixed", "value": 80},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp), encoding="utf-8")
    out = tmp_path / f"out-{name}"
    assert cli.main(["run", str(path), "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    resolved = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    return {"summary": summary, "engine": resolved["engine"], "out": out}


def _timing(summary: dict[str, Any]) -> dict[str, Any]:
    timing = {k: v for k, v in summary.items() if k.endswith("_ms") or "throughput" in k}
    assert "mean_tpot_ms" in timing and "output_throughput" in timing, sorted(summary)
    return timing


def test_a_quantized_checkpoint_runs_in_its_precision_unless_the_engine_says_otherwise(
    tmp_path: Path,
):
    fp8 = _checkpoint(tmp_path, PUBLISHED[0][0])
    plain = _checkpoint(tmp_path, None, "plain")
    taken = _run(tmp_path, "taken", fp8, {})
    # the same deployment written out by hand: fp8 weights beside a 16-bit KV cache
    explicit = _run(tmp_path, "explicit", plain, {"dtype": "fp8", "kv_cache_dtype": "bf16"})
    bf16 = _run(tmp_path, "bf16", plain, {})
    overridden = _run(tmp_path, "overridden", fp8, {"dtype": "bf16"})
    assert (taken["engine"]["dtype"], taken["engine"]["kv_cache_dtype"]) == ("fp8", "bf16")
    assert _timing(taken["summary"]) == _timing(explicit["summary"])
    assert _timing(taken["summary"]) != _timing(bf16["summary"])
    assert overridden["engine"]["dtype"] == "bf16"
    assert _timing(overridden["summary"]) == _timing(bf16["summary"])
    # the resolved config.yaml reruns the same run
    again = tmp_path / "again"
    assert cli.main(["run", str(taken["out"] / "config.yaml"), "-o", str(again)]) == 0
    rerun = json.loads((again / "summary.json").read_text(encoding="utf-8"))
    assert _timing(rerun) == _timing(taken["summary"])


def test_a_checkpoints_fp8_kv_cache_scheme_gives_an_fp8_kv_cache(tmp_path: Path):
    model = _checkpoint(tmp_path, PUBLISHED[7][0])
    run = _run(tmp_path, "kv", model, {})
    assert (run["engine"]["dtype"], run["engine"]["kv_cache_dtype"]) == ("fp8", "fp8")


def test_an_unknown_quant_method_exits_2_naming_the_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    model = _checkpoint(tmp_path, {"quant_method": "hqq", "nbits": 4})
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "hardware": "h100-sxm",
                "model": model,
                "workload": {"num_requests": 5, "arrival": {"process": "poisson", "rate": 1}},
            }
        ),
        encoding="utf-8",
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in (["run", str(exp), "-o", str(tmp_path / "out")], ["validate", str(exp)]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        line = next(i for i, t in enumerate(Path(model).read_text().splitlines(), 1) if "hqq" in t)
        assert f"config.json:{line}: quantization_config.quant_method 'hqq'" in err, err
        assert "supported: fp8" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
