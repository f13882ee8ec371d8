"""A whole experiment: :class:`ExperimentConfig`, its blocks together (one simulated engine
or a cluster of them, one workload), and how it is written back (``config.yaml``)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from batchsim.cluster.config import ClusterConfig
from batchsim.config.blocks import (
    EngineConfig,
    MetricsConfig,
    OutputConfig,
    ParallelConfig,
    SloConfig,
)
from batchsim.scheduler.config import SchedulerConfig
from batchsim.validation import (
    ConfigModel,
    StrictInt,
    format_value,
)
from batchsim.workload.config import WorkloadConfig
from batchsim.yamlio import dump

MAX_NAME_CHARS = 100
_NAME_PATTERN = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")


class ExperimentConfig(ConfigModel):
    """A whole experiment: one simulated engine, one workload."""

    name: str = "experiment"
    description: str = ""
    seed: StrictInt = Field(0, ge=0, le=2**64 - 1)
    """Seed of every random stream of the run (same seed -> identical outputs)."""
    hardware: str
    """Built-in profile name (``batchsim list hardware``) or path to a profile YAML."""
    model: str
    """Built-in model name (``batchsim list models``), a model YAML or a HF config.json."""
    parallel: ParallelConfig = ParallelConfig()
    engine: EngineConfig = EngineConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    workload: WorkloadConfig
    slo: SloConfig | None = None
    metrics: MetricsConfig = MetricsConfig()
    output: OutputConfig = OutputConfig()
    cluster: ClusterConfig | None = None
    """Replicas of the engine behind a router (:mod:`batchsim.cluster`); None: one engine.
    Left out of the resolved config when None."""

    @model_serializer(mode="wrap")
    def _without_cluster(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # an experiment without replicas dumps as it did before cluster: existed
        data = handler(self)
        if data.get("cluster", 0) is None:
            del data["cluster"]
        return data

    @property
    def num_gpus(self) -> int:
        """GPUs one run of this experiment occupies (``parallel.tensor_parallel_size`` x
        ``parallel.pipeline_parallel_size``; the sum over the replicas of a cluster)."""
        if self.cluster is None:
            return self.parallel.tensor_parallel_size * self.parallel.pipeline_parallel_size
        total = 0
        for group in self.cluster.groups:
            parallel = (group.parallel or {}).get("tensor_parallel_size")
            tp = parallel if isinstance(parallel, int) else self.parallel.tensor_parallel_size
            total += group.count * tp
        return total

    @field_validator("hardware", "model")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        # The default output directory is runs/<name>: a name must not reach outside runs/.
        if not _NAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"must be a folder name of 1 to {MAX_NAME_CHARS} letters, digits, '.', '-' or "
                f"'_', not starting with '.'; got {format_value(value)}"
            )
        return value


def unused_scheduler_keys(config: ExperimentConfig, used: frozenset[str]) -> list[str]:
    """``scheduler.*`` keys the policy does not read whose value is not the default.

    Keys left at their default say nothing, so rerunning a resolved ``config.yaml`` (which
    spells out every default) reports only what the user changed.
    """
    scheduler = config.scheduler
    return sorted(
        key
        for key, field in type(scheduler).model_fields.items()
        if key not in used
        and key not in ("policy", "options")
        and getattr(scheduler, key) != field.get_default(call_default_factory=True)
    )


def dump_config(config: ExperimentConfig) -> str:
    """The resolved experiment as YAML, every default filled in (nulls included): enough to
    rerun it."""
    return dump(config.model_dump(mode="json"))
