"""One engine of a deployment, made from its :class:`~batchsim.deployment.setup.Setup`: the KV
cache, the batching policy over it, the engine's settings, and the engine itself.

Every engine of a deployment is made here, whatever it serves as: the engine alone, one
replica of a cluster, a prefill or a decode instance of a disaggregated cluster (its
``link`` says which), or a pipeline of stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchsim.config import ExperimentConfig, unused_scheduler_keys
from batchsim.deployment.setup import Setup
from batchsim.engine.arrivals import Link
from batchsim.engine.engine import Engine
from batchsim.engine.kv_cache import KVCacheManager
from batchsim.engine.options import EngineOptions
from batchsim.engine.pipeline import PipelineEngine
from batchsim.engine.prefix_cache import PrefixCachingKVCacheManager
from batchsim.errors import BatchsimError, Interrupted, PolicyError, describe_exception
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.registry import built_in, policy_name
from batchsim.scheduler.speculation import Speculator
from batchsim.scheduler.speculative import SpeculativeScheduler, speculative_policy
from batchsim.workload.generation import RequestTable


def make_policy(
    policy_cls: type[Scheduler],
    config: ExperimentConfig,
    kv: KVCacheManager,
    window: int | None,
    max_len: int | None,
) -> Scheduler:
    """The policy over ``kv``. One written elsewhere that raises while it is made broke a rule:
    the error names it (the compiled build also raises when it assigns an attribute that
    :class:`Scheduler` declares a value of another type, ``max_num_seqs = 8.0`` say)."""
    try:
        return policy_cls(config.scheduler, kv, window=window, max_model_len=max_len)
    except (BatchsimError, Interrupted):
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt of its own: its error too
        if built_in(policy_cls):
            raise
        raise PolicyError(
            f"scheduler.policy {policy_name(policy_cls)}: __init__() raised "
            f"{describe_exception(exc)}"
        ) from None


def engine_parts(
    config: ExperimentConfig, setup: Setup, policy_cls: type[Scheduler]
) -> tuple[KVCacheManager, Scheduler, EngineOptions]:
    """The KV cache, the policy over it and the engine settings of one engine of ``config``
    (each replica of a cluster has its own)."""
    engine_cfg = config.engine
    hardware = setup.hardware
    window = setup.model.sliding_window
    watermark = int(engine_cfg.watermark * setup.num_gpu_blocks)
    kv: KVCacheManager
    if engine_cfg.enable_prefix_caching:
        kv = PrefixCachingKVCacheManager(
            setup.num_gpu_blocks,
            engine_cfg.block_size,
            setup.num_cpu_blocks,
            watermark_blocks=watermark,
        )
    else:
        kv_window, full, sliding = window, 0, 1
        if setup.hybrid_kv_groups is not None:  # per layer group (vLLM's hybrid KV cache)
            full, sliding, _ = setup.hybrid_kv_groups
            kv_window = setup.model.hybrid_sliding_window
        kv = KVCacheManager(
            setup.num_gpu_blocks,
            engine_cfg.block_size,
            setup.num_cpu_blocks,
            window=kv_window,
            watermark_blocks=watermark,
            full_groups=full,
            window_groups=sliding,
        )
    max_len = engine_cfg.max_model_len or setup.model.max_position_embeddings
    spec = engine_cfg.speculative
    if spec is not None:
        policy_cls = speculative_policy(policy_cls)
    scheduler = make_policy(policy_cls, config, kv, window, max_len)
    if spec is not None:
        assert isinstance(scheduler, SpeculativeScheduler)
        scheduler.speculator = Speculator(spec, config.seed, setup.draft_cost_model)
    options = EngineOptions(
        cpu_overhead_base=(
            engine_cfg.cpu_overhead_ms / 1e3
            if engine_cfg.cpu_overhead_ms is not None
            else hardware.cpu_overhead_base
        ),
        cpu_overhead_per_seq=(
            engine_cfg.cpu_overhead_per_seq_ms / 1e3
            if engine_cfg.cpu_overhead_per_seq_ms is not None
            else hardware.cpu_overhead_per_seq
        ),
        async_scheduling=engine_cfg.async_scheduling,
        cuda_graph_max_batch_size=engine_cfg.cuda_graph_max_batch_size or 0,
        fast_forward=engine_cfg.fast_forward,
        swap_time_per_block=setup.swap_time_per_block,
        record_slots=config.metrics.record_slots,
    )
    return kv, scheduler, options


def make_engine(
    config: ExperimentConfig,
    setup: Setup,
    policy_cls: type[Scheduler],
    table: RequestTable | None,
    on_step: Callable[[Any], None] | None = None,
    link: Link | None = None,
) -> Engine:
    """The engine of ``config`` (one group of a cluster's replicas included) over ``setup``:
    alone on the requests of ``table``, or one replica of a cluster on its ``link``; a
    pipeline of stages with ``parallel.pipeline_parallel_size`` > 1 (alone only)."""
    _, scheduler, options = engine_parts(config, setup, policy_cls)
    if setup.pipeline is not None:
        assert link is None and table is not None, "a pipeline runs alone"
        return PipelineEngine(scheduler, setup.pipeline, table, options, on_step=on_step)
    return Engine(scheduler, setup.cost_model, table, options, on_step, link=link)


def unused_key_notes(config: ExperimentConfig, policy_cls: type[Scheduler]) -> list[str]:
    """A note for each ``scheduler:`` key the policy does not read."""
    return [
        f"scheduler.{key} is not used by policy {config.scheduler.policy}"
        for key in unused_scheduler_keys(config, policy_cls.config_keys)
    ]
