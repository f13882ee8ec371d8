"""Batching policies: one shared mechanism (:mod:`.interface`), one small file per policy."""

from batchsim.scheduler.config import SchedulerConfig
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import SchedulerOutput
from batchsim.scheduler.registry import POLICIES, load_policy

__all__ = ["POLICIES", "Scheduler", "SchedulerConfig", "SchedulerOutput", "load_policy"]
