"""Claims about the model families added to the catalog: Llama 3.1/3.2/3.3, Qwen3 (dense and
MoE), Gemma 2/3, Phi-3/4, DeepSeek-V2-Lite, gpt-oss, Qwen2.5-0.5B.

Parameter counts are checked against published totals (each with its source below), KV bytes
against hand computations from the config, the Hugging Face ``config.json`` of each family
(real files in ``tests/data/hf_configs``, sources in ``SOURCES.md`` there) against the catalog
YAML, and ``model: org/name`` against a fake local Hugging Face cache.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim import cli, deployment, simulation
from batchsim.catalog import catalog_names
from batchsim.catalog.model import ModelSpec
from batchsim.catalog.model_files import load_model, model_table
from batchsim.config import validate_experiment
from batchsim.cost.layers import LayerKernels
from batchsim.errors import ConfigError

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# Published total parameter counts (the language model only: Gemma 3's vision tower and
# gpt-oss' attention sinks excluded), each with its source.
OFFICIAL_PARAMS: dict[str, tuple[float, str]] = {
    "llama-3.1-8b": (8.03e9, "HF model page of meta-llama/Llama-3.1-8B, safetensors metadata"),
    "llama-3.1-70b": (70.55e9, "HF page of meta-llama/Meta-Llama-3-70B (same tensors as 3.1)"),
    "llama-3.1-405b": (405e9, "Llama 3 paper arXiv:2407.21783, Table 3"),
    "llama-3.2-1b": (
        1.23e9,
        "Llama 3.2 model card, https://huggingface.co/meta-llama/Llama-3.2-1B",
    ),
    "llama-3.2-3b": (
        3.21e9,
        "Llama 3.2 model card, https://huggingface.co/meta-llama/Llama-3.2-3B",
    ),
    "llama-3.3-70b": (70.55e9, "Llama 3.1 70B tensors (same config), HF safetensors metadata"),
    "qwen3-0.6b": (0.6e9, "Qwen3-0.6B model card: 0.6B, non-embedding 0.44B"),
    "qwen3-8b": (8.2e9, "Qwen3-8B model card: 8.2B, non-embedding 6.95B"),
    "qwen3-32b": (32.8e9, "Qwen3-32B model card: 32.8B, non-embedding 31.2B"),
    "qwen3-30b-a3b": (30.5e9, "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    "qwen3-235b-a22b": (235e9, "Qwen3-235B-A22B model card: 235B total, 22B activated"),
    "qwen2.5-0.5b": (0.49e9, "Qwen2.5-0.5B model card: 0.49B, non-embedding 0.36B"),
    "gemma-2-9b": (9.24e9, "HF model page of google/gemma-2-9b, safetensors metadata"),
    "gemma-2-27b": (27.2e9, "HF model page of google/gemma-2-27b, safetensors metadata"),
    "gemma-3-12b": (11.8e9, "Gemma 3 report arXiv:2503.19786 Table 1: 10.8B + 1.0B embedding"),
    "phi-3-mini-4k": (3.8e9, "Phi-3-mini-4k-instruct model card; arXiv:2404.14219"),
    "phi-4": (14.7e9, "HF model page of microsoft/phi-4, safetensors metadata"),
    "deepseek-v2-lite": (15.7e9, "DeepSeek-V2 paper arXiv:2405.04434 (Lite: 15.7B, 2.4B active)"),
    "gpt-oss-20b": (21e9, "openai/gpt-oss-20b model card: 21B, 3.6B active"),
    "gpt-oss-120b": (117e9, "openai/gpt-oss-120b model card: 117B, 5.1B active"),
}
NEW_MODELS = sorted(OFFICIAL_PARAMS)


def _config(folder: str) -> dict[str, Any]:
    return json.loads((HF_CONFIGS / folder / "config.json").read_text(encoding="utf-8"))


def _write_json(directory: Path, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _architecture(spec: ModelSpec, **replace: Any) -> dict[str, Any]:
    """Every field that shapes the model (catalog metadata left out)."""
    meta = {"name", "description", "official_num_params", "sources"}
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    fields.update(replace)
    return {k: v for k, v in fields.items() if k not in meta}


# --------------------------------------------------------------------------- catalog


def test_every_new_model_is_in_the_catalog_and_listed(capsys) -> None:
    assert set(NEW_MODELS) <= set(catalog_names("models"))
    assert cli.main(["list", "models"]) == 0
    printed = capsys.readouterr().out
    lines = {line.split()[0]: line for line in printed.splitlines()[1:] if line.strip()}
    assert set(NEW_MODELS) <= set(lines)
    # a hybrid model shows its window and how many layers use it
    assert "4096 on 21/42 layers" in lines["gemma-2-9b"]
    assert "1024 on 40/48 layers" in lines["gemma-3-12b"]
    assert "128 on 18/36 layers" in lines["gpt-oss-120b"]


@pytest.mark.parametrize("name", NEW_MODELS)
def test_param_count_within_2_percent_of_the_published_total(name: str) -> None:
    official, _source = OFFICIAL_PARAMS[name]
    spec = load_model(name)
    assert spec.official_num_params == official  # the catalog cites the same number
    assert spec.num_params == pytest.approx(official, rel=0.02)


def test_active_params_of_the_moe_models_match_their_cards() -> None:
    # batchsim's active count includes the input embedding table; the Qwen cards count it
    # too, the gpt-oss and DeepSeek cards leave it out (their lm_head is in).
    cases = {
        "qwen3-30b-a3b": (3.3e9, 0),
        "qwen3-235b-a22b": (22e9, 0),
        "gpt-oss-20b": (3.6e9, 201088 * 2880),
        "gpt-oss-120b": (5.1e9, 201088 * 2880),
        "deepseek-v2-lite": (2.4e9, 102400 * 2048),
    }
    for name, (active, embedding) in cases.items():
        spec = load_model(name)
        assert spec.num_active_params - embedding == pytest.approx(active, rel=0.03), name


# --------------------------------------------------------------------------- structure


def test_qwen3_has_explicit_head_dim_and_per_head_q_k_norms() -> None:
    spec = load_model("qwen3-32b")
    h, q, kv = 5120, 64 * 128, 8 * 128  # 64 x 128 = 8192 > hidden 5120
    assert spec.head_dim == 128 and spec.qk_norm and not spec.qkv_bias
    assert spec.qkv_proj_params == h * (q + 2 * kv)
    assert spec.o_proj_params == q * h
    assert spec.norm_params == 2 * h + 2 * 128  # input/post-attention + q_norm/k_norm


def test_qwen3_moe_routes_every_layer_without_shared_experts() -> None:
    spec = load_model("qwen3-30b-a3b")
    assert spec.is_moe and spec.num_dense_layers == 0 and spec.num_moe_layers == 48
    assert spec.expert_params == 3 * 2048 * 768
    assert spec.router_params == 128 * 2048
    assert spec.shared_expert_params == 0
    assert spec.dense_mlp_params == 0  # intermediate_size 6144 describes no layer here


def test_qwen3_moe_dense_layers_from_mlp_only_layers_and_sparse_step(tmp_path: Path) -> None:
    config = _config("Qwen3-Coder-30B-A3B")
    # layers 1, 3, 5, ... route ((i + 1) % 2 == 0), except 3 and 7: 24 - 2 = 22 MoE layers
    config.update(decoder_sparse_step=2, mlp_only_layers=[3, 7, 8])
    spec = load_model(str(_write_json(tmp_path / "q", config)))
    assert spec.num_moe_layers == 22 and spec.num_dense_layers == 26
    h, dense, experts = 2048, 3 * 2048 * 5472, 128 * 3 * 2048 * 768 + 128 * 2048
    attention = h * (32 * 128 + 2 * 4 * 128) + 32 * 128 * h + 2 * h + 2 * 128
    expected = 48 * attention + 26 * dense + 22 * experts + 2 * 151936 * h + h
    assert spec.num_params == expected
    config["mlp_only_layers"] = [48]
    message = _error(_write_json(tmp_path / "bad", config))
    assert "mlp_only_layers entries are layer indices" in message and "<= 47" in message


def test_gemma2_has_four_norms_tied_embeddings_and_wide_heads() -> None:
    spec = load_model("gemma-2-9b")
    h = 3584
    assert spec.head_dim == 256 and h != 16 * 256
    assert spec.o_proj_params == 16 * 256 * h
    assert spec.norm_params == 4 * h and not spec.qk_norm
    assert spec.tie_word_embeddings and spec.lm_head_params == 0
    assert spec.embedding_params == 256000 * h
    assert spec.sliding_window is None  # hybrid: the engine's single window stays off
    assert (spec.hybrid_sliding_window, spec.num_sliding_layers) == (4096, 21)


def test_gemma3_adds_q_k_norms_and_slides_five_layers_of_six() -> None:
    spec = load_model("gemma-3-12b")
    assert spec.qk_norm and spec.norm_params == 4 * 3840 + 2 * 256
    # layers 0-4 slide, 5 is global, ...: 48 - 48 // 6 = 40 sliding layers
    assert (spec.hybrid_sliding_window, spec.num_sliding_layers) == (1024, 40)


def test_gpt_oss_counts_biases_of_attention_experts_and_router() -> None:
    spec = load_model("gpt-oss-20b")
    h, w = 2880, 2880
    q, kv = 64 * 64, 8 * 64
    assert spec.qkv_proj_params == h * (q + 2 * kv) + (q + 2 * kv)
    assert spec.o_proj_params == q * h + h
    assert spec.expert_params == 3 * h * w + 2 * w + h  # gate_up + its bias, down + its bias
    assert spec.router_params == 32 * h + 32
    assert spec.num_dense_layers == 0 and spec.num_experts_per_tok == 4
    assert (spec.hybrid_sliding_window, spec.num_sliding_layers) == (128, 12)
    # published exact total (gpt-oss model card, arXiv:2508.10925): 20.91B
    assert spec.num_params == pytest.approx(20.91e9, abs=0.005e9)


def test_deepseek_v2_lite_mla_without_query_compression() -> None:
    spec = load_model("deepseek-v2-lite")
    h, heads = 2048, 16
    assert spec.is_mla and spec.q_lora_rank is None
    expected_qkv = h * heads * (128 + 64) + h * (512 + 64) + 512 + 512 * heads * (128 + 128)
    assert spec.qkv_proj_params == expected_qkv
    assert spec.num_dense_layers == 1 and spec.num_moe_layers == 26
    assert spec.shared_expert_params == 2 * 3 * h * 1408
    assert spec.router_params == 64 * h  # greedy top-k: no correction bias


def test_phi3_reads_its_window_and_fused_projections_as_plain_shapes() -> None:
    mini = load_model("phi-3-mini-4k")
    assert mini.sliding_window == 2047 and mini.attention_type == "MHA"
    assert mini.qkv_proj_params == 3 * 3072 * 3072  # qkv_proj (3072 -> 9216) of HF
    assert mini.dense_mlp_params == 3 * 3072 * 8192  # gate_up_proj (-> 16384) + down_proj
    phi4 = load_model("phi-4")
    assert phi4.sliding_window is None and phi4.attention_type == "GQA"


def test_gemma_and_qwen3_norm_kernels_in_the_cost_model() -> None:
    gemma = LayerKernels.from_model(load_model("gemma-2-9b"), 1)
    assert gemma.norms.launches == 4 and gemma.norms.elems == 2 * 4 * 3584
    assert gemma.latent_norms.launches == 0
    qwen = LayerKernels.from_model(load_model("qwen3-8b"), 2)
    assert qwen.latent_norms.launches == 2  # q_norm, k_norm
    assert qwen.latent_norms.elems == 2 * (16 + 4) * 128  # 32/2 query, 8/2 KV heads per GPU
    llama = LayerKernels.from_model(load_model("llama-3-8b"), 1)
    assert llama.norms.launches == 2 and llama.norms.elems == 4 * 4096


# --------------------------------------------------------------------------- KV bytes


def test_kv_bytes_per_token_gqa_by_hand() -> None:
    # 2 (K, V) x layers x KV heads x head_dim x 2 bytes
    assert load_model("qwen3-8b").kv_bytes_per_token("bf16") == 2 * 36 * 8 * 128 * 2
    assert load_model("llama-3.2-1b").kv_bytes_per_token("bf16") == 2 * 16 * 8 * 64 * 2
    assert load_model("qwen3-235b-a22b").kv_bytes_per_token("fp8") == 2 * 94 * 4 * 128 * 1
    assert load_model("phi-3-mini-4k").kv_bytes_per_token("fp16") == 2 * 32 * 32 * 96 * 2


def test_kv_bytes_per_token_mla_by_hand() -> None:
    # latent (kv_lora_rank) + decoupled RoPE key per layer
    assert load_model("deepseek-v2-lite").kv_bytes_per_token("bf16") == 27 * (512 + 64) * 2


def test_hybrid_models_charge_every_layer_per_token_and_hold_the_window_exactly() -> None:
    gemma = load_model("gemma-2-9b")
    per_layer = 2 * 8 * 256 * 2  # K and V of 8 heads of 256, bf16
    assert gemma.kv_bytes_per_token("bf16") == 42 * per_layer  # what the engine charges
    # exact footprint: 21 full layers keep every token, 21 sliding layers at most 4096
    assert gemma.kv_bytes(1000, "bf16") == 42 * 1000 * per_layer
    assert gemma.kv_bytes(8192, "bf16") == (21 * 8192 + 21 * 4096) * per_layer
    oss = load_model("gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2
    assert oss.kv_bytes(100_000, "bf16") == (18 * 100_000 + 18 * 128) * per_layer
    g3 = load_model("gemma-3-12b")
    assert g3.kv_bytes(32768, "fp8") == (8 * 32768 + 40 * 1024) * 2 * 8 * 256


def test_uniform_window_caps_every_layer() -> None:
    mistral = load_model("mistral-7b")
    per_token = mistral.kv_bytes_per_token("bf16")
    assert mistral.kv_bytes(10_000, "bf16") == 4096 * per_token
    assert load_model("llama-3-8b").kv_bytes(10_000, "bf16") == 10_000 * 131072


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(catalog_names("models")), n=st.integers(0, 300_000))
def test_kv_bytes_is_a_monotone_lower_bound_of_the_per_token_charge(name: str, n: int) -> None:
    spec = load_model(name)
    full = n * spec.kv_bytes_per_token("bf16")
    held = spec.kv_bytes(n, "bf16")
    assert 0 <= held <= full
    assert spec.kv_bytes(n + 1, "bf16") >= held
    window = spec.sliding_window or spec.hybrid_sliding_window
    if window is None or n <= window:
        assert held == full


# --------------------------------------------------------------------------- HF config.json

FIXTURES = [
    # (fixture folder, catalog model, fields the fixture's release differs in)
    ("Llama-3.2-1B", "llama-3.2-1b", {}),
    ("Qwen3-8B", "qwen3-8b", {}),
    ("Qwen3-Coder-30B-A3B", "qwen3-30b-a3b", {"intermediate_size": 5472, "max_pos": 262144}),
    ("gemma-2-9b-it", "gemma-2-9b", {}),
    ("gemma-3-12b-it", "gemma-3-12b", {}),
    ("gemma-3-12b-it-release-format", "gemma-3-12b", {}),
    ("Phi-3-mini-4k-instruct", "phi-3-mini-4k", {}),
    ("phi-4", "phi-4", {}),
    ("DeepSeek-V2-Lite-Chat", "deepseek-v2-lite", {}),
    ("gpt-oss-20b", "gpt-oss-20b", {}),
]


@pytest.mark.parametrize(("folder", "name", "differs"), FIXTURES)
def test_hf_config_json_gives_the_catalog_spec(
    folder: str, name: str, differs: dict[str, int]
) -> None:
    from_json = load_model(str(HF_CONFIGS / folder / "config.json"))
    catalog = load_model(name)
    assert from_json.name == folder  # named after its directory
    replace = {
        "intermediate_size": differs.get("intermediate_size", catalog.intermediate_size),
        "max_position_embeddings": differs.get("max_pos", catalog.max_position_embeddings),
    }
    assert _architecture(from_json) == _architecture(catalog, **replace)
    assert from_json.num_params == catalog.num_params  # none of those fields holds weights


def test_gemma3_config_without_text_config_is_rejected(tmp_path: Path) -> None:
    config = _config("gemma-3-12b-it")
    del config["text_config"]
    message = _error(_write_json(tmp_path / "g", config))
    assert "text_config must be a mapping" in message


def test_errors_inside_text_config_name_the_nested_key(tmp_path: Path) -> None:
    config = _config("gemma-3-12b-it")
    config["text_config"]["hidden_size"] = -1
    path = _write_json(tmp_path / "g", config)
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    message = _error(path)
    assert "text_config.hidden_size must be >= 1, got -1" in message
    line = path.read_text().splitlines().index('  "hidden_size": -1,') + 1
    assert f"{path}:{line}:" in message


@pytest.mark.parametrize(
    ("layer_types", "expected"),
    [
        (["sliding_attention", "full_attention"] * 11, "one entry per layer"),
        (["chunked_attention"] * 24, "unsupported layer type 'chunked_attention'"),
        ("sliding_attention", "must be a list"),
    ],
)
def test_bad_layer_types_are_rejected(tmp_path: Path, layer_types: Any, expected: str) -> None:
    config = _config("gpt-oss-20b")
    config["layer_types"] = layer_types
    message = _error(_write_json(tmp_path / "o", config))
    assert "layer_types" in message and expected in message


def test_layer_types_decide_which_layers_slide(tmp_path: Path) -> None:
    config = _config("gpt-oss-20b")
    config["layer_types"] = ["sliding_attention"] * 20 + ["full_attention"] * 4
    spec = load_model(str(_write_json(tmp_path / "a", config)))
    assert (spec.hybrid_sliding_window, spec.num_sliding_layers) == (128, 20)
    config["layer_types"] = ["sliding_attention"] * 24  # every layer: one window for all
    spec = load_model(str(_write_json(tmp_path / "b", config)))
    assert (spec.sliding_window, spec.num_sliding_layers) == (128, 0)
    config["layer_types"] = ["full_attention"] * 24
    spec = load_model(str(_write_json(tmp_path / "c", config)))
    assert spec.sliding_window is None and not spec.is_hybrid_attention


def test_qwen_sliding_window_from_max_window_layers(tmp_path: Path) -> None:
    # HF Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on slide
    config = _config("Qwen3-8B")
    config.update(use_sliding_window=True, sliding_window=4096, max_window_layers=28)
    spec = load_model(str(_write_json(tmp_path / "q", config)))
    assert (spec.hybrid_sliding_window, spec.num_sliding_layers) == (4096, 36 - 28)
    config["max_window_layers"] = 0
    spec = load_model(str(_write_json(tmp_path / "all", config)))
    assert spec.sliding_window == 4096 and not spec.is_hybrid_attention
    config.update(sliding_window=None)
    assert "sliding_window is null" in _error(_write_json(tmp_path / "null", config))


def test_a_window_as_long_as_the_context_is_no_window(tmp_path: Path) -> None:
    config = _config("Phi-3-mini-4k-instruct")
    config["sliding_window"] = 4096  # = max_position_embeddings: never cuts anything
    assert load_model(str(_write_json(tmp_path / "p", config))).sliding_window is None


# --------------------------------------------------------------------------- org/name


def _error(path: Path | str) -> str:
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    message = str(info.value)
    assert "\n" not in message
    return message


def _fake_hf_cache(root: Path, repo_id: str, config: dict[str, Any]) -> Path:
    """The layout huggingface_hub downloads into: refs/main names a snapshot folder."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    return _write_json(repo / "snapshots" / commit, config)


def test_repo_id_without_huggingface_hub_says_how_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    message = _error("Qwen/Qwen3-8B")
    assert message.startswith("model: 'Qwen/Qwen3-8B' is neither a built-in model nor a file")
    assert "pip install huggingface_hub" in message


def test_existing_paths_and_file_names_are_not_repo_ids(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert "file not found: org/model.yaml" in _error("org/model.yaml")
    _write_json(tmp_path / "Qwen" / "Qwen3-8B", _config("Qwen3-8B"))  # a directory
    assert "model: file not found: Qwen/Qwen3-8B" in _error("Qwen/Qwen3-8B")
    path = _write_json(tmp_path / "local", _config("Qwen3-8B"))
    assert load_model(str(path.relative_to(tmp_path))).name == "local"


@pytest.fixture
def hf_cache(monkeypatch, tmp_path) -> Path:
    """An empty Hugging Face cache that huggingface_hub uses (skipped without the library)."""
    pytest.importorskip("huggingface_hub")
    constants = importlib.import_module("huggingface_hub.constants")
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at import time
    monkeypatch.chdir(tmp_path)
    return cache


def test_repo_id_resolves_through_the_local_cache(hf_cache: Path) -> None:
    _fake_hf_cache(hf_cache, "Qwen/Qwen3-8B", _config("Qwen3-8B"))
    spec = load_model("Qwen/Qwen3-8B")
    assert spec.name == "Qwen/Qwen3-8B"
    assert _architecture(spec) == _architecture(load_model("qwen3-8b"))


def test_repo_id_not_in_the_cache_says_how_to_download(hf_cache: Path) -> None:
    message = _error("google/gemma-2-9b")
    assert f"google/gemma-2-9b is not in the local Hugging Face cache ({hf_cache})" in message
    assert "hf download google/gemma-2-9b config.json" in message


def test_experiment_with_a_repo_id_runs(hf_cache: Path) -> None:
    _fake_hf_cache(hf_cache, "microsoft/phi-4", _config("phi-4"))
    data = _smoke_experiment("microsoft/phi-4", "h100-sxm", 1)
    result = simulation.simulate(validate_experiment(data))
    assert result.summary["completed"] == 6


# --------------------------------------------------------------------------- runs

# hardware and tensor parallelism that hold each model's bf16 weights (fp8 for 405B)
RUN_SETUPS: dict[str, tuple[str, int, str]] = {
    "llama-3.1-70b": ("h100-sxm", 4, "bf16"),
    "llama-3.3-70b": ("h100-sxm", 4, "bf16"),
    "llama-3.1-405b": ("h200", 8, "fp8"),
    "qwen3-32b": ("h100-sxm", 2, "bf16"),
    "qwen3-30b-a3b": ("h100-sxm", 2, "bf16"),
    "qwen3-235b-a22b": ("h100-sxm", 8, "bf16"),
    "gemma-2-27b": ("h100-sxm", 2, "bf16"),
    "gpt-oss-20b": ("h100-sxm", 1, "bf16"),
    "gpt-oss-120b": ("h100-sxm", 4, "bf16"),
}


def _smoke_experiment(model: str, hardware: str, tp: int, dtype: str = "bf16") -> dict[str, Any]:
    return {
        "name": "smoke",
        "seed": 0,
        "hardware": hardware,
        "model": model,
        "parallel": {"tensor_parallel_size": tp},
        "engine": {"dtype": dtype},
        "scheduler": {"policy": "continuous", "max_num_seqs": 8},
        "workload": {
            "num_requests": 6,
            "arrival": {"process": "poisson", "rate": 20.0},
            "prompt_tokens": {"dist": "uniform", "min": 16, "max": 160},
            "output_tokens": {"dist": "uniform", "min": 2, "max": 12},
        },
    }


@pytest.mark.parametrize("name", NEW_MODELS)
def test_short_experiment_runs_with_each_new_model(name: str) -> None:
    hardware, tp, dtype = RUN_SETUPS.get(name, ("a100-80gb", 1, "bf16"))
    config = validate_experiment(_smoke_experiment(name, hardware, tp, dtype))
    setup = deployment.engine_setup(config)
    model = setup.model
    if model.is_hybrid_attention:  # run with full attention on every layer: no engine window
        assert model.sliding_window is None
    assert setup.cost_model.kv_bytes_per_token_per_gpu >= (
        model.kv_bytes_per_token(dtype) / tp  # KV heads replicated when fewer than tp
    )
    result = simulation.simulate(config)
    assert result.summary["completed"] == 6
    assert result.summary["num_rejected"] == 0
    assert result.summary["total_output_tokens"] > 0


def test_model_table_rows_of_new_models() -> None:
    rows = {row["name"]: row for row in model_table()}
    assert rows["qwen3-30b-a3b"]["experts"] == "8/128"
    assert rows["gpt-oss-20b"]["experts"] == "4/32"
    assert rows["deepseek-v2-lite"]["attention"] == "MLA"
    assert rows["phi-3-mini-4k"]["sliding_window"] == 2047
