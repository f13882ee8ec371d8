"""One engine alone: the deployment of an experiment without ``cluster:``.

The engine (tensor parallel across its GPUs, maybe a pipeline of stages) takes its requests
straight from the workload, on its own SimPy environment. It is made by the same function as
every replica of a cluster (:func:`~batchsim.deployment.engines.make_engine`) and runs the
same step loop; what a replica adds — a router process, an inbox per replica, the ordering of
the replicas' passes at one instant, stretches that a routed request may cut — is left out,
because it costs: a cluster of one replica simulates case (a) of ``benchmarks/speed.py``
(10,000 requests) about 1.5x slower than the engine alone, with identical results (tested:
``test_one_replica_reproduces_the_plain_run``). Without a router, the engine also runs its
decodes on through their last tokens when nothing can arrive meanwhile (``Engine.drains``)
and writes its iterations table while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from batchsim.deployment.base import (
    Deployment,
    DeploymentRun,
    IterationStream,
    OnStep,
)
from batchsim.deployment.engines import make_engine, unused_key_notes
from batchsim.deployment.setup import Setup
from batchsim.engine.pipeline import PipelineEngine
from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import IterationLog
from batchsim.metrics.slots import SlotLog
from batchsim.scheduler.registry import load_policy
from batchsim.scheduler.speculative import SpeculativeScheduler
from batchsim.workload.generation import RequestTable


@dataclass
class EngineRun(DeploymentRun):
    """What one engine's run left."""

    setup: Setup | None = None
    num_gpu_blocks: int = 0
    capacity_tokens: int = 0
    """KV-cache capacity (tokens)."""
    bubble_fraction: float = 0.0
    speculative: dict[str, float] | None = None
    slot_log: SlotLog | None = None

    def summary_fields(self, summary: dict[str, Any], requests: Columns) -> dict[str, Any]:
        fields: dict[str, Any] = dict(self.speculative or {})
        fields["num_gpu_blocks"] = self.num_gpu_blocks
        fields["kv_cache_capacity_tokens"] = self.capacity_tokens
        fields["bubble_fraction"] = self.bubble_fraction
        return fields

    def slot_columns(self) -> Columns | None:
        return self.slot_log.to_columns() if self.slot_log is not None else None

    def warnings(self, requests: Columns) -> list[str]:
        setup = self.setup
        assert setup is not None
        if setup.hardware.calibrated_range is None:
            return []
        return range_warnings(setup, self.iterations, requests)


class OneEngine(Deployment):
    """One engine alone (see the module docstring)."""

    def run(
        self,
        table: RequestTable,
        on_step: OnStep | None = None,
        stream: IterationStream | None = None,
    ) -> EngineRun:
        (group,) = self.groups
        config, setup = group.experiment, group.setup
        policy_cls = load_policy(config.scheduler.policy)
        engine = make_engine(config, setup, policy_cls, table, on_step)
        if stream is not None:
            stream(engine.iterations)
        engine.run()
        engine.iterations.end_stream()
        assert engine.request_log.num_rows == engine.num_arrived, "a request never left"
        scheduler = engine.scheduler
        kv = scheduler.kv_cache
        return EngineRun(
            engine.request_log,
            engine.iterations,
            1,
            unused_key_notes(config, policy_cls),
            setup=setup,
            num_gpu_blocks=kv.num_blocks,
            capacity_tokens=kv.capacity_tokens,
            bubble_fraction=(engine.bubble_fraction if isinstance(engine, PipelineEngine) else 0.0),
            speculative=(
                scheduler.speculator.summary()
                if isinstance(scheduler, SpeculativeScheduler)
                else None
            ),
            slot_log=engine.slot_log,
        )


def range_warnings(setup: Setup, iterations: IterationLog, requests: Columns) -> list[str]:
    """The hardware profile's ``calibrated_range`` against the run's extremes (model, TP,
    fewest and most tokens and requests of an iteration, longest request), one line each.
    Read from the per-run batch columns: no pass over the iterations."""
    calibrated = setup.hardware.calibrated_range
    assert calibrated is not None
    tokens = batch = None
    if iterations.num_rows:
        total = (
            iterations.batch_column("num_prefill_tokens").astype(np.int64)
            + iterations.batch_column("num_decode_tokens")
            + iterations.batch_column("num_padding_tokens")
        )
        seqs = iterations.batch_column("num_seqs")
        tokens = (int(total.min()), int(total.max()))
        batch = (int(seqs.min()), int(seqs.max()))
    context = None
    if len(requests["prompt_tokens"]):
        context = int((requests["prompt_tokens"] + requests["output_tokens"]).max())
    lines = calibrated.outside(
        model=setup.model.name,
        hidden_size=setup.model.hidden_size,
        tensor_parallel_size=setup.config.parallel.tensor_parallel_size,
        tokens=tokens,
        batch_size=batch,
        context_tokens=context,
    )
    return [f"hardware {setup.hardware.name}: {line}" for line in lines]
