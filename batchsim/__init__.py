"""batchsim: how would a batching policy behave for model M on GPU G under workload W?

A discrete-event simulator (SimPy) of an LLM serving engine's iteration loop with pluggable
batching policies and a roofline cost model. Public API: :func:`run`,
:func:`sweep`, :func:`capacity`,
:func:`load_experiment`, :class:`Result`, and :func:`kernel` (one kernel's predicted time).

The API names are imported on first use (PEP 562), so that ``import batchsim`` and
``batchsim --version`` or ``--help`` load neither numpy nor pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from batchsim.errors import BatchsimError, ConfigError
from batchsim.version import __version__

if TYPE_CHECKING:
    from batchsim.config import ExperimentConfig, load_experiment
    from batchsim.cost.kernels import kernel
    from batchsim.simulation import Result, run
    from batchsim.studies.capacity import capacity
    from batchsim.studies.sweep import sweep


__all__ = [
    "BatchsimError",
    "ConfigError",
    "ExperimentConfig",
    "Result",
    "__version__",
    "capacity",
    "kernel",
    "load_experiment",
    "run",
    "sweep",
]

_LAZY = {
    "ExperimentConfig": "batchsim.config",
    "load_experiment": "batchsim.config",
    "Result": "batchsim.simulation",
    "kernel": "batchsim.cost.kernels",
    "run": "batchsim.simulation",
    "capacity": "batchsim.studies.capacity",
    "sweep": "batchsim.studies.sweep",
}
"""Public name -> the module defining it, imported when the name is first read."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads find it without calling this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
