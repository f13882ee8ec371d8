"""What one engine of an experiment is built from: its hardware, model and cost model, and
the size of its KV cache.

:func:`engine_setup` turns an experiment (or one group of a cluster's replicas) into a
:class:`Setup`: the catalog entries it names, the roofline cost model of the model on that GPU
at its tensor and pipeline parallelism (with the engine's own all-reduce and launch terms), a
draft model's for speculative decoding, and the KV cache in blocks::

    blocks = (memory x gpu_memory_utilization - weights - activation reserve) / bytes per block

with host swap space for ``preemption_mode: swap``. Nothing here runs: the engines are made
from a :class:`Setup` by :mod:`batchsim.deployment.engines`.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.hardware_files import load_hardware
from batchsim.catalog.model import ModelSpec
from batchsim.catalog.model_files import load_model
from batchsim.config import EngineConfig, ExperimentConfig
from batchsim.cost import RooflineCostModel
from batchsim.cost.pipeline import PipelineCostModel
from batchsim.dtypes import dtype_bytes
from batchsim.engine.kv_cache import kv_capacity_blocks
from batchsim.errors import ConfigError
from batchsim.scheduler.speculative import SPECULATIVE_POLICIES


def activation_reserve_bytes(model: ModelSpec, config: ExperimentConfig, tp: int) -> float:
    """Memory kept free for one forward pass's activations on one GPU (bytes).

    The peak of a forward pass over the token budget T: a few hidden-size tensors and the MLP's
    intermediate tensors per token, plus fp32 logits for the sampled rows. A deliberate,
    documented estimate; ``engine.activation_reserve_gb`` overrides it.
    """
    if config.engine.activation_reserve_gb is not None:
        return config.engine.activation_reserve_gb * 1e9
    tokens = config.scheduler.max_num_batched_tokens
    act_bytes = 2.0  # activations stay in 16-bit even with quantized weights
    width = model.intermediate_size
    if model.is_moe and model.moe_intermediate_size:
        width = max(model.moe_intermediate_size * model.num_experts_per_tok, width or 0)
    per_token = (4 * model.hidden_size + 2 * width / tp) * act_bytes
    logits = config.scheduler.max_num_seqs * model.vocab_size / tp * 4.0
    return tokens * per_token + logits


@dataclass(frozen=True)
class Setup:
    """Everything built from a config before the simulation starts."""

    config: ExperimentConfig
    hardware: HardwareProfile
    model: ModelSpec
    cost_model: RooflineCostModel
    num_gpu_blocks: int
    num_cpu_blocks: int = 0
    """Host swap space in KV blocks (``preemption_mode: swap`` only)."""
    swap_time_per_block: float = 0.0
    """Seconds to copy one KV block of one GPU over the host link."""
    draft_cost_model: RooflineCostModel | None = None
    """Speculative decoding's draft model on the same GPUs (``method: draft``)."""
    pipeline: PipelineCostModel | None = None
    """The stages of ``parallel.pipeline_parallel_size`` > 1 (None: no pipeline; then
    :attr:`cost_model` prices every iteration)."""
    hybrid_kv_groups: tuple[int, int, int] | None = None
    """A hybrid model's KV cache per layer group (vLLM's hybrid KV-cache manager): its full
    groups, sliding-window groups and layers per group (one block holds ``block_size`` tokens
    of one group); None: one block holds a token range in every layer (see
    :func:`hybrid_kv_groups`)."""


def hybrid_kv_groups(model: ModelSpec, engine: EngineConfig) -> tuple[int, int, int] | None:
    """The layer groups of ``model``'s hybrid KV cache
    (:meth:`~batchsim.catalog.model.ModelSpec.kv_layer_groups`), or None when it has none: a
    model of one attention kind, or a hybrid one with prefix caching or speculative decoding,
    which batchsim runs with full attention on every layer (an upper bound on KV use and
    attention time past the window; the run says so)."""
    if not model.is_hybrid_attention or hybrid_kv_fallback(engine):
        return None
    return model.kv_layer_groups()


def hybrid_kv_fallback(engine: EngineConfig) -> str | None:
    """Why a hybrid model runs with full attention on every layer under ``engine`` (a
    setting batchsim's per-group KV cache does not support), or None."""
    if engine.enable_prefix_caching:
        return "engine.enable_prefix_caching"
    if engine.speculative is not None:
        return "engine.speculative"
    return None


def with_engine_terms(hardware: HardwareProfile, engine: EngineConfig) -> HardwareProfile:
    """``hardware`` with the GPU-side terms the engine sets itself (``engine.
    all_reduce_latency_us``, ``engine.launch_overhead_ms``, e.g. from a framework preset) in
    place of the profile's; the same object when the engine sets neither."""
    changes: dict[str, float] = {}
    if engine.all_reduce_latency_us is not None:
        changes["interconnect_latency"] = engine.all_reduce_latency_us / 1e6
    if engine.launch_overhead_ms is not None:
        changes["launch_overhead"] = engine.launch_overhead_ms / 1e3
    if not changes:
        return hardware
    attrs: dict[str, Any] = dict(changes)  # the profile keeps each term twice (see catalog)
    return dataclasses.replace(hardware, efficiency={**hardware.efficiency, **changes}, **attrs)


_COST_MODELS: collections.OrderedDict[tuple, tuple[Any, ...]] = collections.OrderedDict()
_COST_MODELS_KEPT = 8
_COST_MODELS_LOCK = threading.Lock()


def cost_model_for(
    model: ModelSpec, hardware: HardwareProfile, engine: EngineConfig, tp: int
) -> RooflineCostModel:
    """The cost model of ``model`` on ``hardware`` (with the engine's own terms, see
    :func:`with_engine_terms`) at ``tp``: one object for the same catalog objects and terms,
    among the last few asked for in this process. Its per-shape prices are pure functions of
    these inputs, so the runs of a sweep that share them also share what earlier runs priced,
    with the same results."""
    key = (
        id(model),
        id(hardware),
        engine.all_reduce_latency_us,
        engine.launch_overhead_ms,
        tp,
        engine.dtype,
        engine.kv_cache_dtype,
    )
    with _COST_MODELS_LOCK:
        hit = _COST_MODELS.get(key)
        if hit is not None and hit[0] is model and hit[1] is hardware:
            _COST_MODELS.move_to_end(key)
            return hit[2]
    cost_model = RooflineCostModel(
        model,
        with_engine_terms(hardware, engine),
        tp=tp,
        dtype=engine.dtype,
        kv_dtype=engine.kv_cache_dtype,
    )
    with _COST_MODELS_LOCK:  # the objects are kept too, so that their ids stay theirs
        _COST_MODELS[key] = (model, hardware, cost_model)
        while len(_COST_MODELS) > _COST_MODELS_KEPT:
            _COST_MODELS.popitem(last=False)
    return cost_model


def engine_setup(config: ExperimentConfig, hardware: HardwareProfile | None = None) -> Setup:
    """What one engine of ``config`` is built from: load the catalogs, make the cost model
    and size the KV cache; raises ConfigError on anything inconsistent.

    ``hardware`` replaces the profile ``config.hardware`` names (``batchsim calibrate``
    simulates candidate profiles that exist only in memory).
    """
    if hardware is None:
        hardware = load_hardware(config.hardware)
    model = load_model(config.model)
    tp = config.parallel.tensor_parallel_size
    engine = config.engine
    cost_model = cost_model_for(model, hardware, engine, tp)
    hardware = cost_model.hardware  # with the engine's own terms
    pp = config.parallel.pipeline_parallel_size
    if engine.speculative and pp > 1:
        raise ConfigError(
            f"engine.speculative needs parallel.pipeline_parallel_size 1, got {pp} (a "
            "speculative pipeline is not modelled)"
        )
    draft = draft_cost_model(config, hardware, model) if engine.speculative else None
    pipeline = None
    stages = [cost_model]
    if pp > 1:
        pipeline = PipelineCostModel(
            model, hardware, tp=tp, pp=pp, dtype=engine.dtype, kv_dtype=engine.kv_cache_dtype
        )
        stages = pipeline.stages
    # the draft model's weights sit next to the target's; each block holds both KVs
    draft_kv = draft.kv_bytes_per_token_per_gpu if draft is not None else 0.0
    draft_weights = draft.weight_bytes_per_gpu if draft is not None else 0.0
    groups = hybrid_kv_groups(model, engine)
    # a hybrid model's block holds its token range in one group's layers
    group_share = 1.0 if groups is None else groups[2] / model.num_hidden_layers
    if engine.num_gpu_blocks is not None:
        blocks = engine.num_gpu_blocks
    else:
        # one block holds a token range in every layer: each stage's GPUs hold the range for
        # their layers, and the pool is as large as the stage with the least room allows
        blocks = min(
            kv_capacity_blocks(
                memory_bytes=hardware.memory_capacity,
                gpu_memory_utilization=engine.gpu_memory_utilization,
                weight_bytes=stage.weight_bytes_per_gpu + draft_weights,
                activation_reserve_bytes=activation_reserve_bytes(model, config, tp),
                block_bytes=(stage.kv_bytes_per_token_per_gpu + draft_kv)
                * engine.block_size
                * group_share,
            )
            for stage in stages
        )
    dtype_bytes(engine.dtype, "engine.dtype")
    if engine.enable_prefix_caching and model.sliding_window is not None:
        raise ConfigError(
            f"engine.enable_prefix_caching: true is not supported with a sliding-window model "
            f"({model.name}: sliding_window {model.sliding_window} tokens); set it to false"
        )
    cpu_blocks, swap_time = 0, 0.0
    if config.scheduler.preemption_mode == "swap":
        if hardware.host_bandwidth is None:
            raise ConfigError(
                f"scheduler.preemption_mode: swap needs the host link bandwidth, but hardware "
                f"{hardware.name} has no host_bandwidth_gb_s; add it to the profile or use "
                "preemption_mode: recompute"
            )
        # the stage with the most layers copies the most bytes per block
        kv_bytes_per_token = max(s.kv_bytes_per_token_per_gpu for s in stages) + draft_kv
        block_bytes = kv_bytes_per_token * engine.block_size * group_share
        cpu_blocks = int(engine.swap_space_gib * 2**30 // block_bytes)
        link = hardware.host_bandwidth * hardware.efficiency["host_transfer_efficiency"]
        swap_time = block_bytes / link
    return Setup(
        config,
        hardware,
        model,
        cost_model,
        blocks,
        cpu_blocks,
        swap_time,
        draft_cost_model=draft,
        pipeline=pipeline,
        hybrid_kv_groups=groups,
    )


def draft_cost_model(
    config: ExperimentConfig, hardware: HardwareProfile, model: ModelSpec
) -> RooflineCostModel | None:
    """The draft model of ``engine.speculative`` on the target's GPUs (None without one);
    raises ConfigError for a setting speculative decoding does not run with."""
    spec = config.engine.speculative
    assert spec is not None
    policy = config.scheduler.policy
    if policy not in SPECULATIVE_POLICIES:
        allowed = " or ".join(SPECULATIVE_POLICIES)
        raise ConfigError(f"engine.speculative needs scheduler.policy {allowed}, got {policy}")
    if model.sliding_window is not None:
        raise ConfigError(
            f"engine.speculative is not supported with a sliding-window model ({model.name}: "
            f"sliding_window {model.sliding_window} tokens)"
        )
    if spec.draft_model is None:
        return None
    draft = load_model(spec.draft_model, key="engine.speculative.draft_model")
    engine = config.engine
    try:
        return RooflineCostModel(
            draft,
            hardware,
            tp=config.parallel.tensor_parallel_size,
            dtype=engine.dtype,
            kv_dtype=engine.kv_cache_dtype,
        )
    except ConfigError as exc:
        raise ConfigError(f"engine.speculative.draft_model {draft.name}: {exc.message}") from None
