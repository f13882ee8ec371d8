"""The checks of ``cluster:`` that need the whole experiment, and the experiment each group of
replicas runs (:func:`group_experiments`): the experiment's blocks with the group's keys set."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from batchsim.cluster.router import load_router
from batchsim.config.blocks import EngineConfig, ParallelConfig
from batchsim.config.experiment import ExperimentConfig
from batchsim.errors import ConfigError
from batchsim.scheduler.config import SchedulerConfig
from batchsim.scheduler.registry import load_policy
from batchsim.scheduler.static import StaticScheduler
from batchsim.validation import ConfigModel, config_error_from_pydantic


def group_experiments(config: ExperimentConfig) -> list[tuple[int, ExperimentConfig]]:
    """Each group of ``config.cluster`` as (its replica count, the experiment one of its
    replicas runs: the experiment's blocks with the group's keys set, without ``cluster``).

    Raises:
        ConfigError: A group's key is not valid in its block, or a group's scheduler
            settings do not suit its policy; the message names
            ``cluster.replicas[i].<block>.<key>``.
    """
    assert config.cluster is not None, "not a cluster"
    blocks: tuple[tuple[str, type[ConfigModel] | type[SchedulerConfig]], ...] = (
        ("parallel", ParallelConfig),
        ("engine", EngineConfig),
        ("scheduler", SchedulerConfig),
    )
    out = []
    for i, group in enumerate(config.cluster.groups):
        where = config.cluster.group_key(i)
        update: dict[str, Any] = {"cluster": None}
        if group.hardware is not None:
            if not group.hardware.strip():
                raise ConfigError(f"{where}.hardware must not be empty")
            update["hardware"] = group.hardware
        for name, model in blocks:
            override = getattr(group, name)
            if not override:
                continue
            if name == "engine" and override.get("framework", config.engine.framework) != (
                config.engine.framework
            ):
                raise ConfigError(
                    f"{where}.engine.framework: a group cannot change the serving-engine "
                    "preset (it is applied to the whole experiment before the groups); set "
                    "the group's engine and scheduler keys instead"
                )
            merged = {**getattr(config, name).model_dump(), **override}
            try:
                update[name] = model.model_validate(merged)
            except ValidationError as exc:
                raise config_error_from_pydantic(exc, f"{where}.{name}", model=model) from None
        if "scheduler" in update:
            scheduler = update["scheduler"]
            try:
                load_policy(scheduler.policy, f"{where}.scheduler.policy").check_config(scheduler)
            except ConfigError as exc:
                message = exc.message
                if message.startswith("scheduler."):
                    message = f"{where}.{message}"
                raise ConfigError(message) from None
        out.append((group.count, config.model_copy(update=update)))
    return out


def check_cluster(config: ExperimentConfig) -> None:
    """The checks of ``cluster:`` that need the whole experiment (its groups' blocks, the
    router, the settings a cluster does not support).

    Raises:
        ConfigError: Naming the key.
    """
    cluster = config.cluster
    if cluster is None:
        return
    load_router(cluster.router)
    if cluster.disaggregation is not None:
        check_disaggregation(config)
    if config.metrics.record_slots:
        raise ConfigError(
            "metrics.record_slots is not supported with cluster: (the slots of many replicas "
            "would share one timeline); record them on a run of one replica"
        )
    group_experiments(config)


def check_disaggregation(config: ExperimentConfig) -> None:
    """The checks of ``cluster.disaggregation`` that need more than its own block.

    Raises:
        ConfigError: Naming the key.
    """
    assert config.cluster is not None and config.cluster.disaggregation is not None
    disaggregation = config.cluster.disaggregation
    load_router(disaggregation.decode_router, "cluster.disaggregation.decode_router")
    groups = [group for _, group in group_experiments(config)]
    for pool, group in zip(("prefill", "decode"), groups):
        if group.engine.speculative is not None:
            raise ConfigError(
                f"cluster.disaggregation.{pool}: engine.speculative is not modelled with "
                "disaggregated prefill/decode; remove it or run colocated replicas"
            )
        if group.engine.enable_prefix_caching:
            raise ConfigError(
                f"cluster.disaggregation.{pool}: engine.enable_prefix_caching is not modelled "
                "with disaggregated prefill/decode yet; set it to false"
            )
    decode = groups[1]
    policy = load_policy(decode.scheduler.policy)
    if issubclass(policy, StaticScheduler):
        raise ConfigError(
            f"cluster.disaggregation.decode.scheduler.policy: {decode.scheduler.policy} "
            "batching cannot run a decode pool (its batches form around prompts); use "
            "continuous or chunked_prefill"
        )
