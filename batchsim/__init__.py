"""batchsim: how would a batching policy behave for model M on GPU G under workload W?

A discrete-event simulator (SimPy) of an LLM serving engine's iteration loop with pluggable
batching policies and a roofline cost model. Public API: :func:`run`,
:func:`load_experiment`, :class:`Result`.
"""

from batchsim.config import ExperimentConfig, load_experiment
from batchsim.errors import BatchsimError, ConfigError
from batchsim.simulation import Result, run

__version__ = "0.1.0"

__all__ = [
    "BatchsimError",
    "ConfigError",
    "ExperimentConfig",
    "Result",
    "__version__",
    "load_experiment",
    "run",
]
