"""What every deployment is and leaves: its groups of alike engines, and the records of a run.

A :class:`Deployment` is an experiment's engines, built but not run: one or more
:class:`Group` s of alike engines (one engine alone; the groups of a cluster's replicas; a
disaggregated cluster's prefill and decode pools), each with the experiment it runs and the
:class:`~batchsim.deployment.setup.Setup` it is made from. :meth:`Deployment.run` simulates it
on a workload's requests and returns a :class:`DeploymentRun`: the request and iteration logs
that ``requests.csv``, ``iterations.csv`` and the summary are made of, and what the
deployment adds to them (the summary's fields after the serving metrics, the replicas table,
notes and warnings). The kinds are in :mod:`.single`, :mod:`.replicas` and
:mod:`.disaggregated`; :func:`~batchsim.deployment.assembly.assemble` picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchsim.catalog.model import ModelSpec
from batchsim.config import ExperimentConfig
from batchsim.deployment.setup import Setup
from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import IterationLog
from batchsim.metrics.requests import RequestLog
from batchsim.workload.generation import RequestTable

OnStep = Callable[[Any], None]
"""Called with an engine (or a view of the cluster's engines) before every pass of its loop:
a progress line (see :mod:`batchsim.progress`)."""
IterationStream = Callable[[IterationLog], None]
"""Called with the iteration log of the engine before it runs, to write the iterations
table while it is logged (one engine alone)."""


@dataclass(frozen=True)
class Group:
    """Alike engines of a deployment: ``count`` of them, each running ``experiment`` (the
    deployment's experiment with the group's own blocks) on what ``setup`` built."""

    count: int
    experiment: ExperimentConfig
    setup: Setup
    pool: str | None = None
    """``prefill`` or ``decode`` in a disaggregated cluster; None otherwise."""


@dataclass
class DeploymentRun:
    """What simulating a deployment left (see the subclasses of each kind).

    Attributes:
        request_log: Every request that left, one row each.
        iterations: Every iteration of every engine.
        num_engines: Engines whose iterations the log holds (1: one engine).
        notes: Things the user should know (keys a policy ignores), one line each.
    """

    request_log: RequestLog
    iterations: IterationLog
    num_engines: int
    notes: list[str] = field(default_factory=list)
    replica_columns: Columns | None = None
    """``replicas.csv`` as numpy columns (a cluster), set by :meth:`summary_fields`."""

    def request_columns(self) -> Columns:
        """``requests.csv`` as numpy columns."""
        return self.request_log.to_columns()

    def summary_fields(self, summary: dict[str, Any], requests: Columns) -> dict[str, Any]:
        """The summary's fields that follow the serving metrics of ``summary``, in order."""
        raise NotImplementedError

    def slot_columns(self) -> Columns | None:
        """``slots.csv`` as numpy columns, if the run recorded its batch slots."""
        return None

    def warnings(self, requests: Columns) -> list[str]:
        """Things that make the results less trustworthy, one line each."""
        return []


class Deployment:
    """An experiment's engines, built and not yet run.

    Attributes:
        config: The experiment.
        groups: Its groups of alike engines.
        model: The model every engine serves.
    """

    def __init__(self, config: ExperimentConfig, groups: list[Group], model: ModelSpec):
        self.config = config
        self.groups = groups
        self.model = model

    def run(
        self,
        table: RequestTable,
        on_step: OnStep | None = None,
        stream: IterationStream | None = None,
    ) -> DeploymentRun:
        """Simulate the deployment on the requests of ``table`` until every request has left.

        Args:
            table: The workload's requests.
            on_step: A progress line to keep up to date.
            stream: Takes the iteration log before the run, when the deployment can write it
                while it runs (one engine alone); others ignore it.
        """
        raise NotImplementedError


def merged_by_request(requests: Columns, by_request: dict[str, np.ndarray] | None) -> Columns:
    """``requests`` with the columns of ``by_request`` (indexed by request id) added."""
    if by_request is not None:
        ids = requests["request_id"]
        for key, values in by_request.items():
            requests[key] = values[ids]
    return requests
