"""The ``cluster:`` block: many engine replicas behind a router.

::

    cluster:
      replicas: 4                        # N replicas, each the experiment's engine
      router: least_outstanding          # or package.module:Class
      router_overhead_ms: 0              # routing -> delivery to the replica
      load_slack: 0.5                    # prefix_aware: skip replicas above (1 + s) x mean load + 1
      seed: null                         # the router's random stream (default: the run's seed)
      router_options: {}                 # free-form settings for a router written elsewhere

or groups of replicas that differ::

      replicas:
        - {count: 2, hardware: h100-sxm, parallel: {tensor_parallel_size: 2}}
        - {count: 4, hardware: a100-80gb, scheduler: {max_num_seqs: 128}}

A group's ``hardware`` replaces the experiment's; its ``parallel``, ``engine`` and
``scheduler`` mappings set those keys of the experiment's blocks and keep the others. The
model and the workload are the experiment's. Replicas are numbered in order: the first
group's first.

This module builds nothing; it imports neither simpy nor the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, field_validator

from batchsim.errors import ConfigError
from batchsim.validation import (
    MAX_MS,
    ConfigModel,
    FieldError,
    StrictFloat,
    StrictInt,
    config_error_from_pydantic,
    format_value,
    number_problem,
)
from batchsim.yamlio import check_plain_data

if TYPE_CHECKING:
    from batchsim.config import ExperimentConfig

MAX_REPLICAS = 65536
"""Most replicas of one cluster."""


class ReplicaGroup(ConfigModel):
    """One entry of ``cluster.replicas``: ``count`` replicas that share their settings."""

    count: StrictInt = Field(ge=1, le=MAX_REPLICAS)
    """Replicas in the group."""
    hardware: str | None = None
    """Their GPU (a built-in profile name or a profile YAML); default: the experiment's."""
    parallel: dict[str, Any] | None = None
    """Keys of the ``parallel:`` block that differ from the experiment's."""
    engine: dict[str, Any] | None = None
    """Keys of the ``engine:`` block that differ from the experiment's."""
    scheduler: dict[str, Any] | None = None
    """Keys of the ``scheduler:`` block that differ from the experiment's."""


class ClusterConfig(ConfigModel):
    """``cluster:`` — replicas of the engine behind a router (see the module docstring)."""

    replicas: StrictInt | list[ReplicaGroup]
    """N identical replicas, or a list of groups (``{count, hardware, parallel, engine,
    scheduler}``)."""
    router: str = "round_robin"
    """round_robin | random | least_outstanding | least_kv | power_of_two | prefix_aware, or
    ``package.module:Class`` (a :class:`batchsim.cluster.Router` subclass)."""
    router_overhead_ms: StrictFloat = Field(0.0, ge=0, le=MAX_MS)
    """Time from a request's arrival (when it is routed) to its delivery at the replica (ms);
    it counts in the request's TTFT and queueing delay."""
    load_slack: StrictFloat = Field(0.5, ge=0, le=1e6)
    """``prefix_aware``: replicas with more than (1 + load_slack) x the mean number of
    requests in flight, plus one, are skipped, so one cached prefix cannot swamp one
    replica."""
    seed: StrictInt | None = Field(None, ge=0, le=2**64 - 1)
    """Seed of the router's random stream (``random``, ``power_of_two``); default: the
    experiment's ``seed``."""
    router_options: dict[str, Any] = Field(default_factory=dict)
    """Free-form settings for a router written elsewhere (plain data, as
    ``scheduler.options``)."""

    @field_validator("replicas", mode="before")
    @classmethod
    def _replicas(cls, value: Any) -> Any:
        # One message for both forms (a union would report one error per form).
        if isinstance(value, list):
            if not value:
                raise FieldError("", "must not be an empty list")
            groups = []
            for i, item in enumerate(value):
                if isinstance(item, ReplicaGroup):
                    groups.append(item)
                    continue
                if not isinstance(item, Mapping):
                    raise FieldError(
                        "", f"[{i}] must be a mapping {{count: N, ...}}, got {format_value(item)}"
                    )
                try:
                    groups.append(ReplicaGroup.model_validate(item))
                except ValidationError as exc:
                    message = config_error_from_pydantic(exc, f"[{i}]", model=ReplicaGroup).message
                    raise FieldError("", message) from None
            total = sum(group.count for group in groups)
            if total > MAX_REPLICAS:
                raise FieldError("", f"count {total:,} replicas in all, more than {MAX_REPLICAS:,}")
            return groups
        problem = number_problem(value, integer=True, ge=1, le=MAX_REPLICAS)
        if problem is not None:
            raise FieldError("", f"{problem} (a number of replicas, or a list of groups)")
        return int(value)

    @field_validator("router_options")
    @classmethod
    def _plain_bounded_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_plain_data(value)

    @property
    def groups(self) -> list[ReplicaGroup]:
        """The replicas as groups (one group of N for ``replicas: N``)."""
        if isinstance(self.replicas, int):
            return [ReplicaGroup(count=self.replicas)]
        return list(self.replicas)

    @property
    def num_replicas(self) -> int:
        return sum(group.count for group in self.groups)


def group_experiments(config: ExperimentConfig) -> list[tuple[int, ExperimentConfig]]:
    """Each group of ``config.cluster`` as (its replica count, the experiment one of its
    replicas runs: the experiment's blocks with the group's keys set, without ``cluster``).

    Raises:
        ConfigError: A group's key is not valid in its block, or a group's scheduler
            settings do not suit its policy; the message names
            ``cluster.replicas[i].<block>.<key>``.
    """
    from batchsim.config import EngineConfig, ParallelConfig
    from batchsim.scheduler.interface import SchedulerConfig
    from batchsim.scheduler.registry import load_policy

    assert config.cluster is not None, "not a cluster"
    blocks: tuple[tuple[str, type[ConfigModel] | type[SchedulerConfig]], ...] = (
        ("parallel", ParallelConfig),
        ("engine", EngineConfig),
        ("scheduler", SchedulerConfig),
    )
    out = []
    for i, group in enumerate(config.cluster.groups):
        where = f"cluster.replicas[{i}]"
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
    from batchsim.cluster.router import load_router

    cluster = config.cluster
    if cluster is None:
        return
    load_router(cluster.router)
    if config.metrics.record_slots:
        raise ConfigError(
            "metrics.record_slots is not supported with cluster: (the slots of many replicas "
            "would share one timeline); record them on a run of one replica"
        )
    group_experiments(config)
