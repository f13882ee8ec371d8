"""Replicas behind a router: the deployment of an experiment with ``cluster: {replicas: ...}``.

Each replica is a whole engine (:func:`~batchsim.deployment.engines.make_engine`): its own
policy, KV cache and CPU overhead, and the cost model of its group (replicas of one group
share it: it is a pure function with caches). All of them run on the dispatcher's one SimPy
environment (:class:`~batchsim.cluster.dispatch.Dispatcher`). Afterwards their logs become the
cluster's: the iterations of replica 0, then replica 1..., numbered on across the cluster, and
every request with the replica that served it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchsim.cluster.dispatch import Dispatcher, ReplicaLink
from batchsim.cluster.router import make_router
from batchsim.deployment.base import (
    Deployment,
    DeploymentRun,
    Group,
    IterationStream,
    OnStep,
    merged_by_request,
)
from batchsim.deployment.engines import make_engine, unused_key_notes
from batchsim.engine.engine import Engine
from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import IterationLog
from batchsim.metrics.replicas import (
    ReplicaRecord,
    pool_busy_fractions,
    replica_table,
    transfer_summary,
)
from batchsim.metrics.requests import RequestLog
from batchsim.scheduler.registry import load_policy
from batchsim.scheduler.speculation import summary_of
from batchsim.scheduler.speculative import SpeculativeScheduler
from batchsim.workload.generation import RequestTable


@dataclass
class ClusterRun(DeploymentRun):
    """What a cluster's run left: the merged logs and each replica's record."""

    replicas: Sequence[ReplicaRecord] = ()
    capacity_tokens: int = 0
    """KV-cache capacity of the whole cluster (tokens)."""
    num_gpus: int = 0
    speculative: dict[str, float] | None = None
    """Speculative decoding's summary over every replica (None without it)."""
    by_request: dict[str, np.ndarray] | None = None
    """A disaggregated cluster's columns of ``requests.csv`` beyond the log's, indexed by
    request id (:mod:`batchsim.deployment.disaggregated`); None otherwise."""
    warmup_s: float = 0.0
    cooldown_s: float = 0.0

    def request_columns(self) -> Columns:
        return merged_by_request(self.request_log.to_columns(), self.by_request)

    def summary_fields(self, summary: dict[str, Any], requests: Columns) -> dict[str, Any]:
        fields: dict[str, Any] = dict(self.speculative or {})
        fields["num_gpu_blocks"] = sum(r.num_gpu_blocks for r in self.replicas)
        fields["kv_cache_capacity_tokens"] = self.capacity_tokens
        fields["bubble_fraction"] = 0.0  # replicas run without a pipeline
        table = replica_table(self.replicas, requests, self.warmup_s, self.cooldown_s)
        self.replica_columns = table
        fields["num_gpus"] = self.num_gpus
        fields["request_goodput_per_gpu"] = summary["request_goodput"] / self.num_gpus
        if self.by_request is not None:
            fields.update(pool_busy_fractions(table))
            fields.update(transfer_summary(requests, self.warmup_s, self.cooldown_s))
        return fields


class Replicas(Deployment):
    """Replicas behind a router (see the module docstring)."""

    def members(self) -> list[Group]:
        """Every engine's group, engine by engine (replica 0 first)."""
        return [group for group in self.groups for _ in range(group.count)]

    def run(
        self,
        table: RequestTable,
        on_step: OnStep | None = None,
        stream: IterationStream | None = None,
    ) -> ClusterRun:
        config = self.config
        cluster = config.cluster
        assert cluster is not None, "not a cluster"
        members = self.members()
        dispatcher = Dispatcher(
            table, make_router(cluster, config.seed), cluster.router_overhead_ms / 1e3
        )
        links = dispatcher.add_replicas(
            [(m.setup.hardware.name, m.experiment.parallel.tensor_parallel_size) for m in members]
        )
        engines, capacity = run_engines(dispatcher, links, members, on_step)
        for engine in engines:
            engine.check_done()
            assert engine.request_log.num_rows == engine.num_arrived, "a request never left"
        offsets, records = replica_records(engines, members)
        request_log = RequestLog.concatenate([e.request_log for e in engines], offsets)
        return self.cluster_run(engines, records, capacity, request_log)

    def cluster_run(
        self,
        engines: Sequence[Engine],
        records: Sequence[ReplicaRecord],
        capacity: int,
        request_log: RequestLog,
        by_request: dict[str, np.ndarray] | None = None,
    ) -> ClusterRun:
        """What the run of ``engines`` left, their request log merged as ``request_log``."""
        config = self.config
        return ClusterRun(
            request_log,
            IterationLog.concatenate([e.iterations for e in engines]),
            len(engines),
            self.notes(),
            replicas=records,
            capacity_tokens=capacity,
            num_gpus=config.num_gpus,
            speculative=speculative_summary(engines),
            by_request=by_request,
            warmup_s=config.metrics.warmup_s,
            cooldown_s=config.metrics.cooldown_s,
        )

    def notes(self) -> list[str]:
        """The unused-key notes of every group, each once."""
        notes: list[str] = []
        for group in self.groups:
            policy = load_policy(group.experiment.scheduler.policy)
            notes += [n for n in unused_key_notes(group.experiment, policy) if n not in notes]
        return notes


def speculative_summary(engines: Sequence[Engine]) -> dict[str, float] | None:
    """Speculative decoding's summary over every engine that ran it (None if none did)."""
    speculators = [
        e.scheduler.speculator for e in engines if isinstance(e.scheduler, SpeculativeScheduler)
    ]
    return summary_of(speculators) if speculators else None


def replica_records(
    engines: Sequence[Engine], members: Sequence[Group]
) -> tuple[list[int], list[ReplicaRecord]]:
    """Where each engine's iterations start in the cluster's log (they follow one another in
    engine order), and the replica table's record of each engine."""
    offsets, total = [], 0
    for engine in engines:
        offsets.append(total)
        total += engine.iterations.num_rows
    records = [
        ReplicaRecord(
            member.setup.hardware.name,
            member.experiment.parallel.tensor_parallel_size,
            engine.scheduler.kv_cache.num_blocks,
            engine.iterations,
            pool=member.pool,
        )
        for engine, member in zip(engines, members)
    ]
    return offsets, records


class ClusterProgress:
    """The engines' ``on_step`` for a progress line about the whole cluster: it shows the
    progress object an engine-like view of the sum of the replicas."""

    def __init__(self, progress: OnStep, dispatcher: Dispatcher):
        self.progress = progress
        self.engines: Sequence[Engine] = ()
        self.request_log = _Sum(self, "request_log")
        self.iterations = _Sum(self, "iterations")
        self.source = dispatcher.source
        self.env = dispatcher.env

    @property
    def clock(self) -> float:
        """Simulated time the cluster has reached: its furthest engine's."""
        return max((e.clock for e in self.engines), default=float(self.env.now))

    def __call__(self, engine: Any) -> None:
        self.progress(self)


class _Sum:
    def __init__(self, owner: ClusterProgress, attribute: str):
        self.owner = owner
        self.attribute = attribute

    @property
    def num_rows(self) -> int:
        return sum(getattr(e, self.attribute).num_rows for e in self.owner.engines)


def run_engines(
    dispatcher: Any,
    links: Sequence[ReplicaLink],
    members: Sequence[Group],
    on_step: OnStep | None,
) -> tuple[list[Engine], int]:
    """Make one engine per member on its dispatcher link, run them all on the dispatcher's
    clock, and return them with their total KV capacity (tokens)."""
    view = None if on_step is None else ClusterProgress(on_step, dispatcher)
    engines = []
    for link, member in zip(links, members):
        policy = load_policy(member.experiment.scheduler.policy)
        engines.append(make_engine(member.experiment, member.setup, policy, None, view, link))
    capacity = sum(engine.scheduler.kv_cache.capacity_tokens for engine in engines)
    if view is not None:
        view.engines = engines
    dispatcher.run(engines)
    return engines, capacity
