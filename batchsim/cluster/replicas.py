"""Build a cluster's replica engines, run them behind the router, merge their records.

Each replica is a whole engine (:class:`~batchsim.engine.engine.Engine`): its own policy, KV
cache and CPU overhead, and the cost model of its group (replicas of one group share it: it
is a pure function with caches). All of them run on the dispatcher's one SimPy environment
(:class:`~batchsim.engine.dispatch.Dispatcher`). Afterwards their logs become the cluster's:
the iterations of replica 0, then replica 1..., numbered on across the cluster, and every
request with the replica that served it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from batchsim.cluster.config import group_experiments
from batchsim.cluster.router import make_router
from batchsim.engine.dispatch import Dispatcher
from batchsim.engine.engine import Engine
from batchsim.errors import ConfigError
from batchsim.metrics.iterations import IterationLog
from batchsim.metrics.replicas import ReplicaRecord
from batchsim.metrics.requests import RequestLog
from batchsim.scheduler.registry import load_policy
from batchsim.scheduler.speculative import SpeculativeScheduler, summary_of
from batchsim.simulation import Setup, build, engine_parts, unused_key_notes
from batchsim.workload import RequestTable

if TYPE_CHECKING:
    from batchsim.config import ExperimentConfig
    from batchsim.progress import RunProgress


@dataclass
class ClusterRun:
    """What a cluster's simulation left: the merged logs and each replica's record."""

    request_log: RequestLog
    """Every request, with its ``replica``."""
    iterations: IterationLog
    """Every replica's iterations, replica after replica, with a ``replica`` column."""
    replicas: list[ReplicaRecord]
    capacity_tokens: int
    """KV-cache capacity of the whole cluster (tokens)."""
    notes: list[str] = field(default_factory=list)
    speculative: dict[str, float] | None = None
    """Speculative decoding's summary over every replica (None without it)."""
    by_request: dict[str, np.ndarray] | None = None
    """A disaggregated cluster's columns of ``requests.csv`` beyond the log's, indexed by
    request id (:mod:`batchsim.cluster.disaggregation`); None otherwise."""


def run_cluster(
    config: ExperimentConfig, table: RequestTable, progress: RunProgress | None = None
) -> ClusterRun:
    """Simulate ``config`` (with a ``cluster:`` block) on the requests of ``table``."""
    cluster = config.cluster
    assert cluster is not None, "not a cluster"
    if cluster.disaggregation is not None:
        from batchsim.cluster.disaggregation import run_disaggregated

        return run_disaggregated(config, table, progress)
    replicas: list[tuple[ExperimentConfig, Setup]] = []
    notes: list[str] = []
    for count, experiment, setup in build_groups(config):
        policy = load_policy(experiment.scheduler.policy)
        notes += [n for n in unused_key_notes(experiment, policy) if n not in notes]
        replicas += [(experiment, setup)] * count
    dispatcher = Dispatcher(
        table, make_router(cluster, config.seed), cluster.router_overhead_ms / 1e3
    )
    links = dispatcher.add_replicas(
        [(setup.hardware.name, e.parallel.tensor_parallel_size) for e, setup in replicas]
    )
    engines, capacity = run_engines(dispatcher, links, replicas, progress)
    for engine in engines:
        engine.check_done()
        assert engine.request_log.num_rows == engine.num_arrived, "a request never left"
    offsets, records = replica_records(engines, replicas)
    request_log = RequestLog.concatenate([e.request_log for e in engines], offsets)
    iterations = IterationLog.concatenate([e.iterations for e in engines])
    speculators = [
        e.scheduler.speculator for e in engines if isinstance(e.scheduler, SpeculativeScheduler)
    ]
    speculative = summary_of(speculators) if speculators else None
    return ClusterRun(request_log, iterations, records, capacity, notes, speculative)


def replica_records(
    engines: Sequence[Engine],
    members: Sequence[tuple[ExperimentConfig, Setup]],
    pools: Sequence[str | None] | None = None,
) -> tuple[list[int], list[ReplicaRecord]]:
    """Where each engine's iterations start in the cluster's log (they follow one another in
    engine order), and the replica table's record of each engine (``pools``: its pool in a
    disaggregated cluster)."""
    offsets, total = [], 0
    for engine in engines:
        offsets.append(total)
        total += engine.iterations.num_rows
    records = [
        ReplicaRecord(
            setup.hardware.name,
            experiment.parallel.tensor_parallel_size,
            engine.scheduler.kv_cache.num_blocks,
            engine.iterations,
            pool=None if pools is None else pools[index],
        )
        for index, (engine, (experiment, setup)) in enumerate(zip(engines, members))
    ]
    return offsets, records


def build_groups(config: ExperimentConfig) -> list[tuple[int, ExperimentConfig, Setup]]:
    """Each group of replicas of ``config``: (count, the experiment of one of its replicas,
    what :func:`~batchsim.simulation.build` makes of it).

    Raises:
        ConfigError: A group's hardware or settings cannot be built; the message names the
            group (``cluster.replicas[1]: ...``, ``cluster.disaggregation.decode: ...``).
    """
    assert config.cluster is not None, "not a cluster"
    out = []
    for i, (count, experiment) in enumerate(group_experiments(config)):
        try:
            setup = build(experiment)
        except ConfigError as exc:
            if isinstance(config.cluster.replicas, int):
                raise
            raise ConfigError(f"{config.cluster.group_key(i)}: {exc.message}") from None
        out.append((count, experiment, setup))
    return out


class ClusterProgress:
    """The engine's ``on_step`` for a progress line about the whole cluster: it shows the
    progress object an engine-like view of the sum of the replicas."""

    def __init__(self, progress: RunProgress, dispatcher: Dispatcher):
        self.progress = progress
        self.engines: Sequence[Engine] = ()
        self.request_log = _Sum(self, "request_log")
        self.iterations = _Sum(self, "iterations")
        self.source = dispatcher.source
        self.env = dispatcher.env

    def __call__(self, engine: Any) -> None:
        self.progress(self)  # type: ignore[arg-type]


class _Sum:
    def __init__(self, owner: ClusterProgress, attribute: str):
        self.owner = owner
        self.attribute = attribute

    @property
    def num_rows(self) -> int:
        return sum(getattr(e, self.attribute).num_rows for e in self.owner.engines)


def run_engines(
    dispatcher: Any,
    links: Sequence[Any],
    members: Sequence[tuple[ExperimentConfig, Setup]],
    progress: RunProgress | None,
) -> tuple[list[Engine], int]:
    """Build one engine per ``(experiment, setup)`` of ``members`` on its dispatcher link, run
    them all on the dispatcher's clock, and return them with their total KV capacity
    (tokens)."""
    on_step = None if progress is None else ClusterProgress(progress, dispatcher)
    engines = []
    capacity = 0
    for link, (experiment, setup) in zip(links, members):
        kv, scheduler, options = engine_parts(
            experiment, setup, load_policy(experiment.scheduler.policy)
        )
        capacity += kv.capacity_tokens
        engines.append(Engine(scheduler, setup.cost_model, None, options, on_step, link=link))
    if on_step is not None:
        on_step.engines = engines
    dispatcher.run(engines)
    return engines, capacity
