"""Claims about batchsim.catalog.model: derived parameter counts, weight and KV bytes,
loading, errors."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batchsim.catalog import catalog_dir, catalog_names
from batchsim.catalog.model import ModelSpec
from batchsim.catalog.model_files import load_model, model_table
from batchsim.dtypes import DTYPE_BYTES, resolve_kv_dtype
from batchsim.errors import ConfigError
from batchsim.validation import format_value
from batchsim.yamlio import read_mapping

MODEL_NAMES = catalog_names("models")
REQUIRED_MODELS = {
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "yi-34b",
    "opt-13b",
    "mixtral-8x7b",
    "deepseek-v3",
    "gpt3-175b",
}


def _raw(name: str) -> dict[str, Any]:
    return read_mapping(catalog_dir("models") / f"{name}.yaml")[0]


def _write_json(directory: Path, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------- catalog


def test_catalog_has_the_required_models() -> None:
    assert set(MODEL_NAMES) >= REQUIRED_MODELS


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_num_params_within_1_percent_of_official(name: str) -> None:
    spec = load_model(name)
    assert spec.official_num_params is not None, f"{name} has no official_num_params"
    assert spec.num_params == pytest.approx(spec.official_num_params, rel=0.01)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_catalog_number_has_a_source(name: str) -> None:
    raw = _raw(name)
    sources = raw.get("sources", {})
    numbers = [
        key
        for key, value in raw.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
    missing = [key for key in numbers if key not in sources]
    assert not missing, f"{name}: numbers without a source: {missing}"
    assert all(isinstance(v, str) and v.strip() for v in sources.values())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_catalog_name_matches_file_and_has_description(name: str) -> None:
    spec = load_model(name)
    assert spec.name == name
    assert spec.description


# --------------------------------------------------------------------------- per-layer counts


def test_llama_2_7b_per_layer_counts_are_plain_mha_swiglu() -> None:
    spec = load_model("llama-2-7b")
    h, i = 4096, 11008
    assert spec.qkv_proj_params == 3 * h * h
    assert spec.o_proj_params == h * h
    assert spec.dense_mlp_params == 3 * h * i
    assert spec.norm_params == 2 * h
    assert spec.embedding_params == 32000 * h
    assert spec.lm_head_params == 32000 * h  # untied
    assert spec.num_dense_layers == 32
    assert spec.num_params == 6_738_415_616  # sum of the HF checkpoint's tensor sizes


def test_gqa_shrinks_k_and_v_projections() -> None:
    spec = load_model("llama-2-70b")
    h, kv_out = 8192, 8 * 128
    assert spec.qkv_proj_params == h * h + 2 * h * kv_out
    assert spec.attention_type == "GQA"


def test_qwen2_has_qkv_bias() -> None:
    spec = load_model("qwen2.5-7b")
    q, kv = 28 * 128, 4 * 128
    assert spec.qkv_bias
    assert spec.qkv_proj_params == 3584 * (q + 2 * kv) + (q + 2 * kv)


def test_mixtral_counts_experts_and_router_and_no_dense_mlp() -> None:
    spec = load_model("mixtral-8x7b")
    assert spec.is_moe and not spec.is_mla
    assert spec.num_dense_layers == 0
    assert spec.dense_mlp_params == 0
    assert spec.expert_params == 3 * 4096 * 14336
    assert spec.router_params == 8 * 4096
    assert spec.shared_expert_params == 0
    # Mistral AI: 46.7B total, 12.9B active per token.
    assert spec.num_active_params == pytest.approx(12.9e9, rel=0.01)


def test_deepseek_v3_mla_and_moe_structure() -> None:
    spec = load_model("deepseek-v3")
    assert spec.is_mla and spec.is_moe
    assert spec.num_dense_layers == 3
    assert spec.num_moe_layers == 58
    assert spec.head_dim == 128 + 64
    assert spec.shared_expert_params == spec.expert_params == 3 * 7168 * 2048
    assert spec.router_params == 256 * 7168 + 256  # gate + e_score_correction_bias
    # q_a + q_a_norm + q_b + kv_a (latent + rope key) + kv_a_norm + kv_b
    expected_qkv = (
        7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)
    )
    assert spec.qkv_proj_params == expected_qkv
    assert spec.o_proj_params == 128 * 128 * 7168
    # DeepSeek: 37B activated (our count also includes embedding + lm_head, 1.9B).
    assert spec.num_active_params == pytest.approx(37e9, rel=0.02)


def test_dense_model_active_params_equal_total() -> None:
    spec = load_model("llama-3-8b")
    assert spec.num_active_params == spec.num_params


# --------------------------------------------------------------------------- bytes


def test_kv_bytes_per_token_mha_llama_2_7b() -> None:
    assert load_model("llama-2-7b").kv_bytes_per_token("fp16") == 524288


def test_kv_bytes_per_token_gqa() -> None:
    assert load_model("llama-2-70b").kv_bytes_per_token("fp16") == 327680
    assert load_model("llama-3-8b").kv_bytes_per_token("bf16") == 131072


def test_kv_bytes_per_token_mla_latent_and_fp8_halves_it() -> None:
    spec = load_model("deepseek-v3")
    assert spec.kv_bytes_per_token("bf16") == 70272
    assert spec.kv_bytes_per_token("fp8") == 70272 / 2


def test_mqa_caches_a_single_kv_head(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
    }
    spec = load_model(str(_write_json(tmp_path / "mqa", config)))
    assert spec.attention_type == "MQA"
    assert spec.kv_bytes_per_token("fp16") == 2 * 4 * 1 * 128 * 2


def test_kv_dtype_auto_follows_weights_but_int_weights_keep_fp16_cache() -> None:
    spec = load_model("llama-3-8b")
    assert resolve_kv_dtype("auto", "bf16") == "bf16"
    assert resolve_kv_dtype("auto", "fp8") == "fp8"
    assert resolve_kv_dtype("auto", "int4") == "fp16"
    assert resolve_kv_dtype("fp8", "bf16") == "fp8"
    assert spec.kv_bytes_per_token("auto", weight_dtype="int4") == spec.kv_bytes_per_token("fp16")
    assert spec.kv_bytes_per_token("auto", weight_dtype="fp8") == spec.kv_bytes_per_token("fp8")


def test_sliding_window_is_read_where_the_model_uses_one() -> None:
    assert load_model("mistral-7b").sliding_window == 4096
    assert load_model("llama-2-7b").sliding_window is None
    # Qwen2.5 configs carry sliding_window but use_sliding_window is false.
    assert load_model("qwen2.5-7b").sliding_window is None
    assert load_model("mixtral-8x7b").sliding_window is None


def test_weight_bytes_scale_with_dtype_and_int4_ignores_group_scales() -> None:
    spec = load_model("llama-2-7b")
    fp16 = spec.weight_bytes("fp16")
    assert fp16 == 2 * spec.num_params
    assert spec.weight_bytes("bf16") == fp16
    assert spec.weight_bytes("fp8") == fp16 / 2
    assert spec.weight_bytes("int8") == fp16 / 2
    assert spec.weight_bytes("int4") == fp16 / 4  # documented: scales/zeros not counted
    assert spec.weight_bytes("fp32") == 2 * fp16
    assert spec.weight_bytes("nvfp4") == fp16 * 4.5 / 16  # counted: an 8-bit scale per 16
    assert set(DTYPE_BYTES) == {"fp32", "fp16", "bf16", "fp8", "int8", "int4", "nvfp4"}


def test_unknown_dtype_lists_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="allowed: fp32, fp16, bf16, fp8, int8, int4, nvfp4"):
        load_model("llama-2-7b").weight_bytes("fp6")
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        load_model("llama-2-7b").kv_bytes_per_token("int3")


# --------------------------------------------------------------------------- HF config.json


def test_llama_style_config_json_matches_catalog(tmp_path: Path) -> None:
    raw = _raw("llama-2-7b")
    config = {k: v for k, v in raw.items() if k not in ("name", "description", "sources")}
    del config["official_num_params"]
    # Fields every real HF config has and batchsim ignores.
    config.update(
        architectures=["LlamaForCausalLM"],
        torch_dtype="float16",
        rope_scaling=None,
        bos_token_id=1,
        some_future_hf_field={"x": 1},
    )
    spec = load_model(str(_write_json(tmp_path / "Llama-2-7b-hf", config)))
    assert spec.name == "Llama-2-7b-hf"  # directory of config.json
    assert spec.num_params == load_model("llama-2-7b").num_params
    assert spec.kv_bytes_per_token("fp16") == 524288


def test_gpt2_style_config_json(tmp_path: Path) -> None:
    gpt2_small = {
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_ctx": 1024,
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "n_positions": 1024,
        "n_inner": None,
        "vocab_size": 50257,
    }
    spec = load_model(str(_write_json(tmp_path / "gpt2", gpt2_small)))
    assert spec.intermediate_size == 4 * 768
    assert spec.tie_word_embeddings
    assert spec.num_params == 124_439_808  # GPT-2 small checkpoint tensors

    gpt3 = {k: v for k, v in _raw("gpt3-175b").items() if k not in ("name", "sources")}
    spec = load_model(str(_write_json(tmp_path / "gpt3", gpt3)))
    assert spec.num_params == load_model("gpt3-175b").num_params


def test_opt_style_config_json(tmp_path: Path) -> None:
    opt_13b = {k: v for k, v in _raw("opt-13b").items() if k not in ("name", "sources")}
    spec = load_model(str(_write_json(tmp_path / "opt-13b", opt_13b)))
    assert spec.num_params == load_model("opt-13b").num_params
    assert spec.num_learned_positions == 2048 + 2

    opt_350m = {  # post-LN, word_embed_proj_dim != hidden_size: project_in/out, no final norm
        "model_type": "opt",
        "activation_function": "relu",
        "do_layer_norm_before": False,
        "ffn_dim": 4096,
        "hidden_size": 1024,
        "max_position_embeddings": 2048,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "vocab_size": 50272,
        "word_embed_proj_dim": 512,
    }
    spec = load_model(str(_write_json(tmp_path / "opt-350m", opt_350m)))
    assert spec.num_params == 331_196_416  # facebook/opt-350m checkpoint tensors


def test_deepseek_config_json_matches_catalog(tmp_path: Path) -> None:
    config = {k: v for k, v in _raw("deepseek-v3").items() if k not in ("name", "sources")}
    spec = load_model(str(_write_json(tmp_path / "DeepSeek-V3", config)))
    assert spec.num_params == load_model("deepseek-v3").num_params


def test_model_spec_is_frozen_and_hashable() -> None:
    spec = load_model("llama-2-7b")
    with pytest.raises(AttributeError):
        spec.hidden_size = 1  # type: ignore[misc]
    assert {spec: 1}[load_model("llama-2-7b")] == 1
    assert isinstance(spec, ModelSpec)


def test_model_table_has_one_row_per_catalog_model() -> None:
    rows = model_table()
    assert [row["name"] for row in rows] == MODEL_NAMES
    llama = next(row for row in rows if row["name"] == "llama-2-7b")
    assert llama["params_b"] == pytest.approx(6.74, abs=0.01)
    assert llama["kv_kib_per_token_bf16"] == 512
    assert llama["weights_gb_bf16"] == pytest.approx(13.48, abs=0.01)
    assert {"active_params_b", "layers", "hidden", "heads", "kv_heads"} <= set(llama)


# --------------------------------------------------------------------------- errors


def _llama_yaml(tmp_path: Path, **changes: Any) -> Path:
    raw = _raw("llama-2-7b")
    for key, value in changes.items():
        if value is _DROP:
            del raw[key]
        else:
            raw[key] = value
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


_DROP = object()


def _error(path: Path | str) -> str:
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_name_lists_the_builtins() -> None:
    message = _error("llama-9")
    assert "llama-9" in message
    assert "llama-2-7b" in message and "mixtral-8x7b" in message


def test_malformed_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model_type: llama\nhidden_size: [4096\n")
    message = _error(path)
    assert str(path) in message and "malformed YAML" in message


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": }')
    assert f"{path}:2: malformed JSON" in _error(path)


@pytest.mark.parametrize("value", [0, -4096, 4096.5, "wide", True])
def test_bad_value_names_file_and_key(tmp_path: Path, value: Any) -> None:
    path = _llama_yaml(tmp_path, hidden_size=value)
    message = _error(path)
    assert str(path) in message and "hidden_size" in message and format_value(value) in message


def test_unknown_key_in_yaml_is_rejected(tmp_path: Path) -> None:
    path = _llama_yaml(tmp_path, num_key_value_head=8)
    message = _error(path)
    assert str(path) in message and "num_key_value_head: unknown key" in message


def test_missing_required_key(tmp_path: Path) -> None:
    path = _llama_yaml(tmp_path, num_hidden_layers=_DROP)
    assert f"{path}: num_hidden_layers: required key is missing" in _error(path)


def test_unsupported_model_type_lists_supported(tmp_path: Path) -> None:
    message = _error(_llama_yaml(tmp_path, model_type="mamba"))
    assert "'mamba' is not supported" in message and "deepseek_v3" in message


def test_kv_heads_must_divide_heads(tmp_path: Path) -> None:
    message = _error(_llama_yaml(tmp_path, num_key_value_heads=5))
    assert "num_key_value_heads must divide num_attention_heads 32, got 5" in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert "mapping" in _error(path)


# --------------------------------------------------------------------------- number rules

_files = itertools.count()
_INT_KEYS = [
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
]
_NOT_A_SIZE = (
    st.sampled_from([math.nan, math.inf, -math.inf, True, "4096", None, [4096]])
    | st.integers(min_value=2**24 + 1)
    | st.integers(max_value=0)
    | st.floats(min_value=1.0, max_value=1e300).filter(lambda x: not x.is_integer())
    | st.floats(min_value=2.0**24 + 1, max_value=1e308)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(_INT_KEYS), value=_NOT_A_SIZE, as_json=st.booleans())
def test_any_bad_size_is_rejected_naming_its_key(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: Any, as_json: bool
) -> None:
    # Integer fields are integers in [1, 2^24], in a model YAML and in a config.json alike.
    # (null num_key_value_heads means as many KV heads as query heads, as in HF configs)
    assume(not (value is None and key == "num_key_value_heads"))
    raw = {k: v for k, v in _raw("llama-2-7b").items() if k != "sources"}
    raw[key] = value
    directory = tmp_path_factory.mktemp("models") / f"m{next(_files)}"
    if as_json:
        if isinstance(value, float) and not math.isfinite(value):
            text = json.dumps(raw)  # NaN / Infinity: what Python's json writes
        else:
            text = json.dumps(raw, allow_nan=False)
        path = directory / "config.json"
        directory.mkdir(parents=True)
        path.write_text(text)
    else:
        directory.mkdir(parents=True)
        path = directory / "m.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    message = _error(path)
    assert key in message and str(path) in message, message


def test_official_num_params_is_a_finite_number_in_range(tmp_path: Path) -> None:
    for value, expected in [
        (math.inf, "official_num_params must be a finite number, got inf"),
        (1e16, "official_num_params must be <= 1000000000000000, got 1e+16"),
        ("7B", "official_num_params must be a number, got '7B'"),
        (0, "official_num_params must be > 0, got 0"),
    ]:
        assert expected in _error(_llama_yaml(tmp_path, official_num_params=value))


def test_exponent_numbers_are_numbers_in_model_yaml(tmp_path: Path) -> None:
    text = (catalog_dir("models") / "llama-2-7b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "m.yaml"
    path.write_text(text.replace("hidden_size: 4096", "hidden_size: 4.096e3"))
    assert load_model(str(path)).num_params == load_model("llama-2-7b").num_params


def test_config_json_with_a_duplicate_key_or_deep_nesting_is_rejected(tmp_path: Path) -> None:
    raw = {k: v for k, v in _raw("llama-2-7b").items() if k not in ("name", "sources")}
    text = json.dumps(raw, indent=1).replace('"vocab_size"', '"vocab_size": 1,\n "vocab_size"')
    path = _write_json(tmp_path / "dup", {})
    path.write_text(text)
    line = text.splitlines().index(' "vocab_size": 1,') + 2
    assert f"{path}:{line}: duplicate key 'vocab_size'" in _error(path)
    path.write_text(json.dumps({**raw, "rope_scaling": {"a": [[[[[[1]]]]]]}}) + " " * 10)
    assert load_model(str(path)).hidden_size == 4096  # ignored keys may nest a little
    path.write_text('{"rope_scaling": ' * 200 + "1" + "}" * 200 + " ")
    assert "nesting deeper than 100 levels" in _error(path)
