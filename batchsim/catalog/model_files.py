"""Reading model descriptions: :func:`load_model`, :func:`list_models` and :func:`model_table`.

A model is described by a built-in catalog YAML, a user YAML, a Hugging Face ``config.json``
(its fields are read by :mod:`batchsim.catalog.hf_config`), or a Hugging Face repo id found in
the local Hugging Face cache (see :mod:`batchsim.catalog.hf_cache`). Owns the catalog's own
keys (name, description, official parameter count, sources), the strict reading of a YAML file
(no unknown key but the Hugging Face fields of :data:`IGNORED_HF_KEYS`), the checks across
fields, and the cache of what was read.

Must not import anything from batchsim except :mod:`batchsim.errors`, :mod:`batchsim.catalog`,
:mod:`batchsim.yamlio` (the one file reader) and :mod:`batchsim.validation` (the number rules):
the config loader, the simulation and the CLI build on this module.

Every integer field is an integer in [1, 2^24] (widths, layers, heads, experts, vocabulary,
context length; a few counts may be 0), ``official_num_params`` a finite number in
(0, 1e15].
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchsim.catalog import catalog_names, hf_cache, resolve
from batchsim.catalog.hf_config import _Reader, read_fields
from batchsim.catalog.model import ModelSpec
from batchsim.catalog.quantization import checkpoint_precision
from batchsim.errors import ConfigError
from batchsim.validation import number_problem
from batchsim.yamlio import line_of, read_mapping

__all__ = ["IGNORED_HF_KEYS", "list_models", "load_model", "model_table"]

# Keys of catalog YAML that are not Hugging Face config fields.
_META_KEYS = frozenset({"name", "description", "official_num_params", "sources"})

# Hugging Face config fields that exist in real config.json files but do not change parameter
# counts or KV bytes (tokens ids, eps, RoPE settings, dropout, routing details...). A catalog YAML
# may carry them; any other key of a YAML file is rejected as a likely typo. (A config.json is
# read leniently: unknown keys are ignored there because HF adds fields all the time.)
IGNORED_HF_KEYS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "torch_dtype",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "prefix",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "initializer_range",
        "init_std",
        "use_cache",
        "rope_theta",
        "rope_scaling",
        "rope_interleave",
        "pretraining_tp",
        "attention_dropout",
        "dropout",
        "activation_dropout",
        "attn_pdrop",
        "resid_pdrop",
        "embd_pdrop",
        "layerdrop",
        "max_window_layers",
        "router_aux_loss_coef",
        "output_router_logits",
        "router_jitter_noise",
        "aux_loss_alpha",
        "seq_aux",
        "norm_topk_prob",
        "n_group",
        "topk_group",
        "routed_scaling_factor",
        "scoring_func",
        "ep_size",
        "num_nextn_predict_layers",
        "n_ctx",
        "scale_attn_weights",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
        "reorder_and_upcast_attn",
        "scale_attn_by_inverse_layer_idx",
        "task_specific_params",
        "_remove_final_layer_norm",
        "layer_norm_elementwise_affine",
        # Qwen3, Gemma 2/3, Phi-3, gpt-oss fields without effect on parameters or KV bytes:
        # attention scaling and logit soft-capping, local RoPE base, HF cache class, MoE
        # activation clamp, original context of a RoPE extension, MoE aux-loss details.
        "query_pre_attn_scalar",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "cache_implementation",
        "rope_local_base_freq",
        "rope_parameters",
        "original_max_position_embeddings",
        "swiglu_limit",
        "initial_context_length",
        "sliding_window_size",
        "use_qk_norm",
        "use_bidirectional_attention",
        "dtype",
        # Keys of a multimodal Gemma 3 config besides its text_config (vision tower: not counted)
        "vision_config",
        "mm_tokens_per_image",
        "boi_token_index",
        "eoi_token_index",
        "image_token_index",
    }
)

NUMERIC_HF_KEYS = frozenset(
    {
        "rope_theta",
        "rope_local_base_freq",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "initializer_range",
        "init_std",
        "attention_dropout",
        "dropout",
        "activation_dropout",
        "attn_pdrop",
        "resid_pdrop",
        "embd_pdrop",
        "layerdrop",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "aux_loss_alpha",
        "routed_scaling_factor",
        "query_pre_attn_scalar",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "swiglu_limit",
        "original_max_position_embeddings",
        "initial_context_length",
        "sliding_window_size",
        "n_ctx",
        "max_window_layers",
        "n_group",
        "topk_group",
        "ep_size",
        "num_nextn_predict_layers",
        "pretraining_tp",
    }
)
"""Keys of :data:`IGNORED_HF_KEYS` that Hugging Face defines as numbers: their values are
not used, but a value that is not a number (or null) is refused like a NaN is."""
TOKEN_ID_KEYS = frozenset({"bos_token_id", "eos_token_id", "pad_token_id"})
"""Keys of :data:`IGNORED_HF_KEYS` holding a token id, a list of them, or null."""

MAX_NUM_PARAMS = 1e15
"""Largest ``official_num_params``."""


def _check_ignored_numbers(r: _Reader) -> None:
    """The ignored HF keys that hold numbers hold numbers (or null): ``rope_theta: "abc"``
    is an error, as ``rope_theta: .nan`` is."""
    for key in sorted(NUMERIC_HF_KEYS & set(r.data)):
        value = r.data[key]
        if value is not None and (problem := number_problem(value)) is not None:
            raise r.error(key, f"{problem} (or null)")
    for key in sorted(TOKEN_ID_KEYS & set(r.data)):
        value = r.data[key]
        ids = value if isinstance(value, list) else [value]
        if value is not None and any(number_problem(v, integer=True, ge=0) for v in ids):
            raise r.error(key, f"must be a token id >= 0, a list of them or null, got {value!r}")


def _spec_from_mapping(
    data: Mapping[str, Any], source: str, text: str, default_name: str, strict: bool
) -> ModelSpec:
    """Build a ModelSpec from HF config fields (+ catalog meta keys)."""
    r = _Reader(data, source, text)
    model_type, fields = read_fields(r)
    _check_ignored_numbers(r)
    inner = data.get("text_config")
    if isinstance(inner, Mapping):  # a multimodal config's language model
        _check_ignored_numbers(_Reader(inner, source, text, ("text_config",)))

    # Catalog meta keys.
    name = r.str_("name", default=default_name)
    description = r.str_("description", default="")
    official = data.get("official_num_params")
    if official is not None:
        problem = number_problem(official, gt=0, le=MAX_NUM_PARAMS)
        if problem is not None:
            raise r.error("official_num_params", problem)
    sources = data.get("sources") or {}
    if not isinstance(sources, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in sources.items()
    ):
        raise r.error("sources", "must be a mapping of key -> source text")

    weights = kv_dtype = None
    if data.get("quantization_config") is not None:
        r.used.add("quantization_config")
        weights, kv_dtype = checkpoint_precision(
            data["quantization_config"],
            lambda key, message: _quantization_error(r, key, message),
        )
    if strict:
        unknown = sorted(set(data) - r.used - _META_KEYS - IGNORED_HF_KEYS)
        if unknown:
            known = ", ".join(sorted(r.used | _META_KEYS))
            raise ConfigError(
                f"{unknown[0]}: unknown key for model_type {model_type}; known keys: {known}",
                source,
                line_of(text, (unknown[0],)),
            )

    spec = ModelSpec(
        name=name,
        model_type=model_type,
        checkpoint_dtype=weights,
        checkpoint_kv_cache_dtype=kv_dtype,
        description=description,
        official_num_params=float(official) if official is not None else None,
        sources=dict(sources),
        **fields,
    )
    _check_consistency(spec, r)
    return spec


def _quantization_error(r: _Reader, key: str, message: str) -> ConfigError:
    """The error about ``key`` (dotted, "" for the block itself) of ``quantization_config``."""
    path = ("quantization_config", *(key.split(".") if key else ()))
    return ConfigError(f"{'.'.join(path)} {message}", r.source, line_of(r.text, path))


def _check_consistency(spec: ModelSpec, r: _Reader) -> None:
    if not spec.is_mla and spec.num_attention_heads % spec.num_key_value_heads:
        raise r.error(
            "num_key_value_heads",
            f"must divide num_attention_heads {spec.num_attention_heads}, "
            f"got {spec.num_key_value_heads}",
        )
    if spec.is_moe:
        experts = spec.num_local_experts or 0
        key = "num_experts_per_tok"
        if not 1 <= spec.num_experts_per_tok <= experts:
            raise r.error(key, f"must be between 1 and {experts}, got {spec.num_experts_per_tok}")


@functools.lru_cache(maxsize=64)
def _load_path(path: str, mtime_ns: int, repo_id: str | None = None) -> ModelSpec:
    file = Path(path)
    data, text = read_mapping(file)
    is_hf_json = file.suffix == ".json"
    if "name" in data:
        default_name = str(data["name"])
    elif repo_id is not None:
        default_name = repo_id
    elif is_hf_json and file.stem == "config":
        default_name = file.resolve().parent.name
    else:
        default_name = file.stem
    return _spec_from_mapping(data, path, text, default_name, strict=not is_hf_json)


def load_model(name_or_path: str, key: str = "model") -> ModelSpec:
    """Load a model by built-in name, YAML path, Hugging Face ``config.json`` path, or Hugging
    Face repo id (``org/name``, not an existing path) found in the local Hugging Face cache.

    A YAML file is read strictly (unknown keys are errors, except the HF fields in
    :data:`IGNORED_HF_KEYS`); a ``.json`` file is read as a HF config and its unknown keys are
    ignored. A repo id needs ``huggingface_hub`` and the repo's ``config.json`` in the cache
    (:func:`batchsim.catalog.hf_cache.cached_config`; no download); the model is named after
    the repo id. Results are cached per file and modification time.

    Args:
        name_or_path: ``llama-2-7b``, ``my/model.yaml``, ``path/to/config.json`` or
            ``Qwen/Qwen3-8B``.
        key: Config key that held the value, for error messages.

    Raises:
        ConfigError: Unknown name (lists the built-ins), unreadable or malformed file, missing,
            wrong-typed or out-of-range field, unsupported ``model_type``, repo id without
            ``huggingface_hub`` or not in the cache. The message is one line naming the file
            and the key.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError(f"{key}: expected a model name or a file path, got {name_or_path!r}")
    repo_id = None
    if hf_cache.looks_like_repo_id(name_or_path):
        repo_id = name_or_path
        path = hf_cache.cached_config(repo_id, key)
    else:
        path = resolve("models", name_or_path, key)
    return _load_path(str(path), path.stat().st_mtime_ns, repo_id)


def list_models() -> list[ModelSpec]:
    """Every built-in model, sorted by name."""
    return [load_model(name) for name in catalog_names("models")]


def model_table() -> list[dict[str, Any]]:
    """One row of key numbers per built-in model, for ``batchsim list models``.

    Keys: name, description, params_b, active_params_b, official_params_b, layers, hidden,
    heads, kv_heads, attention, experts, kv_kib_per_token_bf16 (every layer at full length:
    what the engine charges per cached token), weights_gb_bf16 (decimal GB), sliding_window
    (the window of every layer, or ``"W on S/L layers"`` for a hybrid model), max_context,
    checkpoint_dtype (the weight dtype of a quantized release, :mod:`batchsim.catalog.
    quantization`; None: 16-bit).
    """
    return [spec.summary() for spec in list_models()]
