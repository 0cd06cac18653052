"""Scheduling policies over one token-budget core. ``POLICIES`` maps scenario names to classes."""

from simserve.sched.core import Batch, Scheduler, SchedulerLimits
from simserve.sched.orca import Orca
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.sched.sarathi import Sarathi
from simserve.sched.static import Static
from simserve.sched.vllm_v0 import VllmV0
from simserve.sched.vllm_v1 import VllmV1

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (Static, Orca, VllmV0, VllmV1, Sarathi)
}

__all__ = ["POLICIES", "Batch", "Request", "Scheduler", "SchedulerLimits", "Status", "StepPlan"]
