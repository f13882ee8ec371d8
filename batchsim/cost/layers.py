"""The kernels of a model's forward pass on one GPU under tensor parallelism: geometry only.

Owns :class:`LayerKernels`, built from a :class:`~batchsim.catalog.model.ModelSpec` and the
tensor-parallel degree: the weight GEMMs of a layer (q/k/v and output projections, dense MLP),
its attention sizes (:class:`~batchsim.cost.attention.AttentionGeometry`), its MoE MLP
(:class:`~batchsim.cost.moe.MoeLayer`), lm_head, the values each elementwise kernel moves
(:class:`ElementwiseKernel`) and the parameters every rank holds in full. No hardware, no
dtype, no time: pricing is the kernel modules' business.

Tensor parallelism splits heads, MLP widths, experts and the vocabulary (lm_head) by ``tp``;
MLA's q_a/kv_a projections, MoE routers and KV heads fewer than ``tp`` are replicated. MLA
(DeepSeek) uses the absorbed formulation: kv_b is applied to the new tokens only, as W_UK
(with q/k/v) and W_UV (with the output projection).

Must not import anything from batchsim but :mod:`batchsim.cost.gemm`,
:mod:`batchsim.cost.attention`, :mod:`batchsim.cost.moe` and :mod:`batchsim.catalog.model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchsim.catalog.model import ModelSpec
from batchsim.cost.attention import AttentionGeometry
from batchsim.cost.gemm import Gemm
from batchsim.cost.moe import MoeLayer

__all__ = ["ElementwiseKernel", "LayerKernels", "activation_flops"]


@dataclass(frozen=True, slots=True)
class ElementwiseKernel:
    """Elementwise kernels of one kind, per row.

    Attributes:
        elems: 16-bit values read and written per row.
        flops: FLOPs per row.
        launches: Kernel launches (per layer, or per forward pass for the ends).
    """

    elems: float
    flops: float
    launches: int


def activation_flops(elems: float) -> float:
    """FLOPs of the MLP activation kernel (e.g. SiLU-and-mul) that moves ``elems`` values."""
    return 4.0 * elems / 3.0


@dataclass(frozen=True, slots=True)
class LayerKernels:
    """The kernels of one forward pass of a model on one GPU.

    Attributes:
        hidden_size: Model width.
        num_layers: Transformer layers.
        num_dense_layers: Layers with a dense MLP.
        num_moe_layers: Layers with an MoE MLP.
        attention: Attention sizes of one layer.
        qkv: Attention input projections (MLA: q_a, q_b, kv_a and the absorbed W_UK).
        o: Attention output projection (MLA: absorbed W_UV and o_proj).
        dense_mlp: Up (gate and up) and down GEMMs of a dense MLP.
        activation_width: Intermediate width of the dense MLP on this GPU.
        gate_factor: Values the activation kernel moves per output (3 gated: gate and up in,
            out; 2 otherwise).
        moe: The MoE MLP, None for a dense model.
        lm_head: Logits GEMM (vocab-parallel).
        norms: The norms of a layer of width ``hidden_size`` (input and post-attention; Gemma
            also pre- and post-feed-forward).
        residual_add: The residual add (two inputs, one output).
        rope: Rotary embedding of the new q and k rows (no launch without rotary).
        latent_norms: MLA's q_a / kv_a layernorms, or the per-head q/k norms of Qwen3 and
            Gemma 3 (no launch for other models).
        ends: Embedding gather and final norm, once per forward pass.
        replicated_params: Parameters every rank holds in full (MLA q_a/kv_a, GQA KV heads
            when fewer than tp, MoE routers), all layers.
    """

    hidden_size: int
    num_layers: int
    num_dense_layers: int
    num_moe_layers: int
    attention: AttentionGeometry
    qkv: tuple[Gemm, ...]
    o: tuple[Gemm, ...]
    dense_mlp: tuple[Gemm, ...]
    activation_width: float
    gate_factor: float
    moe: MoeLayer | None
    lm_head: Gemm
    norms: ElementwiseKernel
    residual_add: ElementwiseKernel
    rope: ElementwiseKernel
    latent_norms: ElementwiseKernel
    ends: ElementwiseKernel
    replicated_params: float

    @classmethod
    def from_model(cls, model: ModelSpec, tp: int) -> LayerKernels:
        """The kernels of ``model`` split over ``tp`` GPUs (``tp`` divides the query heads)."""
        m = model
        h = m.hidden_size
        heads = m.num_attention_heads / tp
        layers = m.num_hidden_layers
        dense_layers = m.num_dense_layers if m.is_moe else m.num_hidden_layers
        gate = 2 if m.gated_mlp else 1
        attention = AttentionGeometry.from_model(m, tp)

        qkv: list[Gemm] = []
        if m.is_mla:
            lora, rope = m.kv_lora_rank or 0, m.qk_rope_head_dim or 0
            nope, v = m.qk_nope_head_dim or 0, m.v_head_dim or 0
            if m.q_lora_rank:
                qkv += [Gemm(h, m.q_lora_rank), Gemm(m.q_lora_rank, int(heads * (nope + rope)))]
            else:
                qkv += [Gemm(h, int(heads * (nope + rope)))]
            qkv += [Gemm(h, lora + rope), Gemm(nope, lora, heads)]  # kv_a, absorbed W_UK
            o = [Gemm(lora, v, heads), Gemm(int(heads * v), h)]  # absorbed W_UV, o_proj
            rope_elems = (heads + 1) * rope
            latent_norms = ElementwiseKernel(
                2.0 * ((m.q_lora_rank or 0) + lora), 0.0, 2 if m.q_lora_rank else 1
            )
            # q_a and kv_a are replicated on every rank (not split by tp)
            replicated: float = h * ((m.q_lora_rank or 0) + lora + rope)
        else:
            hd, kv_heads = m.head_dim, attention.kv_heads
            qkv = [Gemm(h, int((heads + 2 * kv_heads) * hd))]
            o = [Gemm(int(heads * hd), h)]
            rope_elems = 0.0 if m.num_learned_positions else (heads + kv_heads) * hd
            if m.qk_norm:  # q_norm and k_norm over the new rows' heads (read and write)
                qk_elems = (heads + kv_heads) * hd
                latent_norms = ElementwiseKernel(2.0 * qk_elems, 4.0 * qk_elems, 2)
            else:
                latent_norms = ElementwiseKernel(0.0, 0.0, 0)
            # KV heads replicated when fewer than tp: each rank holds kv_heads (not nkv/tp) of
            # them; expressed as the parameter count R with R - R/tp = that per-rank surplus
            surplus = h * 2 * hd * (kv_heads - m.num_key_value_heads / tp)
            replicated = surplus * tp / (tp - 1) if tp > 1 else 0.0

        width = m.intermediate_size / tp
        return cls(
            hidden_size=h,
            num_layers=layers,
            num_dense_layers=dense_layers,
            num_moe_layers=layers - dense_layers,
            attention=attention,
            qkv=tuple(qkv),
            o=tuple(o),
            dense_mlp=(Gemm(h, int(gate * width)), Gemm(int(width), h)),
            activation_width=width,
            gate_factor=3.0 if m.gated_mlp else 2.0,
            moe=MoeLayer.from_model(m, tp) if m.is_moe else None,
            lm_head=Gemm(m.word_embed_proj_dim or h, math.ceil(m.vocab_size / tp)),
            norms=ElementwiseKernel(
                2.0 * m.num_layer_norms * h, 4.0 * m.num_layer_norms * h, m.num_layer_norms
            ),
            residual_add=ElementwiseKernel(3.0 * h, 1.0 * h, 1),
            rope=ElementwiseKernel(2.0 * rope_elems, 3.0 * rope_elems, 1 if rope_elems else 0),
            latent_norms=latent_norms,
            ends=ElementwiseKernel(4.0 * h, 0.0, 2),
            replicated_params=layers * replicated
            + ((layers - dense_layers) * m.router_params if m.is_moe else 0),
        )
