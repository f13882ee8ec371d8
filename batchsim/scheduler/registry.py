"""Policy names -> scheduler classes; ``package.module:Class`` loads an out-of-tree policy."""

from __future__ import annotations

import importlib

from batchsim.errors import ConfigError
from batchsim.scheduler.chunked_prefill import ChunkedPrefillScheduler
from batchsim.scheduler.continuous import ContinuousScheduler
from batchsim.scheduler.dynamic import DynamicScheduler
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.static import StaticScheduler

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (StaticScheduler, DynamicScheduler, ContinuousScheduler, ChunkedPrefillScheduler)
}


def load_policy(name: str, key: str = "scheduler.policy") -> type[Scheduler]:
    """Return the scheduler class for a built-in name or ``package.module:Class``."""
    if name in POLICIES:
        return POLICIES[name]
    if ":" not in name:
        allowed = " | ".join(POLICIES)
        raise ConfigError(
            f"{key}: unknown policy {name!r}; allowed: {allowed} | package.module:Class"
        )
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}: cannot import module {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise ConfigError(f"{key}: {name!r} is not a batchsim.scheduler.Scheduler subclass")
    return cls
