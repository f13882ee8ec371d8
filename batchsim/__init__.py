"""batchsim: how would a batching policy behave for model M on GPU G under workload W?

A discrete-event simulator (SimPy) of an LLM serving engine's iteration loop with pluggable
batching policies and a roofline cost model. Public API: :func:`run`,
:func:`sweep`, :func:`capacity`,
:func:`load_experiment`, :class:`Result`.
"""

from batchsim.config import ExperimentConfig, load_experiment
from batchsim.errors import BatchsimError, ConfigError
from batchsim.simulation import Result, run
from batchsim.studies.capacity import capacity
from batchsim.studies.sweep import sweep

__version__ = "0.1.0"

__all__ = [
    "BatchsimError",
    "ConfigError",
    "ExperimentConfig",
    "Result",
    "__version__",
    "capacity",
    "load_experiment",
    "run",
    "sweep",
]
