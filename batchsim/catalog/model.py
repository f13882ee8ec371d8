"""Model architectures: :class:`ModelSpec` and the quantities derived from it.

A spec holds a transformer's configuration in Hugging Face field names; everything else is
derived from the architecture: per-layer parameter counts (which the cost model turns into
FLOPs and bytes), total and active parameter counts, weight bytes per dtype and KV-cache bytes
per token (and per sequence, :meth:`ModelSpec.kv_bytes`). Nothing here is stored that can be
derived: the catalog holds the config fields and the official parameter count only to check the
derivation against it. Specs are read from files by :mod:`batchsim.catalog.model_files`
(:func:`~batchsim.catalog.model_files.load_model`).

Must not import anything from batchsim except :mod:`batchsim.dtypes`: the cost model, the
config loader and the CLI build on this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from batchsim.dtypes import dtype_bytes, resolve_kv_dtype

__all__ = ["ModelSpec"]


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
            None. The engine keeps such a model's KV cache per layer group
            (:meth:`kv_layer_groups`, vLLM's hybrid KV-cache manager) and the cost model reads
            each layer's own span; with prefix caching or speculative decoding, which the
            grouped cache does not model, every layer runs as full attention (an upper bound
            on memory and attention time past the window; the run says so). The exact
            footprint of one sequence is :meth:`kv_bytes`.
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
        checkpoint_dtype: The weight dtype the checkpoint's ``quantization_config`` says
            (:mod:`batchsim.catalog.quantization`), or None (16-bit weights): an experiment
            that sets no ``engine.dtype`` runs in it.
        checkpoint_kv_cache_dtype: The KV-cache dtype that config says (an FP8 KV-cache
            scheme), or None: an experiment that sets no ``engine.kv_cache_dtype`` uses it.
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
    checkpoint_dtype: str | None = None
    checkpoint_kv_cache_dtype: str | None = None
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

    def kv_layer_groups(self) -> tuple[int, int, int]:
        """How a hybrid KV cache (vLLM's hybrid KV-cache manager) splits the layers: (full
        groups, sliding-window groups, layers per group).

        Every group holds the same number of layers, the greatest common divisor of the
        full-attention and sliding-window layer counts, so that one block of the shared pool
        holds ``block_size`` tokens of one group whatever its kind. A request holds one block
        per ``block_size`` tokens in each full group, and in each sliding group only those of
        its last window. A model without a hybrid layout is one group of every layer: a full
        one, or a sliding one when every layer slides.
        """
        layers = self.num_hidden_layers
        if self.is_hybrid_attention:
            sliding = self.num_sliding_layers
            if sliding < layers:
                g = math.gcd(layers - sliding, sliding)
                return (layers - sliding) // g, sliding // g, g
            return 0, 1, layers
        if self.sliding_window is not None:
            return 0, 1, layers
        return 1, 0, layers

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
                :func:`~batchsim.dtypes.resolve_kv_dtype`).
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

        Every layer counts, sliding-window layers included: the bytes of a token the window
        has not yet dropped; :meth:`kv_bytes` is the footprint of a whole sequence.
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
            "checkpoint_dtype": self.checkpoint_dtype,
        }
