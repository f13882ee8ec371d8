"""Model architectures: :class:`ModelSpec`, :func:`load_model` and the quantities derived from them.

Owns the reading of model descriptions (built-in catalog YAML, a user YAML, a Hugging Face
``config.json`` of a Llama / Mistral / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral / Phi-3 / Gemma 2 /
Gemma 3 / gpt-oss / DeepSeek-V2/V3 / OPT / GPT-2-style model, or a Hugging Face repo id found in
the local Hugging Face cache, see :mod:`batchsim.catalog.hf_cache`), their validation, and
everything derived from the architecture: per-layer parameter counts (which the cost model
turns into FLOPs and bytes), total and active parameter counts, weight bytes per dtype and
KV-cache bytes per token (and per sequence, :meth:`ModelSpec.kv_bytes`). Nothing here is
stored that can be derived: the catalog holds the config fields and the official parameter
count only to check the derivation against it.

Must not import anything from batchsim except :mod:`batchsim.errors`, :mod:`batchsim.catalog`,
:mod:`batchsim.dtypes`, :mod:`batchsim.yamlio` (the one file reader) and
:mod:`batchsim.validation` (the number rules): the cost model, the config loader and the CLI
build on this module.

Every integer field is an integer in [1, 2^24] (widths, layers, heads, experts, vocabulary,
context length; a few counts may be 0), ``official_num_params`` a finite number in
(0, 1e15].
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchsim.catalog import catalog_names, hf_cache, resolve
from batchsim.dtypes import DTYPE_BYTES  # bytes per element of each dtype; re-exported here
from batchsim.errors import ConfigError
from batchsim.validation import format_value, number_problem
from batchsim.yamlio import line_of, read_mapping

__all__ = [
    "DTYPE_BYTES",
    "SUPPORTED_MODEL_TYPES",
    "ModelSpec",
    "dtype_bytes",
    "list_models",
    "load_model",
    "model_table",
    "resolve_kv_dtype",
]

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
"""Values of ``model_type`` that :func:`load_model` understands (``gemma3``: the multimodal
config, whose ``text_config`` describes the language model; the vision tower is not counted)."""

_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3")
_QWEN = ("qwen2", "qwen3", "qwen3_moe")
_GEMMA = ("gemma2", "gemma3_text")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
LAYER_TYPES = ("full_attention", "sliding_attention")
"""Values of a config's ``layer_types`` list that :func:`load_model` understands."""

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
        "quantization_config",
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

_REQUIRED = object()

MAX_MODEL_INT = 2**24
"""Largest value of an integer field of a model (16,777,216)."""
MAX_NUM_PARAMS = 1e15
"""Largest ``official_num_params``."""


def dtype_bytes(dtype: str, key: str = "dtype") -> float:
    """Bytes per element of ``dtype``.

    Raises:
        ConfigError: Unknown dtype; the message lists the allowed ones.
    """
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        allowed = ", ".join(DTYPE_BYTES)
        raise ConfigError(f"{key}: unknown dtype {dtype!r}; allowed: {allowed}") from None


def resolve_kv_dtype(kv_dtype: str, weight_dtype: str) -> str:
    """The KV-cache dtype that ``kv_dtype`` means when the weights are ``weight_dtype``.

    ``auto`` follows the weight dtype, except that integer-quantized weights (int8/int4 —
    weight-only quantization) keep an fp16 KV cache, as vLLM does.
    """
    if kv_dtype != "auto":
        dtype_bytes(kv_dtype, "kv_cache_dtype")
        return kv_dtype
    dtype_bytes(weight_dtype, "dtype")
    return "fp16" if weight_dtype in ("int8", "int4") else weight_dtype


@dataclass(frozen=True)
class ModelSpec:
    """One transformer architecture, in Hugging Face field names.

    Sizes are element counts (parameters, dimensions), not bytes. All ``*_params`` properties
    are per layer and unsharded unless they say otherwise.

    Attributes:
        name: Catalog name (or file/directory stem).
        model_type: Hugging Face ``model_type`` (llama, mistral, qwen2, mixtral, deepseek_v3,
            opt, gpt2, ...).
        hidden_size: Model width h.
        intermediate_size: FFN width of a *dense* layer (Mixtral: per expert, as in HF).
        num_hidden_layers: Number of decoder layers L.
        num_attention_heads: Query heads.
        num_key_value_heads: KV heads (= query heads for MHA, 1 for MQA; MLA: as in the config,
            unused for the cache size).
        head_dim: Query/key head dimension (MLA: qk_nope_head_dim + qk_rope_head_dim).
        vocab_size: Vocabulary rows of the embedding / lm_head.
        hidden_act: Activation name (silu, gelu_new, relu...).
        gated_mlp: True for SwiGLU-style MLPs (gate, up and down projections).
        tie_word_embeddings: lm_head shares the embedding matrix.
        sliding_window: Attention window in tokens of EVERY layer (Mistral-7B-v0.1, Phi-3-mini-4k),
            or None. The engine's KV cache and the cost model apply it to all layers.
        hybrid_sliding_window: Window in tokens of the sliding-window layers of a model that
            interleaves sliding-window and full-attention layers (Gemma 2/3, gpt-oss), else
            None. The engine (one KV-cache window for all layers) runs such a model as full
            attention on every layer: KV capacity counts every layer at full length and
            attention reads every cached token in every layer — an upper bound on memory and
            attention time, exact while every context fits in the window. The exact footprint
            of one sequence is :meth:`kv_bytes`.
        num_sliding_layers: Layers that use ``hybrid_sliding_window`` (0 unless hybrid).
        qkv_bias: q/k/v projections have a bias.
        max_position_embeddings: Longest context the model was configured for (tokens).
        num_local_experts: Routed experts per MoE layer, or None for dense models.
        num_experts_per_tok: Routed experts each token uses (top-k); 0 for dense models.
        moe_intermediate_size: FFN width of one routed (and of one shared) expert.
        num_shared_experts: Always-active experts per MoE layer (DeepSeek), else 0.
        num_dense_layers: Layers with a dense MLP (all layers of a dense model, 0 for Mixtral,
            DeepSeek ``first_k_dense_replace``).
        kv_lora_rank: MLA compressed KV latent width, or None when not MLA.
        q_lora_rank: MLA query low-rank width (None: full-rank q_proj, or not MLA).
        qk_rope_head_dim: MLA decoupled RoPE key dimension, or None.
        qk_nope_head_dim: MLA non-RoPE query/key head dimension, or None.
        v_head_dim: MLA value head dimension, or None.
        o_proj_bias: Attention output projection has a bias.
        mlp_bias: MLP projections have biases.
        norm_type: ``rmsnorm`` (weight only) or ``layernorm`` (weight and bias).
        num_layer_norms: Norms of width ``hidden_size`` per layer (2: input and
            post-attention; Gemma 2/3: 4, with pre- and post-feed-forward norms).
        qk_norm: Per-head RMSNorm of q and k (``head_dim`` weights each; Qwen3, Gemma 3).
        final_norm: A norm sits after the last layer.
        num_learned_positions: Rows of a learned position embedding (OPT, GPT-2), 0 with RoPE.
        word_embed_proj_dim: OPT embedding width when it differs from hidden (project_in/out),
            else equal to ``hidden_size``.
        router_bias: The MoE router has a per-expert bias (DeepSeek-V3
            ``e_score_correction_bias``).
        description: Free text.
        official_num_params: Published total parameter count, if known (for checking only).
        sources: Field -> where its value comes from.
    """

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    hidden_act: str
    gated_mlp: bool
    tie_word_embeddings: bool
    sliding_window: int | None
    qkv_bias: bool
    max_position_embeddings: int
    num_local_experts: int | None = None
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    o_proj_bias: bool = False
    mlp_bias: bool = False
    norm_type: str = "rmsnorm"
    num_layer_norms: int = 2
    qk_norm: bool = False
    hybrid_sliding_window: int | None = None
    num_sliding_layers: int = 0
    final_norm: bool = True
    num_learned_positions: int = 0
    word_embed_proj_dim: int = 0
    router_bias: bool = False
    description: str = ""
    official_num_params: float | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    # ----------------------------------------------------------------- kind of model
    @property
    def is_moe(self) -> bool:
        """True when some layers route tokens to experts."""
        return self.num_local_experts is not None and self.num_local_experts > 0

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.num_hidden_layers - self.num_dense_layers

    @property
    def is_hybrid_attention(self) -> bool:
        """True when sliding-window and full-attention layers alternate (Gemma 2/3, gpt-oss)."""
        return self.hybrid_sliding_window is not None and self.num_sliding_layers > 0

    @property
    def attention_type(self) -> str:
        """``MHA``, ``GQA``, ``MQA`` or ``MLA``."""
        if self.is_mla:
            return "MLA"
        if self.num_key_value_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_key_value_heads == 1 else "GQA"

    # ----------------------------------------------------------------- per-layer parameter counts
    @property
    def _norm_width(self) -> int:
        """Parameters of one norm per unit of width (1 for RMSNorm, 2 for LayerNorm w+b)."""
        return 2 if self.norm_type == "layernorm" else 1

    @property
    def qkv_proj_params(self) -> int:
        """Parameters of the q, k, v projections of one layer, biases included.

        MLA: q_a_proj, q_a_layernorm, q_b_proj (or q_proj without q LoRA), kv_a_proj_with_mqa,
        kv_a_layernorm and kv_b_proj.
        """
        h = self.hidden_size
        if self.is_mla:
            assert self.kv_lora_rank is not None
            nope, rope = self.qk_nope_head_dim or 0, self.qk_rope_head_dim or 0
            v = self.v_head_dim or 0
            heads = self.num_attention_heads
            q_out = heads * (nope + rope)
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out
            else:
                q = h * q_out
            kv_a = h * (self.kv_lora_rank + rope) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * heads * (nope + v)
            return q + kv_a + kv_b
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        weights = h * (q_out + 2 * kv_out)
        return weights + (q_out + 2 * kv_out if self.qkv_bias else 0)

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output that enters o_proj (heads x value head dim)."""
        if self.is_mla:
            return self.num_attention_heads * (self.v_head_dim or 0)
        return self.num_attention_heads * self.head_dim

    @property
    def o_proj_params(self) -> int:
        """Parameters of the attention output projection of one layer (bias included)."""
        h = self.hidden_size
        return self.attn_out_dim * h + (h if self.o_proj_bias else 0)

    def _mlp_params(self, width: int) -> int:
        h = self.hidden_size
        if self.gated_mlp:
            return 3 * h * width + ((2 * width + h) if self.mlp_bias else 0)
        return 2 * h * width + ((width + h) if self.mlp_bias else 0)

    @property
    def dense_mlp_params(self) -> int:
        """Parameters of one dense layer's MLP (0 when the model has no dense layer)."""
        if self.num_dense_layers == 0:
            return 0
        return self._mlp_params(self.intermediate_size)

    @property
    def expert_params(self) -> int:
        """Parameters of ONE routed expert (0 for dense models)."""
        return self._mlp_params(self.moe_intermediate_size) if self.is_moe else 0

    @property
    def shared_expert_params(self) -> int:
        """Parameters of all shared experts of one MoE layer (DeepSeek), else 0."""
        if not self.is_moe:
            return 0
        return self.num_shared_experts * self._mlp_params(self.moe_intermediate_size)

    @property
    def router_params(self) -> int:
        """Parameters of the router (gate) of one MoE layer, 0 for dense models."""
        if not self.is_moe:
            return 0
        experts = self.num_local_experts or 0
        return experts * self.hidden_size + (experts if self.router_bias else 0)

    @property
    def norm_params(self) -> int:
        """Parameters of the norms of one layer: ``num_layer_norms`` of width ``hidden_size``
        (input and post-attention; Gemma also pre- and post-feed-forward), plus the q and k
        norms of width ``head_dim`` when ``qk_norm``."""
        params = self.num_layer_norms * self._norm_width * self.hidden_size
        return params + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def final_norm_params(self) -> int:
        """Parameters of the norm after the last layer (0 if there is none)."""
        return self._norm_width * self.hidden_size if self.final_norm else 0

    @property
    def embedding_params(self) -> int:
        """Token embedding + learned position embedding (+ OPT project_in/out), whole model."""
        width = self.word_embed_proj_dim or self.hidden_size
        params = self.vocab_size * width + self.num_learned_positions * self.hidden_size
        if width != self.hidden_size:
            params += 2 * width * self.hidden_size
        return params

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection stored separately: 0 when tied to the embedding.

        The lm_head matmul still happens when tied: use :attr:`lm_head_matmul_params` for FLOPs.
        """
        return 0 if self.tie_word_embeddings else self.lm_head_matmul_params

    @property
    def lm_head_matmul_params(self) -> int:
        """Weights the lm_head matmul multiplies by (vocab x width), tied or not."""
        return self.vocab_size * (self.word_embed_proj_dim or self.hidden_size)

    # ----------------------------------------------------------------- totals
    @property
    def attention_layer_params(self) -> int:
        """q/k/v + o_proj + norms of one layer (everything but its MLP)."""
        return self.qkv_proj_params + self.o_proj_params + self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """MLP part of one MoE layer: all routed experts + shared experts + router."""
        if not self.is_moe:
            return 0
        experts = self.num_local_experts or 0
        return experts * self.expert_params + self.shared_expert_params + self.router_params

    @property
    def num_params(self) -> int:
        """Total parameters (MTP / draft modules not included)."""
        return (
            self.num_hidden_layers * self.attention_layer_params
            + self.num_dense_layers * self.dense_mlp_params
            + self.num_moe_layers * self.moe_layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to.

        Counts the embedding table (as the Mixtral 12.9 B figure does); equals
        :attr:`num_params` for dense models.
        """
        if not self.is_moe:
            return self.num_params
        unused = (self.num_local_experts or 0) - self.num_experts_per_tok
        return self.num_params - self.num_moe_layers * unused * self.expert_params

    def weight_bytes(self, dtype: str) -> float:
        """Bytes of all weights when every parameter is stored as ``dtype``.

        Quantization metadata is ignored: for int4 (and int8, fp8) the per-group / per-block
        scales and zero points (int4 at group size 128 with fp16 scale+zero: +0.03 byte per
        weight, about +6 %) are not counted, and embeddings / norms are assumed quantized too.
        So ``weight_bytes("int4") == weight_bytes("fp16") / 4`` exactly.
        """
        return self.num_params * dtype_bytes(dtype)

    def kv_bytes_per_token(self, kv_dtype: str, weight_dtype: str = "bf16") -> float:
        """KV-cache bytes one token occupies, summed over all layers.

        GQA/MQA/MHA: ``2 * L * kv_heads * head_dim * bytes``. MLA: the compressed latent plus
        the decoupled RoPE key, ``L * (kv_lora_rank + qk_rope_head_dim) * bytes``.

        Args:
            kv_dtype: KV-cache dtype, or ``auto`` (then derived from ``weight_dtype``, see
                :func:`resolve_kv_dtype`).
            weight_dtype: Weight dtype, used only when ``kv_dtype`` is ``auto``.
        """
        bytes_per = dtype_bytes(resolve_kv_dtype(kv_dtype, weight_dtype), "kv_cache_dtype")
        return self.kv_elements_per_token * bytes_per

    @property
    def kv_elements_per_layer(self) -> int:
        """Cached values one token occupies in one layer (K and V, or the MLA latent)."""
        if self.is_mla:
            assert self.kv_lora_rank is not None
            return self.kv_lora_rank + (self.qk_rope_head_dim or 0)
        return 2 * self.num_key_value_heads * self.head_dim

    @property
    def kv_elements_per_token(self) -> int:
        """Cached values per token over all layers (K and V, or the MLA latent).

        Every layer counts, sliding-window layers included: what the engine charges per
        cached token (see ``hybrid_sliding_window``); :meth:`kv_bytes` is the exact footprint
        of a sequence.
        """
        return self.num_hidden_layers * self.kv_elements_per_layer

    def kv_bytes(self, context_len: int, kv_dtype: str, weight_dtype: str = "bf16") -> float:
        """KV-cache bytes one sequence of ``context_len`` tokens holds, counting each layer
        with its own attention span: full-attention layers keep every token, sliding-window
        layers at most their window.

        Equals ``context_len * kv_bytes_per_token(...)`` for full-attention models and for any
        context that fits in the window.
        """
        if context_len < 0:
            raise ValueError(f"context_len must be >= 0, got {context_len}")
        layers, sliding, window = self.num_hidden_layers, 0, None
        if self.sliding_window is not None:
            sliding, window = layers, self.sliding_window
        elif self.is_hybrid_attention:
            sliding, window = self.num_sliding_layers, self.hybrid_sliding_window
        held = (layers - sliding) * context_len
        if window is not None:
            held += sliding * min(context_len, window)
        bytes_per = dtype_bytes(resolve_kv_dtype(kv_dtype, weight_dtype), "kv_cache_dtype")
        return held * self.kv_elements_per_layer * bytes_per

    def summary(self) -> dict[str, Any]:
        """Key numbers for ``batchsim list models`` (units in the key names)."""
        return {
            "name": self.name,
            "description": self.description,
            "params_b": self.num_params / 1e9,
            "active_params_b": self.num_active_params / 1e9,
            "official_params_b": (
                self.official_num_params / 1e9 if self.official_num_params else None
            ),
            "layers": self.num_hidden_layers,
            "hidden": self.hidden_size,
            "heads": self.num_attention_heads,
            "kv_heads": self.num_key_value_heads,
            "attention": self.attention_type,
            "experts": (
                f"{self.num_experts_per_tok}/{self.num_local_experts}" if self.is_moe else None
            ),
            "kv_kib_per_token_bf16": self.kv_bytes_per_token("bf16") / 1024,
            "weights_gb_bf16": self.weight_bytes("bf16") / 1e9,
            "sliding_window": (
                f"{self.hybrid_sliding_window} on {self.num_sliding_layers}/"
                f"{self.num_hidden_layers} layers"
                if self.is_hybrid_attention
                else self.sliding_window
            ),
            "max_context": self.max_position_embeddings,
        }


# --------------------------------------------------------------------------- reading files


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


def _spec_from_mapping(
    data: Mapping[str, Any], source: str, text: str, default_name: str, strict: bool
) -> ModelSpec:
    """Build a ModelSpec from HF config fields (+ catalog meta keys)."""
    r = _Reader(data, source, text)
    model_type = r.str_("model_type", default=None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        allowed = ", ".join(SUPPORTED_MODEL_TYPES)
        what = "is missing" if model_type is None else f"{model_type!r} is not supported"
        raise ConfigError(
            f"model_type {what}; supported: {allowed}", source, line_of(text, ("model_type",))
        )

    if model_type in _LLAMA_FAMILY:
        fields = _llama_family(r, model_type)
    elif model_type in _GEMMA:
        fields = _gemma(r, model_type)
    elif model_type == "gemma3":
        # Multimodal Gemma 3: the language model is the text_config (a gemma3_text config).
        text_config = data.get("text_config")
        r.used.add("text_config")
        if not isinstance(text_config, Mapping):
            raise r.error("text_config", "must be a mapping: the language model's config")
        fields = _gemma(_Reader(text_config, source, text, ("text_config",)), "gemma3_text")
        model_type = "gemma3_text"
    elif model_type == "gpt_oss":
        fields = _gpt_oss(r)
    elif model_type in _DEEPSEEK:
        fields = _deepseek(r)
    elif model_type == "opt":
        fields = _opt(r)
    else:
        fields = _gpt2(r)

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
        description=description,
        official_num_params=float(official) if official is not None else None,
        sources=dict(sources),
        **fields,
    )
    _check_consistency(spec, r)
    return spec


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
    (the window of every layer, or ``"W on S/L layers"`` for a hybrid model), max_context.
    """
    return [spec.summary() for spec in list_models()]
