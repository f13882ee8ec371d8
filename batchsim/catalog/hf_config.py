"""Hugging Face ``config.json`` fields: the model types batchsim reads and how each family's
fields become :class:`~batchsim.catalog.model.ModelSpec` fields.

Owns :func:`read_fields` (a Llama / Mistral / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral / Phi-3 /
Gemma 2 / Gemma 3 / gpt-oss / DeepSeek-V2/V3 / OPT / GPT-2-style config: the per-layer widths,
heads, experts, MLA ranks, sliding-window layers, norms and biases), the defaults of fields real
configs omit, and :class:`_Reader`, the typed access to a config mapping that remembers which
keys were read and names a key's file and line in errors. Every integer field is an integer in
[1, :data:`MAX_MODEL_INT`] (a few counts may be 0).

Imports nothing from batchsim but :mod:`batchsim.errors`, :mod:`batchsim.yamlio` (line numbers)
and :mod:`batchsim.validation` (the number rules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchsim.errors import ConfigError
from batchsim.validation import format_value, number_problem
from batchsim.yamlio import line_of

__all__ = ["LAYER_TYPES", "SUPPORTED_MODEL_TYPES", "read_fields"]

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "phi3",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gpt_oss",
    "deepseek_v2",
    "deepseek_v3",
    "opt",
    "gpt2",
)
"""Values of ``model_type`` that :func:`~batchsim.catalog.model_files.load_model` understands
(``gemma3``: the multimodal config, whose ``text_config`` describes the language model; the
vision tower is not counted)."""

_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3")
_QWEN = ("qwen2", "qwen3", "qwen3_moe")
_GEMMA = ("gemma2", "gemma3_text")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
LAYER_TYPES = ("full_attention", "sliding_attention")
"""Values of a config's ``layer_types`` list that
:func:`~batchsim.catalog.model_files.load_model` understands."""

_REQUIRED = object()

MAX_MODEL_INT = 2**24
"""Largest value of an integer field of a model (16,777,216)."""


class _Reader:
    """Typed access to a config mapping that remembers which keys were read.

    ``prefix``: the keys above ``data`` in the file (``("text_config",)`` for the language
    model of a multimodal Gemma 3 config), for messages and line numbers.
    """

    def __init__(
        self, data: Mapping[str, Any], source: str, text: str, prefix: tuple[str, ...] = ()
    ):
        self.data = data
        self.source = source
        self.text = text
        self.prefix = prefix
        self.used: set[str] = set()

    def name(self, key: str) -> str:
        return ".".join((*self.prefix, key))

    def line(self, key: str) -> int | None:
        return line_of(self.text, (*self.prefix, key))

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.name(key)} {message}", self.source, self.line(key))

    def int_(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        """An integer >= ``minimum``; ``default`` when missing or null (required if not given)."""
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            if default is _REQUIRED:
                present = "is null" if key in self.data else "is missing"
                raise ConfigError(
                    f"{self.name(key)}: required key {present}", self.source, self.line(key)
                )
            return default
        problem = number_problem(value, integer=True, ge=minimum, le=MAX_MODEL_INT)
        if problem is not None:
            raise self.error(key, problem)
        return int(value)

    def bool_(self, key: str, default: bool) -> bool:
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {format_value(value)}")
        return value

    def str_(self, key: str, default: Any = _REQUIRED) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            if default is _REQUIRED:
                raise ConfigError(
                    f"{self.name(key)}: required key is missing", self.source, self.line(key)
                )
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {format_value(value)}")
        return value

    def list_(self, key: str, length: int | None = None) -> list[Any] | None:
        """A list (None when missing or null), of ``length`` items when given."""
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(key, f"must be a list, got {format_value(value)}")
        if length is not None and len(value) != length:
            raise self.error(
                key, f"must have one entry per layer (num_hidden_layers={length}), got {len(value)}"
            )
        return value


def read_fields(r: _Reader) -> tuple[str, dict[str, Any]]:
    """The ``model_type`` of a config and its :class:`~batchsim.catalog.model.ModelSpec` fields,
    but for the catalog's own keys (name, description, official parameter count, sources).

    A multimodal Gemma 3 config is read as its language model, ``text_config``: its model type
    is then ``gemma3_text``.

    Raises:
        ConfigError: ``model_type`` missing or not in :data:`SUPPORTED_MODEL_TYPES`, a missing,
            wrong-typed or out-of-range field. The message names the file, the key and its line.
    """
    model_type = r.str_("model_type", default=None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        allowed = ", ".join(SUPPORTED_MODEL_TYPES)
        what = "is missing" if model_type is None else f"{model_type!r} is not supported"
        raise ConfigError(
            f"model_type {what}; supported: {allowed}", r.source, line_of(r.text, ("model_type",))
        )

    if model_type in _LLAMA_FAMILY:
        fields = _llama_family(r, model_type)
    elif model_type in _GEMMA:
        fields = _gemma(r, model_type)
    elif model_type == "gemma3":
        # Multimodal Gemma 3: the language model is the text_config (a gemma3_text config).
        text_config = r.data.get("text_config")
        r.used.add("text_config")
        if not isinstance(text_config, Mapping):
            raise r.error("text_config", "must be a mapping: the language model's config")
        fields = _gemma(_Reader(text_config, r.source, r.text, ("text_config",)), "gemma3_text")
        model_type = "gemma3_text"
    elif model_type == "gpt_oss":
        fields = _gpt_oss(r)
    elif model_type in _DEEPSEEK:
        fields = _deepseek(r)
    elif model_type == "opt":
        fields = _opt(r)
    else:
        fields = _gpt2(r)
    return model_type, fields


def _num_sliding_layers(r: _Reader, layers: int, default_sliding: Any) -> int:
    """Layers with sliding-window attention: from ``layer_types`` when the config lists them,
    else ``default_sliding(i)`` for layer i (the family's pattern)."""
    types = r.list_("layer_types", length=layers)
    if types is None:
        return sum(1 for i in range(layers) if default_sliding(i))
    for value in types:
        if value not in LAYER_TYPES:
            raise r.error(
                "layer_types",
                f"has an unsupported layer type {format_value(value)}; "
                f"supported: {', '.join(LAYER_TYPES)}",
            )
    return types.count("sliding_attention")


def _window_fields(
    r: _Reader, window: int | None, sliding_layers: int, layers: int, max_pos: int
) -> dict[str, Any]:
    """``sliding_window`` (every layer) or the hybrid pair, from a window and how many layers
    use it. A window as long as the context never cuts anything: no window."""
    none: dict[str, Any] = {"sliding_window": None}
    if sliding_layers == 0:
        return none
    if window is None:
        raise r.error("sliding_window", "is null but some layers use sliding-window attention")
    if window >= max_pos:
        return none
    if sliding_layers == layers:
        return {"sliding_window": window}
    return {
        "sliding_window": None,
        "hybrid_sliding_window": window,
        "num_sliding_layers": sliding_layers,
    }


def _llama_family(r: _Reader, model_type: str) -> dict[str, Any]:
    hidden = r.int_("hidden_size")
    heads = r.int_("num_attention_heads")
    kv_heads = r.int_("num_key_value_heads", default=heads)
    head_dim = r.int_("head_dim", default=None)
    if head_dim is None:
        if hidden % heads:
            raise r.error("num_attention_heads", f"must divide hidden_size {hidden}, got {heads}")
        head_dim = hidden // heads
    layers = r.int_("num_hidden_layers")
    max_pos = r.int_("max_position_embeddings")
    attention_bias = r.bool_("attention_bias", False)
    windows: dict[str, Any]
    if model_type in ("mistral", "mixtral", "phi3"):
        # one window for every layer; newer configs write null (full attention)
        if model_type == "mistral" and "sliding_window" not in r.data:
            window = 4096  # MistralConfig default (Mistral-7B-v0.1)
        else:
            window = r.int_("sliding_window", default=None)
        windows = _window_fields(r, window, layers if window else 0, layers, max_pos)
    elif model_type in _QWEN:
        # HF Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on slide
        use = r.bool_("use_sliding_window", False)
        window = r.int_("sliding_window", default=None)
        first = r.int_("max_window_layers", default=layers, minimum=0)
        sliding = _num_sliding_layers(r, layers, lambda i: use and i >= first)
        windows = _window_fields(r, window, sliding, layers, max_pos)
    else:
        windows = {"sliding_window": None}
    inter = r.int_("intermediate_size")
    fields: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": r.int_("vocab_size"),
        "hidden_act": r.str_("hidden_act", default="silu"),
        "gated_mlp": True,
        "tie_word_embeddings": r.bool_("tie_word_embeddings", False),
        "qkv_bias": True if model_type == "qwen2" else attention_bias,
        "o_proj_bias": attention_bias if model_type == "llama" else False,
        "mlp_bias": r.bool_("mlp_bias", False) if model_type == "llama" else False,
        "max_position_embeddings": max_pos,
        "norm_type": "rmsnorm",
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        **windows,
    }
    if model_type == "mixtral":
        fields.update(
            num_local_experts=r.int_("num_local_experts"),
            num_experts_per_tok=r.int_("num_experts_per_tok"),
            moe_intermediate_size=inter,
            num_dense_layers=0,
        )
    elif model_type == "qwen3_moe" and r.int_("num_experts", default=0, minimum=0):
        # Qwen3MoE: layer i routes unless listed in mlp_only_layers or (i + 1) is not a
        # multiple of decoder_sparse_step; routed experts only (no shared expert, no bias).
        step = r.int_("decoder_sparse_step", default=1)
        dense_only = r.list_("mlp_only_layers") or []
        for index in dense_only:
            problem = number_problem(index, integer=True, ge=0, le=layers - 1)
            if problem is not None:
                raise r.error("mlp_only_layers", f"entries are layer indices: {problem}")
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        fields.update(
            num_local_experts=r.int_("num_experts"),
            num_experts_per_tok=r.int_("num_experts_per_tok"),
            moe_intermediate_size=r.int_("moe_intermediate_size"),
            num_dense_layers=layers - moe_layers,
        )
    else:
        fields["num_dense_layers"] = layers
    return fields


# Defaults of transformers' Gemma2Config / Gemma3TextConfig for the keys real configs omit
# (gemma-3-*-it configs leave out head_dim, max_position_embeddings, the layer pattern...).
_GEMMA_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
    },
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
}


def _gemma(r: _Reader, model_type: str) -> dict[str, Any]:
    """Gemma 2 and Gemma 3 (text): GeGLU MLP, four norms per layer, tied embeddings,
    sliding-window layers interleaved with full-attention ones (Gemma 2: every other layer
    from the first; Gemma 3: five of every six, ``sliding_window_pattern``); Gemma 3 adds
    q/k norms."""
    d = _GEMMA_DEFAULTS[model_type]
    layers = r.int_("num_hidden_layers")
    heads = r.int_("num_attention_heads", default=d.get("num_attention_heads", _REQUIRED))
    max_pos = r.int_("max_position_embeddings", default=d["max_position_embeddings"])
    window = r.int_("sliding_window", default=d["sliding_window"])
    if model_type == "gemma2":
        sliding = _num_sliding_layers(r, layers, lambda i: i % 2 == 0)
    else:
        pattern_key = "sliding_window_pattern"
        if "_sliding_window_pattern" in r.data and pattern_key not in r.data:
            pattern_key = "_sliding_window_pattern"  # newer configs beside layer_types
        pattern = r.int_(pattern_key, default=d["sliding_window_pattern"])
        sliding = _num_sliding_layers(r, layers, lambda i: (i + 1) % pattern != 0)
    activation = r.str_("hidden_act", default=None)
    activation = r.str_("hidden_activation", default=activation or "gelu_pytorch_tanh")
    attention_bias = r.bool_("attention_bias", False)
    return {
        "hidden_size": r.int_("hidden_size"),
        "intermediate_size": r.int_("intermediate_size"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": r.int_("num_key_value_heads", default=d["num_key_value_heads"]),
        "head_dim": r.int_("head_dim", default=d["head_dim"]),
        "vocab_size": r.int_("vocab_size", default=d["vocab_size"]),
        "hidden_act": activation,
        "gated_mlp": True,
        "tie_word_embeddings": r.bool_("tie_word_embeddings", True),
        "qkv_bias": attention_bias,
        "o_proj_bias": attention_bias,
        "max_position_embeddings": max_pos,
        "num_dense_layers": layers,
        "norm_type": "rmsnorm",
        "num_layer_norms": 4,
        "qk_norm": model_type == "gemma3_text",
        **_window_fields(r, window, sliding, layers, max_pos),
    }


def _gpt_oss(r: _Reader) -> dict[str, Any]:
    """gpt-oss: every layer MoE (experts with biases, router with bias), q/k/v/o biases,
    sliding-window (128) and full attention alternating from the first layer. The per-head
    attention sinks (num_attention_heads values per layer) are not counted."""
    layers = r.int_("num_hidden_layers")
    max_pos = r.int_("max_position_embeddings")
    sliding = _num_sliding_layers(r, layers, lambda i: i % 2 == 0)
    window = r.int_("sliding_window", default=128)
    top_k = r.int_("num_experts_per_tok", default=None)
    if top_k is None:
        top_k = r.int_("experts_per_token")
    else:
        r.used.add("experts_per_token")
    inter = r.int_("intermediate_size")
    attention_bias = r.bool_("attention_bias", True)
    return {
        "hidden_size": r.int_("hidden_size"),
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": r.int_("num_attention_heads"),
        "num_key_value_heads": r.int_("num_key_value_heads"),
        "head_dim": r.int_("head_dim"),
        "vocab_size": r.int_("vocab_size"),
        "hidden_act": r.str_("hidden_act", default="silu"),
        "gated_mlp": True,
        "tie_word_embeddings": r.bool_("tie_word_embeddings", False),
        "qkv_bias": attention_bias,
        "o_proj_bias": attention_bias,
        "mlp_bias": True,
        "router_bias": True,
        "max_position_embeddings": max_pos,
        "num_local_experts": r.int_("num_local_experts"),
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": inter,
        "num_dense_layers": 0,
        "norm_type": "rmsnorm",
        **_window_fields(r, window, sliding, layers, max_pos),
    }


def _deepseek(r: _Reader) -> dict[str, Any]:
    layers = r.int_("num_hidden_layers")
    heads = r.int_("num_attention_heads")
    nope = r.int_("qk_nope_head_dim")
    rope = r.int_("qk_rope_head_dim")
    routed = r.int_("n_routed_experts", default=None)
    first_dense = r.int_("first_k_dense_replace", default=0, minimum=0)
    freq = r.int_("moe_layer_freq", default=1)
    r.int_("head_dim", default=None)  # newer HF configs: the RoPE dim; derived below instead
    if routed:
        moe_layers = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
    else:
        moe_layers = 0
    topk_method = r.str_("topk_method", default="greedy")
    return {
        "hidden_size": r.int_("hidden_size"),
        "intermediate_size": r.int_("intermediate_size"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": r.int_("num_key_value_heads", default=heads),
        "head_dim": nope + rope,
        "vocab_size": r.int_("vocab_size"),
        "hidden_act": r.str_("hidden_act", default="silu"),
        "gated_mlp": True,
        "tie_word_embeddings": r.bool_("tie_word_embeddings", False),
        "sliding_window": None,
        "qkv_bias": r.bool_("attention_bias", False),
        "max_position_embeddings": r.int_("max_position_embeddings"),
        "num_local_experts": routed,
        "num_experts_per_tok": r.int_("num_experts_per_tok", default=0, minimum=0) if routed else 0,
        "moe_intermediate_size": r.int_("moe_intermediate_size") if routed else 0,
        "num_shared_experts": r.int_("n_shared_experts", default=0, minimum=0) if routed else 0,
        "num_dense_layers": layers - moe_layers,
        "kv_lora_rank": r.int_("kv_lora_rank"),
        "q_lora_rank": r.int_("q_lora_rank", default=None),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": nope,
        "v_head_dim": r.int_("v_head_dim"),
        "router_bias": topk_method == "noaux_tc",
        "norm_type": "rmsnorm",
    }


def _opt(r: _Reader) -> dict[str, Any]:
    hidden = r.int_("hidden_size")
    heads = r.int_("num_attention_heads")
    if hidden % heads:
        raise r.error("num_attention_heads", f"must divide hidden_size {hidden}, got {heads}")
    bias = r.bool_("enable_bias", True)
    layers = r.int_("num_hidden_layers")
    max_pos = r.int_("max_position_embeddings")
    return {
        "hidden_size": hidden,
        "intermediate_size": r.int_("ffn_dim"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "vocab_size": r.int_("vocab_size"),
        "hidden_act": r.str_("activation_function", default="relu"),
        "gated_mlp": False,
        "tie_word_embeddings": r.bool_("tie_word_embeddings", True),
        "sliding_window": None,
        "qkv_bias": bias,
        "o_proj_bias": bias,
        "mlp_bias": bias,
        "max_position_embeddings": max_pos,
        "num_dense_layers": layers,
        "norm_type": "layernorm",
        # OPT-350m (post-LN) has no final layer norm.
        "final_norm": r.bool_("do_layer_norm_before", True),
        # OPTLearnedPositionalEmbedding keeps 2 extra rows (offset for padding).
        "num_learned_positions": max_pos + 2,
        "word_embed_proj_dim": r.int_("word_embed_proj_dim", default=hidden),
    }


def _gpt2(r: _Reader) -> dict[str, Any]:
    hidden = r.int_("n_embd")
    heads = r.int_("n_head")
    if hidden % heads:
        raise r.error("n_head", f"must divide n_embd {hidden}, got {heads}")
    layers = r.int_("n_layer")
    positions = r.int_("n_positions")
    return {
        "hidden_size": hidden,
        "intermediate_size": r.int_("n_inner", default=4 * hidden),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "vocab_size": r.int_("vocab_size"),
        "hidden_act": r.str_("activation_function", default="gelu_new"),
        "gated_mlp": False,
        "tie_word_embeddings": r.bool_("tie_word_embeddings", True),
        "sliding_window": None,
        "qkv_bias": True,
        "o_proj_bias": True,
        "mlp_bias": True,
        "max_position_embeddings": positions,
        "num_dense_layers": layers,
        "norm_type": "layernorm",
        "num_learned_positions": positions,
    }
