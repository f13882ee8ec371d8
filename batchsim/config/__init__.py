"""The experiment: its schema, how it is read, overridden and validated, and written back.

An experiment YAML (or a mapping) becomes a validated, frozen
:class:`~batchsim.config.experiment.ExperimentConfig` through :func:`load_experiment`. The
package owns every block's keys, defaults, bounds and units, ``--set`` overrides, and the
mapping of validation errors to one line naming the file, the line and the dotted key path.
Unknown keys are errors. It builds nothing (no model or hardware is loaded, no engine made)
and imports no simpy.

- :mod:`.blocks`: ``parallel:``, ``engine:``, ``slo:``, ``metrics:``, ``output:``;
- :mod:`.experiment`: the whole experiment and its ``config.yaml``;
- :mod:`.groups`: the experiment each group of replicas runs, and the cluster's checks;
- :mod:`.resolve`: a raw mapping -> a validated experiment;
- :mod:`.overrides`: dotted-key overrides (``--set``, :func:`batchsim.run`'s keywords);
- :mod:`.source`: an experiment as read from its file, resolved once or many times.

The ``scheduler:`` and ``engine.speculative:`` blocks are the policies'
(:mod:`batchsim.scheduler.config`), ``workload:`` the workload's
(:mod:`batchsim.workload.config`) and ``cluster:`` the cluster's (:mod:`batchsim.cluster.config`).
"""

from batchsim.config.blocks import (
    OUTPUT_FORMATS,
    EngineConfig,
    FrameworkName,
    KvDtype,
    MetricsConfig,
    OutputConfig,
    ParallelConfig,
    SloConfig,
    WeightDtype,
)
from batchsim.config.experiment import ExperimentConfig, dump_config, unused_scheduler_keys
from batchsim.config.overrides import (
    apply_overrides,
    keyword_overrides,
    name_override,
    override_label,
    parse_override,
)
from batchsim.config.resolve import validate_experiment
from batchsim.config.source import STUDY_BLOCKS, ExperimentSource, load_experiment
from batchsim.scheduler.config import SchedulerConfig, SpeculativeConfig

__all__ = [
    "OUTPUT_FORMATS",
    "STUDY_BLOCKS",
    "EngineConfig",
    "ExperimentConfig",
    "ExperimentSource",
    "FrameworkName",
    "KvDtype",
    "MetricsConfig",
    "OutputConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "SloConfig",
    "SpeculativeConfig",
    "WeightDtype",
    "apply_overrides",
    "dump_config",
    "keyword_overrides",
    "load_experiment",
    "name_override",
    "override_label",
    "parse_override",
    "unused_scheduler_keys",
    "validate_experiment",
]
