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

or, instead of ``replicas``, a prefill pool and a decode pool (disaggregated serving)::

      disaggregation:
        prefill: {replicas: 2, hardware: h100-sxm, scheduler: {max_num_batched_tokens: 8192}}
        decode: {replicas: 2, scheduler: {policy: chunked_prefill}}
        kv_transfer: {link: infiniband-ndr-400, mode: after_prefill}   # or layerwise
        decode_router: least_kv

``cluster.router`` then routes arrivals to the prefill pool, and ``decode_router`` picks the
decode instance of each request whose prompt is done (:mod:`batchsim.deployment.disaggregated`).
A pool's ``hardware``, ``parallel``, ``engine`` and ``scheduler`` work as a group's; the
prefill instances are replicas 0 .. P-1, the decode instances P .. P+D-1.

This module builds nothing; it imports neither simpy nor the engine. The checks that need the
whole experiment are :mod:`batchsim.config.groups`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from batchsim.catalog.links import MAX_LINK_GB_S, MAX_LINK_LATENCY_US, load_link
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


class PoolConfig(ConfigModel):
    """``cluster.disaggregation.prefill`` or ``.decode``: the instances of one pool."""

    replicas: StrictInt = Field(ge=1, le=MAX_REPLICAS)
    """Instances in the pool."""
    hardware: str | None = None
    """Their GPU (a built-in profile name or a profile YAML); default: the experiment's."""
    parallel: dict[str, Any] | None = None
    """Keys of the ``parallel:`` block that differ from the experiment's."""
    engine: dict[str, Any] | None = None
    """Keys of the ``engine:`` block that differ from the experiment's."""
    scheduler: dict[str, Any] | None = None
    """Keys of the ``scheduler:`` block that differ from the experiment's (the pool's own
    batching policy and token budget)."""

    def group(self) -> ReplicaGroup:
        return ReplicaGroup(
            count=self.replicas,
            hardware=self.hardware,
            parallel=self.parallel,
            engine=self.engine,
            scheduler=self.scheduler,
        )


class LinkConfig(ConfigModel):
    """A link given by its numbers: ``{bandwidth_gb_s, latency_us}``."""

    bandwidth_gb_s: StrictFloat = Field(gt=0, le=MAX_LINK_GB_S)
    """One GPU's link, one direction, GB/s (1e9 bytes/s)."""
    latency_us: StrictFloat = Field(0.0, ge=0, le=MAX_LINK_LATENCY_US)
    """Fixed time of one transfer, us."""


class KVTransferConfig(ConfigModel):
    """``cluster.disaggregation.kv_transfer``: how a prompt's KV cache reaches its decode
    instance."""

    link: str | LinkConfig
    """A built-in link (``hardware_profiles/_links.yaml``: nvlink-4, infiniband-ndr-400,
    roce-200, pcie-gen4-x16, pcie-gen5-x16) or ``{bandwidth_gb_s, latency_us}``; one such
    link per GPU."""
    mode: Literal["after_prefill", "layerwise"] = "after_prefill"
    """``after_prefill``: one transfer once the prompt is done; ``layerwise``: streamed layer
    by layer while the prompt's last iteration computes, so only the part it does not hide
    is left (see :mod:`batchsim.cluster.disaggregation`)."""

    @field_validator("link", mode="before")
    @classmethod
    def _link(cls, value: Any) -> Any:
        # One message for both forms (a union would report one error per form).
        if isinstance(value, Mapping):
            try:
                return LinkConfig.model_validate(value)
            except ValidationError as exc:
                message = config_error_from_pydantic(exc, "", model=LinkConfig).message
                raise FieldError("", f".{message}") from None
        if isinstance(value, (str, LinkConfig)):
            if isinstance(value, str):
                try:
                    load_link(value, "")
                except ConfigError as exc:
                    raise FieldError("", exc.message) from None
            return value
        raise FieldError(
            "",
            f"must be a built-in link name or {{bandwidth_gb_s: ..., latency_us: ...}}, got "
            f"{format_value(value)}",
        )


class DisaggregationConfig(ConfigModel):
    """``cluster.disaggregation``: a prefill pool and a decode pool (see the module
    docstring)."""

    prefill: PoolConfig
    """The instances that run prompts (each request's prefill, which emits its first
    token)."""
    decode: PoolConfig
    """The instances that run decodes (and recompute a request preempted there)."""
    kv_transfer: KVTransferConfig
    """The link a prompt's KV cache moves over, and when."""
    decode_router: str = "least_kv"
    """Picks the decode instance of a request whose prefill is done: a router of
    ``cluster.router``'s list or ``package.module:Class``."""


class ClusterConfig(ConfigModel):
    """``cluster:`` — replicas of the engine behind a router (see the module docstring)."""

    replicas: StrictInt | list[ReplicaGroup] | None = None
    """N identical replicas, or a list of groups (``{count, hardware, parallel, engine,
    scheduler}``); or None with ``disaggregation``."""
    disaggregation: DisaggregationConfig | None = None
    """A prefill pool and a decode pool instead of ``replicas``."""
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
        if value is None:
            return None
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

    @model_validator(mode="after")
    def _one_layout(self) -> ClusterConfig:
        if self.replicas is None and self.disaggregation is None:
            raise FieldError(
                "replicas", "is required (N, or a list of groups), or cluster.disaggregation"
            )
        if self.replicas is not None and self.disaggregation is not None:
            raise FieldError(
                "disaggregation",
                "and cluster.replicas exclude each other: the pools of a disaggregated cluster "
                "are its replicas (give disaggregation.prefill.replicas and .decode.replicas)",
            )
        return self

    @property
    def groups(self) -> list[ReplicaGroup]:
        """The replicas as groups (one group of N for ``replicas: N``; the prefill pool, then
        the decode pool, of a disaggregated cluster)."""
        if self.disaggregation is not None:
            return [self.disaggregation.prefill.group(), self.disaggregation.decode.group()]
        if isinstance(self.replicas, int):
            return [ReplicaGroup(count=self.replicas)]
        assert self.replicas is not None
        return list(self.replicas)

    def group_key(self, index: int) -> str:
        """The key of group ``index`` in error messages."""
        if self.disaggregation is not None:
            return f"cluster.disaggregation.{('prefill', 'decode')[index]}"
        return f"cluster.replicas[{index}]"

    @property
    def num_replicas(self) -> int:
        return sum(group.count for group in self.groups)
